"""Settings resolve flag > environment > file > default, and typos fail loudly."""

from __future__ import annotations

import pytest

from tidemesh.core.settings import ConfigError, Setting, resolve

TABLE = (
    Setting("ipc.http_port", int, 0, "port"),
    Setting("ipc.tcp_enabled", bool, True, "tcp"),
    Setting("outbox.override", int, None, "opt", optional=True),
)


def test_precedence_flag_env_file_default() -> None:
    file = {"ipc": {"http_port": 1, "tcp_enabled": False}}
    env = {"TIDEMESH_IPC_HTTP_PORT": "2"}
    got = resolve(TABLE, file, env, {"ipc.http_port": 3})
    assert (got["ipc.http_port"].value, got["ipc.http_port"].source) == (3, "flag")
    got = resolve(TABLE, file, env, {})
    assert (got["ipc.http_port"].value, got["ipc.http_port"].source) == (2, "env")
    assert (got["ipc.tcp_enabled"].value, got["ipc.tcp_enabled"].source) == (False, "file")
    assert resolve(TABLE, {}, {}, {})["outbox.override"].value is None


def test_unknown_key_in_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"ipc\.htp_port"):
        resolve(TABLE, {"ipc": {"htp_port": 1}}, {}, {})


def test_bad_values_name_the_setting_and_source() -> None:
    with pytest.raises(ConfigError, match="TIDEMESH_IPC_TCP_ENABLED"):
        resolve(TABLE, {}, {"TIDEMESH_IPC_TCP_ENABLED": "maybe"}, {})
