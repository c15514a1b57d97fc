"""Use cases of the daemon, one module per thing they own (outbox, inbox, events).

Knows nothing of HTTP or WebSockets: takes validated values, returns plain data or raises
the ``core.errors`` tree. Never imports aiohttp or websockets.
"""
