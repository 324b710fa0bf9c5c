// Package fence is silt's create-only object store: the commit fence that
// makes one writer win each commit.
//
// A Store creates an object only if its key is free (S3's PutObject with
// If-None-Match: *, or link(2) on a local directory), so two writers racing
// for one key get exactly one winner, and the loser learns it with ErrExists.
// Backends: S3-compatible storage (Tigris, MinIO, versitygw, AWS) and a local
// directory (the embedded default). Open chooses one from a URL:
//
//	file:///var/lib/silt/remote
//	s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1&path-style=true
//
// Every backend passes the same conformance suite, package fencetest.
package fence
