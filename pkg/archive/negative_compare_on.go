//go:build silt_negative_compare

package archive

// noCompare: this build trims below the watermark without comparing the
// live entries with the archive, and readers hide live entries at or below
// it, on purpose (negative control); never ship it.
const noCompare = true
