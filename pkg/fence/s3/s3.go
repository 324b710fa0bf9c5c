// Package s3 is the fence.Store on S3-compatible object storage (Tigris,
// MinIO, versitygw, AWS): create-only writes with PutObject If-None-Match: *,
// a 412 resolved by reading the object's hash back, 409s retried.
//
// It is its own package so that a program using only a local store links no
// AWS code. Open takes a Config; OpenURL an s3:// URL:
//
//	s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1&path-style=true
package s3

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/silt-dev/silt/pkg/fence"
)

// Config says where an S3 store is. Credentials come from the standard AWS
// chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile, ...) unless
// AccessKey is set.
type Config struct {
	Bucket    string
	Prefix    string // key prefix inside the bucket, without a trailing slash
	Endpoint  string // empty for AWS itself
	Region    string
	PathStyle bool

	AccessKey, SecretKey string // optional static credentials (tests)

	// Consistent adds X-Tigris-Consistent: true to every request, so Tigris
	// evaluates conditional writes and reads on the object's leader (globally
	// strong). ParseURL turns it on for Tigris endpoints.
	Consistent bool

	// Server-side encryption passed through to the store: SSE "aws:kms"
	// (with SSEKMSKeyID, or the bucket's default key) or "AES256" on every
	// PUT; or SSECustomerKey (32 bytes), sent with every PUT, GET and HEAD.
	SSE            string
	SSEKMSKeyID    string
	SSECustomerKey []byte

	Timeout     time.Duration // bound on each attempt of a request; 30s
	MaxAttempts int           // SDK attempts per request, retries included; 3
	HTTPClient  *http.Client  // optional (tests, TLS settings)
}

// Store is a fence.Store on an S3-compatible bucket.
type Store struct {
	cfg    Config
	client s3API
	// ConflictRetries bounds our own retries of 409 ConditionalRequestConflict.
	ConflictRetries int
}

var _ fence.Store = (*Store)(nil)

// s3API is the part of the S3 client the store uses.
type s3API interface {
	PutObject(context.Context, *awss3.PutObjectInput, ...func(*awss3.Options)) (*awss3.PutObjectOutput, error)
	GetObject(context.Context, *awss3.GetObjectInput, ...func(*awss3.Options)) (*awss3.GetObjectOutput, error)
	HeadObject(context.Context, *awss3.HeadObjectInput, ...func(*awss3.Options)) (*awss3.HeadObjectOutput, error)
	ListObjectsV2(context.Context, *awss3.ListObjectsV2Input, ...func(*awss3.Options)) (*awss3.ListObjectsV2Output, error)
	DeleteObject(context.Context, *awss3.DeleteObjectInput, ...func(*awss3.Options)) (*awss3.DeleteObjectOutput, error)
}

// hashMeta is the user metadata holding the SHA-256 of an object's body, so
// an ambiguous create can be resolved with a HEAD.
const hashMeta = "silt-sha256"

// Open returns a store on cfg's bucket. It does not touch the network; see
// Probe for the check that the store honours conditional writes.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Bucket == "" {
		return nil, fmt.Errorf("s3 store: %w: no bucket", fence.ErrBadURL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	opts := []func(*config.LoadOptions) error{config.WithRegion(cfg.Region), config.WithRetryMaxAttempts(cfg.MaxAttempts)}
	if cfg.AccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(staticCredentials{cfg.AccessKey, cfg.SecretKey}))
	}
	if cfg.HTTPClient != nil {
		opts = append(opts, config.WithHTTPClient(cfg.HTTPClient))
	} else {
		// A buildable client keeps AWS_CA_BUNDLE and friends working.
		opts = append(opts, config.WithHTTPClient(awshttp.NewBuildableClient().WithTimeout(cfg.Timeout)))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 store: load AWS config: %w", err)
	}
	client := awss3.NewFromConfig(awsCfg, func(o *awss3.Options) {
		o.UsePathStyle = cfg.PathStyle
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			// Several S3-compatible stores reject the CRC32 checksums newer
			// SDKs send by default: send and check them only when required.
			o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
			o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		}
		if cfg.Consistent {
			o.APIOptions = append(o.APIOptions, smithyhttp.AddHeaderValue("X-Tigris-Consistent", "true"))
		}
	})
	return &Store{cfg: cfg, client: client, ConflictRetries: 5}, nil
}

type staticCredentials struct{ id, secret string }

func (s staticCredentials) Retrieve(context.Context) (aws.Credentials, error) {
	return aws.Credentials{AccessKeyID: s.id, SecretAccessKey: s.secret, Source: "silt static"}, nil
}

// String names the store without credentials: endpoint, bucket and prefix.
func (s *Store) String() string {
	ep := s.cfg.Endpoint
	if ep == "" {
		ep = "aws"
	}
	return fmt.Sprintf("s3://%s/%s (endpoint %s)", s.cfg.Bucket, s.cfg.Prefix, ep)
}

