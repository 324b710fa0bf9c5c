// Package testserver starts the real servers tests need: redis-server on a free
// loopback port with its data in the test's temp dir, and (from environment
// variables printed by scripts/servers.sh) MinIO and versitygw.
//
// A test that needs a server that is absent fails with a message naming the
// script to run, unless the tests run with -short, where it is skipped.
package testserver
