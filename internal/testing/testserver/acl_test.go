package testserver

import (
	"os"
	"strings"
	"testing"
)

// TestACLDocumented keeps docs/security.md's ACL rule equal to SiltACL, the
// rule every test server gives the silt user.
func TestACLDocumented(t *testing.T) {
	b, err := os.ReadFile("../../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "ACL SETUSER silt " + strings.Replace(SiltACL, "on ", "on >PASSWORD ", 1)
	if !strings.Contains(string(b), want) {
		t.Fatalf("docs/security.md does not show the ACL the tests use:\n%s", want)
	}
}
