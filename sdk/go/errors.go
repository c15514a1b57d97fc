package tidemesh

import (
	"encoding/json"
	"fmt"
)

// Error is every failure the daemon answers, rebuilt from its error body
// {"error": {"code", "message", ...details}}, and DaemonNotRunning when nothing answers.
// Kind is the class name of the one error tree (core/errors.py), the same in the three
// SDKs; errors.Is(err, tidemesh.ErrConflict) holds for a Conflict and its subclasses.
type Error struct {
	Kind    string // "IdempotencyConflict", "NotFound", ...
	Code    string // the wire code, e.g. "idempotency_key_reused"
	Status  int    // the HTTP status of the answer
	Message string
	Details map[string]any // every other field of the error body ("field", "conflict", ...)
	Hint    string         // DaemonNotRunning: the command that starts the daemon
}

func (e *Error) Error() string {
	if e.Hint != "" {
		return fmt.Sprintf("%s; start it with `%s`", e.Message, e.Hint)
	}
	return fmt.Sprintf("%s (%s): %s", e.Kind, e.Code, e.Message)
}

// Is matches a sentinel of this error's class or of any class above it in the tree.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Message != "" {
		return false
	}
	for kind := e.Kind; kind != ""; kind = classes[kind].parent {
		if kind == t.Kind {
			return true
		}
	}
	return false
}

type class struct {
	code   string
	status int
	parent string
}

// The tree of core/errors.py, by class name.
var classes = map[string]class{
	"TidemeshError":          {"internal", 500, ""},
	"InvalidRequest":         {"invalid_request", 400, "TidemeshError"},
	"IdempotencyKeyMismatch": {"idempotency_key_mismatch", 400, "InvalidRequest"},
	"TokenInQuery":           {"token_in_query", 400, "InvalidRequest"},
	"MeshNotChosen":          {"mesh_not_chosen", 400, "InvalidRequest"},
	"InvalidName":            {"invalid_name", 400, "InvalidRequest"},
	"Unauthorized":           {"unauthorized", 401, "TidemeshError"},
	"Forbidden":              {"forbidden", 403, "TidemeshError"},
	"SendVetoed":             {"send_vetoed", 403, "Forbidden"},
	"MemberRevoked":          {"member_revoked", 403, "Forbidden"},
	"NotFound":               {"not_found", 404, "TidemeshError"},
	"UnknownDestination":     {"unknown_destination", 404, "NotFound"},
	"UnknownMember":          {"unknown_member", 404, "NotFound"},
	"AmbiguousMember":        {"ambiguous_member", 400, "InvalidRequest"},
	"MethodNotAllowed":       {"method_not_allowed", 405, "TidemeshError"},
	"Conflict":               {"conflict", 409, "TidemeshError"},
	"IdempotencyConflict":    {"idempotency_key_reused", 409, "Conflict"},
	"PayloadTooLarge":        {"payload_too_large", 413, "TidemeshError"},
	"Busy":                   {"daemon_busy", 429, "TidemeshError"},
	"RateLimited":            {"rate_limited", 429, "TidemeshError"},
	"Unavailable":            {"unavailable", 503, "TidemeshError"},
	"InsufficientStorage":    {"insufficient_storage", 507, "TidemeshError"},
	"DaemonNotRunning":       {"daemon_not_running", 503, "TidemeshError"},
	// Made by CheckCompatible, never sent by a daemon.
	"IncompatibleDaemon": {"incompatible_daemon", 409, "TidemeshError"},
}

var kindByCode = func() map[string]string {
	m := map[string]string{}
	for kind, c := range classes {
		m[c.code] = kind
	}
	return m
}()

func sentinel(kind string) *Error { return &Error{Kind: kind, Code: classes[kind].code} }

// Sentinels for errors.Is, one per class.
var (
	ErrTidemesh               = sentinel("TidemeshError")
	ErrInvalidRequest         = sentinel("InvalidRequest")
	ErrIdempotencyKeyMismatch = sentinel("IdempotencyKeyMismatch")
	ErrTokenInQuery           = sentinel("TokenInQuery")
	ErrMeshNotChosen          = sentinel("MeshNotChosen")
	ErrUnauthorized           = sentinel("Unauthorized")
	ErrForbidden              = sentinel("Forbidden")
	ErrSendVetoed             = sentinel("SendVetoed")
	ErrMemberRevoked          = sentinel("MemberRevoked")
	ErrNotFound               = sentinel("NotFound")
	ErrUnknownDestination     = sentinel("UnknownDestination")
	ErrUnknownMember          = sentinel("UnknownMember")
	ErrAmbiguousMember        = sentinel("AmbiguousMember")
	ErrMethodNotAllowed       = sentinel("MethodNotAllowed")
	ErrConflict               = sentinel("Conflict")
	ErrIdempotencyConflict    = sentinel("IdempotencyConflict")
	ErrPayloadTooLarge        = sentinel("PayloadTooLarge")
	ErrBusy                   = sentinel("Busy")
	ErrRateLimited            = sentinel("RateLimited")
	ErrUnavailable            = sentinel("Unavailable")
	ErrInsufficientStorage    = sentinel("InsufficientStorage")
	ErrDaemonNotRunning       = sentinel("DaemonNotRunning")
	ErrIncompatibleDaemon     = sentinel("IncompatibleDaemon")
)

// FromBody is the error of an answer's status and body; an unknown code keeps its code and
// text as a TidemeshError.
func FromBody(status int, body []byte) *Error {
	var wire struct {
		Error map[string]any `json:"error"`
	}
	if json.Unmarshal(body, &wire) != nil || wire.Error == nil {
		return &Error{Kind: "TidemeshError", Code: "internal", Status: status,
			Message: fmt.Sprintf("HTTP %d with no error body", status),
			Details: map[string]any{"status": status}}
	}
	code, _ := wire.Error["code"].(string)
	message, _ := wire.Error["message"].(string)
	details := map[string]any{}
	for k, v := range wire.Error {
		if k != "code" && k != "message" {
			details[k] = v
		}
	}
	kind, ok := kindByCode[code]
	if !ok {
		kind = "TidemeshError"
	}
	return &Error{Kind: kind, Code: code, Status: status, Message: message, Details: details}
}

func daemonNotRunning(reason, hint string) *Error {
	return &Error{Kind: "DaemonNotRunning", Code: "daemon_not_running", Status: 503,
		Message: reason, Hint: hint, Details: map[string]any{}}
}
