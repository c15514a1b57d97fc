package tidemesh_test

// The compatibility check, pure: the cases of sdk/conformance/compat.json, which the Python
// and TypeScript SDKs' checks answer too.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	tidemesh "github.com/tidemesh/tidemesh/sdk/go"
)

type compatVectors struct {
	Fits []struct {
		Range, Version string
		Fits           bool
	}
	Misfit []struct {
		Doc   map[string]any
		Cases []struct {
			Client, Version string
			Misfit          *string
		}
	}
}

func TestCompatAsEverySDK(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "conformance", "compat.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v compatVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Fits {
		if got := tidemesh.Fits(c.Range, c.Version); got != c.Fits {
			t.Errorf("Fits(%q, %q) = %v, want %v", c.Range, c.Version, got, c.Fits)
		}
	}
	for _, g := range v.Misfit {
		for _, c := range g.Cases {
			want := ""
			if c.Misfit != nil {
				want = *c.Misfit
			}
			if kind, _ := tidemesh.Misfit(g.Doc, c.Client, c.Version); kind != want {
				t.Errorf("Misfit(%v, %s, %s) = %q, want %q", g.Doc, c.Client, c.Version, kind, want)
			}
		}
	}
	if n, ok := tidemesh.APIMajor("v12.3"); !ok || n != 12 {
		t.Errorf("APIMajor(v12.3) = %d, %v", n, ok)
	}
	if _, ok := tidemesh.APIMajor(1); ok {
		t.Error("APIMajor(1) is no API")
	}
}
