// Package brand mints and parses branded ids: KIND_body strings whose string
// order is mint order and whose body maps field by field onto a Redis stream
// entry id <ms>-<seq>.
//
// A branded id looks like EVT_01JC3T7QG0000000000000A: a three-letter upper-case
// kind, an underscore, then 23 characters of Crockford base32 (digits, then
// upper-case letters without I, L, O and U, so ASCII order is numeric order).
// The first 10 characters hold the Unix milliseconds (50 bits), the last 13 the
// sequence within that millisecond (the full uint64 range). Either form can be
// computed from the other:
//
//	id, _ := brand.Parse("EVT_01JC3T7QG0000000000000A")
//	id.StreamID.String() // "1731000000000-10"
//
// A Minter is a monotone cell: every Mint returns an id strictly greater than the
// last one it returned, from any goroutine, even when the host clock steps back.
package brand
