"""``make fuzz``: the long fuzz run, by hand or nightly, never part of ``make test``.

1. Starts a broker (embedded SQLite) and a daemon joined to it, both under a temporary
   ``TIDEMESH_HOME``, exactly as a user would with the ``tidemesh`` command.
2. Runs the schemathesis CLI against the daemon's loopback port with the committed
   ``schemas/openapi.json``: the command a new user would type.
3. Runs the WebSocket frame fuzzer (tests/fuzz/test_ws_frames.py) with many more examples:
   frames of every type, deep nesting and numeric edges, before and after the handshake.
4. Runs the IPC edge fuzzer (tests/fuzz/test_ipc_edges.py): deep nesting anywhere in every
   POST body, numeric edges in every number a route reads (what schemathesis never writes).
5. Runs the sealed-header fuzzer (tests/fuzz/test_sealed_headers.py): a hostile member's
   sealed DM headers, opened and stored by the daemon's own code into a real inbox.
6. Checks the meta canonicalisation against rfc8785 on many more generated objects
   (tests/core/test_fingerprint.py; the suite draws 500).
7. Stops both processes and removes the folder; exits non-zero if any fuzzer failed.

The daemon runs with its TCP port on (a container or CI turns it off by default) and no
request budget; token rotation is left out of the schemathesis run (a rotation would change
the token under it).

    python scripts/fuzz.py [--max-examples N] [--ws-examples N] [--edge-examples N]
                           [--sealed-examples N] [--canonical-examples N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tidemesh.core.paths import daemon_paths

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MESH = "t"
# schemathesis speaks to the daemon's TCP port, which a container or CI turns off by default
# (core/environment); the request budget is off too, or every case past the burst is a 429
# (as tests/fuzz/test_ipc_schemathesis.py runs it).
DAEMON_ENV = {"TIDEMESH_IPC_TCP_ENABLED": "true", "TIDEMESH_IPC_RATE_PER_S": "0"}


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMESH_")}
    return {**env, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_FORMAT": "json"}


def _tidemesh(home: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], env=_env(home),
                         capture_output=True, text=True, check=False, timeout=60)
    if res.returncode:
        sys.exit(f"tidemesh {args[0]} {args[1]} failed: {res.stderr or res.stdout}")
    return res.stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _process(argv: list[str], home: Path, log: Path, extra_env: dict[str, str] | None = None
             ) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env={**_env(home), **(extra_env or {})}, stdout=out,
                                stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait(what: str, ready: object, proc: subprocess.Popen[bytes], log: Path,
          timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if ready():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} was not ready within {timeout:.0f} s: {log.read_text()[-2000:]}")


def _connected(port_file: Path, token_file: Path) -> bool:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port_file.read_text().strip()}/v1/health",
        headers={"Authorization": f"Bearer {token_file.read_text().strip()}"})
    with urllib.request.urlopen(req, timeout=2) as r:  # noqa: S310
        return bool(json.loads(r.read())["connected"])


def _schemathesis(port: int, token: str, max_examples: int) -> int:
    argv = [str(BIN / "schemathesis"), "run", str(REPO / "schemas" / "openapi.json"),
            "--url", f"http://127.0.0.1:{port}", "-H", f"Authorization: Bearer {token}",
            "--max-examples", str(max_examples), "--workers", "1",
            # A generated rotation would change the token under the run: every later request
            # a 401, which the document allows (the suite's run reads the token per case).
            "--exclude-path", "/v1/token/rotate",
            "--suppress-health-check", "all"]
    print("+", " ".join(argv).replace(token, "TOKEN"), flush=True)
    return subprocess.run(argv, cwd=REPO, check=False).returncode


def _pytest_fuzzer(path: str, examples: int) -> int:
    argv = [str(BIN / "pytest"), path, "-q", "-s", "-p", "no:cacheprovider", "-o", "timeout=0"]
    print(f"+ TIDEMESH_FUZZ_EXAMPLES={examples}", " ".join(argv), flush=True)
    env = {**os.environ, "TIDEMESH_FUZZ_EXAMPLES": str(examples)}
    return subprocess.run(argv, cwd=REPO, env=env, check=False).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=4000,
                        help="schemathesis examples per operation and phase (default 4000)")
    parser.add_argument("--ws-examples", type=int, default=30000,
                        help="frame batches for the WebSocket fuzzer (default 30000; 0 skips it)")
    parser.add_argument("--edge-examples", type=int, default=5000,
                        help="requests per IPC edge property (default 5000; 0 skips them)")
    parser.add_argument("--canonical-examples", type=int, default=20000,
                        help="meta objects checked against rfc8785 (default 20000; 0 skips)")
    parser.add_argument("--sealed-examples", type=int, default=5000,
                        help="hostile sealed DM headers opened and stored (default 5000; 0 skips)")
    opts = parser.parse_args()
    # Short: the daemon's socket path must stay under the OS limit of about 104 bytes.
    root = Path(tempfile.mkdtemp(prefix="tm-fuzz-", dir="/tmp"))
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        broker_home, member = root / "broker", root / "m"
        broker_home.mkdir()
        member.mkdir()
        store = f"sqlite://{broker_home}/broker.db"
        port = _free_port()
        _tidemesh(broker_home, "broker", "mesh", "create", "team", "--store", store)
        log = broker_home / "broker.out"
        broker = stack.enter_context(_process(
            [sys.executable, "-m", "tidemesh", "broker", "up", "--store", store,
             "--listen", f"127.0.0.1:{port}"], broker_home, log))
        _wait("the broker", lambda: b"broker_ready" in log.read_bytes(), broker, log)
        invite = _tidemesh(broker_home, "broker", "invite", "create", "--mesh", "team",
                           "--url", f"ws://127.0.0.1:{port}", "--store", store)
        _tidemesh(member, "daemon", "join", invite, "--mesh", MESH)
        paths = daemon_paths(MESH, {"TIDEMESH_HOME": str(member)})
        log = member / "daemon.out"
        daemon = stack.enter_context(_process(
            [sys.executable, "-m", "tidemesh", "daemon", "up", "--foreground", "--mesh", MESH],
            member, log, DAEMON_ENV))
        _wait("the daemon", lambda: _connected(paths.port_file, paths.token_file), daemon, log)
        rc = _schemathesis(int(paths.port_file.read_text()), paths.token_file.read_text().strip(),
                           opts.max_examples)
        if daemon.poll() is not None:
            print(f"the daemon died during the run: {log.read_text()[-2000:]}", file=sys.stderr)
            rc = rc or 1
    for path, examples in (("tests/fuzz/test_ws_frames.py", opts.ws_examples),
                           ("tests/fuzz/test_ipc_edges.py", opts.edge_examples),
                           ("tests/fuzz/test_sealed_headers.py", opts.sealed_examples),
                           ("tests/core/test_fingerprint.py::"
                            "test_meta_canonical_is_rfc8785_byte_for_byte",
                            opts.canonical_examples)):
        if examples:
            rc = _pytest_fuzzer(path, examples) or rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
