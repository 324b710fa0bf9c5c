// Package archive will join package stream and package graft: it folds
// mint-ordered slices of a stream into graft pages, commits them, trims the
// live stream never above the committed watermark, and merge-reads archive
// and live tail as one history. Not built yet: see the archiver issue.
package archive
