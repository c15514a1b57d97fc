"""The broker: membership, the WebSocket protocol, the atomic accept, and its stores.

Must not import ``tidemesh.daemon``, ``tidemesh.cli`` or ``tidemesh.spark``; shared logic comes
from ``tidemesh.core``. Only ``broker.server`` uses websockets; only ``broker.store.*`` uses
database drivers; ``broker.session`` and ``broker.accept`` are pure.
"""
