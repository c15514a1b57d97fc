"""Version ranges and the compatibility verdict (spec §15.4; core/compat.py, pure)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tidemesh.core import compat

# The cases the TypeScript and Go SDKs' own checks answer too (sdk/conformance/compat.json).
VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "sdk" / "conformance" / "compat.json").read_text())


@pytest.mark.parametrize(("range_", "version", "expected"), [
    (">=0.1.0,<0.2.0", "0.1.0", True),
    (">=0.1.0,<0.2.0", "0.1.9", True),
    (">=0.1.0,<0.2.0", "0.2.0", False),
    (">=0.1.0,<0.2.0", "0.0.9", False),
    (">=0.1.0,<0.2.0", "0.1.3.dev2", True),   # a suffix is ignored
    ("0.9.x", "0.9.4", True),
    ("0.9.x", "0.10.0", False),
    ("*", "3.1.4", True),
    ("==1.2", "1.2.0", True),
    (">1.2.0", "1.2.0", False),
    ("<=1.2.0", "1.2.0", True),
    (">=0.1.0", "not a version", False),
    ("~1.2", "1.2.0", False),                  # a clause not understood fits nothing
    ("", "1.0.0", False),
])
def test_fits(range_: str, version: str, expected: bool) -> None:
    assert compat.fits(range_, version) is expected


def test_this_release_fits_its_own_ranges() -> None:
    import tidemesh
    doc = compat.document(tidemesh.__version__, None)
    for client in ("cli", *compat.COMPATIBLE_SDKS):
        assert compat.misfit(doc, client, tidemesh.__version__) is None, client
    assert compat.fits(compat.COMPATIBLE_BROKERS, tidemesh.__version__)
    assert doc["broker"] == {"version": None, "fits": None}
    assert "client_message_id_dedupe" in doc["required_broker_features"]


def test_another_ipc_api_major_or_a_version_out_of_range_is_a_misfit() -> None:
    doc = compat.document("0.1.0", "0.1.2")
    assert doc["broker"]["fits"] is True
    assert compat.misfit({**doc, "ipc_api": "v1.3"}, "python", "0.1.0") is None  # a minor
    kind, message = compat.misfit({**doc, "ipc_api": "v2"}, "cli", "0.1.0") or ("", "")
    assert kind == "ipc_api" and "v2" in message and "v1" in message
    kind, message = compat.misfit(doc, "python", "0.2.0") or ("", "")
    assert kind == "version" and ">=0.1.0,<0.2.0" in message and "0.2.0" in message
    # A daemon that publishes no range for a client (an old one, or a new SDK language).
    assert compat.misfit({"daemon": "0.1.0", "ipc_api": "v1"}, "rust", "7.0.0") is None
    assert compat.api_major("v1") == 1 and compat.api_major("1") is None


@pytest.mark.parametrize("case", VECTORS["fits"], ids=lambda c: f"{c['range']}~{c['version']}")
def test_fits_as_every_sdk_does(case: dict[str, Any]) -> None:
    assert compat.fits(case["range"], case["version"]) is case["fits"]


@pytest.mark.parametrize(("doc", "case"), [
    (group["doc"], case) for group in VECTORS["misfit"] for case in group["cases"]],
    ids=lambda v: f"{v.get('client')}@{v.get('version')}" if "client" in v else v["daemon"])
def test_misfit_as_every_sdk_does(doc: dict[str, Any], case: dict[str, Any]) -> None:
    why = compat.misfit(doc, case["client"], case["version"])
    assert (why[0] if why else None) == case["misfit"]
