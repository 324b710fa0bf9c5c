package graft

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/silt-dev/silt/pkg/fence"
)

// TestReadCommit_MalformedPackedObjects: a commit object that ends like a
// packed one but is not sound is ErrCorrupt naming its key, never a
// commit: a footer that does not parse, one naming a record longer than
// the object, a record whose checksum fails, a record of another format.
func TestReadCommit_MalformedPackedObjects(t *testing.T) {
	ctx := context.Background()
	_, st, v := localVolume(t)
	if _, err := v.Commit(ctx, []Page{{No: 1, Data: []byte("page 1")}}, nil); err != nil {
		t.Fatal(err)
	}
	good, err := st.Get(ctx, v.commitKey(1), fence.Range{})
	if err != nil {
		t.Fatal(err)
	}
	rec := v.Latest().raw
	body := good[:len(good)-packedFooter-len(rec)]
	unpacked := strings.Replace(string(rec), `"version":3`, `"version":1`, 1)
	for i, obj := range []string{
		string(good[:len(good)-packedFooter]) + "packed 00000000000zzzzz\n",                                            // footer does not parse
		string(good[:len(good)-packedFooter]) + fmt.Sprintf("packed %016x\n", len(good)*4),                             // longer than the object
		string(body) + strings.Replace(string(rec), `"lsn":1`, `"lsn":2`, 1) + fmt.Sprintf("packed %016x\n", len(rec)), // checksum fails
		string(body) + unpacked + fmt.Sprintf("packed %016x\n", len(unpacked)),                                         // checksum fails or format 1
	} {
		key := v.commitKey(uint64(10 + i))
		if err := st.Create(ctx, key, []byte(obj)); err != nil {
			t.Fatal(err)
		}
		if c, err := v.readCommit(ctx, key); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), key) {
			t.Errorf("case %d: readCommit = %v, %v; want ErrCorrupt naming %s", i, c, err, key)
		}
	}
}
