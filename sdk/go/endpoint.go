package tidemesh

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Loopback is the only address the daemon's TCP listener is on.
const Loopback = "127.0.0.1"

// DefaultMesh is the mesh used when none is named and none (or it) is joined.
const DefaultMesh = "default"

// Env is the environment discovery reads; nil means the process's own.
type Env map[string]string

func (e Env) get(key string) string {
	if e == nil {
		return os.Getenv(key)
	}
	return e[key]
}

// DaemonPaths are the files of mesh M's daemon, found as the CLI finds them
// (core/paths.py): DIR/daemon/M/ with TIDEMESH_HOME=DIR, else the XDG folders.
type DaemonPaths struct {
	DataDir, RuntimeDir         string
	Socket, TokenFile, PortFile string
}

// PathsFor computes the daemon's paths of mesh from env (nothing is read).
func PathsFor(mesh string, env Env) DaemonPaths {
	var data, runtime string
	if home := env.get("TIDEMESH_HOME"); home != "" {
		data = filepath.Join(expandUser(home), "daemon", mesh)
		runtime = data
	} else {
		userHome := env.get("HOME")
		if userHome == "" {
			userHome, _ = os.UserHomeDir()
		}
		dataHome := env.get("XDG_DATA_HOME")
		if dataHome == "" {
			dataHome = filepath.Join(userHome, ".local", "share")
		}
		runtimeHome := env.get("XDG_RUNTIME_DIR")
		if runtimeHome == "" {
			runtimeHome = fmt.Sprintf("/tmp/tidemesh-%d", os.Getuid())
		}
		data = filepath.Join(dataHome, "tidemesh", "daemon", mesh)
		runtime = filepath.Join(runtimeHome, "tidemesh", "daemon", mesh)
	}
	return DaemonPaths{DataDir: data, RuntimeDir: runtime,
		Socket:    filepath.Join(runtime, "sock"),
		TokenFile: filepath.Join(runtime, "local_token"),
		PortFile:  filepath.Join(runtime, "http.port")}
}

// JoinedMeshes are the meshes this user has joined on this host (each has a mesh.json).
func JoinedMeshes(env Env) []string {
	root := filepath.Dir(PathsFor(DefaultMesh, env).DataDir)
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if st, err := os.Stat(filepath.Join(root, e.Name(), "mesh.json")); err == nil && st.Mode().IsRegular() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// ChooseMesh is the mesh the CLI would use: TIDEMESH_DAEMON_MESH, else the only joined
// mesh, else "default"; several joined and none named is a MeshNotChosen error.
func ChooseMesh(env Env) (string, error) {
	if asked := env.get("TIDEMESH_DAEMON_MESH"); asked != "" {
		return asked, nil
	}
	joined := JoinedMeshes(env)
	if len(joined) == 1 {
		return joined[0], nil
	}
	for _, name := range joined {
		if name == DefaultMesh {
			return DefaultMesh, nil
		}
	}
	if len(joined) == 0 {
		return DefaultMesh, nil
	}
	return "", &Error{Kind: "MeshNotChosen", Code: "mesh_not_chosen", Status: 400,
		Message: fmt.Sprintf("several meshes are joined (%s); say which with --mesh or "+
			"TIDEMESH_DAEMON_MESH", strings.Join(joined, ", ")), Details: map[string]any{}}
}

// StartHint is the command that starts mesh's daemon.
func StartHint(mesh string) string {
	if mesh != "" && mesh != DefaultMesh {
		return "tidemesh daemon up --mesh " + mesh
	}
	return "tidemesh daemon up"
}

// Endpoint is where a daemon listens: its Unix socket (no token: the socket's mode is the
// gate), or loopback TCP with the bearer token of TokenFile, read at each request. The
// port is Port, or read from PortFile at each connection (it changes when the daemon
// restarts).
type Endpoint struct {
	Socket    string
	Port      int
	PortFile  string
	TokenFile string
	Mesh      string
}

func (e Endpoint) check() error {
	tcp := e.Port != 0 || e.PortFile != ""
	if (e.Socket == "") == !tcp {
		return errors.New("tidemesh: give either Socket or Port (with TokenFile), not both")
	}
	if tcp && e.TokenFile == "" {
		return errors.New("tidemesh: a TCP endpoint needs TokenFile (the daemon's local_token)")
	}
	return nil
}

func (e Endpoint) where() string {
	if e.Socket != "" {
		return e.Socket
	}
	if e.Port != 0 {
		return fmt.Sprintf("%s:%d", Loopback, e.Port)
	}
	return fmt.Sprintf("%s:(%s)", Loopback, e.PortFile)
}

func (e Endpoint) dial(ctx context.Context, d *net.Dialer) (net.Conn, error) {
	if e.Socket != "" {
		return d.DialContext(ctx, "unix", e.Socket)
	}
	port := e.Port
	if port == 0 {
		raw, err := os.ReadFile(e.PortFile)
		if err == nil {
			port, err = strconv.Atoi(strings.TrimSpace(string(raw)))
		}
		if err != nil {
			return nil, daemonNotRunning("no daemon publishes a TCP port in "+e.PortFile,
				StartHint(e.Mesh))
		}
	}
	return d.DialContext(ctx, "tcp", net.JoinHostPort(Loopback, strconv.Itoa(port)))
}

func (e Endpoint) authorization() (string, error) {
	if e.TokenFile == "" {
		return "", nil
	}
	raw, err := os.ReadFile(e.TokenFile)
	if err != nil {
		return "", daemonNotRunning(fmt.Sprintf("cannot read the daemon's token %s: %v",
			e.TokenFile, err), StartHint(e.Mesh))
	}
	return "Bearer " + strings.TrimSpace(string(raw)), nil
}

// notRunning is the one error for "nothing answers here", with how to start a daemon.
func (e Endpoint) notRunning(err error) *Error {
	var own *Error
	if errors.As(err, &own) {
		return own
	}
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return daemonNotRunning("no daemon answers on "+e.where(), StartHint(e.Mesh))
	}
	return daemonNotRunning(fmt.Sprintf("the daemon on %s did not answer: %v", e.where(), err),
		StartHint(e.Mesh))
}

func expandUser(path string) string {
	if path == "~" || strings.HasPrefix(path, "~/") {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, path[1:])
		}
	}
	return path
}
