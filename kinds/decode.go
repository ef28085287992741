package kinds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// decodeStrict decodes a JSON object into dst, rejecting anything else:
// unknown fields, field names that match only case-insensitively, null for
// a field that cannot hold it, trailing data.
func decodeStrict(raw []byte, dst any) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	if raw[0] != '{' {
		return errors.New("args must be a JSON object, such as {}")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return describeJSONError(err)
	}
	if err := checkExact(raw, reflect.TypeOf(dst), ""); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: unexpected data after the args object")
	}
	return nil
}

func describeJSONError(err error) error {
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntaxErr):
		return fmt.Errorf("malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			return fmt.Errorf("field %q: want %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return fmt.Errorf("want %s, got JSON %s", typeErr.Type, typeErr.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("malformed JSON: unexpected end of input")
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	default:
		return fmt.Errorf("malformed JSON: %v", err)
	}
}
