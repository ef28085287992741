package kinds

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// checkExact checks raw (a JSON object) against the fields of t (a struct
// type, or a pointer to one) more strictly than encoding/json does: a key
// must name a field exactly (encoding/json also takes "MS" for "ms"), and
// null is refused for a field that cannot hold it (anything but a pointer,
// map, slice or interface; encoding/json leaves the field as it was). It
// looks into nested objects of struct fields too. path prefixes the field
// names in errors ("" at the top).
func checkExact(raw json.RawMessage, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil // not an object: encoding/json reports it
	}
	fields := jsonFields(t)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		name := path + key
		f, ok := fields[key]
		if !ok {
			for known := range fields {
				if strings.EqualFold(known, key) {
					return fmt.Errorf("unknown field %q (field names are case-sensitive: %q)", name, path+known)
				}
			}
			return fmt.Errorf("unknown field %q", name)
		}
		value := bytes.TrimSpace(obj[key])
		if bytes.Equal(value, []byte("null")) {
			switch f.Type.Kind() {
			case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Interface:
			default:
				return fmt.Errorf("field %q: null is not a %s", name, f.Type)
			}
			continue
		}
		if err := checkExact(value, f.Type, name+"."); err != nil {
			return err
		}
	}
	return nil
}

// jsonFields maps the JSON names of t's fields (as encoding/json names
// them, embedded structs' fields promoted) to the fields.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					if _, taken := out[k]; !taken {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}
