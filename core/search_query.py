"""The FTS5 expression an inbox search runs (pure): the caller's query, kept to the text
column, and the page's topic and sender filters as index terms, so that the index intersects
them with the words instead of the inbox checking every match afterwards."""

from __future__ import annotations

from tidemesh.core.errors import InvalidRequest


def expression(q: str, topic: str | None, sender: str | None) -> str:
    """``text : (q)``, ANDed with a phrase per filter the index can read.

    The filters stay in the SQL too: here they only narrow the walk, so a filter value the
    tokenizer reads differently from SQL equality (``ops.alerts`` is the phrase "ops alerts")
    widens the candidates and never the answer."""
    _check_parentheses(q)
    parts = [f"text : ({q})"]
    for column, value in (("topic", topic), ("sender", sender)):
        if value is not None and _indexable(value):
            parts.append(f'{column} : "{value.replace(chr(34), chr(34) * 2)}"')
    return " AND ".join(parts)


def user_words(own_error: str, q: str) -> str:
    """SQLite's words for q parsed on its own, as the user reads them: FTS5 says a query that
    ends too early (``disk AND``) fails near "" (the end of input); the user is shown the last
    thing they typed instead, never the ``)`` of the ``text : (…)`` wrapper."""
    tokens = q.split()
    if own_error.endswith('near ""') and tokens:
        return own_error[:-len('""')] + '"' + tokens[-1].replace('"', '""') + '"'
    return own_error


def _indexable(value: str) -> bool:
    # An ASCII value with a letter or digit is a phrase of at least one token for unicode61;
    # an empty phrase would match nothing at all.
    return value.isascii() and any(ch.isalnum() for ch in value)


def _check_parentheses(q: str) -> None:
    """A ``)`` that closes more than q opened would end ``text : (…)`` early and let the rest
    of q match the other columns; refused as the syntax error it is on its own."""
    depth, quoted = 0, False
    for ch in q:
        if ch == '"':
            quoted = not quoted   # "" inside a string toggles twice: still inside
        elif not quoted and ch in "()":
            depth += 1 if ch == "(" else -1
            if depth < 0:
                raise InvalidRequest("q is not a valid search query (a ')' closes nothing): "
                                     f"{q[:80]!r}", field="q")
