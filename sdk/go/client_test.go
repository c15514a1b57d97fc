package tidemesh_test

// Client against a real lone daemon (no broker needed): typed results, the error types,
// TCP with the token, discovery, and the ends of the event stream.

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tidemesh "github.com/tidemesh/tidemesh/sdk/go"
)

func loneDaemon(t *testing.T) (*daemon, *tidemesh.Client) {
	d := &daemon{home: shortTemp(t), mesh: "t"}
	d.start(t)
	t.Cleanup(func() {
		if code := d.stop(false); code != 0 {
			t.Errorf("daemon exited %d: %s", code, d.tail())
		}
	})
	c, err := tidemesh.ForMesh("t", tidemesh.MeshOptions{Env: tidemesh.Env{"TIDEMESH_HOME": d.home}})
	if err != nil {
		t.Fatal(err)
	}
	return d, c
}

// tcpClient finds d's daemon by mesh over loopback TCP, as a program would.
func tcpClient(t *testing.T, d *daemon) *tidemesh.Client {
	tcp, err := tidemesh.ForMesh(d.mesh, tidemesh.MeshOptions{TCP: true,
		Env: tidemesh.Env{"TIDEMESH_HOME": d.home}})
	if err != nil {
		t.Fatal(err)
	}
	return tcp
}

