#!/usr/bin/env python3
"""Append entries to a silt stream with branded ids, from Python (redis-py).

Usage: REDIS_URL=redis://127.0.0.1:6379/0 STREAM=emq:{cm}:stream:events \
       KIND=EVT python3 producer.py N   (prints each entry's branded id)
WAIT_REPLICAS=1 prints an id only once a replica holds its entry.

The branded id is the stream id, field by field: KIND_ then the
milliseconds (10 digits) and the sequence (13 digits) in Crockford's base32.
"""
import os, sys, time
import redis

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

def b32(v, width):
    return "".join(ALPHABET[(v >> (5 * i)) & 31] for i in reversed(range(width)))

def branded(kind, ms, seq):
    return f"{kind}_{b32(ms, 10)}{b32(seq, 13)}"

class Minter:
    """Successive mints strictly increase, even if the clock steps back."""
    def __init__(self, kind):
        self.kind, self.ms, self.seq = kind, 0, -1

    def next(self):
        now = int(time.time() * 1000)
        if now > self.ms:
            self.ms, self.seq = now, 0
        else:
            self.seq += 1
        return self.ms, self.seq

    def past(self, top):  # another writer got ahead: go past its top
        ms, seq = (int(x) for x in top.split("-"))
        if (ms, seq) >= (self.ms, self.seq):
            self.ms, self.seq = ms, seq

def append(r, stream, minter, fields):
    while True:
        ms, seq = minter.next()
        bid = branded(minter.kind, ms, seq)
        try:
            r.xadd(stream, {"id": bid, **fields}, id=f"{ms}-{seq}")
            return bid
        except redis.ResponseError as e:
            if "equal or smaller" not in str(e):
                raise
            minter.past(r.xinfo_stream(stream)["last-generated-id"])

if __name__ == "__main__":
    # One connection: WAIT counts the replicas holding this connection's writes.
    pool = redis.ConnectionPool.from_url(os.environ["REDIS_URL"], decode_responses=True)
    r = redis.Redis(connection_pool=pool, single_connection_client=True)
    stream, minter = os.environ["STREAM"], Minter(os.environ.get("KIND", "EVT"))
    replicas, wait_ms = int(os.environ.get("WAIT_REPLICAS", "0")), int(os.environ.get("WAIT_MS", "5000"))
    for i in range(int(sys.argv[1])):
        bid = append(r, stream, minter, {"lang": "python", "n": str(i)})
        if replicas and r.wait(replicas, wait_ms) < replicas:
            sys.exit(f"{bid}: not on {replicas} replicas within {wait_ms} ms: it may or may not survive a failover")
        print(bid, flush=True)
