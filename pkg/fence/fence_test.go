package fence_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/fencetest"
)

func TestLocal_Conformance(t *testing.T) {
	fencetest.Run(t, func(t *testing.T) fence.Store {
		st, err := fence.OpenLocal(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}

func TestParseURL(t *testing.T) {
	u, err := fence.ParseURL("file:///var/lib/silt/../silt")
	if err != nil || fence.Dir(u) != "/var/lib/silt" {
		t.Fatalf("file URL: %v %v", u, err)
	}
	if u, err := fence.ParseURL("s3://b/p?anything"); err != nil || u.Host != "b" {
		t.Fatalf("s3 URL (its parameters are package s3's): %v %v", u, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"ftp://x/y", "unknown scheme"},
		{"/just/a/path", "no scheme"},
		{"file://host/dir", "host"},
		{"file:relative", "not absolute"},
		{"%zz://secret", "unparsable"},
	} {
		_, err := fence.ParseURL(tc.in)
		if !errors.Is(err, fence.ErrBadURL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseURL(%q) = %v, want ErrBadURL saying %q", tc.in, err, tc.want)
		}
	}
}

// fence.Open opens file URLs: read-only creates nothing, read-write probes;
// an s3 URL is refused with the package to use instead.
func TestOpen_Modes(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "remote")
	if _, err := fence.Open(ctx, "file://"+dir, fence.ReadOnly); err == nil {
		if _, serr := os.Stat(dir); serr == nil {
			t.Fatal("a read-only open created the directory")
		}
	}
	st, err := fence.Open(ctx, "file://"+dir, fence.ReadWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Create(ctx, "k", []byte("x")); err != nil {
		t.Fatal(err)
	}
	ro, err := fence.Open(ctx, "file://"+dir, fence.ReadOnly)
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.Create(ctx, "k2", []byte("x")); !errors.Is(err, fence.ErrReadOnly) {
		t.Fatalf("create through a read-only open = %v, want ErrReadOnly", err)
	}
	if _, err := fence.Open(ctx, "s3://b/p", fence.ReadOnly); !errors.Is(err, fence.ErrBadURL) || !strings.Contains(err.Error(), "fence/s3") {
		t.Fatalf("fence.Open of an s3 URL = %v, want ErrBadURL naming package fence/s3", err)
	}
}

// FuzzParseURL: any store URL parses or is an ErrBadURL, and an error never
// shows the URL's password.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{"file:///tmp/x", "s3://b/p?endpoint=http://127.0.0.1:9000&path-style=true&timeout=2s",
		"s3://user:canary-pw@b/p", "ftp://x", "%zz", "", "file://u:canary-pw@h/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, err := fence.ParseURL(s)
		if err != nil && !errors.Is(err, fence.ErrBadURL) {
			t.Fatalf("ParseURL(%q): %v is not ErrBadURL", s, err)
		}
		if err != nil && strings.Contains(s, ":canary-pw@") && strings.Contains(err.Error(), "canary-pw") {
			t.Fatalf("ParseURL(%q) error shows the password: %v", s, err)
		}
	})
}

// Opening a local store for writing removes staged objects a killed
// process left behind once they are an hour old, and nothing younger (a
// create of this or another process in flight); objects stay.
func TestLocal_OpenSweepsStaleStagedObjects(t *testing.T) {
	dir := t.TempDir()
	st, err := fence.OpenLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Create(context.Background(), "segments/1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for name, stale := range map[string]bool{"obj-old": true, "obj-young": false} {
		path := filepath.Join(dir, ".tmp", name)
		if err := os.WriteFile(path, []byte("half a segment"), 0o644); err != nil {
			t.Fatal(err)
		}
		if stale {
			os.Chtimes(path, old, old)
		}
	}
	os.Chtimes(filepath.Join(dir, "segments", "1"), old, old)
	if _, err := fence.OpenLocal(dir); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(filepath.Join(dir, ".tmp"))
	if len(left) != 1 || left[0].Name() != "obj-young" {
		t.Fatalf(".tmp holds %v after open, want obj-young alone", left)
	}
	if got, err := st.Get(context.Background(), "segments/1", fence.Range{}); err != nil || string(got) != "kept" {
		t.Fatalf("an old object after open: %q, %v", got, err)
	}
}

// TestLocal_ListInPages: paging through a listing with after and a small
// limit gives every key once, in order, the same as one whole listing and
// as the keys created; prefixes that end inside a name, nested directories
// and a sibling directory sharing a name's start are each listed right, and
// a prefix inside an object or out of the root lists nothing.
func TestLocal_ListInPages(t *testing.T) {
	st, err := fence.OpenLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var all []string
	for i := range 300 {
		for _, k := range []string{
			fmt.Sprintf("v/segments/%05d-x", (i*7919)%300), // created out of order
			fmt.Sprintf("v/segmentsx/%03d", i%40),
			fmt.Sprintf("v/index/%d/%d", i%3, i),
		} {
			if err := st.Create(ctx, k, []byte(k)); err != nil && !errors.Is(err, fence.ErrExists) {
				t.Fatal(err)
			} else if err == nil {
				all = append(all, k)
			}
		}
	}
	slices.Sort(all)
	for _, prefix := range []string{"v/segments/", "v/segments", "v/segments/001", "v/", "", "v/index/1/", "w/",
		"v/segments/00001-x/", "../", "v/../v/", "/v/"} { // the last four: inside an object, out of the root
		var want []string
		for _, k := range all {
			if strings.HasPrefix(k, prefix) {
				want = append(want, k)
			}
		}
		whole, err := st.List(ctx, prefix, "", 0)
		if err != nil || !slices.Equal(whole, want) {
			t.Fatalf("List(%q) = %d keys, %v; want %d", prefix, len(whole), err, len(want))
		}
		for _, limit := range []int{1, 7, 1000} {
			var paged []string
			for after := ""; ; {
				page, err := st.List(ctx, prefix, after, limit)
				if err != nil {
					t.Fatal(err)
				}
				paged = append(paged, page...)
				if len(page) < limit {
					break
				}
				after = page[len(page)-1]
			}
			if !slices.Equal(paged, want) {
				t.Fatalf("List(%q) in pages of %d: %d keys, want %d", prefix, limit, len(paged), len(want))
			}
		}
	}
}
