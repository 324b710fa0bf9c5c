//go:build silt_negative_proof

package archive

// noProof: this build trims without proof on purpose (negative control);
// never ship it.
const noProof = true
