// Package graft will hold silt's page store: volumes of pages versioned by
// commits, written as checksummed segment files and replicated behind the
// create-only commit fence of package fence. It knows nothing of Redis.
// Not built yet: see the fence/graft issue.
package graft
