// Package stream is the Redis side of silt: the keyspace, the Log that appends
// branded entries and reads them back in mint order, and the Consumer that
// runs a short-lived worker over a consumer group.
//
// Every key lives under <prefix>:{<queue>}: so that all keys of a queue share
// one Redis Cluster slot. Keyspace documents each key in one place.
//
// Every entry stores its branded id under the field "id"; the other fields are
// the payload. The entry's stream id and its branded id name the same
// (milliseconds, sequence) pair.
package stream
