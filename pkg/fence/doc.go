// Package fence will hold silt's create-only object store: a narrow Store
// interface (create-only put that fails with ErrExists when the key is there,
// whole and ranged get, list by prefix, delete for GC) with an S3 backend
// (PutObject with If-None-Match: *) and a local-directory backend, plus the
// conformance suite every backend passes. Not built yet: see the fence/graft issue.
package fence
