// The server's error replies read by their code word: the first word of every error the
// module sends (src/vocab/errors.rs; spec/vectors/errors.json lists each with its kind,
// and vectors_test.go checks this table against every row). The rlock package turns the
// kind into its typed ServerError.

package proto

import "strings"

// Kind is what a client makes of a server error.
type Kind string

const (
	// KindArgument: the request is malformed; nothing changed.
	KindArgument Kind = "argument"
	// KindWrongType: the key holds another type, or a value of another primitive.
	KindWrongType Kind = "wrong-type"
	// KindRefused: the state forbids it now (an overflow, a full queue, a read hold in
	// the way).
	KindRefused Kind = "refused"
	// KindRetry: the server cannot serve it now (loading, failing over, reshaping).
	KindRetry Kind = "retry"
	// KindInternal: an internal command sent by a client, or a bug caught in the module.
	KindInternal Kind = "internal"
	// KindOther: a code word that is neither the module's nor one of these (NOPERM, ...).
	KindOther Kind = ""
)

// ErrorCode is an error text's code word: its first word.
func ErrorCode(text string) string {
	if i := strings.IndexByte(text, ' '); i >= 0 {
		return text[:i]
	}
	return text
}

// ErrorKind is the kind of a code word. Redis's own ERR is a malformed request (a syntax
// error, a wrong argument count); the module's codes follow its scheme: BAD<what> for an
// argument, NOTA<primitive> for another primitive's key.
func ErrorKind(code string) Kind {
	switch code {
	case "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "BUSY":
		return KindRetry
	case "OVERFLOW", "TOOMANYWAITERS", "TOOMANYHOLDS", "READHELD", "TAKENBACK":
		return KindRefused
	case "INTERNALCMD", "BADPAYLOAD", "RLOCKBUG":
		return KindInternal
	case "WRONGTYPE":
		return KindWrongType
	case "ERR":
		return KindArgument
	}
	switch {
	case strings.HasPrefix(code, "NOTA"):
		return KindWrongType
	case strings.HasPrefix(code, "BAD"):
		return KindArgument
	}
	return KindOther
}
