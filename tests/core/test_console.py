"""The console's refusals and page, without a broker."""

from __future__ import annotations

from tidemesh.core import console

TOKEN = "t0ken"
OK = {"Host": "127.0.0.1:7800", "Authorization": f"Bearer {TOKEN}"}


def test_loopback_host_and_own_origin_with_the_token_pass() -> None:
    assert console.refusal(OK, "/console", TOKEN) is None
    assert console.refusal({**OK, "Host": "[::1]:7800"}, "/console", TOKEN) is None
    assert console.refusal({**OK, "Origin": "http://127.0.0.1:7800"}, "/console", TOKEN) is None


def test_foreign_host_or_origin_is_403_before_the_token() -> None:
    for headers in ({**OK, "Host": "rebound.example:7800"},
                    {"Host": "attacker.example"},
                    {**OK, "Origin": "http://attacker.example"},
                    {**OK, "Origin": "null"}):
        refused = console.refusal(headers, "/console", TOKEN)
        assert refused is not None and refused.status == 403, headers


def test_no_or_wrong_token_is_401() -> None:
    for headers in ({"Host": "localhost:1"}, {"Host": "localhost:1", "Cookie": "a=b"},
                    {"Host": "localhost:1", "Authorization": "Bearer wrong"}):
        refused = console.refusal(headers, "/console", TOKEN)
        assert refused is not None and refused.status == 401
    cookie = {"Host": "localhost:1", "Cookie": f"x=1; {console.COOKIE}={TOKEN}"}
    assert console.refusal(cookie, "/console", TOKEN) is None
    assert console.refusal({"Host": "localhost:1"}, f"/console?token={TOKEN}", TOKEN) is None


def test_the_page_escapes_what_members_chose() -> None:
    view = console.View(now_ms=10_000, loop="ok", accepts={"accepted": 3.0}, counts={"m": 1},
                        members=[console.MemberRow("m1", "ab" * 32, "<script>x</script>",
                                                   0, False, True)],
                        meshes=[("m1", "team")])
    page = console.render(view)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "team" in page and "<td>accepted</td><td>3</td>" in page
