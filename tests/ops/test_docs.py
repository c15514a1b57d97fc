"""The operator docs link to files and sections that exist; the command reference is current."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tidemesh.cli.main import cli
from tidemesh.cli.reference import render

DOCS = Path(__file__).resolve().parents[2] / "docs"
OPERATOR_DOCS = ("install.md", "operations.md", "threat-model.md", "configuration.md", "cli.md")
_LINK = re.compile(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)")


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in heads}


@pytest.mark.parametrize("name", OPERATOR_DOCS)
def test_links_point_at_existing_docs_and_sections(name: str) -> None:
    for target, anchor in _LINK.findall((DOCS / name).read_text(encoding="utf-8")):
        assert (DOCS / target).exists(), f"{name} links to missing {target}"
        if anchor:
            assert anchor in _anchors((DOCS / target).read_text(encoding="utf-8")), (
                f"{name} links to {target}#{anchor}, which has no such heading")


def test_cli_reference_is_the_commands_own_help() -> None:
    assert (DOCS / "cli.md").read_text(encoding="utf-8") == render(cli), (
        "docs/cli.md is stale: python -m tidemesh.cli.reference > docs/cli.md")


# Documents that are not in the repository: a reader cannot follow such a reference.
_ABSENT_SPEC = re.compile(r"\b(?:spec|DESIGN|claudemesh)\s*§|§\s*\d", re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(p.name for p in DOCS.glob("*.md")))
def test_docs_cite_no_section_of_a_document_outside_the_repository(name: str) -> None:
    text = (DOCS / name).read_text(encoding="utf-8")
    found = [line for line in text.splitlines() if _ABSENT_SPEC.search(line)]
    assert found == [], f"{name} cites sections of a spec the repository does not hold"
