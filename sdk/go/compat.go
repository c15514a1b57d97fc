package tidemesh

// Which versions work together: the check CheckCompatible makes against a daemon's
// GET /v1/compat (docs/ipc.md, "Compatibility"). The cases of sdk/conformance/compat.json keep
// it answering as the Python and TypeScript SDKs do.
//
// A range is comma-separated clauses that must all hold: >=0.1.0, <0.2.0, ==0.1.3, or a
// pattern such as 0.1.x (* is any version). A client refuses a daemon of another IPC API
// major, and a daemon whose range for this client leaves this client's version out.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// SDKVersion is this SDK's version, as the daemon's compatible_sdks.go range judges it.
const SDKVersion = "0.1.0"

// IPCAPI is the IPC API this SDK speaks.
const IPCAPI = "v1"

var (
	versionText = regexp.MustCompile(`^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?`)
	clauseText  = regexp.MustCompile(`^(>=|<=|==|>|<)?\s*([0-9x*][0-9a-zA-Z.*+-]*)$`)
	apiText     = regexp.MustCompile(`^v(\d+)(?:\.\d+)?$`)
	digits      = regexp.MustCompile(`^\d+$`)
)

// ParseVersion reads 1.2.3 (a pre-release or build suffix ignored) as numbers.
func ParseVersion(text string) ([3]int, bool) {
	m := versionText.FindStringSubmatch(strings.TrimSpace(text))
	if m == nil {
		return [3]int{}, false
	}
	var v [3]int
	for i := 0; i < 3; i++ {
		if m[i+1] != "" {
			v[i], _ = strconv.Atoi(m[i+1])
		}
	}
	return v, true
}

// Fits says whether version is in rng; false for a version or range not understood.
func Fits(rng, version string) bool {
	v, ok := ParseVersion(version)
	if !ok {
		return false
	}
	clauses := 0
	for _, c := range strings.Split(rng, ",") {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		clauses++
		if !holds(c, v) {
			return false
		}
	}
	return clauses > 0
}

func holds(clause string, v [3]int) bool {
	m := clauseText.FindStringSubmatch(clause)
	if m == nil {
		return false
	}
	op, text := m[1], m[2]
	if op == "" && strings.ContainsAny(text, "x*") {
		for i, p := range strings.Split(text, ".") {
			if i >= len(v) {
				break
			}
			if p == "x" || p == "*" {
				continue
			}
			if n, err := strconv.Atoi(p); err != nil || !digits.MatchString(p) || n != v[i] {
				return false
			}
		}
		return true
	}
	bound, ok := ParseVersion(text)
	if !ok {
		return false
	}
	c := compareVersions(v, bound)
	switch op {
	case ">=":
		return c >= 0
	case ">":
		return c > 0
	case "<=":
		return c <= 0
	case "<":
		return c < 0
	}
	return c == 0
}

func compareVersions(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// APIMajor reads "v1" (or "v1.2") as 1; false when not of that form.
func APIMajor(ipcAPI any) (int, bool) {
	s, ok := ipcAPI.(string)
	if !ok {
		return 0, false
	}
	m := apiText.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	n, _ := strconv.Atoi(m[1])
	return n, true
}

// Misfit says why client ("go", another SDK's language, or "cli") at version cannot use the
// daemon that answered doc: kind "ipc_api" or "version" and a message; kind "" when it
// fits. A range the daemon does not publish is no objection.
func Misfit(doc map[string]any, client, version string) (kind, message string) {
	daemon, ok := doc["daemon"].(string)
	if !ok {
		daemon = "?"
	}
	theirs, theirsOK := APIMajor(doc["ipc_api"])
	ours, _ := APIMajor(IPCAPI)
	if !theirsOK || theirs != ours {
		return "ipc_api", fmt.Sprintf("the daemon (%s) speaks IPC API %v, this %s (%s) speaks %s",
			daemon, doc["ipc_api"], client, version, IPCAPI)
	}
	var rng any
	if client == "cli" {
		rng = doc["compatible_clis"]
	} else if sdks, ok := doc["compatible_sdks"].(map[string]any); ok {
		rng = sdks[client]
	}
	if r, ok := rng.(string); ok && !Fits(r, version) {
		return "version", fmt.Sprintf("the daemon (%s) works with %s versions %s, and this %s is %s",
			daemon, client, r, client, version)
	}
	return "", ""
}

// Compat is GET /v1/compat: the versions the daemon works with.
func (c *Client) Compat(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	return out, c.call(ctx, "GET", "/v1/compat", nil, nil, &out)
}

// CheckCompatible is Compat, or an *Error of kind IncompatibleDaemon (Details["kind"]
// "ipc_api" or "version", the message naming both versions) when this SDK does not fit the
// daemon; a daemon older than the route is judged by /v1/version's ipc_api. version ""
// is this SDK's own. Call it once when a program starts.
func (c *Client) CheckCompatible(ctx context.Context, version string) (map[string]any, error) {
	if version == "" {
		version = SDKVersion
	}
	doc, err := c.Compat(ctx)
	if errors.Is(err, ErrNotFound) {
		v, verr := c.Version(ctx)
		if verr != nil {
			return nil, verr
		}
		doc, err = map[string]any{"daemon": v["daemon_version"], "ipc_api": v["ipc_api"]}, nil
	}
	if err != nil {
		return nil, err
	}
	kind, message := Misfit(doc, "go", version)
	if kind == "" {
		return doc, nil
	}
	advice := "upgrade (or downgrade) the SDK so that the daemon and its clients match"
	if kind == "ipc_api" {
		advice = "use a tidemesh SDK of the daemon's IPC API"
	}
	return nil, &Error{Kind: "IncompatibleDaemon", Code: "incompatible_daemon", Status: 409,
		Message: message + ": " + advice,
		Details: map[string]any{"kind": kind, "daemon": doc["daemon"], "client": "go",
			"client_version": version}}
}
