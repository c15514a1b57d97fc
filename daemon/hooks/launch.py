"""One hook run for one event, as every caller makes it (the ledger's runs, pre-send in the
daemon and on the cold path, ``hooks test``): the event redacted and capped on stdin, the
hook's own environment, the hooks folder as its working directory, its span (core/tracing)."""

from __future__ import annotations

from pathlib import Path

from tidemesh.core import hooks as rules
from tidemesh.core import tracing
from tidemesh.core.hooks import HookConfig
from tidemesh.daemon.hooks.runner import RunResult, Sandbox, hook_env, run_hook


async def run_for_event(folder: Path, mesh: str, socket: Path, cfg: HookConfig, key: str,
                        doc: dict[str, object], sandbox: Sandbox,
                        token: str | None = None) -> RunResult:
    stdin = rules.encode_capped(rules.redact(dict(doc), cfg.redact_payload))
    traceparent = doc.get("traceparent")
    parent = traceparent if isinstance(traceparent, str) else None
    # A child of the message's trace context; the hook's TRACEPARENT names this span, so
    # whatever the hook traces hangs under its run.
    with tracing.span("tidemesh.daemon.hook", (parent,),
                      {"tidemesh.mesh": mesh, "tidemesh.hook": cfg.name}) as hop:
        bmid = doc.get("broker_message_id") if doc.get("type") == "message" else None
        env = hook_env(mesh, cfg.name, key, socket, token, hop.onward(parent),
                       bmid if isinstance(bmid, str) else None)
        result = await run_hook(folder / cfg.name, cfg, stdin, env, sandbox)
        hop.set("tidemesh.hook.exit_code", -1 if result.exit_code is None else result.exit_code)
        hop.set("tidemesh.hook.timed_out", result.timed_out)
        return result
