"""core/jsonbounds: the size and depth of every parse."""

from __future__ import annotations

import pytest

from tidemesh.core import jsonbounds
from tidemesh.core.jsonbounds import TooDeep, TooLarge, deeper_than, loads


def _nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


def test_depth_counts_containers() -> None:
    assert [deeper_than(v, 0) for v in (1, "x", None, {}, [1])] == [False] * 3 + [True] * 2
    assert not deeper_than({"a": [1, {"b": []}]}, 4)
    assert deeper_than({"a": [1, {"b": []}]}, 3)


@pytest.mark.parametrize("text", [_nested(64), "[" * 64 + "]" * 64])
def test_the_limit_itself_parses_and_one_more_level_does_not(text: str) -> None:
    assert loads(text, max_bytes=10_000) is not None
    with pytest.raises(TooDeep):
        loads("[" + text + "]", max_bytes=10_000)
    with pytest.raises(TooDeep):
        loads(("[" + text + "]").encode(), max_bytes=10_000)


def test_brackets_inside_strings_do_not_count_as_depth() -> None:
    assert loads('{"a": "' + "[{" * 500 + '"}', max_bytes=10_000) == {"a": "[{" * 500}


def test_the_size_is_checked_first() -> None:
    with pytest.raises(TooLarge):
        loads(b"[" * 100, max_bytes=99)


def test_meta_fits_inside_every_frame_that_wraps_it() -> None:
    # deliver_batch > deliveries > deliver > meta: four levels over the meta's own.
    assert jsonbounds.META_DEPTH + 4 <= jsonbounds.MAX_DEPTH
