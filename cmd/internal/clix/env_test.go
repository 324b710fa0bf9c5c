package clix

import (
	"bytes"
	"flag"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// A flag reads SILT_<NAME>, falls back to the deprecated EMQ_<NAME>, and
// the logger names every EMQ_ variable set.
func TestEnvVars_SiltFirstEmqDeprecated(t *testing.T) {
	parse := func() *cli.Context {
		t.Helper()
		set := flag.NewFlagSet("t", flag.ContinueOnError)
		f := &cli.StringFlag{Name: FlagQueue, EnvVars: EnvVars("QUEUE")}
		if err := f.Apply(set); err != nil {
			t.Fatal(err)
		}
		if err := set.Parse(nil); err != nil {
			t.Fatal(err)
		}
		return cli.NewContext(cli.NewApp(), set, nil)
	}
	warnings := func() string {
		var buf bytes.Buffer
		warnDeprecatedEnv(slog.New(slog.NewTextHandler(&buf, nil)))
		return buf.String()
	}
	t.Setenv("SILT_QUEUE", "")
	os.Unsetenv("SILT_QUEUE") // restored by t.Setenv's cleanup
	t.Setenv("EMQ_QUEUE", "old")
	if got := parse().String(FlagQueue); got != "old" {
		t.Errorf("with EMQ_QUEUE only: --queue = %q, want old", got)
	}
	if w := warnings(); !strings.Contains(w, "EMQ_QUEUE") || strings.Contains(w, "ignored") {
		t.Errorf("warning = %q, want EMQ_QUEUE named as in use", w)
	}
	t.Setenv("SILT_QUEUE", "new")
	if got := parse().String(FlagQueue); got != "new" {
		t.Errorf("with both: --queue = %q, want new", got)
	}
	if w := warnings(); !strings.Contains(w, "EMQ_QUEUE (ignored: SILT_QUEUE is set)") {
		t.Errorf("warning = %q, want EMQ_QUEUE named as ignored", w)
	}
	os.Unsetenv("EMQ_QUEUE")
	if name, v := lookupEnv("QUEUE"); name != "SILT_QUEUE" || v != "new" {
		t.Errorf("lookupEnv = %s=%s", name, v)
	}
}
