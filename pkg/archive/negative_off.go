//go:build !silt_negative_trim

package archive

// negativeTrim is true only in the negative-control build (tag
// silt_negative_trim), which trims one entry above the watermark on purpose
// so that the tests can show their checker catches a broken promise.
const negativeTrim = false
