from __future__ import annotations

import re
from pathlib import Path

import pytest

from tidemesh.core.agents import check_session_name
from tidemesh.core.errors import InvalidName
from tidemesh.core.invite import Invite, decode
from tidemesh.core.paths import MeshNotChosen, check_name, choose_mesh, daemon_paths, meshes_dir


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


GOOD = ["default", "m", "team-a", "ops.eu_1", "A" * 64, "0x"]
BAD = ["", ".", "..", "../x", "../../../x", "/abs/path", "a/b", "a\\b", ".hidden", "-flag",
       "_x", "sp ace", "tab\t", "nl\n", "x" * 65, "é", "a:b", "a\x00b"]


@pytest.mark.parametrize("name", GOOD)
def test_a_good_name_builds_paths_inside_the_home(name: str) -> None:
    assert check_name(name) == name
    p = daemon_paths(name, {"TIDEMESH_HOME": "/h"})
    assert p.data_dir == Path("/h/daemon") / name and p.data_dir.parent == Path("/h/daemon")


@pytest.mark.parametrize("name", BAD)
def test_a_bad_name_builds_no_path_and_is_named(name: str) -> None:
    for make in (lambda: daemon_paths(name, {"TIDEMESH_HOME": "/h"}),
                 lambda: daemon_paths(name, {"HOME": "/u"}),
                 lambda: choose_mesh(name, []) if name else check_name(name)):
        with pytest.raises(InvalidName) as raised:
            make()
        assert raised.value.details["name"] == name and repr(name) in raised.value.message


def test_a_session_name_keeps_to_the_same_pattern() -> None:
    assert check_session_name("alpha.1") == "alpha.1"
    with pytest.raises(InvalidName) as raised:
        check_session_name("../x")
    assert raised.value.details["field"] == "session"


def test_an_invite_with_a_bad_mesh_name_is_refused_when_decoded() -> None:
    good = Invite("ws://b:1", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "team", "tok")
    assert decode(good.encode()) == good
    for name in ("../../../x", "/etc", ".."):
        with pytest.raises(InvalidName, match=re.escape(repr(name))):
            decode(Invite(good.url, good.mesh_id, name, good.token).encode())
