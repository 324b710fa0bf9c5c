//go:build silt_negative_ack

package stream

// negativeAck: this build acks before the handler runs on purpose (negative
// control); never ship it.
const negativeAck = true