func TestLoneDaemon(t *testing.T) {
	d, c := loneDaemon(t)
	ctx := context.Background()

	t.Run("a send answers a typed result and a retry binds the same row", func(t *testing.T) {
		msg := tidemesh.SendRequest{To: "topic:ops", Body: "x"}
		first, err := c.Send(ctx, msg, "job-1")
		if err != nil {
			t.Fatal(err)
		}
		again, err := c.Send(ctx, msg, "job-1")
		if err != nil {
			t.Fatal(err)
		}
		if first.Status != "queued" || first.ClientMessageID != "job-1" || again.OutboxID != first.OutboxID {
			t.Fatalf("first %+v, again %+v", first, again)
		}
		page, err := c.OutboxList(ctx, tidemesh.OutboxQuery{})
		if err != nil || len(page.Items) != 1 || page.Items[0].ID != first.OutboxID {
			t.Fatalf("%+v %v", page, err)
		}
		row, err := c.OutboxInspect(ctx, first.OutboxID)
		if err != nil || row.ClientMessageID != "job-1" || row.Fields["chain"] == nil {
			t.Fatalf("%+v %v", row, err)
		}
		v, err := c.Version(ctx)
		if err != nil || v["ipc_api"] != "v1" {
			t.Fatalf("%v %v", v, err)
		}
		if m, err := c.Metrics(ctx); err != nil || !strings.Contains(m, "cm_daemon") {
			t.Fatalf("metrics: %v", err)
		}
	})

	t.Run("the daemon's error bodies arrive as their error type", func(t *testing.T) {
		_, err := c.Send(ctx, tidemesh.SendRequest{To: "nowhere:x", Body: "x"}, "")
		var e *tidemesh.Error
		if !errors.As(err, &e) || !errors.Is(err, tidemesh.ErrInvalidRequest) ||
			e.Details["field"] != "to" || e.Status != 400 {
			t.Fatalf("%#v", err)
		}
		if _, err := c.OutboxInspect(ctx, "no-such-row"); !errors.Is(err, tidemesh.ErrNotFound) {
			t.Fatalf("%v", err)
		}
		if _, err := c.Send(ctx, tidemesh.SendRequest{To: "topic:ops", Body: "one"}, "job-2"); err != nil {
			t.Fatal(err)
		}
		_, err = c.Send(ctx, tidemesh.SendRequest{To: "topic:ops", Body: "other"}, "job-2")
		if !errors.Is(err, tidemesh.ErrIdempotencyConflict) || !errors.Is(err, tidemesh.ErrConflict) ||
			errors.Is(err, tidemesh.ErrNotFound) {
			t.Fatalf("%v", err)
		}
		errors.As(err, &e)
		if e.Kind != "IdempotencyConflict" || e.Details["conflict"] != "outbox_pending_fingerprint_mismatch" {
			t.Fatalf("%#v", e)
		}
		if _, err := c.SendMany(ctx, nil); !errors.Is(err, tidemesh.ErrInvalidRequest) {
			t.Fatalf("%v", err)
		}
	})

	t.Run("loopback TCP needs the token, and finds the port by mesh", func(t *testing.T) {
		tcp := tcpClient(t, d)
		if v, err := tcp.Version(ctx); err != nil || v["mesh"] != "t" {
			t.Fatalf("%v %v", v, err)
		}
		wrong := filepath.Join(d.home, "wrong-token")
		if err := os.WriteFile(wrong, []byte("not-the-token\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		bad, err := tidemesh.New(tidemesh.Endpoint{PortFile: tcp.Endpoint.PortFile, TokenFile: wrong}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bad.OutboxList(ctx, tidemesh.OutboxQuery{}); !errors.Is(err, tidemesh.ErrUnauthorized) {
			t.Fatalf("%v", err)
		}
	})

	t.Run("the SDK fits the daemon's compat document, and says why when it does not", func(t *testing.T) {
		doc, err := c.CheckCompatible(ctx, "")
		if err != nil || doc["ipc_api"] != "v1" {
			t.Fatalf("%v %v", doc, err)
		}
		_, err = c.CheckCompatible(ctx, "9.0.0")
		var e *tidemesh.Error
		if !errors.As(err, &e) || !errors.Is(err, tidemesh.ErrIncompatibleDaemon) ||
			e.Details["kind"] != "version" ||
			!strings.Contains(e.Message, "go versions >=0.1.0,<0.2.0, and this go is 9.0.0") {
			t.Fatalf("%#v", err)
		}
	})

	t.Run("a rotated token: the TCP client reads the new one at its next call", func(t *testing.T) {
		tcp := tcpClient(t, d)
		old, err := os.ReadFile(tcp.Endpoint.TokenFile)
		if err != nil {
			t.Fatal(err)
		}
		kept := filepath.Join(d.home, "kept-token")
		if err := os.WriteFile(kept, old, 0o600); err != nil {
			t.Fatal(err)
		}
		holder, err := tidemesh.New(tidemesh.Endpoint{PortFile: tcp.Endpoint.PortFile, TokenFile: kept}, 0)
		if err != nil {
			t.Fatal(err)
		}
		rotated, err := tcp.RotateToken(ctx)
		if err != nil || rotated["rotated"] != true || rotated["token_file"] != tcp.Endpoint.TokenFile {
			t.Fatalf("%v %v", rotated, err)
		}
		if _, err := holder.Version(ctx); err != nil {
			t.Fatalf("the old token is good for its grace: %v", err)
		}
		if _, err := tcp.RotateToken(ctx); err != nil { // retires the first token at once
			t.Fatal(err)
		}
		if _, err := holder.Version(ctx); !errors.Is(err, tidemesh.ErrUnauthorized) {
			t.Fatalf("%v", err)
		}
		if v, err := tcp.Version(ctx); err != nil || v["mesh"] != "t" {
			t.Fatalf("%v %v", v, err)
		}
	})

	t.Run("an inbox search answers a page, and a query FTS5 cannot read is a 400 on q", func(t *testing.T) {
		page, err := c.Inbox(ctx, tidemesh.InboxQuery{Q: "deploy*"})
		if err != nil || len(page.Items) != 0 {
			t.Fatalf("%+v %v", page, err)
		}
		_, err = c.Inbox(ctx, tidemesh.InboxQuery{Q: "disk AND"})
		var e *tidemesh.Error
		if !errors.As(err, &e) || !errors.Is(err, tidemesh.ErrInvalidRequest) || e.Details["field"] != "q" {
			t.Fatalf("%#v", err)
		}
		if _, err := c.Backup(ctx, "short"); !errors.Is(err, tidemesh.ErrInvalidRequest) {
			t.Fatalf("%v", err)
		}
	})

	t.Run("a client found by mesh over TCP follows the daemon to its new port", func(t *testing.T) {
		tcp := tcpClient(t, d)
		if _, err := tcp.Version(ctx); err != nil {
			t.Fatal(err)
		}
		if code := d.stop(false); code != 0 {
			t.Fatalf("daemon exited %d: %s", code, d.tail())
		}
		if _, err := tcp.Version(ctx); !errors.Is(err, tidemesh.ErrDaemonNotRunning) {
			t.Fatalf("%v", err)
		}
		d.start(t)
		if v, err := tcp.Version(ctx); err != nil || v["mesh"] != "t" {
			t.Fatalf("%v %v", v, err)
		}
	})

	t.Run("events end after the idle timeout, or when the context ends", func(t *testing.T) {
		err := c.EachEvent(ctx, tidemesh.EventsOptions{Since: tidemesh.From(0), IdleTimeout: 300 * time.Millisecond},
			func(it tidemesh.Item) error {
				if it.IsNotice {
					t.Errorf("notice %v", it)
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		s := c.Events(short, tidemesh.EventsOptions{})
		if it, err := s.Next(); !errors.Is(err, io.EOF) {
			t.Fatalf("%v %v", it, err)
		}
	})
}

func TestNoDaemonIsDaemonNotRunningWithHowToStartOne(t *testing.T) {
	env := tidemesh.Env{"TIDEMESH_HOME": shortTemp(t)}
	ctx := context.Background()
	for _, tcp := range []bool{false, true} {
		c, err := tidemesh.ForMesh("team", tidemesh.MeshOptions{TCP: tcp, Env: env})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Health(ctx)
		var e *tidemesh.Error
		if !errors.As(err, &e) || e.Kind != "DaemonNotRunning" || e.Hint != "tidemesh daemon up --mesh team" {
			t.Fatalf("%#v", err)
		}
		if _, err := c.Events(ctx, tidemesh.EventsOptions{Since: tidemesh.From(0)}).Next(); !errors.Is(err, tidemesh.ErrDaemonNotRunning) {
			t.Fatalf("events: %v", err)
		}
		err = c.Consume(ctx, "w", tidemesh.ConsumeOptions{}, func(tidemesh.InboxEntry) error { return nil })
		if !errors.Is(err, tidemesh.ErrDaemonNotRunning) {
			t.Fatalf("consume: %v", err)
		}
	}
}

func TestTheMeshIsChosenAsTheCLIChoosesIt(t *testing.T) {
	home := shortTemp(t)
	env := tidemesh.Env{"TIDEMESH_HOME": home}
	join := func(name string) {
		dir := filepath.Join(home, "daemon", name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "mesh.json"), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := tidemesh.ChooseMesh(env); m != "default" {
		t.Fatal(m)
	}
	join("team")
	if m, _ := tidemesh.ChooseMesh(env); m != "team" {
		t.Fatal(m)
	}
	join("ops")
	if _, err := tidemesh.ChooseMesh(env); !errors.Is(err, tidemesh.ErrMeshNotChosen) {
		t.Fatal(err)
	}
	env["TIDEMESH_DAEMON_MESH"] = "ops"
	if m, _ := tidemesh.ChooseMesh(env); m != "ops" {
		t.Fatal(m)
	}
}
