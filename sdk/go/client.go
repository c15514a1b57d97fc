// Package tidemesh is the Go SDK of a tidemesh daemon: its IPC surface (docs/ipc.md) as
// typed calls over the daemon's Unix socket or loopback TCP, with the standard library only.
//
//	c, err := tidemesh.ForMesh("team", tidemesh.MeshOptions{})
//	res, err := c.Send(ctx, tidemesh.SendRequest{To: "topic:ops", Body: "deployed"}, "deploy-42")
//	err = c.Consume(ctx, "billing", tidemesh.ConsumeOptions{}, func(e tidemesh.InboxEntry) error {
//		return nil // acked once this returns nil
//	})
//	s := c.Events(ctx, tidemesh.EventsOptions{Since: tidemesh.From(0)})
//	defer s.Close()
//	for { item, err := s.Next(); ... }
//
// docs/sdk.md has the three SDKs side by side.
package tidemesh

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client is a daemon's IPC surface. Each call opens its own connection (no pooling, so a
// daemon restart never leaves a stale one behind). Failures are *Error.
type Client struct {
	Endpoint Endpoint
	// Timeout bounds each call (not Events or Consume, which wait as long as told).
	Timeout time.Duration
	http    *http.Client
	files   *http.Client // FileShare and FileGet: no answer comes before the file has moved
}

// New is a client of the daemon at e, each call bounded by timeout (0: 10 s).
func New(e Endpoint, timeout time.Duration) (*Client, error) {
	if err := e.check(); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	c := &Client{Endpoint: e, Timeout: timeout}
	dialer := &net.Dialer{Timeout: timeout}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return e.dial(ctx, dialer)
	}
	c.http = &http.Client{Transport: &http.Transport{
		DialContext: dial, DisableKeepAlives: true, ResponseHeaderTimeout: timeout,
	}}
	c.files = &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
	return c, nil
}

// MeshOptions says how ForMesh reaches the daemon.
type MeshOptions struct {
	TCP     bool          // loopback TCP with local_token, instead of the Unix socket
	Timeout time.Duration // per call; 0: 10 s
	Env     Env           // the environment to find it in; nil: the process's
}

// ForMesh is the daemon of mesh on this host, found as the CLI finds it (TIDEMESH_HOME,
// else the XDG folders); mesh "" is the mesh the CLI would choose. With TCP, the port in
// http.port and the token in local_token are read at each connection.
func ForMesh(mesh string, opts MeshOptions) (*Client, error) {
	if mesh == "" {
		chosen, err := ChooseMesh(opts.Env)
		if err != nil {
			return nil, err
		}
		mesh = chosen
	}
	p := PathsFor(mesh, opts.Env)
	e := Endpoint{Socket: p.Socket, Mesh: mesh}
	if opts.TCP {
		e = Endpoint{PortFile: p.PortFile, TokenFile: p.TokenFile, Mesh: mesh}
	}
	return New(e, opts.Timeout)
}

// -- transport ---------------------------------------------------------------------------

func (c *Client) open(ctx context.Context, method, path string, body any,
	headers map[string]string) (*http.Response, error) {
	return c.openWith(ctx, c.http, method, path, body, headers)
}

func (c *Client) openWith(ctx context.Context, hc *http.Client, method, path string, body any,
	headers map[string]string) (*http.Response, error) {
	var payload io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		payload = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, payload)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	auth, err := c.Endpoint.authorization()
	if err != nil {
		return nil, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ctx.Err() // the caller cancelled
		}
		return nil, c.Endpoint.notRunning(err)
	}
	return resp, nil
}

// call sends a request and decodes a 2xx body into out (nil: discard); another answer is
// its *Error.
func (c *Client) call(ctx context.Context, method, path string, body any,
	headers map[string]string, out any) error {
	return c.callWith(ctx, c.http, c.Timeout, method, path, body, headers, out)
}

func (c *Client) callWith(ctx context.Context, hc *http.Client, timeout time.Duration,
	method, path string, body any, headers map[string]string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.openWith(ctx, hc, method, path, body, headers)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return c.Endpoint.notRunning(err)
	}
	if resp.StatusCode >= 400 {
		return FromBody(resp.StatusCode, raw)
	}
	switch o := out.(type) {
	case nil:
		return nil
	case *string:
		*o = string(raw)
		return nil
	default:
		return json.Unmarshal(raw, out)
	}
}

// Request calls any route, for what has no method here: a 2xx answer's status and body,
// or its *Error.
func (c *Client) Request(ctx context.Context, method, path string, body any,
	headers map[string]string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	resp, err := c.open(ctx, method, path, body, headers)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, c.Endpoint.notRunning(err)
	}
	if resp.StatusCode >= 400 {
		return resp.StatusCode, raw, FromBody(resp.StatusCode, raw)
	}
	return resp.StatusCode, raw, nil
}

