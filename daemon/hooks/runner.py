"""Running one hook process: its own process group, a minimal environment, the event on
stdin, stdout kept up to a cap, a timeout that ends the whole group (SIGTERM, then SIGKILL
after a grace), and an optional new network namespace.

Knows nothing of the ledger or of events; ``service`` decides what to run and records it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import structlog

from tidemesh.core.hooks import HookConfig, NetworkPolicy

log = structlog.get_logger(__name__)

KILL_GRACE_S = 5.0
SAFE_PATH = "/usr/bin:/bin"
_CHUNK = 65536
_STDERR_KEEP = 2048
# How long output is still read after the hook exited, for a child it left holding the
# pipes; the run does not wait for that child's end.
OUTPUT_AFTER_EXIT_S = 0.5


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_code: int | None      # None: it did not finish (timed out, or could not start)
    timed_out: bool
    stdout: bytes              # at most the hook's output_size_limit
    stdout_bytes: int          # everything it wrote, counted
    stderr_tail: bytes
    duration_s: float
    isolated: bool             # ran in its own network namespace
    error: str | None = None
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout_cut(self) -> bool:
        return self.stdout_bytes > len(self.stdout)

    def describe(self) -> str:
        if self.error is not None:
            return self.error
        if self.timed_out:
            return "timed out"
        tail = self.stderr_tail.decode(errors="replace").strip()
        return f"exit {self.exit_code}" + (f": {tail[-300:]}" if tail else "")


class Sandbox:
    """How a hook with ``network_policy = "deny"`` is put in a new network namespace, found
    once at start; None when the host allows none (the hook then runs anyway and the service
    says so).

    The hook must keep no privilege that lets it join another namespace (``setns`` needs
    CAP_SYS_ADMIN over it: a root hook in a plain ``unshare --net`` could ``nsenter`` the
    daemon's network). So it gets a user namespace of its own too (``unshare -rn``): it may
    be "root" there, with no capability over the host's namespaces. Where user namespaces
    are off, a root daemon falls back to ``unshare --net`` with every capability dropped
    from the hook's bounding set (``setpriv``), and no_new_privs."""

    def __init__(self, prefix: Sequence[str] | None) -> None:
        self.prefix = tuple(prefix) if prefix is not None else None

    @classmethod
    async def probe(cls) -> Sandbox:
        for prefix in candidates():
            if await _works(prefix):
                return cls([*prefix, "--"])
        return cls(None)

    def argv(self, path: Path, cfg: HookConfig) -> tuple[list[str], bool]:
        if cfg.network_policy is NetworkPolicy.DENY and self.prefix is not None:
            return [*self.prefix, str(path)], True
        return [str(path)], False


def candidates() -> list[list[str]]:
    """The ways to isolate a hook this host may allow, best first."""
    unshare = shutil.which("unshare", path=SAFE_PATH)
    if unshare is None:
        return []
    found = [[unshare, "-rn"]]
    setpriv = shutil.which("setpriv", path=SAFE_PATH)
    if os.geteuid() == 0 and setpriv is not None:
        found.append([unshare, "--net", "--", setpriv, "--bounding-set=-all",
                      "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs"])
    return found


async def _works(prefix: Sequence[str]) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec(
            *prefix, "--", "true", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        return await asyncio.wait_for(proc.wait(), 5.0) == 0
    except (OSError, TimeoutError):
        return False


def hook_env(mesh: str, hook: str, event_id: str, socket: Path,
             token: str | None = None, traceparent: str | None = None,
             message_id: str | None = None) -> dict[str, str]:
    """The whole environment of a hook: nothing of the daemon's own is passed on.
    ``traceparent``: the message's W3C trace context, as ``TRACEPARENT`` (the name
    OpenTelemetry's environment carrier reads). ``message_id``: a message's broker id, as
    ``TIDEMESH_MESSAGE_ID``, the same on every host and inbox of the member."""
    env = {"PATH": SAFE_PATH, "TIDEMESH_MESH": mesh, "TIDEMESH_HOOK_NAME": hook,
           "TIDEMESH_EVENT_ID": event_id, "TIDEMESH_DAEMON_SOCK": str(socket)}
    if message_id is not None:
        env["TIDEMESH_MESSAGE_ID"] = message_id
    if token is not None:
        env["TIDEMESH_CAPABILITY_TOKEN"] = token
    if traceparent is not None:
        env["TRACEPARENT"] = traceparent
    return env


class _Capture:
    """A pipe read to its end, keeping the first (or last) ``keep`` bytes and counting all;
    what was read stays here when the reading is cut short."""

    def __init__(self, keep: int, tail: bool = False) -> None:
        self.keep, self.tail = keep, tail
        self.kept = bytearray()
        self.total = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_CHUNK):
            self.total += len(chunk)
            self.kept += chunk
            if len(self.kept) > self.keep:
                self.kept = self.kept[-self.keep:] if self.tail else self.kept[:self.keep]


class _Pipes:
    """The hook's pipes on the event loop: the event written to stdin (which is then
    closed), stdout and stderr read into their captures."""

    def __init__(self, proc: subprocess.Popen[bytes], out: _Capture, err: _Capture) -> None:
        self.proc, self.out, self.err = proc, out, err
        self.handed: list[IO[bytes]] = []   # pipes a transport owns (and closes)
        self.readers: list[asyncio.BaseTransport] = []
        self.writer: asyncio.WriteTransport | None = None
        self.reading: list[asyncio.Task[None]] = []

    async def open(self, stdin: bytes) -> None:
        loop = asyncio.get_running_loop()
        proc = self.proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        for capture, pipe in ((self.out, proc.stdout), (self.err, proc.stderr)):
            stream = asyncio.StreamReader()
            reader, _ = await loop.connect_read_pipe(
                lambda s=stream: asyncio.StreamReaderProtocol(s), pipe)  # type: ignore[misc]
            self.handed.append(pipe)
            self.readers.append(reader)
            self.reading.append(loop.create_task(capture.read(stream)))
        made, _ = await loop.connect_write_pipe(asyncio.Protocol, proc.stdin)
        self.handed.append(proc.stdin)
        # A hook need not read its stdin: what the pipe does not take waits in the
        # transport's buffer, and goes with the run.
        self.writer = made
        self.writer.write(stdin)
        self.writer.close()

    async def read_out(self, bound_s: float) -> None:
        """Output to EOF, for at most ``bound_s``."""
        if self.reading:
            await asyncio.wait(self.reading, timeout=bound_s)

    def close(self) -> None:
        for task in self.reading:
            task.cancel()
        for transport in self.readers:
            transport.close()
        if self.writer is not None and self.writer.get_write_buffer_size():
            self.writer.abort()  # the event the hook did not read
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and pipe not in self.handed:
                pipe.close()


def _exited(proc: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """The hook's exit status, from a thread that waits for it: not the event loop's child
    watcher, which uvloop has only for processes it spawned itself."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def settle(code: int) -> None:
        if not done.done():
            done.set_result(code)

    def wait() -> None:
        code = proc.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed first (process exit)
            loop.call_soon_threadsafe(settle, code)

    threading.Thread(target=wait, name=f"hook-wait-{proc.pid}", daemon=True).start()
    return done


def _signal(proc: subprocess.Popen[bytes], sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


async def _end(proc: subprocess.Popen[bytes], exited: asyncio.Future[int], group: bool,
               grace_s: float) -> None:
    """SIGTERM, a grace, then SIGKILL; to the whole group unless the hook opted out."""
    _signal(proc, signal.SIGTERM, group)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(exited), grace_s)
    _signal(proc, signal.SIGKILL, group)
    await asyncio.shield(exited)


def _spawn(argv: list[str], env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    # subprocess, not the loop's subprocess_exec: uvloop ignores close_fds and leaves the
    # hook extra inheritable copies of its pipes, so a background child that redirected its
    # own stdio still held them. close_fds=True leaves the hook its fds 0-2 and nothing else.
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(env), cwd=cwd,
                            close_fds=True, start_new_session=True)


async def run_hook(path: Path, cfg: HookConfig, stdin: bytes, env: Mapping[str, str],
                   sandbox: Sandbox, grace_s: float = KILL_GRACE_S) -> RunResult:
    """Run one hook to its end or its timeout; never raises for the hook's own failures.

    The run ends when the hook process exits: its output is read to EOF, or for at most
    ``OUTPUT_AFTER_EXIT_S`` more when a child it left running still holds the pipes."""
    argv, isolated = sandbox.argv(path, cfg)
    started = time.monotonic()
    try:
        proc = _spawn(argv, env, path.parent)
    except OSError as exc:
        return RunResult(None, False, b"", 0, b"", time.monotonic() - started, isolated,
                         error=f"could not start: {exc.strerror or exc}")
    exited = _exited(proc)
    out, err = _Capture(cfg.output_size_limit), _Capture(_STDERR_KEEP, tail=True)
    pipes = _Pipes(proc, out, err)
    timed_out = False
    try:
        await pipes.open(stdin)
        try:
            async with asyncio.timeout(cfg.timeout_s):
                await asyncio.shield(exited)
        except TimeoutError:
            timed_out = True
            await _end(proc, exited, cfg.killpg_on_timeout, grace_s)
        await pipes.read_out(OUTPUT_AFTER_EXIT_S)
    finally:
        if proc.returncode is None:  # cancelled (daemon stopping): leave nothing running
            _signal(proc, signal.SIGKILL, True)
        pipes.close()
    return RunResult(None if timed_out else proc.returncode, timed_out, bytes(out.kept),
                     out.total, bytes(err.kept), time.monotonic() - started, isolated,
                     stderr_bytes=err.total)
