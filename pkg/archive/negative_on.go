//go:build silt_negative_trim

package archive

// negativeTrim: this build breaks "fold before trim" on purpose (negative
// control); never ship it.
const negativeTrim = true
