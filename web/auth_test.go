package web_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/web"
)

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8089":       true,
		"127.1.2.3:0":          true,
		"localhost:8089":       true,
		"LOCALHOST:1":          true,
		"[::1]:8089":           true,
		":8089":                false,
		"0.0.0.0:8089":         false,
		"[::]:8089":            false,
		"10.0.0.5:8089":        false,
		"example.com:8089":     false,
		"[::ffff:127.0.0.1]:1": true,
		"nonsense":             false,
	} {
		require.Equal(t, want, web.IsLoopback(addr), addr)
	}
}

func TestCheckExposure(t *testing.T) {
	t.Parallel()
	const token = "0123456789abcdef"
	require.NoError(t, web.CheckExposure("127.0.0.1:8089", ""))
	require.NoError(t, web.CheckExposure("", ""), "no server")
	require.NoError(t, web.CheckExposure("0.0.0.0:8089", token))
	require.NoError(t, web.CheckExposure("127.0.0.1:8089", token))
	for _, addr := range []string{":8089", "0.0.0.0:8089", "[::]:8089", "host.example:8089"} {
		err := web.CheckExposure(addr, "")
		require.ErrorIs(t, err, web.ErrTokenRequired, addr)
		require.ErrorContains(t, err, "set SLUICE_HTTP_TOKEN", addr)
	}
	require.ErrorContains(t, web.CheckExposure("0.0.0.0:8089", "short"), "too short")
	require.ErrorContains(t, web.CheckExposure("", "short"), "too short", "a token is checked even without a server (Handler uses it)")
}

func TestValidateToken(t *testing.T) {
	t.Parallel()
	require.NoError(t, web.ValidateToken("0123456789abcdef"))
	require.NoError(t, web.ValidateToken("A-Za-z0-9._~+/=!#$%&'*"))
	for token, want := range map[string]string{
		"":                     "got 0",
		"fifteen-chars!!":      "got 15",
		"0123456789 abcdef":    "at byte 11",
		"0123456789abcdef\n":   "at byte 17",
		"0123456789abcdéf":     "not printable ASCII",
		"\x000123456789abcdef": "at byte 1",
	} {
		err := web.ValidateToken(token)
		require.ErrorContains(t, err, want, "%q", token)
		if len(token) > 3 {
			require.NotContains(t, err.Error(), token, "the token is never quoted")
		}
	}
}

func TestRequireToken(t *testing.T) {
	t.Parallel()
	const token = "the-token-0123456789"
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := web.RequireToken(token, ok)
	serve := func(header string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	basic := func(user, password string) string {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.SetBasicAuth(user, password)
		return r.Header.Get("Authorization")
	}
	for _, header := range []string{"Bearer " + token, "BEARER " + token, "Bearer  " + token + " ", basic("", token), basic("anyone", token)} {
		require.Equal(t, http.StatusTeapot, serve(header).Code, header)
	}
	for _, header := range []string{"", "Bearer", "Bearer ", "Bearer x" + token, "Bearer " + token[1:], token, basic(token, ""), basic(token, token+"x"), "Basic !!", "Digest " + token} {
		w := serve(header)
		require.Equal(t, http.StatusUnauthorized, w.Code, header)
		require.Equal(t, `Basic realm="sluice", charset="UTF-8"`, w.Header().Get("WWW-Authenticate"))
		require.NotContains(t, w.Body.String(), token)
	}
	require.Equal(t, http.StatusTeapot, func() int {
		w := httptest.NewRecorder()
		web.RequireToken("", ok).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		return w.Code
	}(), "no token: nothing is guarded")
}

func TestValidatePrefix(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "/jobs", "/ops/sluice", "/a-b_c.d~e"} {
		require.NoError(t, web.ValidatePrefix(ok), ok)
	}
	for prefix, want := range map[string]string{
		"jobs":      "leading slash",
		"/jobs/":    "leading slash",
		"/":         "leading slash",
		"//jobs":    "leading slash",
		"/a/../b":   "no . or .. segments",
		"/a/./b":    "no . or .. segments",
		"/jobs?x=1": `'?' is not allowed`,
		"/jo bs":    `' ' is not allowed`,
		"/jöbs":     `'ö' is not allowed`,
	} {
		require.ErrorContains(t, web.ValidatePrefix(prefix), want, prefix)
	}
}
