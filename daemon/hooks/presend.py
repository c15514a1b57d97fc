"""The pre-send gate, decided one way wherever a send starts: the daemon's request
(``HookService.pre_send``) and the cold path of ``tidemesh send`` (``gate_without_daemon``)
give the hook the same event and the same timeout, and read its verdict the same way."""

from __future__ import annotations

from pathlib import Path

from tidemesh.core import hooks as rules
from tidemesh.core.errors import SendVetoed
from tidemesh.core.hooks import HookConfig
from tidemesh.core.ids import new_ulid
from tidemesh.core.send import SendRequest
from tidemesh.core.settings import ConfigError
from tidemesh.daemon.hooks.files import load_plan
from tidemesh.daemon.hooks.launch import run_for_event
from tidemesh.daemon.hooks.runner import RunResult, Sandbox

_VETO_REASON_MAX = 4096


def event(cfg: HookConfig, req: SendRequest, now_ms: int) -> tuple[str, dict[str, object]]:
    """The event id and the stdin document of one send's pre-send run."""
    key = req.client_message_id or new_ulid()
    data = {**req.to_payload(), "client_message_id": req.client_message_id}
    return key, rules.stdin_doc(key, cfg.name, "pre_send", data, now_ms)


def verdict(result: RunResult) -> None:
    """Exit 0 lets the send through; anything else (a timeout, a hook that could not start)
    refuses it."""
    if result.ok:
        return
    said = result.stdout.decode(errors="replace").strip()[:_VETO_REASON_MAX]
    raise SendVetoed(f"the pre-send hook refused this send: {said or result.describe()}",
                     reason=said, hook_exit=result.exit_code, timed_out=result.timed_out)


async def gate_without_daemon(folder: Path, enabled: bool, mesh: str, socket: Path,
                              req: SendRequest, now_ms: int) -> None:
    """The gate for a send made with no daemon running. A hooks.toml that cannot be read
    means the hook cannot run, and a veto that cannot run refuses the send."""
    try:
        plan = load_plan(folder, enabled)
    except ConfigError as exc:
        raise SendVetoed(f"the pre-send hook cannot run ({exc.message}), so this send is "
                         "refused; fix hooks.toml or start the daemon",
                         reason="hooks_config_invalid") from exc
    cfg = plan.runnable(rules.PRE_SEND)
    if cfg is None:
        return
    key, doc = event(cfg, req, now_ms)
    verdict(await run_for_event(folder, mesh, socket, cfg, key, doc, await Sandbox.probe()))