// -- the daemon --------------------------------------------------------------------------

// Version is GET /v1/version.
func (c *Client) Version(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	return out, c.call(ctx, "GET", "/v1/version", nil, nil, &out)
}

// Health is GET /v1/health.
func (c *Client) Health(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	return out, c.call(ctx, "GET", "/v1/health", nil, nil, &out)
}

// Metrics is GET /v1/metrics: Prometheus text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	var out string
	return out, c.call(ctx, "GET", "/v1/metrics", nil, nil, &out)
}

// Backup is POST /v1/backup: a sealed backup of this member's identity and configuration
// (never the outbox or inbox), the bytes of the file `tidemesh daemon restore` reads. The
// passphrase has at least 8 characters.
func (c *Client) Backup(ctx context.Context, passphrase string) ([]byte, error) {
	var out struct {
		Bundle []byte `json:"bundle"` // base64 on the wire
	}
	err := c.call(ctx, "POST", "/v1/backup", map[string]any{"passphrase": passphrase}, nil, &out)
	return out.Bundle, err
}

// RotateToken is POST /v1/token/rotate: a new local bearer token in the token file; the old
// one works for ipc.token_grace_s more (60 s by default). A TCP client reads the token file
// at each call, so it follows.
func (c *Client) RotateToken(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	return out, c.call(ctx, "POST", "/v1/token/rotate", map[string]any{}, nil, &out)
}

// -- send side ---------------------------------------------------------------------------

// Send hands one message to the daemon; it is on disk when this returns. A retry with the
// same idempotencyKey (or ClientMessageID) and body is sent once. "" sends no key.
func (c *Client) Send(ctx context.Context, m SendRequest, idempotencyKey string) (SendResult, error) {
	var out SendResult
	var headers map[string]string
	if idempotencyKey != "" {
		headers = map[string]string{"Idempotency-Key": idempotencyKey}
	}
	return out, c.call(ctx, "POST", "/v1/send", m, headers, &out)
}

// SendMany hands 1-1000 messages over in one request and one outbox transaction: one
// result per message, in order, each what Send would have got; a refused one fails no
// other. The error is for the whole request only.
func (c *Client) SendMany(ctx context.Context, messages []SendRequest) ([]BatchResult, error) {
	var out struct {
		Results []struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		} `json:"results"`
	}
	if messages == nil {
		messages = []SendRequest{}
	}
	body := map[string]any{"sends": messages}
	if err := c.call(ctx, "POST", "/v1/send_batch", body, nil, &out); err != nil {
		return nil, err
	}
	results := make([]BatchResult, len(out.Results))
	for i, r := range out.Results {
		results[i] = BatchResult{Status: r.Status, Body: r.Body}
		if r.Status >= 400 {
			results[i].Err = FromBody(r.Status, r.Body)
			continue
		}
		var sent SendResult
		if err := json.Unmarshal(r.Body, &sent); err != nil {
			return nil, err
		}
		results[i].Result = &sent
	}
	return results, nil
}

// OutboxQuery pages GET /v1/outbox.
type OutboxQuery struct {
	Status string // pending, inflight, done, dead, aborted, failed; "": all
	Limit  int    // 0: 50
	Before string
}

// OutboxList is the outbox's rows, newest first.
func (c *Client) OutboxList(ctx context.Context, q OutboxQuery) (OutboxPage, error) {
	if q.Limit == 0 {
		q.Limit = 50
	}
	var out OutboxPage
	path := "/v1/outbox" + query("limit", strconv.Itoa(q.Limit), "status", q.Status,
		"before", q.Before)
	return out, c.call(ctx, "GET", path, nil, nil, &out)
}

// OutboxInspect is one row, with its requeue "chain" in Fields.
func (c *Client) OutboxInspect(ctx context.Context, rowID string) (OutboxRow, error) {
	var out OutboxRow
	return out, c.call(ctx, "GET", "/v1/outbox/"+url.PathEscape(rowID), nil, nil, &out)
}

// RequeueOptions: a new id ("" : minted) and fields that replace the send's (nil: none).
type RequeueOptions struct {
	NewClientMessageID string
	PatchPayload       map[string]any
}

// OutboxRequeue aborts a dead or pending row and queues it again under a fresh id.
func (c *Client) OutboxRequeue(ctx context.Context, rowID string, o RequeueOptions) (RequeueResult, error) {
	body := map[string]any{"id": rowID}
	if o.NewClientMessageID != "" {
		body["new_client_message_id"] = o.NewClientMessageID
	}
	if o.PatchPayload != nil {
		body["patch_payload"] = o.PatchPayload
	}
	var out RequeueResult
	return out, c.call(ctx, "POST", "/v1/outbox/requeue", body, nil, &out)
}

