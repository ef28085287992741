package web

import (
	"fmt"
	"strings"
)

// ValidatePrefix checks a mount prefix: empty (the root), or a path that
// starts with '/', does not end with one and has only letters, digits and
// "-._~/" in it, such as "/jobs" or "/ops/sluice".
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	if !strings.HasPrefix(prefix, "/") || strings.HasSuffix(prefix, "/") || strings.Contains(prefix, "//") {
		return fmt.Errorf("invalid HTTP prefix %q: want a path such as /jobs (a leading slash, no trailing one)", prefix)
	}
	for _, seg := range strings.Split(prefix[1:], "/") {
		if seg == "." || seg == ".." {
			return fmt.Errorf("invalid HTTP prefix %q: no . or .. segments", prefix)
		}
	}
	for _, c := range prefix {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-._~/", c)) {
			return fmt.Errorf("invalid HTTP prefix %q: %q is not allowed (letters, digits and -._~/)", prefix, c)
		}
	}
	return nil
}
