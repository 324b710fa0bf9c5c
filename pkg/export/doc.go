// Package export writes a stream's merged history (archive and live tail,
// exactly as archive.Archive.Read yields it) as files that SQL engines read
// directly: Parquet with zstd (DuckDB, Athena, Spark, pandas) or JSON lines,
// under Hive-style partitions of the entries' mint time:
//
//	stream=<name>/date=YYYY-MM-DD/hour=HH/<first stream id>_<last stream id>.parquet
//
// One row per entry: the branded id, the stream id, the mint time, kind,
// queue and stream, the fields (a map, plus the same fields as JSON text for
// tools without maps; binary pairs base64 encoded in fields_base64), and an
// error for an entry whose id is malformed: such an entry is exported with
// its raw id and the reason, never skipped.
//
// An export is incremental and idempotent. What it covered is a chain of
// manifests under the target, one per file, each created with the store's
// create-only fence before its file:
//
//	_silt/export/<name>/<20-digit 2^64-1-seq>.json
//
// (the newest sorts first, so one LIST of one key finds it). A run starts
// after the newest manifest's range, so a rerun exports only what is new;
// two exporters racing for one manifest get one winner. A run killed between
// a manifest and its file is resumed by the next one, which writes the same
// rows under the same name (a file's name and bytes follow from its range).
// A file is never rewritten or written twice.
package export
