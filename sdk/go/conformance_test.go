package tidemesh_test

// The conformance scenario (sdk/conformance/scenario.json) run through this SDK. The Python
// and TypeScript SDKs run the same file; sdk/conformance/README.md defines the steps, the
// matchers and how a result is observed. This runner only carries steps to the SDK and
// reports what came back, each result read from the SDK's typed values.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	tidemesh "github.com/tidemesh/tidemesh/sdk/go"
)

const waitFor = 30 * time.Second

type step = map[string]any

type scenario struct {
	Mesh    string                       `json:"mesh"`
	Daemons map[string]map[string]string `json:"daemons"`
	Steps   []step                       `json:"steps"`
}

func loadScenario(t *testing.T) scenario {
	raw, err := os.ReadFile(filepath.Join("..", "conformance", "scenario.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s scenario
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// observed is v as JSON values (maps, slices, float64, ...), read through its Go type.
func observed(v any) any {
	raw, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		panic(err)
	}
	return out
}

func observedError(e *tidemesh.Error) map[string]any {
	return map[string]any{"kind": e.Kind, "code": e.Code, "status": float64(e.Status),
		"details": observed(e.Details)}
}

// mismatch says why got does not match expect ("": it does).
func mismatch(expect, got any, saved map[string]any, at string) string {
	switch want := expect.(type) {
	case map[string]any:
		if len(want) == 1 {
			for op, arg := range want {
				if strings.HasPrefix(op, "$") {
					return matcher(op, arg, got, saved, at)
				}
			}
		}
		obj, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: expected an object, got %s", at, show(got))
		}
		keys := make([]string, 0, len(want))
		for k := range want {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if why := mismatch(want[k], obj[k], saved, at+"."+k); why != "" {
				return why
			}
		}
		return ""
	case []any:
		list, ok := got.([]any)
		if !ok || len(list) != len(want) {
			return fmt.Sprintf("%s: expected %d items, got %s", at, len(want), show(got))
		}
		for i := range want {
			if why := mismatch(want[i], list[i], saved, fmt.Sprintf("%s[%d]", at, i)); why != "" {
				return why
			}
		}
		return ""
	}
	if !reflect.DeepEqual(expect, got) {
		return fmt.Sprintf("%s: expected %s, got %s", at, show(expect), show(got))
	}
	return ""
}

func matcher(op string, arg, got any, saved map[string]any, at string) string {
	switch op {
	case "$ref":
		return mismatch(saved[arg.(string)], got, saved, at)
	case "$in":
		for _, v := range arg.([]any) {
			if mismatch(v, got, saved, at) == "" {
				return ""
			}
		}
		return fmt.Sprintf("%s: %s is not one of %s", at, show(got), show(arg))
	case "$present":
		if (got != nil) == arg.(bool) {
			return ""
		}
		return fmt.Sprintf("%s: presence is not %v", at, arg)
	case "$len":
		if list, ok := got.([]any); ok && float64(len(list)) == arg.(float64) {
			return ""
		}
		return fmt.Sprintf("%s: %s has not %v items", at, show(got), arg)
	}
	panic("unknown matcher " + op)
}

func show(v any) string {
	raw, _ := json.Marshal(v)
	return string(raw)
}

func pick(v any, path string) any {
	for _, part := range strings.Split(path, ".") {
		switch x := v.(type) {
		case []any:
			i, _ := strconv.Atoi(part)
			v = x[i]
		case map[string]any:
			v = x[part]
		default:
			return nil
		}
	}
	return v
}

type stream struct {
	s      *tidemesh.EventStream
	lastID int64
}

type runner struct {
	t       *testing.T
	ctx     context.Context
	clients map[string]*tidemesh.Client
	restart func(label string, kill bool, whileDown func())
	saved   map[string]any
	streams map[string]*stream
}

func (r *runner) run(steps []step) {
	for _, st := range steps {
		var got any
		res, err := r.observe(st)
		var own *tidemesh.Error
		switch {
		case errors.As(err, &own):
			got = map[string]any{"error": observedError(own)}
		case err != nil:
			r.t.Fatalf("step %q: %v", st["name"], err)
		default:
			got = observed(res)
		}
		if save, ok := st["save"].(map[string]any); ok {
			for name, path := range save {
				r.saved[name] = pick(got, path.(string))
			}
		}
		if expect, ok := st["expect"]; ok {
			if why := mismatch(expect, got, r.saved, "$"); why != "" {
				r.t.Fatalf("step %q: %s\n got: %s", st["name"], why, show(got))
			}
		}
	}
}

func (r *runner) arg(st step, key string) any {
	v := st[key]
	if m, ok := v.(map[string]any); ok && len(m) == 1 {
		if ref, ok := m["$ref"].(string); ok {
			return r.saved[ref]
		}
	}
	return v
}

func (r *runner) str(st step, key string) string { s, _ := r.arg(st, key).(string); return s }

func (r *runner) num(st step, key string) int64 { f, _ := r.arg(st, key).(float64); return int64(f) }

// as decodes a step's JSON argument into the SDK's type.
func as[T any](v any) T {
	var out T
	raw, _ := json.Marshal(v)
	if err := json.Unmarshal(raw, &out); err != nil {
		panic(err)
	}
	return out
}

func (r *runner) observe(st step) (any, error) {
	c := r.clients[st["on"].(string)]
	ctx := r.ctx
	switch st["do"] {
	case "wait_connected":
		return poll(func() (any, error) {
			h, err := c.Health(ctx)
			if err != nil || h["connected"] != true {
				return nil, err
			}
			return true, nil
		})
	case "version":
		return c.Version(ctx)
	case "subscribe":
		create, _ := r.arg(st, "create").(bool)
		return c.Membership(ctx, "topic", "subscribe", r.str(st, "topic"), create)
	case "send":
		return c.Send(ctx, as[tidemesh.SendRequest](r.arg(st, "message")),
			r.str(st, "idempotency_key"))
	case "send_many":
		results, err := c.SendMany(ctx, as[[]tidemesh.SendRequest](r.arg(st, "messages")))
		if err != nil {
			return nil, err
		}
		out := make([]any, len(results))
		for i, res := range results {
			if res.Err != nil {
				out[i] = map[string]any{"status": res.Status, "error": observedError(res.Err)}
			} else {
				out[i] = map[string]any{"status": res.Status, "body": res.Result}
			}
		}
		return out, nil
	case "outbox_inspect":
		return c.OutboxInspect(ctx, r.str(st, "id"))
	case "outbox_wait":
		cid := r.str(st, "client_message_id")
		return poll(func() (any, error) {
			page, err := c.OutboxList(ctx, tidemesh.OutboxQuery{Status: r.str(st, "status")})
			for _, row := range page.Items {
				if row.ClientMessageID == cid {
					return row, nil
				}
			}
			return nil, err
		})
	case "outbox_requeue":
		patch, _ := r.arg(st, "patch_payload").(map[string]any)
		return c.OutboxRequeue(ctx, r.str(st, "id"), tidemesh.RequeueOptions{
			NewClientMessageID: r.str(st, "new_client_message_id"), PatchPayload: patch})
	case "check_compatible":
		return c.CheckCompatible(ctx, r.str(st, "version"))
	case "backup":
		bundle, err := c.Backup(ctx, r.str(st, "passphrase"))
		if err != nil {
			return nil, err
		}
		magic, _, _ := strings.Cut(string(bundle), "\n")
		return map[string]any{"magic": magic}, nil
	case "rotate_token":
		return c.RotateToken(ctx)
	case "inbox":
		return c.Inbox(ctx, tidemesh.InboxQuery{Consumer: r.str(st, "consumer"), Q: r.str(st, "q")})
	case "inbox_wait":
		return poll(func() (any, error) {
			page, err := c.Inbox(ctx, tidemesh.InboxQuery{Limit: 1000})
			if err != nil || int64(len(page.Items)) < r.num(st, "count") {
				return nil, err
			}
			bodies := []string{}
			for _, e := range page.Items {
				bodies = append(bodies, e.Body)
			}
			return map[string]any{"bodies": bodies}, nil
		})
	case "consume":
		return r.consume(c, st)
	case "events_open":
		since := r.num(st, "since")
		r.streams[r.str(st, "stream")] = &stream{
			s:      c.Events(ctx, tidemesh.EventsOptions{Since: tidemesh.From(since), IdleTimeout: waitFor}),
			lastID: since}
		return nil, nil
	case "events_take":
		return take(r.streams[r.str(st, "stream")], int(r.num(st, "messages")))
	case "events_close":
		r.streams[r.str(st, "stream")].s.Close()
		delete(r.streams, r.str(st, "stream"))
		return nil, nil
	case "restart":
		kill, _ := r.arg(st, "kill").(bool)
		whileDown, _ := r.arg(st, "while_down").([]any)
		r.restart(st["on"].(string), kill, func() { r.run(as[[]step](whileDown)) })
		return nil, nil
	}
	return nil, fmt.Errorf("unknown step %v", st["do"])
}

func (r *runner) consume(c *tidemesh.Client, st step) (any, error) {
	bodies, seqs := []string{}, []int64{}
	idle := waitFor
	if ms := r.num(st, "idle_timeout_ms"); ms > 0 {
		idle = time.Duration(ms) * time.Millisecond
	}
	holdAt := int(r.num(st, "hold_at"))
	err := c.Consume(r.ctx, r.str(st, "consumer"), tidemesh.ConsumeOptions{IdleTimeout: idle},
		func(e tidemesh.InboxEntry) error {
			bodies, seqs = append(bodies, e.Body), append(seqs, e.Seq)
			if len(bodies) == holdAt {
				return tidemesh.ErrStop // stop while holding it: never acked
			}
			return nil
		})
	return map[string]any{"bodies": bodies, "seqs": seqs}, err
}

func take(st *stream, messages int) (any, error) {
	got, notices := []string{}, []string{}
	gapless := true
	for len(got) < messages {
		it, err := st.s.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the event stream ended")
		}
		if err != nil {
			return nil, err
		}
		if it.IsNotice {
			notices = append(notices, it.Type)
			key := "oldest_available" // where the replay starts (docs/ipc.md, "Events")
			if it.Type == "cursor_ahead" {
				key = "replay_from"
			}
			from, _ := it.Data[key].(float64)
			st.lastID = int64(from) - 1
			continue
		}
		gapless = gapless && it.ID == st.lastID+1
		st.lastID = it.ID
		if it.Type == "message" {
			entry, err := it.Entry()
			if err != nil {
				return nil, err
			}
			got = append(got, entry.Body)
		}
	}
	return map[string]any{"messages": got, "gapless": gapless, "notices": notices}, nil
}

