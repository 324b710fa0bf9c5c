package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/parquet-go/parquet-go"
)

// Format is an export's file format.
type Format string

// Formats.
const (
	Parquet Format = "parquet" // zstd-compressed, one row group per 64k rows
	JSONL   Format = "jsonl"   // one JSON object per line
)

// ParseFormat checks a format name.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case Parquet, JSONL:
		return f, nil
	}
	return "", fmt.Errorf("export format %q: want parquet or jsonl", s)
}

// Row is one exported entry: a Parquet row or a JSON line.
type Row struct {
	ID       string    `parquet:"id" json:"id"` // the branded id; the raw id field when Error is set
	StreamID string    `parquet:"stream_id" json:"stream_id"`
	Time     time.Time `parquet:"time,timestamp(millisecond)" json:"time"` // the mint time (the stream id's milliseconds)
	Kind     string    `parquet:"kind" json:"kind"`
	Queue    string    `parquet:"queue" json:"queue"`
	Stream   string    `parquet:"stream" json:"stream"`
	// Fields holds the payload's UTF-8 pairs; FieldsBase64 the others,
	// name and value base64 encoded.
	Fields       map[string]string `parquet:"fields" json:"fields"`
	FieldsBase64 map[string]string `parquet:"fields_base64" json:"fields_base64,omitempty"`
	// FieldsJSON is Fields as a JSON object, for tools without maps.
	FieldsJSON string `parquet:"fields_json" json:"-"`
	// Error says why the entry's id is malformed; null for a good entry.
	Error *string `parquet:"error,optional" json:"error,omitempty"`
}

// rowGroupRows bounds a Parquet row group: readers skip groups by their
// statistics, and the writer holds one group in memory.
const rowGroupRows = 64 << 10

// encoder turns rows into one file's bytes.
type encoder interface {
	write(rows []Row) error
	close() ([]byte, error)
}

func newEncoder(f Format) encoder {
	if f == JSONL {
		return &jsonlEncoder{}
	}
	e := &parquetEncoder{}
	e.w = parquet.NewGenericWriter[Row](&e.buf,
		parquet.Compression(&parquet.Zstd),
		parquet.MaxRowsPerRowGroup(rowGroupRows),
		parquet.CreatedBy("silt", "", ""))
	return e
}

type parquetEncoder struct {
	buf bytes.Buffer
	w   *parquet.GenericWriter[Row]
}

func (e *parquetEncoder) write(rows []Row) error {
	_, err := e.w.Write(rows)
	return err
}

func (e *parquetEncoder) close() ([]byte, error) {
	if err := e.w.Close(); err != nil {
		return nil, err
	}
	return e.buf.Bytes(), nil
}

type jsonlEncoder struct{ buf bytes.Buffer }

func (e *jsonlEncoder) write(rows []Row) error {
	enc := json.NewEncoder(&e.buf)
	enc.SetEscapeHTML(false)
	for i := range rows {
		if err := enc.Encode(&rows[i]); err != nil {
			return err
		}
	}
	return nil
}

func (e *jsonlEncoder) close() ([]byte, error) { return e.buf.Bytes(), nil }
