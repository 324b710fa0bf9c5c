//go:build silt_negative_sent

package stream

// sentEarly: this build says a start record is written before it is, and
// writes it late, whether sent on its own or with a read (negative
// control); never ship it.
const sentEarly = true
