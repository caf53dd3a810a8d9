// Package proto is the wire protocol of the rlock module as the Go client speaks it, with
// no I/O: the command words of every primitive, what each reply means, the ticket
// channel and its messages, the state machine of one queued wait, and the retry backoff.
//
// It sits below package rlock (which sends these commands through go-redis and sleeps
// between retries) and knows nothing of connections, so every rule here is tested
// without a server (proto_test.go). The reference for every word is the Rust client
// (clients/rust/src/proto/cmd.rs, clients/rust/src/net/tickets/machine.rs) and the
// command reference (docs/commands/); docs/commands/tickets.md describes the ticket protocol.
package proto
