//go:build !silt_negative_ack

package stream

// negativeAck is true only in the negative-control build (tag
// silt_negative_ack), which acks each batch before its handlers run, so that
// the crash tests can show their checker catches an entry acked but never
// handled.
const negativeAck = false
