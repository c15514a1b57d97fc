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


BOUNDED = (Setting("ipc.max_inflight", int, 256, "n", bounds=(1, 1000)),
           Setting("ipc.rate_per_s", float, 1.0, "r", bounds=(0, 1e9)),
           Setting("ipc.keepalive_s", float, 1.0, "k"))


@pytest.mark.parametrize(("env", "raw"), [
    ({"TIDEMESH_IPC_MAX_INFLIGHT": "-5"}, "'-5'"), ({"TIDEMESH_IPC_MAX_INFLIGHT": "0"}, "'0'"),
    ({"TIDEMESH_IPC_MAX_INFLIGHT": "1001"}, "'1001'"),
    ({"TIDEMESH_IPC_RATE_PER_S": "nan"}, "'nan'"), ({"TIDEMESH_IPC_RATE_PER_S": "-1"}, "'-1'"),
    ({"TIDEMESH_IPC_KEEPALIVE_S": "inf"}, "'inf'"),
])
def test_a_number_outside_its_range_is_refused_naming_the_setting(
    env: dict[str, str], raw: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(BOUNDED, {}, env, {})
    assert raw in err.value.message and err.value.details["field"] in err.value.message


def test_a_number_within_its_range_and_huge_ints_from_the_file() -> None:
    got = resolve(BOUNDED, {"ipc": {"max_inflight": 1000, "rate_per_s": 0}}, {}, {})
    assert (got["ipc.max_inflight"].value, got["ipc.rate_per_s"].value) == (1000, 0)
    with pytest.raises(ConfigError, match="must be 1 to 1000"):
        resolve(BOUNDED, {"ipc": {"max_inflight": 10 ** 22}}, {}, {})

