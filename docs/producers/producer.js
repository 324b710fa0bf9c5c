// Append entries to a silt stream with branded ids, from Node (ioredis).
//
// Usage: REDIS_URL=redis://127.0.0.1:6379/0 STREAM='emq:{cm}:stream:events' \
//        KIND=EVT node producer.js N   (prints each entry's branded id)
// WAIT_REPLICAS=1 prints an id only once a replica holds its entry.
//
// The branded id is the stream id, field by field: KIND_ then the
// milliseconds (10 digits) and the sequence (13 digits) in Crockford's base32.
const Redis = require("ioredis");

const ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

function b32(v, width) { // v: a BigInt
  let s = "";
  for (let i = 0; i < width; i++, v >>= 5n) s = ALPHABET[Number(v & 31n)] + s;
  return s;
}

const branded = (kind, ms, seq) => `${kind}_${b32(ms, 10)}${b32(seq, 13)}`;

// Successive mints strictly increase, even if the clock steps back.
class Minter {
  constructor(kind) { this.kind = kind; this.ms = 0n; this.seq = -1n; }
  next() {
    const now = BigInt(Date.now());
    if (now > this.ms) { this.ms = now; this.seq = 0n; } else { this.seq += 1n; }
    return [this.ms, this.seq];
  }
  past(top) { // another writer got ahead: go past its top
    const [ms, seq] = top.split("-").map(BigInt);
    if (ms > this.ms || (ms === this.ms && seq >= this.seq)) { this.ms = ms; this.seq = seq; }
  }
}

async function append(redis, stream, minter, fields) {
  for (;;) {
    const [ms, seq] = minter.next();
    const id = branded(minter.kind, ms, seq);
    try {
      await redis.xadd(stream, `${ms}-${seq}`, "id", id, ...Object.entries(fields).flat());
      return id;
    } catch (e) {
      if (!String(e.message).includes("equal or smaller")) throw e;
      const info = await redis.xinfo("STREAM", stream);
      minter.past(info[info.indexOf("last-generated-id") + 1]);
    }
  }
}

async function main() {
  const redis = new Redis(process.env.REDIS_URL);
  const minter = new Minter(process.env.KIND || "EVT");
  const replicas = Number(process.env.WAIT_REPLICAS || 0), waitMs = Number(process.env.WAIT_MS || 5000);
  for (let i = 0; i < Number(process.argv[2]); i++) {
    const id = await append(redis, process.env.STREAM, minter, { lang: "node", n: String(i) });
    // WAIT counts the replicas holding this connection's writes (ioredis has one).
    if (replicas && (await redis.wait(replicas, waitMs)) < replicas) {
      throw new Error(`${id}: not on ${replicas} replicas within ${waitMs} ms: it may or may not survive a failover`);
    }
    console.log(id);
  }
  redis.disconnect();
}

main().catch((e) => { console.error(e); process.exit(1); });
