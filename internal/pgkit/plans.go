package pgkit

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluice-dev/sluice/db"
)

// CustomPlans wraps conn so that every statement sent through it is
// planned for its own arguments and the tables as they are now: it runs
// as pgx.QueryExecModeCacheDescribe (the unnamed statement, its parameter
// and result types cached per connection), never as a cached generic plan.
//
// pgx's default prepares each statement once per connection, and after
// five runs Postgres may settle on a generic plan chosen with the
// statistics of that moment. The limiter's line tables swing from empty
// to thousands of rows and back (a breaker raised over a
// backlog): a generic plan made while a table looked empty scans all of it
// once per key for as long as the connection lives — 80 ms instead of 1 ms
// a statement, under the kind's lock. A custom plan costs a plan per
// statement (0.1 to 2 ms here for the limiter's largest) and sees the
// table's real size.
func CustomPlans(conn db.DBTX) db.DBTX {
	return customPlans{conn: conn}
}

// customPlans is the db.DBTX of CustomPlans.
type customPlans struct {
	conn db.DBTX
}

// Exec runs sql planned for args.
func (c customPlans) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return c.conn.Exec(ctx, sql, withCustomPlan(args)...)
}

// Query runs sql planned for args.
func (c customPlans) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return c.conn.Query(ctx, sql, withCustomPlan(args)...)
}

// QueryRow runs sql planned for args.
func (c customPlans) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return c.conn.QueryRow(ctx, sql, withCustomPlan(args)...)
}

// withCustomPlan puts the query execution mode in front of args.
func withCustomPlan(args []any) []any {
	return append([]any{pgx.QueryExecModeCacheDescribe}, args...)
}
