"""Drive ``tidemesh mcp`` with the official MCP SDK's stdio client, against real daemons
and a real broker (tests/e2e's fixtures)."""

from tests.e2e.conftest import any_mesh, mesh, sqlite_broker

__all__ = ["any_mesh", "mesh", "sqlite_broker"]
