//go:build !silt_negative_readback

package s3

// negativeReadback is true only in the negative-control build (tag
// silt_negative_readback), which takes every 412 for a lost race without
// reading the object back, so that the tests can show their checker catches
// the wrong verdicts that follow a lost reply.
const negativeReadback = false
