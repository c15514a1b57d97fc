"""Job entry points: build the session, read, call the transforms, write. I/O lives only here."""
