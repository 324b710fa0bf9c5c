//go:build silt_negative_readback

package s3

// negativeReadback: this build skips the 412 read-back on purpose (negative
// control); never ship it.
const negativeReadback = true
