"""All SQL of the daemon: the database adapter (db), migrations, and one module per table.

Must not import ``daemon.service`` or ``daemon.api``.
"""
