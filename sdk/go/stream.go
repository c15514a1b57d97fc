package tidemesh

import (
	"encoding/json"
	"math/rand"
	"strconv"
	"strings"
	"time"
)

// Item is one thing the event stream gives: an Event of the daemon's log (ID > 0), or a
// Notice about the stream itself (IsNotice, no id): "history_truncated" or "cursor_ahead".
type Item struct {
	IsNotice bool
	ID       int64
	Type     string // message, peer_join, peer_leave, peer_key_rotated, broker_status, outbox_dead, hook_failed, clone_suspected
	Data     map[string]any
	Raw      json.RawMessage // Data as sent; a "message" event's is an InboxEntry
}

// Entry decodes a "message" event's data as an InboxEntry.
func (it Item) Entry() (InboxEntry, error) {
	var e InboxEntry
	err := json.Unmarshal(it.Raw, &e)
	return e, err
}

// parser turns the stream's lines into items (Server-Sent Events).
type parser struct{ fields map[string]string }

func (p *parser) feed(line string) (Item, bool, error) {
	line = strings.TrimRight(line, "\r\n")
	if line != "" {
		if !strings.HasPrefix(line, ":") { // ":" starts a comment (keepalive)
			key, value, _ := strings.Cut(line, ":")
			if p.fields == nil {
				p.fields = map[string]string{}
			}
			p.fields[key] = strings.TrimPrefix(value, " ")
		}
		return Item{}, false, nil
	}
	fields := p.fields
	p.fields = nil
	data, ok := fields["data"]
	if !ok {
		return Item{}, false, nil
	}
	it := Item{Type: "message", Raw: json.RawMessage(data)}
	if t, ok := fields["event"]; ok {
		it.Type = t
	}
	if err := json.Unmarshal([]byte(data), &it.Data); err != nil {
		return Item{}, false, err
	}
	if id, ok := fields["id"]; ok {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return Item{}, false, err
		}
		it.ID = n
	} else {
		it.IsNotice = true
	}
	return it, true, nil
}

// cursor is the last event id passed on: what to ask for on (re)connect, and what to pass.
type cursor struct {
	last  int64
	valid bool
}

func (c *cursor) headers() map[string]string {
	h := map[string]string{"Accept": "text/event-stream"}
	if c.valid {
		h["Last-Event-ID"] = strconv.FormatInt(c.last, 10)
	}
	return h
}

func (c *cursor) admit(it Item) bool {
	if it.IsNotice {
		num := func(key string) int64 { f, _ := it.Data[key].(float64); return int64(f) }
		switch it.Type {
		case "cursor_ahead": // the log restarted below our id: its replay is new to us
			c.last, c.valid = num("replay_from")-1, true
		case "history_truncated": // what is gone stays gone; do not ask for it again
			c.last, c.valid = num("oldest_available")-1, true
		}
		return true
	}
	if c.valid && it.ID <= c.last {
		return false // already given before a reconnect
	}
	c.last, c.valid = it.ID, true
	return true
}

// reconnect: a stream that never connected fails at once; one that did keeps trying,
// from 50 ms doubling to at most 1 s apart (±25 %), as a restarting daemon needs.
type reconnect struct {
	connected bool
	failures  int
}

func (r *reconnect) succeeded() { r.connected, r.failures = true, 0 }

func (r *reconnect) delay() (time.Duration, bool) {
	if !r.connected {
		return 0, false
	}
	r.failures++
	base := 50 * time.Millisecond
	for i := 1; i < r.failures && base < time.Second; i++ {
		base *= 2
	}
	if base > time.Second {
		base = time.Second
	}
	jitter := 1 + (rand.Float64()*2-1)*0.25 //nolint:gosec // jitter, not secrets
	return time.Duration(float64(base) * jitter), true
}

// quiet is how long a stream may stay quiet before it ends (limit 0: follow forever).
type quiet struct {
	limit time.Duration
	since time.Time
}

func newQuiet(limit time.Duration) *quiet { return &quiet{limit: limit, since: time.Now()} }

func (q *quiet) touch() { q.since = time.Now() }

// remaining is how long is left, and whether there is a limit at all.
func (q *quiet) remaining() (time.Duration, bool) {
	if q.limit <= 0 {
		return 0, false
	}
	left := time.Until(q.since.Add(q.limit))
	if left < 0 {
		left = 0
	}
	return left, true
}

func (q *quiet) over() bool {
	left, limited := q.remaining()
	return limited && left == 0
}

func (q *quiet) wait(want time.Duration) time.Duration {
	if left, limited := q.remaining(); limited && left < want {
		return left
	}
	return want
}
