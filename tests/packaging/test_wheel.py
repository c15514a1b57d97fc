"""The wheel holds every module and data file once, under ``tidemesh/``, and nothing else.

It is built from a copy of the checkout made the way git writes one without symlink support
(a symlink becomes a small file holding its target), so the layout cannot depend on links.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAPPING: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))[
    "tool"]["setuptools"]["package-dir"]


def _checkout_without_symlinks(target: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source, copy = REPO / name, target / name
        if not source.is_symlink() and not source.is_file():
            continue  # deleted in the working tree, not yet committed
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.write_text(os.readlink(source))
        else:
            copy.write_bytes(source.read_bytes())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The file names in a wheel built offline from the checkout."""
    root = tmp_path_factory.mktemp("wheel")
    _checkout_without_symlinks(root / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--wheel-dir", str(root / "dist"), str(root / "src")],
        check=True, capture_output=True, timeout=300)
    (built,) = (root / "dist").glob("tidemesh-*.whl")
    with zipfile.ZipFile(built) as zf:
        return zf.namelist()


def _expected(suffixes: tuple[str, ...]) -> set[str]:
    names = set()
    for package, folder in MAPPING.items():
        source = REPO / folder
        for path in source.rglob("*"):
            if path.suffix in suffixes and "__pycache__" not in path.parts:
                names.add(f"{package.replace('.', '/')}/{path.relative_to(source).as_posix()}")
    return names


def test_wheel_has_every_module_of_every_package(wheel: list[str]) -> None:
    modules = _expected((".py",))
    assert {"tidemesh/core/accept.py", "tidemesh/daemon/link/relay.py", "tidemesh/broker/server.py",
            "tidemesh/cli/main.py", "tidemesh/spark/jobs/orphan_audit.py"} <= modules
    assert modules - set(wheel) == set()


def test_wheel_has_the_schemas_migrations_and_type_marker(wheel: list[str]) -> None:
    data = _expected((".json", ".sql"))
    assert "tidemesh/schemas/openapi.json" in data
    assert any(n.startswith("tidemesh/migrations/broker/postgres/") for n in data)
    assert data - set(wheel) == set()
    assert "tidemesh/py.typed" in wheel


def test_wheel_holds_only_tidemesh_each_file_once_and_no_tests(wheel: list[str]) -> None:
    assert [n for n, count in Counter(wheel).items() if count > 1] == []
    assert [n for n in wheel if not n.startswith("tidemesh/") and not (
        n.startswith("tidemesh-") and ".dist-info/" in n)] == []
    assert [n for n in wheel if "/tests/" in n or Path(n).name.startswith("test_")
            or "conftest" in n] == []
    packaged = {n for n in wheel if n.startswith("tidemesh/")}
    assert packaged == _expected((".py", ".json", ".sql")) | {"tidemesh/py.typed"}