func (s *Store) objectKey(key string) (string, error) {
	if err := fence.CheckKey(key); err != nil {
		return "", err
	}
	if s.cfg.Prefix == "" {
		return key, nil
	}
	return s.cfg.Prefix + "/" + key, nil
}

// timeout bounds one call, all its attempts included: each attempt has
// Timeout (the HTTP client's), so an attempt whose reply never comes is
// retried, and a retried create that finds its own object resolves by hash.
func (s *Store) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.Timeout*time.Duration(s.cfg.MaxAttempts)+time.Second)
}

func sum256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Create implements fence.Store with PutObject If-None-Match: *. A 409 (a
// concurrent conditional write in progress) is retried with backoff; a 412
// is resolved by reading the object's hash back, because an earlier attempt
// of this very call may have landed before its reply was lost.
func (s *Store) Create(ctx context.Context, key string, body []byte) error {
	return s.CreateHashed(ctx, key, body, sum256(body))
}

var _ fence.HashedCreator = (*Store)(nil)

// CreateHashed implements fence.HashedCreator: hash goes in the object's metadata
// (for resolving a 412) and to the request signer, which then need not
// hash the body itself.
func (s *Store) CreateHashed(ctx context.Context, key string, body []byte, hash string) error {
	return s.create(ctx, key, func() io.ReadSeeker { return bytes.NewReader(body) }, int64(len(body)), hash)
}

var _ fence.FileCreator = (*Store)(nil)

// CreateFile implements fence.FileCreator: the body is read from the file
// as the request goes out (each attempt from its start), never held in
// memory whole.
func (s *Store) CreateFile(ctx context.Context, key, path string, size int64, hash string) error {
	if _, err := s.objectKey(key); err != nil {
		return err
	}
	f, err := fence.OpenSized(key, path, size)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.create(ctx, key, func() io.ReadSeeker { return io.NewSectionReader(f, 0, size) }, size, hash)
}

// create is CreateHashed with the body given as a fresh reader per attempt.
func (s *Store) create(ctx context.Context, key string, body func() io.ReadSeeker, size int64, hash string) error {
	ok, err := s.objectKey(key)
	if err != nil {
		return err
	}
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := s.put(ctx, ok, body(), size, hash)
		switch {
		case err == nil:
			return nil
		case isCode(err, http.StatusPreconditionFailed, "PreconditionFailed"):
			if negativeReadback {
				return fmt.Errorf("create %s: %w", key, fence.ErrExists)
			}
			return s.resolve(ctx, key, ok, hash)
		case isCode(err, http.StatusConflict, "ConditionalRequestConflict") && attempt < s.ConflictRetries:
			if err := sleep(ctx, backoff); err != nil {
				return fmt.Errorf("create %s: %w", key, err)
			}
			backoff *= 2
		default:
			return fmt.Errorf("create %s in %s: %w", key, s, err)
		}
	}
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s *Store) put(ctx context.Context, objectKey string, body io.ReadSeeker, size int64, hash string) error {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	in := &awss3.PutObjectInput{
		Bucket:        aws.String(s.cfg.Bucket),
		Key:           aws.String(objectKey),
		Body:          body,
		ContentLength: aws.Int64(size),
		IfNoneMatch:   aws.String("*"),
		Metadata:      map[string]string{hashMeta: hash},
	}
	if s.cfg.SSE != "" {
		in.ServerSideEncryption = types.ServerSideEncryption(s.cfg.SSE)
	}
	if s.cfg.SSEKMSKeyID != "" {
		in.SSEKMSKeyId = aws.String(s.cfg.SSEKMSKeyID)
	}
	in.SSECustomerAlgorithm, in.SSECustomerKey, in.SSECustomerKeyMD5 = s.ssec()
	_, err := s.client.PutObject(ctx, in, withPayloadHash(hash))
	return err
}

// ssec returns the SSE-C parameters of every request (nil without a key).
func (s *Store) ssec() (alg, key, keyMD5 *string) {
	if len(s.cfg.SSECustomerKey) == 0 {
		return nil, nil, nil
	}
	sum := md5.Sum(s.cfg.SSECustomerKey)
	return aws.String("AES256"), aws.String(base64.StdEncoding.EncodeToString(s.cfg.SSECustomerKey)),
		aws.String(base64.StdEncoding.EncodeToString(sum[:]))
}

