"""The per-host daemon: IPC server, SQLite outbox, identity, and (later) the broker link.

Layers: ``main`` (composition root) → ``server`` → ``api`` → ``service`` → ``store``.
``api`` never touches ``store``; ``service`` never imports aiohttp. Imports ``core``;
never ``broker``, ``cli`` or ``spark``.
"""
