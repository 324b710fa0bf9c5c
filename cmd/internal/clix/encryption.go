package clix

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/silt-dev/silt/pkg/fence"
)

// Flags of client-side encryption at rest.
const (
	FlagEncryptionKeyFile = "encryption-key-file"
	envEncryptionKey      = "SILT_ENCRYPTION_KEY"
)

// EncryptionKeyFlag is the flag of every command that opens an archive's remote.
func EncryptionKeyFlag() cli.Flag {
	return &cli.StringFlag{Name: FlagEncryptionKeyFile, EnvVars: EnvVars("ENCRYPTION_KEY_FILE"),
		Usage: "encrypt the archive's objects with the AES-256 key in `FILE` (32 bytes, raw or base64); or give it base64 in " + envEncryptionKey +
			". The remote's objects only: the local data directory or archive cache stays plain text (docs/security.md)"}
}

// LocalPlainNotice says, when the remote is encrypted, that the local
// directory dir holds the archive's pages in plain text.
func LocalPlainNotice(log *slog.Logger, store fence.Store, dir string) {
	if _, encrypted := store.(*fence.Encrypted); encrypted {
		log.Info("the remote is encrypted; the local directory holds archived entries, commits and checkpoints in plain text: protect it (docs/security.md)", "dir", dir)
	}
}

// Encryption wraps store with client-side encryption when a key is given
// (--encryption-key-file, or SILT_ENCRYPTION_KEY in base64); without one it
// refuses to read encrypted objects as if they were plain (fence.Plain).
// The key is never printed.
func Encryption(c *cli.Context, store fence.Store) (fence.Store, error) {
	key, err := encryptionKey(c)
	if err != nil {
		return nil, err
	}
	if key == nil {
		return fence.Plain(store), nil
	}
	e, err := fence.Encrypt(store, key)
	if err != nil {
		return nil, Usagef("--"+FlagEncryptionKeyFile, "%v", err)
	}
	return e, nil
}

func encryptionKey(c *cli.Context) ([]byte, error) {
	if path := c.String(FlagEncryptionKeyFile); path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, Usagef("--"+FlagEncryptionKeyFile, "%v", err)
		}
		if len(b) == 32 {
			return b, nil
		}
		if k, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b))); err == nil && len(k) == 32 {
			return k, nil
		}
		return nil, Usagef("--"+FlagEncryptionKeyFile, "%s holds %d bytes: want 32 raw bytes or their base64", path, len(b))
	}
	if name, s := lookupEnv("ENCRYPTION_KEY"); s != "" {
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(k) != 32 {
			return nil, fmt.Errorf("%s: want the base64 of 32 bytes (%w)", name, fence.ErrKey)
		}
		return k, nil
	}
	return nil, nil
}
