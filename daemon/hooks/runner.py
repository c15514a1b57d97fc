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
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from tidemesh.core.hooks import HookConfig, NetworkPolicy

log = structlog.get_logger(__name__)

KILL_GRACE_S = 5.0
SAFE_PATH = "/usr/bin:/bin"
_CHUNK = 65536
_STDERR_KEEP = 2048


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
    once at start: ``unshare --net`` as root, else ``unshare -rn``; None when the host
    allows neither (the hook then runs anyway and the service says so)."""

    def __init__(self, prefix: Sequence[str] | None) -> None:
        self.prefix = tuple(prefix) if prefix is not None else None

    @classmethod
    async def probe(cls) -> Sandbox:
        unshare = shutil.which("unshare", path=SAFE_PATH)
        if unshare is None:
            return cls(None)
        prefix = [unshare, "--net"] if os.geteuid() == 0 else [unshare, "-rn"]
        try:
            proc = await asyncio.create_subprocess_exec(
                *prefix, "true", stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            ok = await asyncio.wait_for(proc.wait(), 5.0) == 0
        except (OSError, TimeoutError):
            ok = False
        return cls([*prefix, "--"] if ok else None)

    def argv(self, path: Path, cfg: HookConfig) -> tuple[list[str], bool]:
        if cfg.network_policy is NetworkPolicy.DENY and self.prefix is not None:
            return [*self.prefix, str(path)], True
        return [str(path)], False


def hook_env(mesh: str, hook: str, event_id: str, socket: Path,
             token: str | None = None) -> dict[str, str]:
    """The whole environment of a hook: nothing of the daemon's own is passed on."""
    env = {"PATH": SAFE_PATH, "TIDEMESH_MESH": mesh, "TIDEMESH_HOOK_NAME": hook,
           "TIDEMESH_EVENT_ID": event_id, "TIDEMESH_DAEMON_SOCK": str(socket)}
    if token is not None:
        env["TIDEMESH_CAPABILITY_TOKEN"] = token
    return env


async def _read_capped(stream: asyncio.StreamReader, keep: int, tail: bool = False
                       ) -> tuple[bytes, int]:
    kept = bytearray()
    total = 0
    while chunk := await stream.read(_CHUNK):
        total += len(chunk)
        kept += chunk
        if len(kept) > keep:
            kept = kept[-keep:] if tail else kept[:keep]
    return bytes(kept), total


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    # A hook need not read its stdin; its going away is not an error (uvloop says so with a
    # RuntimeError on the closed transport).
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, RuntimeError):
        if not proc.stdin.is_closing():
            proc.stdin.write(data)
            await proc.stdin.drain()
    proc.stdin.close()


def _signal(proc: asyncio.subprocess.Process, sig: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)


async def _end(proc: asyncio.subprocess.Process, group: bool, grace_s: float) -> None:
    """SIGTERM, a grace, then SIGKILL; to the whole group unless the hook opted out."""
    _signal(proc, signal.SIGTERM, group)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), grace_s)
    _signal(proc, signal.SIGKILL, group)
    await proc.wait()


async def run_hook(path: Path, cfg: HookConfig, stdin: bytes, env: Mapping[str, str],
                   sandbox: Sandbox, grace_s: float = KILL_GRACE_S) -> RunResult:
    """Run one hook to its end or its timeout; never raises for the hook's own failures."""
    argv, isolated = sandbox.argv(path, cfg)
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=path.parent,
            start_new_session=True)
    except OSError as exc:
        return RunResult(None, False, b"", 0, b"", time.monotonic() - started, isolated,
                         error=f"could not start: {exc.strerror or exc}")
    assert proc.stdout is not None
    assert proc.stderr is not None
    out = asyncio.ensure_future(_read_capped(proc.stdout, cfg.output_size_limit))
    err = asyncio.ensure_future(_read_capped(proc.stderr, _STDERR_KEEP, tail=True))
    timed_out = False
    try:
        async with asyncio.timeout(cfg.timeout_s):
            await _feed(proc, stdin)
            await asyncio.gather(proc.wait(), out, err)
    except TimeoutError:
        timed_out = True
        await _end(proc, cfg.killpg_on_timeout, grace_s)
    finally:
        if proc.returncode is None:  # cancelled (daemon stopping): leave nothing running
            _signal(proc, signal.SIGKILL, True)
            with contextlib.suppress(ProcessLookupError):
                await proc.wait()
        for task in (out, err):
            if not task.done():
                task.cancel()
    stdout, stdout_bytes = out.result() if out.done() and not out.cancelled() else (b"", 0)
    tail, stderr_bytes = err.result() if err.done() and not err.cancelled() else (b"", 0)
    return RunResult(None if timed_out else proc.returncode, timed_out, stdout, stdout_bytes,
                     tail, time.monotonic() - started, isolated, stderr_bytes=stderr_bytes)
