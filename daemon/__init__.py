"""The per-host daemon: the IPC server, the SQLite outbox and inbox, and the broker link.

Layers: ``api`` → ``service`` → ``store`` (import contracts in pyproject.toml); ``api``
never touches ``store``, ``service`` never imports aiohttp. Beside them ``link/`` (the
broker link), ``process/`` (the running process around ``main``, the composition root),
``membership/`` (this member's keys and joins) and ``offline/`` (tools on a stopped daemon,
reached through ``admin``). Imports ``core``; never ``broker``, ``cli`` or ``spark``.
"""
