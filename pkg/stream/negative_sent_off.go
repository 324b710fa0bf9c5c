//go:build !silt_negative_sent

package stream

// sentEarly is false: a start record is sent before its handler may start.
const sentEarly = false
