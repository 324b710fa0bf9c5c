// Package fence is silt's create-only object store: the commit fence that
// makes one writer win each commit.
//
// A Store creates an object only if its key is free (S3's PutObject with
// If-None-Match: *, or link(2) on a local directory), so two writers racing
// for one key get exactly one winner, and the loser learns it with ErrExists.
// This package holds the contract, the local directory backend (the embedded
// default), the client-side encryption wrapper and Probe; S3-compatible
// storage (Tigris, MinIO, versitygw, AWS) is package fence/s3, so that a
// program storing locally links no AWS code. Stores are named by URL:
//
//	file:///var/lib/silt/remote                                            fence.Open
//	s3://bucket/prefix?endpoint=http://127.0.0.1:9000&path-style=true     s3.OpenURL
//
// A large object can be created from a local file without holding it in
// memory (CreateFromFile; FileCreator on every store here): compaction
// uploads its merged segments so.
//
// Every backend passes the same conformance suite, package fencetest.
package fence
