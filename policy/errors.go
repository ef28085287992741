package policy

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs the trigger sluice_enqueue_policy raises.
const (
	// CodeRejected: an insert under a reject policy found its key full.
	CodeRejected = "SLR01"
	// CodeRefused: a replace (or debounce) the policy cannot carry out: the
	// new args would move a parked job to another limit key, or one River
	// InsertMany carries more jobs of a key than it has waiting jobs to
	// answer with.
	CodeRefused = "SLR02"
)

// AsRejected returns the Postgres error in err's chain when it is a reject
// policy's refusal (SQLSTATE SLR01): its Message names the kind, the key
// and the count. The statement failed, and with it the transaction unless
// a savepoint (pgx's nested Begin) held the insert.
func AsRejected(err error) (*pgconn.PgError, bool) { return asCode(err, CodeRejected) }

// AsRefused returns the Postgres error in err's chain when it is a replace
// the policy refused (SQLSTATE SLR02); its Message says why.
func AsRefused(err error) (*pgconn.PgError, bool) { return asCode(err, CodeRefused) }

func asCode(err error, code string) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == code {
		return pgErr, true
	}
	return nil, false
}
