"""What ``network_policy = "deny"`` holds (issue #31, item 8): a hook in its own network
namespace cannot join the daemon's with ``nsenter`` (it keeps no privilege that allows
``setns``), even when the daemon runs as root, and reaches no TCP listener of the host."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.daemon.test_hooks_service import script
from tidemesh.core.hooks import HookConfig, NetworkPolicy
from tidemesh.daemon.hooks.runner import Sandbox, candidates, hook_env, run_hook


def _root_with_nsenter() -> None:
    if os.geteuid() != 0:
        unavailable("the escape this guards against needs a daemon running as root")
    if shutil.which("nsenter", path="/usr/bin:/bin") is None:
        unavailable("nsenter (util-linux) is not installed")


@pytest.mark.parametrize("way", ["chosen", "user_namespace", "capabilities_dropped"])
async def test_a_denied_hook_cannot_enter_the_daemons_network_namespace(
        short_tmp: Path, way: str) -> None:
    _root_with_nsenter()
    if way == "chosen":
        sandbox = await Sandbox.probe()
    else:
        ways = {"-rn" in c: c for c in candidates()}
        if (way == "user_namespace") not in ways:
            unavailable(f"this host has no way to isolate a hook by {way}")
        sandbox = Sandbox([*ways[way == "user_namespace"], "--"])
    if sandbox.prefix is None:
        unavailable("this host allows no network namespace for hooks")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen = f"grep -qi ':{port:04X} ' /proc/net/tcp"   # the listener, as the kernel lists it
    path = script(short_tmp, "on-message",
                  f"nsenter --net=/proc/$PPID/ns/net -- {seen} && echo escaped\n"
                  f"{seen} && echo sees-the-host\necho done")
    try:
        result = await run_hook(path, HookConfig("on-message", timeout_s=20,
                                                 network_policy=NetworkPolicy.DENY),
                                b"{}", hook_env("t", "on-message", "e1", short_tmp / "sock"),
                                sandbox)
    finally:
        listener.close()
    assert result.isolated and result.ok, result.describe()
    assert result.stdout == b"done\n", result.stdout
