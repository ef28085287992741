package db

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRedact(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, conn, msg string
	}{
		{"url", "postgres://bob:s3cret@h/db", "cannot connect to postgres://bob:s3cret@h/db"},
		{"url echoed elsewhere", "postgres://bob:s3cret@h/db", "auth failed for password s3cret"},
		{"key value", "host=h user=bob password=s3cret dbname=x", "bad: host=h user=bob password=s3cret"},
		{"quoted key value", "host=h password='s3 cret' dbname=x", "bad: password='s3 cret' dbname=x"},
		{"unknown URL in message", "", "dial postgres://eve:s3cret@h:1/x failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := Redact(tc.msg, tc.conn)
			require.NotContains(t, got, "s3cret")
			require.NotContains(t, got, "s3 cret")
		})
	}
}

func TestParseConfigErrors(t *testing.T) {
	t.Parallel()

	_, err := ParseConfig("")
	require.True(t, IsURLError(err))
	require.Contains(t, err.Error(), "DATABASE_URL")

	_, err = ParseConfig("postgres://bob:s3cretpw@127.0.0.1:99999999/x")
	require.True(t, IsURLError(err))
	require.NotContains(t, err.Error(), "s3cretpw")

	cfg, err := ParseConfig("postgres://bob@127.0.0.1/x")
	require.NoError(t, err)
	require.EqualValues(t, DefaultMaxConns, cfg.MaxConns)

	cfg, err = ParseConfig("postgres://bob@127.0.0.1/x?pool_max_conns=3")
	require.NoError(t, err)
	require.EqualValues(t, 3, cfg.MaxConns)
}

func TestOpenUnreachableHidesPassword(t *testing.T) {
	t.Parallel()

	// Port 1 on loopback refuses connections.
	_, err := Open(context.Background(), "postgres://bob:s3cretpw@127.0.0.1:1/x?connect_timeout=2", 3*time.Second)
	require.Error(t, err)
	require.False(t, IsURLError(err), "an unreachable server is a runtime failure, not bad input")
	require.NotContains(t, err.Error(), "s3cretpw")
	require.False(t, strings.Contains(err.Error(), "\n"), "one line: %q", err.Error())
}
