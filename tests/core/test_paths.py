from __future__ import annotations

from pathlib import Path

import pytest

from tidemesh.core.paths import MeshNotChosen, choose_mesh, daemon_paths, meshes_dir


def test_asked_mesh_wins_over_what_is_joined() -> None:
    assert choose_mesh("team", ["a", "b"]) == "team"


def test_the_only_joined_mesh_is_the_default() -> None:
    assert choose_mesh(None, ["team"]) == "team"


def test_nothing_joined_or_default_joined_means_default() -> None:
    assert choose_mesh(None, []) == "default"
    assert choose_mesh(None, ["default", "team"]) == "default"


def test_several_joined_and_none_asked_names_them() -> None:
    with pytest.raises(MeshNotChosen, match=r"several meshes are joined \(a, b\)"):
        choose_mesh(None, ["b", "a"])


@pytest.mark.parametrize("env", [{"TIDEMESH_HOME": "/h"},
                                 {"HOME": "/u", "XDG_DATA_HOME": "/d"}])
def test_meshes_dir_is_the_parent_of_each_mesh_data_folder(env: dict[str, str]) -> None:
    assert daemon_paths("team", env).data_dir.parent == meshes_dir(env)
    assert isinstance(meshes_dir(env), Path)
