// Package terraform_test checks the Terraform module without providers
// (they cannot be downloaded here): every file parses, every variable has a
// type and a description, no secret has a default, and the schedules and
// the image are variables used by the resources.
package terraform_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

func parseAll(t *testing.T) map[string]*hclsyntax.Body {
	t.Helper()
	files, _ := filepath.Glob("*.tf")
	if len(files) == 0 {
		t.Fatal("no .tf files")
	}
	p := hclparse.NewParser()
	bodies := map[string]*hclsyntax.Body{}
	for _, f := range files {
		file, diags := p.ParseHCLFile(f)
		if diags.HasErrors() {
			t.Fatalf("%s: %s", f, diags.Error())
		}
		bodies[f] = file.Body.(*hclsyntax.Body)
	}
	return bodies
}

func blocks(bodies map[string]*hclsyntax.Body, typ string) []*hclsyntax.Block {
	var out []*hclsyntax.Block
	for _, b := range bodies {
		for _, blk := range b.Blocks {
			if blk.Type == typ {
				out = append(out, blk)
			}
		}
	}
	return out
}

// secretish names variables that hold credentials.
func secretish(name string, blk *hclsyntax.Block) bool {
	if a, ok := blk.Body.Attributes["sensitive"]; ok {
		if v, diags := a.Expr.Value(nil); !diags.HasErrors() && v.True() {
			return true
		}
	}
	for _, w := range []string{"secret", "password", "token", "access_key"} {
		if strings.Contains(name, w) && !strings.HasSuffix(name, "_arn") {
			return true
		}
	}
	return false
}

func TestVariables(t *testing.T) {
	vars := blocks(parseAll(t), "variable")
	if len(vars) == 0 {
		t.Fatal("no variables")
	}
	names := map[string]bool{}
	for _, v := range vars {
		name := v.Labels[0]
		names[name] = true
		for _, attr := range []string{"type", "description"} {
			if _, ok := v.Body.Attributes[attr]; !ok {
				t.Errorf("variable %q has no %s", name, attr)
			}
		}
		if d, ok := v.Body.Attributes["description"]; ok {
			if val, diags := d.Expr.Value(nil); diags.HasErrors() || len(val.AsString()) < 10 {
				t.Errorf("variable %q: description too short", name)
			}
		}
		if _, hasDefault := v.Body.Attributes["default"]; hasDefault && secretish(name, v) {
			t.Errorf("secret variable %q has a default", name)
		}
	}
	for _, want := range []string{"image", "worker_schedule", "archiver_schedule", "tigris_access_key_id", "tigris_secret_access_key"} {
		if !names[want] {
			t.Errorf("no variable %q", want)
		}
	}
}

// TestSchedulesAndImageAreVariables: the resources take the schedule and the
// image from variables, not literals.
func TestSchedulesAndImageAreVariables(t *testing.T) {
	bodies := parseAll(t)
	uses := func(typ, attr, variable string) {
		t.Helper()
		found := false
		for _, r := range blocks(bodies, "resource") {
			if r.Labels[0] != typ {
				continue
			}
			found = true
			a, ok := r.Body.Attributes[attr]
			if !ok || !refersTo(a.Expr, variable) {
				t.Errorf("resource %s.%s: %s does not use var.%s", typ, r.Labels[1], attr, variable)
			}
		}
		if !found {
			t.Errorf("no resource %s", typ)
		}
	}
	schedules := 0
	for _, r := range blocks(bodies, "resource") {
		if r.Labels[0] != "aws_scheduler_schedule" {
			continue
		}
		schedules++
		a, ok := r.Body.Attributes["schedule_expression"]
		if !ok || !refersTo(a.Expr, r.Labels[1]+"_schedule") {
			t.Errorf("schedule %s does not take its expression from var.%s_schedule", r.Labels[1], r.Labels[1])
		}
	}
	if schedules != 2 {
		t.Errorf("%d schedules, want worker and archiver", schedules)
	}
	uses("aws_ecs_task_definition", "container_definitions", "image")
}

func refersTo(expr hclsyntax.Expression, variable string) bool {
	for _, tr := range expr.Variables() {
		if tr.RootName() == "var" && len(tr) > 1 {
			if a, ok := tr[1].(hcl.TraverseAttr); ok && a.Name == variable {
				return true
			}
		}
	}
	return false
}

func TestNoSecretLiterals(t *testing.T) {
	files, _ := filepath.Glob("*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || strings.HasSuffix(f, "_test.go") {
			continue
		}
		for _, bad := range []string{"AKIA", "tid_", "tsec_", "BEGIN PRIVATE KEY"} {
			if strings.Contains(string(b), bad) {
				t.Errorf("%s contains what looks like a credential (%q)", f, bad)
			}
		}
	}
}
