//go:build !silt_negative_proof

package archive

// noProof is true only in the negative-control build (tag
// silt_negative_proof), which trims by whatever watermark the remote says,
// without proving the history is this stream's, so that the tests can show
// they catch a trim by another stream's archive.
const noProof = false
