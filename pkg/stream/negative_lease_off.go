//go:build !silt_negative_lease

package stream

// leasesOff is true only in the negative-control build (tag
// silt_negative_lease), which never renews in-flight entries, so that the
// slow-handler tests can show their checker catches a peer stealing work in
// progress.
const leasesOff = false
