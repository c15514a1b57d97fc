"""``make typecheck``: mypy --strict over every package, as it installs.

mypy finds a module by its folder's name and cannot follow setuptools' ``package-dir``
(``tidemesh.daemon`` is the folder ``daemon/``). This copies the Python files into
``build/typecheck/tidemesh/`` the way the wheel lays them out (mapping from pyproject.toml),
runs mypy there with the project's settings, and prints each error at its source path.

    python scripts/typecheck.py [mypy arguments]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from layout import assemble, package_dirs

REPO = Path(__file__).resolve().parents[1]
TREE = REPO / "build" / "typecheck"


def main() -> int:
    dirs = package_dirs(REPO)
    assemble(REPO, TREE, dirs)
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
