"""Array literals round-trip through a real PostgreSQL server unchanged: any text (quotes,
backslashes, braces, commas, spaces, control characters, non-ASCII, the word NULL), NULLs,
empty strings, and 64-bit integers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemesh.storage.pgarray import int_array, text_array

# PostgreSQL text holds any character but NUL, and no lone surrogates (not UTF-8).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))


@pytest.fixture
async def conn(pg_dsn: str) -> AsyncIterator[Any]:
    c = await asyncpg.connect(pg_dsn)
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.parametrize("values", [
    [], ["a"], [None], [""], ["NULL", "null", None], ['"', "\\", "{}", "a,b", " x ", "\\\""],
    ["line\nbreak", "tab\t", "\x01", "é", "😀", "\u2028\u2029\x7f</\ufeff"],
])
async def test_edge_cases_come_back_as_they_went(conn: Any, values: list[str | None]) -> None:
    assert await conn.fetchval("SELECT $1::text::text[]", text_array(values)) == values


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), TEXT), max_size=20))
async def test_any_text_comes_back_as_it_went(conn: Any, values: list[str | None]) -> None:
    assert await conn.fetchval("SELECT $1::text::text[]", text_array(values)) == values


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=20))
async def test_any_bigint_comes_back_as_it_went(conn: Any, values: list[int | None]) -> None:
    assert await conn.fetchval("SELECT $1::text::bigint[]", int_array(values)) == values
