"""The installed layout of tidemesh, rebuilt from the source tree for tools that find modules
by folder name (mypy, import-linter) and so cannot follow setuptools' ``package-dir``."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path


def package_dirs(repo: Path) -> dict[str, str]:
    """Installed folder (``tidemesh/daemon``) -> source folder (``daemon``)."""
    config = tomllib.loads((repo / "pyproject.toml").read_text("utf-8"))
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return {name.replace(".", "/"): folder for name, folder in mapping.items()}


def assemble(repo: Path, tree: Path, dirs: dict[str, str]) -> None:
    """Copy every Python file of ``repo`` into ``tree`` as the wheel lays them out."""
    shutil.rmtree(tree, ignore_errors=True)
    for installed, folder in dirs.items():
        source = repo / folder
        for path in source.rglob("*"):
            if path.suffix in (".py", ".typed") and "__pycache__" not in path.parts:
                target = tree / installed / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)  # keeps mtimes, so mypy's cache stays valid
