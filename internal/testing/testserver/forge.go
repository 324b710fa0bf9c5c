package testserver

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// ForgeWatermark rewrites the "w" of a packed commit object's record to w
// and recomputes its checksum line and footer, as a forger with write
// access to the bucket would: the object still decodes, its hash changes.
// ok is false for an object that is not a packed commit or has no W.
func ForgeWatermark(obj []byte, w string) (forged []byte, ok bool) {
	const footer = len("packed 0000000000000000\n")
	if len(obj) < footer || !strings.HasPrefix(string(obj[len(obj)-footer:]), "packed ") {
		return nil, false
	}
	n, err := strconv.ParseUint(string(obj[len(obj)-footer+len("packed "):len(obj)-1]), 16, 63)
	if err != nil || int(n)+footer > len(obj) {
		return nil, false
	}
	start := len(obj) - footer - int(n)
	body, _, _ := strings.Cut(string(obj[start:len(obj)-footer]), "\n")
	var c struct{ Meta map[string]string }
	if json.Unmarshal([]byte(body), &c) != nil || c.Meta["w"] == "" || c.Meta["w"] == w {
		return nil, false
	}
	body = strings.Replace(body, `"w":"`+c.Meta["w"]+`"`, `"w":"`+w+`"`, 1)
	sum := sha256.Sum256([]byte(body))
	rec := fmt.Appendf([]byte(body), "\nsha256 %x\n", sum)
	out := append(slices.Clone(obj[:start]), rec...)
	return fmt.Appendf(out, "packed %016x\n", len(rec)), true
}
