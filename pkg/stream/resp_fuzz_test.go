package stream

import (
	"testing"
)

// FuzzResp: the reply reader takes any bytes without panicking, and what
// it reads from a well-formed reply survives being cut short as an error.
func FuzzResp(f *testing.F) {
	for _, seed := range []string{
		"*2\r\n*2\r\n$3\r\n1-1\r\n*2\r\n$1\r\na\r\n$0\r\n\r\n*2\r\n$3\r\n1-2\r\n*-1\r\n",
		"%1\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n5-0\r\n_\r\n",
		"*1\r\n*2\r\n$1\r\ns\r\n*1\r\n*2\r\n$3\r\n5-0\r\n*2\r\n$1\r\nk\r\n=7\r\ntxt:v\r\n\r\n",
		"*-1\r\n", "_\r\n", "*0\r\n", "*999999999\r\n", "$-1\r\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		flat, ferr := (&resp{s: s}).flat("k")
		if len(s) > 0 {
			(&resp{s: s}).messages()
		}
		if ferr != nil || len(flat) == 0 {
			return
		}
		for cut := 1; cut < len(s); cut++ { // a reply cut short is an error or fewer bytes read
			if short, err := (&resp{s: s[:cut]}).flat("k"); err == nil && len(short) > len(flat) {
				t.Fatalf("%q cut at %d reads %d entries, whole %d", s, cut, len(short), len(flat))
			}
		}
	})
}