// withPayloadHash hands the body's SHA-256 to the SigV4 signer, which would
// otherwise read and hash the whole body once more per attempt.
func withPayloadHash(hash string) func(*awss3.Options) {
	return func(o *awss3.Options) {
		o.APIOptions = append(o.APIOptions, func(st *middleware.Stack) error {
			return st.Finalize.Insert(middleware.FinalizeMiddlewareFunc("SiltPayloadHash",
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					return next.HandleFinalize(v4.SetPayloadHash(ctx, hash), in)
				}), "ComputePayloadHash", middleware.Before)
		})
	}
}

// resolve decides a 412: the object holds our bytes (an earlier attempt
// landed) or someone else's.
func (s *Store) resolve(ctx context.Context, key, objectKey, hash string) error {
	theirs, err := s.hashOf(ctx, objectKey)
	if err != nil {
		return fmt.Errorf("create %s: resolve 412: %w", key, err)
	}
	if theirs == hash {
		return nil
	}
	return fmt.Errorf("create %s: %w", key, fence.ErrExists)
}

// hashOf returns the SHA-256 of an object, from its metadata when it has
// one, else by reading it.
func (s *Store) hashOf(ctx context.Context, objectKey string) (string, error) {
	hctx, cancel := s.timeout(ctx)
	defer cancel()
	hin := &awss3.HeadObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(objectKey)}
	hin.SSECustomerAlgorithm, hin.SSECustomerKey, hin.SSECustomerKeyMD5 = s.ssec()
	head, err := s.client.HeadObject(hctx, hin)
	if err != nil {
		return "", err
	}
	if h := head.Metadata[hashMeta]; h != "" {
		return h, nil
	}
	b, err := s.get(ctx, objectKey, fence.Range{})
	if err != nil {
		return "", err
	}
	return sum256(b), nil
}

// Get implements fence.Store.
func (s *Store) Get(ctx context.Context, key string, r fence.Range) ([]byte, error) {
	ok, err := s.objectKey(key)
	if err != nil {
		return nil, err
	}
	b, err := s.get(ctx, ok, r)
	if r.IsSuffix() && isCode(err, http.StatusRequestedRangeNotSatisfiable, "InvalidRange") {
		b, err = s.get(ctx, ok, fence.Range{}) // an empty object has no last bytes to select
	}
	if isCode(err, http.StatusNotFound, "NoSuchKey") {
		return nil, fmt.Errorf("get %s: %w", key, fence.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s from %s: %w", key, s, err)
	}
	return b, nil
}

func (s *Store) get(ctx context.Context, objectKey string, r fence.Range) ([]byte, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	in := &awss3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(objectKey)}
	in.SSECustomerAlgorithm, in.SSECustomerKey, in.SSECustomerKeyMD5 = s.ssec()
	switch {
	case r.IsSuffix():
		in.Range = aws.String(fmt.Sprintf("bytes=%d", r.Off)) // "bytes=-n"
	case !r.IsWhole():
		end := ""
		if r.Len > 0 {
			end = fmt.Sprint(r.Off + r.Len - 1)
		}
		in.Range = aws.String(fmt.Sprintf("bytes=%d-%s", r.Off, end))
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, err
	}
	defer out.Body.Close()
	return io.ReadAll(out.Body)
}

// List implements fence.Store.
func (s *Store) List(ctx context.Context, prefix, after string, limit int) ([]string, error) {
	full := func(k string) string {
		if s.cfg.Prefix == "" {
			return k
		}
		return s.cfg.Prefix + "/" + k
	}
	in := &awss3.ListObjectsV2Input{Bucket: aws.String(s.cfg.Bucket), Prefix: aws.String(full(prefix))}
	if after != "" {
		in.StartAfter = aws.String(full(after))
	}
	var keys []string
	for {
		lctx, cancel := s.timeout(ctx)
		out, err := s.client.ListObjectsV2(lctx, in)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list %s in %s: %w", prefix, s, err)
		}
		for _, o := range out.Contents {
			k := aws.ToString(o.Key)
			if s.cfg.Prefix != "" {
				k = strings.TrimPrefix(k, s.cfg.Prefix+"/")
			}
			keys = append(keys, k)
			if limit > 0 && len(keys) == limit {
				return keys, nil
			}
		}
		if !aws.ToBool(out.IsTruncated) || out.NextContinuationToken == nil {
			return keys, nil
		}
		in.ContinuationToken = out.NextContinuationToken
	}
}

// Delete implements fence.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	ok, err := s.objectKey(key)
	if err != nil {
		return err
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	_, err = s.client.DeleteObject(ctx, &awss3.DeleteObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(ok)})
	if err != nil && !isCode(err, http.StatusNotFound, "NoSuchKey") {
		return fmt.Errorf("delete %s from %s: %w", key, s, err)
	}
	return nil
}

// isCode classifies an SDK error by its S3 error code first, then its HTTP status.
func isCode(err error, status int, code string) bool {
	if err == nil {
		return false
	}
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() == code {
		return true
	}
	var re *awshttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() == status
}
