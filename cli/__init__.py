"""The ``tidemesh`` command line. Talks to a running daemon only through the SDK,
``tidemesh.client``;
starts a daemon or works on a stopped daemon's outbox through the daemon's own entry points
(``daemon.main``, ``daemon.admin``)."""
