//go:build !silt_negative_compare

package archive

// noCompare is the negative control's switch (negative_compare_on.go).
const noCompare = false
