"""Tools on a daemon that is not running: backup and restore, ``daemon recover``, the
outbox operations on a stopped daemon's database (``outbox``), and the cold path, one send
straight to the broker when no daemon answers. Reached by the CLI through ``daemon.admin``."""
