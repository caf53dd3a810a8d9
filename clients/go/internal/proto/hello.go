// The capability probe: what `RLOCK.HELLO` (docs/commands/module.md) says about the
// server a connection reached. The ticket hub asks it on every new session (once per
// notification connection, again after a reconnect), so nothing guesses from error
// texts. Pure: the command and the reading of its reply, no I/O.

package proto

import (
	"fmt"
	"strings"
)

// ProtocolVersion is the protocol this client speaks (the module's `protocol` field): a
// server that answers a lower one lacks something this client sends.
const ProtocolVersion = 1

// Capabilities is what a server can do. The zero value, NoModule, is a server without
// the module (it does not know RLOCK.HELLO); a server whose ACL refuses the probe is
// Refused. Either way waits block a connection in the server instead of queuing tickets.
type Capabilities struct {
	// Module: the rlock module answered the probe (the fields below are its answer).
	Module bool
	// Refused: the server refused the probe itself (an ACL user without +rlock.hello):
	// what it can do is unknown, so waits block, which works wherever the module is.
	Refused bool
	// Version is the module's version, "major.minor.patch".
	Version string
	// Protocol is the module's wire protocol version, compared with ProtocolVersion.
	Protocol int64
	// Features: tickets, request-ids, one word per primitive, sharded-channels in a
	// cluster.
	Features []string
	// Replication is the module's rlock.replication setting: commands or effects.
	Replication string
}

// NoModule is the answer of a server without the module.
var NoModule = Capabilities{}

// Has tells whether the module names feature (and speaks this client's protocol).
func (c Capabilities) Has(feature string) bool {
	if !c.Module || c.Protocol < ProtocolVersion {
		return false
	}
	for _, f := range c.Features {
		if f == feature {
			return true
		}
	}
	return false
}

// Tickets tells whether waits may queue tickets (`WAIT t ASYNC ID id`).
func (c Capabilities) Tickets() bool { return c.Has("tickets") }

// HelloArgs is the probe's command.
func HelloArgs() []any { return []any{"RLOCK.HELLO"} }

// ParseHello reads the probe's outcome: a map (RESP3) or flat pairs (RESP2), read by
// field name since fields may be added. "unknown command" is NoModule; a NOPERM refusal
// is Refused; any other error (a broken connection, a server loading) is returned.
func ParseHello(reply any, err error) (Capabilities, error) {
	if err != nil {
		text := err.Error()
		switch {
		case strings.HasPrefix(strings.ToLower(text), "err unknown command"):
			return NoModule, nil
		case ErrorCode(text) == "NOPERM":
			return Capabilities{Refused: true}, nil
		}
		return Capabilities{}, err
	}
	var pairs [][2]any
	switch v := reply.(type) {
	case map[any]any:
		for k, x := range v {
			pairs = append(pairs, [2]any{k, x})
		}
	case []any:
		if len(v)%2 != 0 {
			return Capabilities{}, fmt.Errorf("%w: RLOCK.HELLO answered %v", ErrUnexpected, reply)
		}
		for i := 0; i < len(v); i += 2 {
			pairs = append(pairs, [2]any{v[i], v[i+1]})
		}
	default:
		return Capabilities{}, fmt.Errorf("%w: RLOCK.HELLO answered %v", ErrUnexpected, reply)
	}
	c := Capabilities{Module: true}
	for _, p := range pairs {
		k, _ := p[0].(string)
		switch k {
		case "version":
			c.Version, _ = p[1].(string)
		case "protocol":
			c.Protocol, _ = p[1].(int64)
		case "replication":
			c.Replication, _ = p[1].(string)
		case "features":
			words, _ := p[1].([]any)
			for _, w := range words {
				if s, ok := w.(string); ok {
					c.Features = append(c.Features, s)
				}
			}
		}
	}
	if c.Protocol == 0 {
		return Capabilities{}, fmt.Errorf("%w: RLOCK.HELLO answered no protocol", ErrUnexpected)
	}
	return c, nil
}
