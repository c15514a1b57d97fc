"""``make importcheck``: the import contracts of pyproject.toml ([tool.importlinter]), checked
by import-linter over tidemesh as it installs (see layout.py for why it is assembled first).

    python scripts/importcheck.py [--repo DIR]     exit 0 when every contract holds
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from layout import assemble, package_dirs


def check(repo: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="tm-imports-") as tmp:
        tree = Path(tmp)
        assemble(repo, tree, package_dirs(repo))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        lint = Path(sys.executable).with_name("lint-imports")
        proc = subprocess.run(
            [str(lint), "--config", str(repo / "pyproject.toml"), "--no-cache", "--no-logo"],
            cwd=tree, env=env, check=False)
        return proc.returncode


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    return check(ap.parse_args().repo.resolve())


if __name__ == "__main__":
    sys.exit(main())
