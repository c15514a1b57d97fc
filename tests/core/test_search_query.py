"""The FTS5 expression of an inbox search: the query kept to the text column, the filters as
index phrases, and no way for a query to close the text column's parenthesis."""

from __future__ import annotations

import pytest

from tidemesh.core import search_query
from tidemesh.core.errors import InvalidRequest
from tidemesh.core.search_query import expression


def test_the_query_is_kept_to_the_text_column() -> None:
    assert expression("disk OR db*", None, None) == "text : (disk OR db*)"


def test_filters_become_phrases_of_their_columns_with_quotes_doubled() -> None:
    assert expression("disk", "ops.alerts", "ab" * 32) == (
        f'text : (disk) AND topic : "ops.alerts" AND sender : "{"ab" * 32}"')
    assert expression("x", 'a"b', None) == 'text : (x) AND topic : "a""b"'


def test_a_filter_the_index_cannot_read_is_left_to_the_sql() -> None:
    assert expression("x", "...", "é") == "text : (x)"


@pytest.mark.parametrize("q", ["x) OR (y", ")", "a) OR sender : (b"])
def test_a_parenthesis_closing_what_q_did_not_open_is_refused(q: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        expression(q, None, None)
    assert err.value.details == {"field": "q"}


@pytest.mark.parametrize("q", ['"a)"', "(a OR b) c", '"say ""hi)"""'])
def test_parentheses_inside_strings_or_balanced_are_fine(q: str) -> None:
    assert expression(q, None, None) == f"text : ({q})"


def test_an_error_at_the_end_of_the_query_names_the_last_word_typed() -> None:
    assert search_query.user_words('fts5: syntax error near ""', "disk AND") == \
        'fts5: syntax error near "AND"'
    assert search_query.user_words('fts5: syntax error near "OR"', "a OR OR b") == \
        'fts5: syntax error near "OR"'
