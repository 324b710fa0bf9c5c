package clix

import (
	"context"

	"github.com/silt-dev/silt/pkg/fence"
	"github.com/silt-dev/silt/pkg/fence/s3"
)

// CheckStoreURL checks a store URL (file:///dir or s3://bucket/prefix?...)
// without opening it, so that a bad one is a usage error before any work.
func CheckStoreURL(raw string) error {
	u, err := fence.ParseURL(raw)
	if err == nil && u.Scheme == "s3" {
		_, err = s3.FromURL(u)
	}
	return err
}

// OpenStore opens the store a URL names: a local directory with package
// fence, S3-compatible storage with package fence/s3. With fence.ReadWrite
// the store is probed for the create-only contract.
func OpenStore(ctx context.Context, raw string, mode fence.Mode) (fence.Store, error) {
	u, err := fence.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "s3" {
		st, err := s3.OpenURL(ctx, raw, mode)
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	return fence.Open(ctx, raw, mode)
}
