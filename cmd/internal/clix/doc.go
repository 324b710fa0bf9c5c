// Package clix holds what the silt binaries share: the common flags with their
// environment variables, the Redis connection, logging, and the mapping of
// errors to exit codes. Only cmd/* imports it; library packages never read
// flags or the environment.
package clix
