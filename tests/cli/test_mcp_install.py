"""``tidemesh mcp install``: each client's configuration, and .mcp.json merged, not replaced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tidemesh", "mcp", "install", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def test_claude_code_writes_mcp_json_keeping_other_servers(tmp_path: Path) -> None:
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    res = _run(tmp_path, "--client", "claude-code", "--mesh", "team", "--session", "alpha")
    assert res.returncode == 0, res.stderr
    assert "claude mcp add --scope project tidemesh -- tidemesh mcp --mesh team" in res.stdout
    doc = json.loads((tmp_path / ".mcp.json").read_text())
    assert doc["mcpServers"]["other"] == {"command": "x"}
    assert doc["mcpServers"]["tidemesh"]["args"] == ["mcp", "--mesh", "team", "--session",
                                                     "alpha"]


def test_codex_and_json_print_their_forms(tmp_path: Path) -> None:
    codex = _run(tmp_path, "--client", "codex", "--mesh", "team")
    assert codex.returncode == 0, codex.stderr
    table = tomllib.loads(codex.stdout)["mcp_servers"]["tidemesh"]
    assert table == {"command": "tidemesh", "args": ["mcp", "--mesh", "team"]}
    generic = json.loads(_run(tmp_path, "--client", "json", "--mesh", "team").stdout)
    assert generic["mcpServers"]["tidemesh"]["command"] == "tidemesh"
    assert not (tmp_path / ".mcp.json").exists()


def test_a_broken_mcp_json_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / ".mcp.json").write_text("[1, 2]")
    res = _run(tmp_path, "--client", "claude-code", "--mesh", "team")
    assert res.returncode == 1 and "not an MCP configuration" in res.stderr
    assert (tmp_path / ".mcp.json").read_text() == "[1, 2]"


def test_mcp_without_the_sdk_names_the_extra(tmp_path: Path) -> None:
    """As where the [mcp] extra is not installed: importing ``mcp`` fails."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "mcp.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'mcp'\", name='mcp')\n")
    res = subprocess.run([sys.executable, "-m", "tidemesh", "mcp", "--mesh", "team"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "PYTHONPATH": str(shadow)}, stdin=subprocess.DEVNULL)
    assert res.returncode == 1
    assert "pip install 'tidemesh[mcp]'" in res.stderr
