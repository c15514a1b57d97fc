package tidemesh_test

// Real processes for the tests: a broker on an SQLite store and joined daemons, run by the
// repository's tidemesh command (TIDEMESH_BIN, else the repository's .venv, else PATH), as
// tests/e2e/harness.py does it. Sockets live under a short folder in /tmp.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	tidemesh "github.com/tidemesh/tidemesh/sdk/go"
)

func tidemeshBin() string {
	if bin := os.Getenv("TIDEMESH_BIN"); bin != "" {
		return bin
	}
	venv, _ := filepath.Abs(filepath.Join("..", "..", ".venv", "bin", "tidemesh"))
	if _, err := os.Stat(venv); err == nil {
		return venv
	}
	return "tidemesh"
}

func procEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TIDEMESH_") || strings.HasPrefix(kv, "TIDEMESH_BIN=") {
			env = append(env, kv)
		}
	}
	// The suite runs in CI and in containers, whose defaults (no loopback TCP, no hooks, an
	// ephemeral key) are not what it tests: the daemons are pinned to a plain host.
	return append(env, "TIDEMESH_HOME="+home, "TIDEMESH_LOG_FORMAT=json",
		"TIDEMESH_ENVIRONMENT_KIND=host")
}

func cli(t *testing.T, home string, args ...string) string {
	t.Helper()
	cmd := exec.Command(tidemeshBin(), args...)
	cmd.Env = procEnv(home)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		t.Fatalf("tidemesh %s: %v\n%s%s", strings.Join(args, " "), err, stderr, out)
	}
	return strings.TrimSpace(string(out))
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func shortTemp(t *testing.T) string {
	dir, err := os.MkdirTemp("/tmp", "tm-go-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type daemon struct {
	home, mesh string
	cmd        *exec.Cmd
	done       chan struct{}
}

func (d *daemon) log() string { return filepath.Join(d.home, d.mesh+".out") }

func (d *daemon) tail() string {
	raw, _ := os.ReadFile(d.log())
	if len(raw) > 2000 {
		raw = raw[len(raw)-2000:]
	}
	return string(raw)
}

// start runs `daemon up --foreground` and waits until it answers on its socket.
func (d *daemon) start(t *testing.T) {
	t.Helper()
	out, err := os.OpenFile(d.log(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	d.cmd = exec.Command(tidemeshBin(), "daemon", "up", "--foreground", "--mesh", d.mesh)
	d.cmd.Env, d.cmd.Stdout, d.cmd.Stderr = procEnv(d.home), out, out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(d.cmd, d.done)
	probe, err := tidemesh.New(tidemesh.Endpoint{
		Socket: filepath.Join(d.home, "daemon", d.mesh, "sock")}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			t.Fatalf("daemon exited: %s", d.tail())
		default:
		}
		if _, err := probe.Version(context.Background()); err == nil {
			return
		} else if !errors.Is(err, tidemesh.ErrDaemonNotRunning) {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	_ = d.cmd.Process.Kill()
	t.Fatalf("daemon did not answer in 30 s: %s", d.tail())
}

// stop sends SIGTERM (SIGKILL with kill) and returns the exit code.
func (d *daemon) stop(kill bool) int {
	select {
	case <-d.done:
		return d.cmd.ProcessState.ExitCode()
	default:
	}
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	return d.cmd.ProcessState.ExitCode()
}

// world is a broker with one mesh on a fresh SQLite store, and daemons joined to it.
type world struct {
	root, mesh, store, url string
	broker                 *exec.Cmd
	daemons                map[string]*daemon
}

func startWorld(t *testing.T, mesh string, labels []string) *world {
	t.Helper()
	root := shortTemp(t)
	w := &world{root: root, mesh: mesh, daemons: map[string]*daemon{}}
	brokerHome := filepath.Join(root, "broker")
	if err := os.Mkdir(brokerHome, 0o700); err != nil {
		t.Fatal(err)
	}
	w.store = "sqlite://" + filepath.Join(brokerHome, "broker.db")
	cli(t, brokerHome, "broker", "mesh", "create", mesh, "--store", w.store)
	port := freePort(t)
	w.url = fmt.Sprintf("ws://127.0.0.1:%d", port)
	errLog, err := os.Create(filepath.Join(brokerHome, "broker.out"))
	if err != nil {
		t.Fatal(err)
	}
	w.broker = exec.Command(tidemeshBin(), "broker", "up", "--store", w.store, "--listen",
		fmt.Sprintf("127.0.0.1:%d", port))
	w.broker.Env, w.broker.Stderr = procEnv(brokerHome), errLog
	stdout, err := w.broker.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.broker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.stop)
	ready := make(chan bool, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		lines.Buffer(make([]byte, 1<<20), 1<<20)
		sent := false
		for lines.Scan() { // keep draining, so the broker never blocks on its stdout
			if !sent && strings.Contains(lines.Text(), "broker_ready") {
				ready <- true
				sent = true
			}
		}
		if !sent {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("broker exited before it was ready")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("broker did not become ready")
	}
	for _, label := range labels {
		home := filepath.Join(root, label)
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		invite := cli(t, brokerHome, "broker", "invite", "create", "--mesh", mesh, "--uses", "1",
			"--url", w.url, "--store", w.store)
		cli(t, home, "daemon", "join", invite, "--mesh", mesh, "--name", label)
		d := &daemon{home: home, mesh: mesh}
		d.start(t)
		w.daemons[label] = d
	}
	return w
}

func (w *world) stop() {
	for _, d := range w.daemons {
		d.stop(false)
	}
	if w.broker != nil && w.broker.Process != nil {
		_ = w.broker.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = w.broker.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = w.broker.Process.Kill()
		}
	}
}
