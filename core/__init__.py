"""Pure logic shared by the daemon and the broker.

Owns: ids, the request fingerprint, the daemon's accept table, error codes, backoff and the
outbox max-age math. Imports only the standard library (and ``rfc8785`` for canonical JSON);
never ``daemon``, ``broker``, ``cli``, ``spark``, or any I/O library.
"""
