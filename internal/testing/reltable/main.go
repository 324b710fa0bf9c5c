// Command reltable turns the scenario reports of a reliability run (JSON
// lines, SILT_RELIABILITY_REPORT) into the Markdown table of a tier, prints
// it, and with a file argument rewrites that tier's block in the file
// (between "<!-- TIER tier: begin -->" and "<!-- TIER tier: end -->").
//
//	go run ./internal/testing/reltable REPORT-FILE TIER [RELIABILITY.md "machine line"]
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

type row struct {
	Name, Test                                                    string
	Runs, Faults, Detected                                        int
	Entries, Handled, Lost, Duplicates, Reordered, Gaps, Phantoms int
}

func main() {
	if len(os.Args) != 3 && len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, `usage: reltable REPORT-FILE TIER [RELIABILITY.md "machine line"]`)
		os.Exit(2)
	}
	table, err := render(os.Args[1], os.Args[2])
	if err == nil && len(os.Args) == 5 {
		err = rewrite(os.Args[3], os.Args[2], os.Args[4], table)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "reltable:", err)
		os.Exit(1)
	}
	fmt.Print(table)
}

func render(report, tier string) (string, error) {
	f, err := os.Open(report)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var b strings.Builder
	b.WriteString("| scenario | runs | faults injected | entries | lost | duplicates | reordered / gaps / phantoms | detected | reproduce |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return "", err
		}
		test, _, _ := strings.Cut(r.Test, "/")
		cmd := fmt.Sprintf("go test -count=1 -run '^%s$' ./e2e", test)
		if tier == "long" {
			cmd = "SILT_RELIABILITY_TIER=long " + cmd
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d / %d / %d | %d | `%s` |\n", strings.ReplaceAll(r.Name, "|", "/"),
			r.Runs, r.Faults, r.Entries, r.Lost, r.Duplicates, r.Reordered, r.Gaps, r.Phantoms, r.Detected, cmd)
	}
	return b.String(), sc.Err()
}

// rewrite replaces the tier's block in path with the machine line and table.
func rewrite(path, tier, machine, table string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin, end := "<!-- "+tier+" tier: begin -->", "<!-- "+tier+" tier: end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q ... %q block", path, begin, end)
	}
	block := begin + "\nLast run: " + machine + ".\n\n" + table + end
	return os.WriteFile(path, []byte(s[:i]+block+s[j+len(end):]), 0o644)
}
