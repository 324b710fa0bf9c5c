// Package e2e holds end-to-end tests: they build the silt binaries and run
// them as a user would, against real servers (redis-server started per test;
// MinIO and versitygw from scripts/servers.sh). scripts/test.sh runs them after
// the unit tests.
package e2e
