"""The console in a real browser: headless Chromium (Debian's ``chromium``) follows the login
link, keeps the token in its cookie, renders the page with members connected, and leaves a
screenshot as a test artefact. Skipped without Chromium, failed in CI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.broker.test_console import _token, console_mesh  # noqa: F401 - the fixture
from tests.conftest import unavailable
from tests.e2e.harness import Mesh, two_on_topic

ARTEFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artefacts"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if (found := shutil.which(name)) is not None:
            return found
    unavailable("Chromium is not installed (Debian: apt-get install chromium)")
    raise AssertionError("unreachable")


def _browse(chromium: str, profile: Path, *args: str) -> str:
    res = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", f"--user-data-dir={profile}", *args],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


async def test_login_link_opens_the_page_in_chromium(console_mesh: Mesh,  # noqa: F811
                                                      short_tmp: Path) -> None:
    chromium = _chromium()
    await two_on_topic(console_mesh, short_tmp)
    port = console_mesh.broker.port
    base = f"http://127.0.0.1:{port}/console"
    profile = short_tmp / "chromium"

    # Without the token the browser gets the refusal, not the page.
    assert "unauthorized" in _browse(chromium, profile, "--dump-dom", base)

    token = _token(console_mesh.broker.home)
    dom = _browse(chromium, profile, "--dump-dom", f"{base}?token={token}")
    assert '<b id="connected">2</b>' in dom
    assert "team" in dom and token not in dom

    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTEFACTS / "console-overview.png"
    shot.unlink(missing_ok=True)
    _browse(chromium, profile, "--window-size=1280,900", f"--screenshot={shot}",
            f"{base}?token={token}")
    assert shot.stat().st_size > 0
