//go:build silt_negative_lease

package stream

// leasesOff: this build lets a live worker's in-flight entries look idle on
// purpose (negative control); never ship it.
const leasesOff = true
