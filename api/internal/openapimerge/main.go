// Command openapimerge adds the routes the proxy serves by hand (not
// through the generated gateway, so unknown to protoc-gen-openapiv2) to the
// generated OpenAPI document: `make proto` runs it after protoc with the
// document and a checked-in supplement (a Swagger 2.0 fragment with only
// "paths" and "definitions"). The generated text keeps its order and
// layout; a supplement's path or definition that the generator already
// wrote is refused, so the two can never disagree silently.
//
//	openapimerge api/taskstorepb/taskstore.swagger.json api/proto/taskstore/v1/taskstore_openapi_hand.json
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: openapimerge GENERATED.swagger.json SUPPLEMENT.json (GENERATED is rewritten)")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "openapimerge:", err)
		os.Exit(1)
	}
}

func run(docPath, suppPath string) error {
	doc, err := os.ReadFile(docPath)
	if err != nil {
		return err
	}
	supp, err := os.ReadFile(suppPath)
	if err != nil {
		return err
	}
	out, err := merge(doc, supp)
	if err != nil {
		return fmt.Errorf("%s into %s: %w", suppPath, docPath, err)
	}
	return os.WriteFile(docPath, out, 0o644)
}

// member is one name/value pair of a JSON object, its value as written.
type member struct {
	key string
	val json.RawMessage
}

// merge returns doc with the paths and definitions of supp added, each
// in its sorted place (the generator sorts both), indented as the
// generator indents.
func merge(doc, supp []byte) ([]byte, error) {
	top, err := members(doc)
	if err != nil {
		return nil, fmt.Errorf("the document: %w", err)
	}
	add, err := members(supp)
	if err != nil {
		return nil, fmt.Errorf("the supplement: %w", err)
	}
	for _, a := range add {
		if a.key != "paths" && a.key != "definitions" {
			return nil, fmt.Errorf("the supplement has %q: only paths and definitions are merged", a.key)
		}
		i := slices.IndexFunc(top, func(m member) bool { return m.key == a.key })
		if i < 0 {
			return nil, fmt.Errorf("the document has no %q", a.key)
		}
		have, err := members(top[i].val)
		if err != nil {
			return nil, fmt.Errorf("the document's %s: %w", a.key, err)
		}
		more, err := members(a.val)
		if err != nil {
			return nil, fmt.Errorf("the supplement's %s: %w", a.key, err)
		}
		for _, m := range more {
			if slices.ContainsFunc(have, func(h member) bool { return h.key == m.key }) {
				return nil, fmt.Errorf("%s %q is generated already", a.key, m.key)
			}
			at := slices.IndexFunc(have, func(h member) bool { return h.key > m.key })
			if at < 0 {
				at = len(have)
			}
			have = slices.Insert(have, at, m)
		}
		top[i].val = object(have)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, object(top), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// members reads a JSON object's members in their order.
func members(b []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object (%v)", err)
	}
	var ms []member
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var m member
		m.key = t.(string)
		if err := dec.Decode(&m.val); err != nil {
			return nil, fmt.Errorf("%q: %w", m.key, err)
		}
		ms = append(ms, m)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return ms, nil
}

// object writes members as a JSON object.
func object(ms []member) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.val)
	}
	b.WriteByte('}')
	return b.Bytes()
}