func poll(probe func() (any, error)) (any, error) {
	deadline := time.Now().Add(waitFor)
	for {
		got, err := probe()
		if err != nil || got != nil {
			return got, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not seen within %v", waitFor)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConformanceScenario(t *testing.T) {
	sc := loadScenario(t)
	labels := make([]string, 0, len(sc.Daemons))
	for label := range sc.Daemons {
		labels = append(labels, label)
	}
	sort.Strings(labels)
	w := startWorld(t, sc.Mesh, labels)
	clients := map[string]*tidemesh.Client{}
	for label, how := range sc.Daemons {
		c, err := tidemesh.ForMesh(sc.Mesh, tidemesh.MeshOptions{
			TCP: how["transport"] == "tcp", Env: tidemesh.Env{"TIDEMESH_HOME": w.daemons[label].home}})
		if err != nil {
			t.Fatal(err)
		}
		clients[label] = c
	}
	restart := func(label string, kill bool, whileDown func()) {
		d := w.daemons[label]
		if code := d.stop(kill); !kill && code != 0 {
			t.Fatalf("daemon %s exited %d: %s", label, code, d.tail())
		}
		whileDown()
		d.start(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := &runner{t: t, ctx: ctx, clients: clients, restart: restart,
		saved: map[string]any{}, streams: map[string]*stream{}}
	r.run(sc.Steps)
}

func TestMatchersSayWhatDiffers(t *testing.T) {
	saved := map[string]any{"row": "01J"}
	parse := func(s string) any { var v any; _ = json.Unmarshal([]byte(s), &v); return v }
	cases := []struct {
		expect, got, why string
	}{
		{`{"a": {"$ref": "row"}, "b": [1, {"$in": [2, 3]}]}`, `{"a": "01J", "b": [1, 3], "x": 1}`, ""},
		{`{"a": {"$ref": "row"}}`, `{"a": "02K"}`, `$.a: expected "01J", got "02K"`},
		{`{"items": {"$len": 0}}`, `{"items": [1]}`, `$.items: [1] has not 0 items`},
		{`{"x": {"$present": true}}`, `{}`, `$.x: presence is not true`},
		{`["a"]`, `["a", "b"]`, `$: expected 1 items, got ["a","b"]`},
	}
	for _, c := range cases {
		if why := mismatch(parse(c.expect), parse(c.got), saved, "$"); why != c.why {
			t.Errorf("%s vs %s: %q, want %q", c.expect, c.got, why, c.why)
		}
	}
}
