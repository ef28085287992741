package pgkit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// TestRedactAwkwardPasswords: passwords with '@', ':', '/', quotes, spaces
// and percent-encoding, in both forms of connection string, never appear in
// a message, in any form pgx or the string holds them, nor a fragment of
// them after an unencoded '@'.
func TestRedactAwkwardPasswords(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name, conn string
		secrets    []string
	}{
		{"url unencoded @", "postgres://bob:p@ss@w0rd@h:5432/db", []string{"p@ss@w0rd", "ss@w0rd", "w0rd"}},
		{"url unencoded : and @", "postgres://bob:se:cr@et@h/db?sslmode=disable", []string{"se:cr@et", "cr@et"}},
		{"url percent-encoded", "postgres://bob:p%40ss%2Fw%3Ard@h/db", []string{"p@ss/w:rd", "p%40ss%2Fw%3Ard"}},
		{"key value plain", "host=h user=bob password=hunter@2@x dbname=d", []string{"hunter@2@x"}},
		{"key value quoted", `host=h password='pa ss@w\'d' dbname=d`, []string{"pa ss@w'd", `pa ss@w\'d`, "ss@w"}},
		{"key value equals", "host=h password=a=b=c@d dbname=d", []string{"a=b=c@d"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgconn.ParseConfig(tc.conn)
			require.NoError(t, err)
			secrets := tc.secrets
			if len(cfg.Password) >= 3 { // as pgx reads it (it may cut an unencoded '@' differently)
				secrets = append(secrets, cfg.Password)
			}
			msgs := []string{
				"cannot connect to " + tc.conn,
				"failed: password " + cfg.Password + " rejected",
				"dial " + tc.conn + ": refused",
			}
			for _, msg := range msgs {
				got := Redact(msg, tc.conn)
				for _, secret := range secrets {
					require.NotContains(t, got, secret, "in %q", got)
				}
			}
			// And an error of a failed connection (port 1 refuses) says
			// nothing of it either.
			failing := tc.conn + " port=1 connect_timeout=1"
			if strings.HasPrefix(tc.conn, "postgres://") {
				failing = strings.Replace(tc.conn, ":5432", "", 1)
				failing = strings.Replace(failing, "@h/", "@h:1/", 1)
				failing = strings.Replace(failing, "@h:5432/", "@h:1/", 1)
			}
			_, err = Open(context.Background(), failing, time.Second)
			if err != nil {
				for _, secret := range secrets {
					require.NotContains(t, err.Error(), secret)
				}
			}
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