// Prune runs retention now on "outbox", or "inbox" and its events.
func (c *Client) Prune(ctx context.Context, which string, dryRun bool) (PruneResult, error) {
	var out PruneResult
	return out, c.call(ctx, "POST", "/v1/"+which+"/prune", map[string]any{"dry_run": dryRun},
		nil, &out)
}

// -- receive side ------------------------------------------------------------------------

// InboxQuery pages GET /v1/inbox; with Consumer, a named consumer's entries.
type InboxQuery struct {
	After    *int64
	Limit    int // 0: 100
	Topic    string
	Sender   string // the sender's public key
	Consumer string
	// Q keeps the entries whose text body matches this search (words, "a phrase", pre*,
	// AND/OR/NOT; docs/ipc.md, "Searching the inbox"), in seq order.
	Q string
}

// Inbox is a page of received messages.
func (c *Client) Inbox(ctx context.Context, q InboxQuery) (InboxPage, error) {
	if q.Limit == 0 {
		q.Limit = 100
	}
	after := ""
	if q.After != nil {
		after = strconv.FormatInt(*q.After, 10)
	}
	var out InboxPage
	path := "/v1/inbox" + query("after", after, "limit", strconv.Itoa(q.Limit), "topic", q.Topic,
		"from", q.Sender, "consumer", q.Consumer, "q", q.Q)
	return out, c.call(ctx, "GET", path, nil, nil, &out)
}

// Ack advances a named consumer's cursor to upTo (never backwards).
func (c *Client) Ack(ctx context.Context, consumer string, upTo int64) (AckResult, error) {
	var out AckResult
	return out, c.call(ctx, "POST", "/v1/inbox/ack",
		map[string]any{"consumer": consumer, "up_to": upTo}, nil, &out)
}

// ErrStop, returned by a Consume callback, stops the loop without acking the entry it was
// given (it comes again next time); Consume then returns nil.
var ErrStop = errors.New("tidemesh: stop consuming")

// ConsumeOptions tune Consume.
type ConsumeOptions struct {
	Limit       int           // page size; 0: 100
	IdleTimeout time.Duration // end after this long with nothing new; 0: never
	Poll        time.Duration // how often to look when idle; 0: 500 ms
}

// Consume gives the named consumer's entries to fn, in order. An entry is acked once fn
// returns nil for it, so one fn was holding when the program stopped (an error, a crash)
// comes again on the next Consume. fn's error stops the loop without that ack and is
// returned (ErrStop: nil is returned).
func (c *Client) Consume(ctx context.Context, name string, o ConsumeOptions,
	fn func(InboxEntry) error) error {
	if o.Poll <= 0 {
		o.Poll = 500 * time.Millisecond
	}
	q := newQuiet(o.IdleTimeout)
	for {
		page, err := c.Inbox(ctx, InboxQuery{Limit: o.Limit, Consumer: name})
		if err != nil {
			return err
		}
		if len(page.Items) == 0 {
			if q.over() {
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(q.wait(o.Poll)):
			}
			continue
		}
		for _, entry := range page.Items {
			if err := fn(entry); err != nil {
				if errors.Is(err, ErrStop) {
					return nil
				}
				return err
			}
			if _, err := c.Ack(ctx, name, entry.Seq); err != nil {
				return err
			}
		}
		q.touch()
	}
}

// From is the Since of a stream that starts after event id.
func From(id int64) *int64 { return &id }

// EventsOptions tune Events.
type EventsOptions struct {
	Since       *int64        // start after this event id; nil: only new events
	IdleTimeout time.Duration // end after this long quiet; 0: never
}

// EventStream follows /v1/events. Next gives each event of the daemon's log once, in
// order, and the notices; it reconnects on its own (across daemon restarts) resuming by
// Last-Event-ID, and returns io.EOF once the stream stays quiet for IdleTimeout or ctx ends.
type EventStream struct {
	c      *Client
	ctx    context.Context
	cursor cursor
	quiet  *quiet
	again  reconnect
	lines  chan lineOrEnd
	body   io.Closer
	parser parser
	err    error
}

type lineOrEnd struct {
	line string
	end  bool
}

// Events opens the daemon's event stream (lazily: the first Next connects).
func (c *Client) Events(ctx context.Context, o EventsOptions) *EventStream {
	s := &EventStream{c: c, ctx: ctx, quiet: newQuiet(o.IdleTimeout)}
	if o.Since != nil {
		s.cursor = cursor{last: *o.Since, valid: true}
	}
	return s
}

