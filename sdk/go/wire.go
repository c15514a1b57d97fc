package tidemesh

import "encoding/json"

// Destination is a send's target; a SendRequest's To may also be the short form
// "topic:ops", "dm:<hex>" or "queue:jobs".
type Destination struct {
	Kind string `json:"kind"` // "topic", "dm" or "queue"
	Ref  string `json:"ref"`
}

// SendRequest is one message (docs/ipc.md, "Sending").
type SendRequest struct {
	To              any            `json:"to"` // Destination or "topic:ops"
	Body            string         `json:"body"`
	BodyEncoding    string         `json:"body_encoding,omitempty"` // "utf8" (default) or "base64"
	Priority        string         `json:"priority,omitempty"`      // "now", "next", "low"
	Meta            map[string]any `json:"meta,omitempty"`
	ReplyTo         string         `json:"reply_to,omitempty"`
	ClientMessageID string         `json:"client_message_id,omitempty"`
	Traceparent     string         `json:"traceparent,omitempty"` // W3C trace context; the daemon makes one when empty
}

// SendResult: 202 "queued"/"inflight" (on disk, will be sent), or 200 "done" with
// Duplicate (this id was already delivered, as BrokerMessageID).
type SendResult struct {
	ClientMessageID string  `json:"client_message_id"`
	OutboxID        string  `json:"outbox_id"`
	Status          string  `json:"status"`
	Duplicate       bool    `json:"duplicate,omitempty"`
	BrokerMessageID *string `json:"broker_message_id,omitempty"`
	HistoryID       *string `json:"history_id,omitempty"`
}

// BatchResult is one message of SendMany: the Status send would have got, and Result
// (202/200) or Err (400 not a valid send, 403 vetoed, 409 the accept table).
type BatchResult struct {
	Status int
	Result *SendResult
	Err    *Error
	Body   json.RawMessage // the item's body as the daemon sent it
}

// RequeueResult answers OutboxRequeue.
type RequeueResult struct {
	AbortedRowID       string `json:"aborted_row_id"`
	NewRowID           string `json:"new_row_id"`
	NewClientMessageID string `json:"new_client_message_id"`
}

// PruneResult answers Prune.
type PruneResult struct {
	DryRun        bool   `json:"dry_run"`
	Deleted       int    `json:"deleted"`
	EventsDeleted *int   `json:"events_deleted,omitempty"`
	Skipped       string `json:"skipped,omitempty"`
}

// OutboxRow is one outbox row; Fields holds every field as the daemon sent it (the
// attempts, errors, times and, from OutboxInspect, the requeue "chain").
type OutboxRow struct {
	ID              string         `json:"id"`
	ClientMessageID string         `json:"client_message_id"`
	Status          string         `json:"status"` // pending, inflight, done, dead, aborted
	Fields          map[string]any `json:"-"`
}

// UnmarshalJSON fills the typed fields and keeps them all in Fields.
func (r *OutboxRow) UnmarshalJSON(raw []byte) error {
	type plain OutboxRow
	if err := json.Unmarshal(raw, (*plain)(r)); err != nil {
		return err
	}
	return json.Unmarshal(raw, &r.Fields)
}

// OutboxPage answers OutboxList: rows newest first, and the count per status.
type OutboxPage struct {
	Items  []OutboxRow    `json:"items"`
	Counts map[string]int `json:"counts"`
}

// InboxEntry is one received message.
type InboxEntry struct {
	Seq             int64          `json:"seq"`
	ID              string         `json:"id"`
	Mesh            string         `json:"mesh"`
	From            string         `json:"from"`
	SenderName      *string        `json:"sender_name,omitempty"`
	ClientMessageID string         `json:"client_message_id"`
	BrokerMessageID string         `json:"broker_message_id"`
	To              Destination    `json:"to"`
	Body            string         `json:"body"`
	BodyEncoding    string         `json:"body_encoding"`
	Priority        string         `json:"priority"`
	Meta            map[string]any `json:"meta"`
	ReplyTo         *string        `json:"reply_to"`
	SentAt          int64          `json:"sent_at"`
	ReceivedAt      int64          `json:"received_at"`
	Delivery        struct {
		Epoch int64 `json:"epoch"`
		Seq   int64 `json:"seq"`
	} `json:"delivery"`
	Traceparent *string `json:"traceparent"`
}

// Lost says how many entries retention removed before a named consumer acked them.
type Lost struct {
	Count      int   `json:"count"`
	ThroughSeq int64 `json:"through_seq"`
}

// InboxPage is a page (NextAfter to read on), or a named consumer's entries (Consumer,
// Cursor, and Lost when retention removed entries it had not acked).
type InboxPage struct {
	Items     []InboxEntry `json:"items"`
	NextAfter *int64       `json:"next_after,omitempty"`
	More      bool         `json:"more,omitempty"` // the 10 MiB byte budget ended the page before limit
	Consumer  string       `json:"consumer,omitempty"`
	Cursor    *int64       `json:"cursor,omitempty"`
	Lost      *Lost        `json:"lost,omitempty"`
}

// AckResult answers Ack.
type AckResult struct {
	Consumer string `json:"consumer"`
	Cursor   int64  `json:"cursor"`
}

// Memberships answers Memberships.
type Memberships struct {
	Kind  string `json:"kind"`
	Items []struct {
		Name  string `json:"name"`
		Since int64  `json:"since"`
	} `json:"items"`
}
