package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// MinTokenLength is the shortest token accepted.
const MinTokenLength = 16

// Realm is the basic-auth realm a browser shows when it asks for the
// token.
const Realm = "sluice"

// ValidateToken reports what is wrong with token (which it never quotes):
// shorter than MinTokenLength, or with a character other than printable
// ASCII without spaces (a token must survive an Authorization header).
func ValidateToken(token string) error {
	if len(token) < MinTokenLength {
		return fmt.Errorf("HTTP token (SLUICE_HTTP_TOKEN) too short: want at least %d characters, got %d (make one with: openssl rand -hex 32)", MinTokenLength, len(token))
	}
	for i := 0; i < len(token); i++ {
		if c := token[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("HTTP token (SLUICE_HTTP_TOKEN) has a character that is not printable ASCII (or a space) at byte %d", i+1)
		}
	}
	return nil
}

// IsLoopback reports whether the listen address addr (host:port) binds to
// the loopback interface only: "localhost", an address of 127.0.0.0/8 or
// ::1. An empty host (":8089"), 0.0.0.0, :: and any other name or address
// bind where other hosts can reach.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ErrTokenRequired is the error of a listen address off loopback without a
// token.
var ErrTokenRequired = errors.New("no token is set")

// CheckExposure applies the rule of the worker's HTTP server: off loopback
// (IsLoopback), it serves only with a token; a token, wherever it is set,
// must be valid (ValidateToken).
func CheckExposure(addr, token string) error {
	if token != "" {
		return ValidateToken(token)
	}
	if addr != "" && !IsLoopback(addr) {
		return fmt.Errorf("HTTP address %q is off loopback and %w: set SLUICE_HTTP_TOKEN (a bearer token or basic-auth password, at least %d characters), or listen on 127.0.0.1",
			addr, ErrTokenRequired, MinTokenLength)
	}
	return nil
}

// RequireToken returns next guarded by token: a request passes with
// "Authorization: Bearer TOKEN", or with basic auth whose password is the
// token (any user name); any other gets 401 with a WWW-Authenticate
// challenge, so that a browser asks for it. The comparison takes the same
// time whatever the guess. An empty token guards nothing: next is returned
// as it is.
func RequireToken(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if given, ok := presentedToken(r); ok {
			got := sha256.Sum256([]byte(given))
			if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
				next.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="`+Realm+`", charset="UTF-8"`)
		http.Error(w, "401 unauthorized: this server needs its token (Authorization: Bearer TOKEN, or TOKEN as the basic-auth password)", http.StatusUnauthorized)
	})
}

// presentedToken is the token a request presents: a bearer token, or a
// basic-auth password.
func presentedToken(r *http.Request) (string, bool) {
	header := r.Header.Get("Authorization")
	if scheme, value, ok := strings.Cut(header, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(value), true
	}
	if _, password, ok := r.BasicAuth(); ok {
		return password, true
	}
	return "", false
}
