//go:build !silt_negative_checksum

package graft

// negativeChecksum is true only in the negative-control build (tag
// silt_negative_checksum), which skips the page checksum on purpose so that
// the tests can show they catch a corrupt page read by range.
const negativeChecksum = false
