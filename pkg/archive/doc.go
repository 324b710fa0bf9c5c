// Package archive joins a Redis stream (package stream) and a graft volume
// (package graft): it folds mint-ordered slices of the stream into pages,
// commits them behind the fence, trims the live stream never above what is
// committed, and merge-reads archive and live tail as one history.
//
// One volume per stream, named from prefix, queue and stream. Each record is
// one page in the reserved high range (RecordBase + its ordinal), so pages
// sort like stream ids; each commit's metadata holds the watermark W (the
// last archived stream id) and running counts.
package archive
