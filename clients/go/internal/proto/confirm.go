// What a confirmation's answer means, and the semaphore's debt: the pure part of holding
// on a `granted` message (design.md 5). The hub (tickets.go) sends the confirmation (the
// waiting command again, without WAIT) and reads its answer with ConfirmAnswer; the
// Semaphore (semaphore.go) keeps the permits answered TAKENBACK as a debt that its next
// releases absorb (AbsorbRelease).

package proto

import (
	"reflect"
	"strings"
)

// Confirmed is what one answer to a grant's confirmation says.
type Confirmed int

const (
	// ConfirmRetry: no answer yet (the connection broke, or the server refused it: a
	// redirection, TRYAGAIN, LOADING, a connection refused at maxclients); ask again.
	ConfirmRetry Confirmed = iota
	// ConfirmHeld: the grant's reply, replayed: the grant is confirmed.
	ConfirmHeld
	// ConfirmTakenBack: TAKENBACK: the server took the grant back (its ticket connection
	// closed and no confirmation came within `rlock.ticket-confirm-ms`); what it granted
	// is no longer held, and a semaphore's permits were returned to it.
	ConfirmTakenBack
	// ConfirmOther: a definite answer that is neither (another error, another reply):
	// the hold is not confirmed, but nothing says what the server did with the grant.
	ConfirmOther
)

// ConfirmAnswer reads one answer to a confirmation whose grant replied held: reply (when
// !isErr) or the error text errText. A go-redis caller passes an answer without a reply
// (a broken connection, a timeout) as ConfirmRetry itself.
func ConfirmAnswer(reply any, errText string, isErr bool, held any) Confirmed {
	if !isErr {
		if reflect.DeepEqual(reply, held) {
			return ConfirmHeld
		}
		return ConfirmOther
	}
	code := ErrorCode(errText)
	switch {
	case code == "TAKENBACK":
		return ConfirmTakenBack
	case code == "MOVED", code == "ASK", code == "TRYAGAIN", code == "LOADING":
		// Sent elsewhere, or asked again: the grant's slot moved on (the migration carried
		// its request id's record) or a restarted server is reading its AOF.
		return ConfirmRetry
	case strings.HasPrefix(errText, "ERR max number of clients reached"):
		// The server refused the connection, not the command: it never ran.
		return ConfirmRetry
	}
	return ConfirmOther
}

// AbsorbRelease splits a release of n permits against debt, the permits of grants that
// were taken back (the server returned them itself) and not yet released by the
// application: send is what is left to send to the server (0: nothing at all), left the
// debt after it.
func AbsorbRelease(debt, n int64) (send, left int64) {
	if debt <= 0 || n <= 0 {
		return n, debt
	}
	absorbed := min(debt, n)
	return n - absorbed, debt - absorbed
}
