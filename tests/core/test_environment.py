"""The environment detector and its defaults (spec §16), over given variables and files."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tidemesh.core.environment import (
    CI,
    CONTAINER,
    HOST,
    WARN_PERSISTENT_IN_CI,
    Detected,
    detect,
    settle,
)

NOTHING: dict[str, str] = {}


def files() -> Callable[[str], str | None]:
    """A reader of a root with no marker file."""
    return {}.get


def test_a_bare_host_is_a_host() -> None:
    got = detect("auto", {"CI": "false", "HOME": "/home/x"}, files())
    assert got.kind == HOST


@pytest.mark.parametrize("environ", [{"CI": "true"}, {"GITHUB_ACTIONS": "true"},
                                     {"GITLAB_CI": "yes"}, {"JENKINS_URL": "http://j"}])
def test_ci_variables_make_ci(environ: dict[str, str]) -> None:
    got = detect("auto", environ, files())
    assert got == Detected(CI, f"CI variable {next(iter(environ))}")


def test_false_ci_values_are_not_ci() -> None:
    assert detect("auto", {"CI": "0", "BUILDKITE": "false"}, files()).kind == HOST


@pytest.mark.parametrize(("environ", "read", "reason"), [
    ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, files(), "KUBERNETES_SERVICE_HOST"),
    ({}, {"/.dockerenv": ""}.get, "/.dockerenv"),
    ({}, {"/run/.containerenv": "engine=podman"}.get, "/run/.containerenv"),
    ({}, {"/proc/1/cgroup": "12:pids:/kubepods/besteffort/pod1/abc\n"}.get, "/proc/1/cgroup"),
    ({}, {"/proc/1/cgroup": "4:memory:/docker/0123abcd\n"}.get, "/proc/1/cgroup"),
])
def test_container_markers(environ: dict[str, str], read: Callable[[str], str | None],
                           reason: str) -> None:
    assert detect("auto", environ, read) == Detected(CONTAINER, reason)


def test_a_plain_cgroup_is_no_container() -> None:
    read = {"/proc/1/cgroup": "0::/\n1:cpu:/\n"}.get
    assert detect("auto", NOTHING, read).kind == HOST


def test_ci_wins_over_a_container() -> None:
    assert detect("auto", {"CI": "true"}, {"/.dockerenv": ""}.get).kind == CI


def test_the_setting_pins_the_kind_whatever_is_found() -> None:
    assert detect("host", {"CI": "true"}, {"/.dockerenv": ""}.get) == \
        Detected(HOST, "environment.kind")
    assert detect("container", NOTHING, files()).kind == CONTAINER


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match=r"environment\.kind"):
        detect("laptop", NOTHING, files())


UNSET = {"ipc.tcp_enabled": None, "hooks.enabled": None, "identity.persistent": None}


def test_each_environment_has_the_defaults_of_the_table() -> None:
    host = settle(Detected(HOST, "x"), UNSET)
    assert (host.tcp_enabled, host.hooks_enabled, host.persistent, host.changed) == \
        (True, True, True, ())
    box = settle(Detected(CONTAINER, "x"), UNSET)
    assert (box.tcp_enabled, box.hooks_enabled, box.persistent, box.changed) == \
        (False, True, True, ("ipc.tcp_enabled",))
    ci = settle(Detected(CI, "x"), UNSET)
    assert (ci.tcp_enabled, ci.hooks_enabled, ci.persistent) == (False, False, False)
    assert ci.changed == ("ipc.tcp_enabled", "hooks.enabled", "identity.persistent")
    assert ci.warnings == ()


def test_a_setting_given_explicitly_wins_and_is_not_counted_as_changed() -> None:
    got = settle(Detected(CONTAINER, "x"), {**UNSET, "ipc.tcp_enabled": True})
    assert got.tcp_enabled is True and got.changed == ()
    ci = settle(Detected(CI, "x"), {**UNSET, "hooks.enabled": True})
    assert ci.hooks_enabled is True and "hooks.enabled" not in ci.changed


def test_a_persistent_key_asked_for_in_ci_warns() -> None:
    got = settle(Detected(CI, "x"), {**UNSET, "identity.persistent": True})
    assert got.persistent is True
    assert got.warnings == (WARN_PERSISTENT_IN_CI,)
    # Elsewhere asking for it is just the default.
    assert settle(Detected(HOST, "x"), {**UNSET, "identity.persistent": True}).warnings == ()


def test_the_view_says_what_health_shows() -> None:
    view = settle(Detected(CI, "CI variable CI"), UNSET).view()
    assert view == {"kind": "ci", "reason": "CI variable CI", "tcp_enabled": False,
                    "hooks_enabled": False, "persistent_keypair": False,
                    "changed": ["ipc.tcp_enabled", "hooks.enabled", "identity.persistent"]}
