//go:build silt_negative_checksum

package graft

// negativeChecksum: this build skips the page checksum on purpose (negative
// control); never ship it.
const negativeChecksum = true
