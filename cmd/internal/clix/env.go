package clix

import (
	"log/slog"
	"os"
	"sort"
	"strings"
)

// Environment variables are named SILT_<NAME>. The names of silt's first
// releases, EMQ_<NAME>, are still read when the SILT_ one is unset, with a
// warning, so that a deployment can move at its own pace.
const (
	envPrefix           = "SILT_"
	deprecatedEnvPrefix = "EMQ_"
)

// EnvVars returns the environment variables of a flag: SILT_<name>, then
// the deprecated EMQ_<name>.
func EnvVars(name string) []string {
	return []string{envPrefix + name, deprecatedEnvPrefix + name}
}

// lookupEnv returns the first of name's variables that is set (as the
// flags read them: SILT_ first, set even if empty) and its value.
func lookupEnv(name string) (string, string) {
	for _, n := range EnvVars(name) {
		if v, ok := os.LookupEnv(n); ok {
			return n, v
		}
	}
	return "", ""
}

// warnDeprecatedEnv logs one warning naming every EMQ_* variable set, and
// whether its SILT_* name overrides it.
func warnDeprecatedEnv(log *slog.Logger) {
	var names []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if rest, ok := strings.CutPrefix(name, deprecatedEnvPrefix); ok && rest != "" {
			if _, set := os.LookupEnv(envPrefix + rest); set {
				name += " (ignored: " + envPrefix + rest + " is set)"
			}
			names = append(names, name)
		}
	}
	if len(names) > 0 {
		sort.Strings(names)
		log.Warn("deprecated environment variables: rename EMQ_* to SILT_*", "variables", strings.Join(names, ", "))
	}
}
