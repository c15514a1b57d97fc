"""The broker's hold on the shared PostgreSQL engine (``tidemesh.storage.postgres``): its
pool for single statements and short transactions, its writers for group-committed accepts."""

from __future__ import annotations

from typing import Any

from tidemesh.storage.postgres import Database


class PostgresBase:
    db: Database
    pool: Any
    generic_pool: Any   # statements run on their generic plan (``Database.open``)
