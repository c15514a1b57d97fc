"""``make typecheck``: mypy --strict over every package, as it installs.

mypy finds a module by its folder's name and cannot follow setuptools' ``package-dir``
(``tidemesh.daemon`` is the folder ``daemon/``). This copies the Python files into
``build/typecheck/tidemesh/`` the way the wheel lays them out (mapping from pyproject.toml),
runs mypy there with the project's settings, and prints each error at its source path.

    python scripts/typecheck.py [mypy arguments]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "build" / "typecheck"


def package_dirs() -> dict[str, str]:
    """Installed folder (``tidemesh/daemon``) -> source folder (``daemon``)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return {name.replace(".", "/"): folder for name, folder in mapping.items()}


def assemble(dirs: dict[str, str]) -> None:
    shutil.rmtree(TREE, ignore_errors=True)
    for installed, folder in dirs.items():
        source = REPO / folder
        for path in source.rglob("*"):
            if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                target = TREE / installed / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)  # keeps mtimes, so mypy's cache stays valid


def main() -> int:
    dirs = package_dirs()
    assemble(dirs)
    # Longest first, so tidemesh/daemon/ is rewritten before tidemesh/.
    rewrites = sorted(((f"{i}/", f"{f}/") for i, f in dirs.items()), key=lambda r: -len(r[0]))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(REPO / ".mypy_cache"), *sys.argv[1:]],
        cwd=TREE, capture_output=True, text=True, check=False)
    for line in (proc.stdout + proc.stderr).splitlines():
        for installed, folder in rewrites:
            if line.startswith(installed):
                line = folder + line.removeprefix(installed)
                break
        print(line)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