// Next is the next event or notice; io.EOF when the stream has ended. A *Error with Kind
// DaemonNotRunning comes only when the first connection fails.
func (s *EventStream) Next() (Item, error) {
	for s.err == nil {
		if s.lines == nil {
			s.connect()
			continue
		}
		got, ok := s.read()
		if !ok {
			continue
		}
		if got.end {
			s.drop()
			continue
		}
		it, complete, err := s.parser.feed(got.line)
		if err != nil {
			s.drop()
			continue
		}
		if complete && s.cursor.admit(it) {
			s.quiet.touch()
			return it, nil
		}
	}
	return Item{}, s.err
}

// read waits for the next line, the quiet limit or ctx; ok false when it ended the stream.
func (s *EventStream) read() (lineOrEnd, bool) {
	var timeout <-chan time.Time
	if left, limited := s.quiet.remaining(); limited {
		timer := time.NewTimer(left)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case got := <-s.lines:
		return got, true
	case <-timeout:
		s.finish(io.EOF)
	case <-s.ctx.Done():
		s.finish(io.EOF)
	}
	return lineOrEnd{}, false
}

func (s *EventStream) connect() {
	if s.quiet.over() || s.ctx.Err() != nil {
		s.finish(io.EOF)
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	resp, err := s.c.open(ctx, "GET", "/v1/events", nil, s.cursor.headers())
	if err != nil {
		cancel()
		delay, again := s.again.delay()
		var own *Error
		if !again || !errors.As(err, &own) || own.Kind != "DaemonNotRunning" {
			s.finish(err)
			return
		}
		select {
		case <-time.After(s.quiet.wait(delay)):
		case <-s.ctx.Done():
		}
		return
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		s.finish(FromBody(resp.StatusCode, raw))
		return
	}
	s.again.succeeded()
	s.parser = parser{}
	lines := make(chan lineOrEnd)
	s.lines, s.body = lines, closer{resp.Body, cancel}
	go func() {
		r := bufio.NewReader(resp.Body)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				select {
				case lines <- lineOrEnd{end: true}:
				case <-ctx.Done():
				}
				return
			}
			select {
			case lines <- lineOrEnd{line: line}:
			case <-ctx.Done():
				return
			}
		}
	}()
}

// drop closes the current connection; the next Next reconnects.
func (s *EventStream) drop() {
	if s.body != nil {
		s.body.Close()
	}
	s.lines, s.body = nil, nil
}

func (s *EventStream) finish(err error) {
	s.drop()
	s.err = err
}

// Close ends the stream and its connection.
func (s *EventStream) Close() error {
	if s.err == nil {
		s.finish(io.EOF)
	}
	return nil
}

type closer struct {
	body   io.Closer
	cancel context.CancelFunc
}

func (c closer) Close() error {
	c.cancel()
	return c.body.Close()
}

// EachEvent calls fn with each item of Events until the stream ends (nil), fn returns an
// error (returned, ErrStop: nil) or the stream fails.
func (c *Client) EachEvent(ctx context.Context, o EventsOptions, fn func(Item) error) error {
	s := c.Events(ctx, o)
	defer s.Close()
	for {
		it, err := s.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(it); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
}

// -- membership and presence -------------------------------------------------------------

// Membership: kind "topic" (subscribe, unsubscribe, create) or "queue" (consume, leave).
func (c *Client) Membership(ctx context.Context, kind, action, name string, create bool) (map[string]any, error) {
	body := map[string]any{"name": name}
	if create {
		body["create"] = true
	}
	var out map[string]any
	return out, c.call(ctx, "POST", fmt.Sprintf("/v1/%ss/%s", kind, action), body, nil, &out)
}

// Memberships lists the topics ("topic") or queues ("queue") of this member.
func (c *Client) Memberships(ctx context.Context, kind string) (Memberships, error) {
	var out Memberships
	return out, c.call(ctx, "GET", "/v1/"+kind+"s", nil, nil, &out)
}

// Peers is GET /v1/peers.
func (c *Client) Peers(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	return out, c.call(ctx, "GET", "/v1/peers", nil, nil, &out)
}

// Profile is this member's profile; with a non-empty patch, those fields change first.
func (c *Client) Profile(ctx context.Context, patch map[string]any) (map[string]any, error) {
	var out map[string]any
	if len(patch) > 0 {
		return out, c.call(ctx, "POST", "/v1/profile", patch, nil, &out)
	}
	return out, c.call(ctx, "GET", "/v1/profile", nil, nil, &out)
}

// query builds "?k=v&..." from pairs, leaving out empty values.
func query(pairs ...string) string {
	var parts []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] != "" {
			parts = append(parts, pairs[i]+"="+url.QueryEscape(pairs[i+1]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "?" + strings.Join(parts, "&")
}
