"""The running daemon as a process, around what ``daemon.main`` composes: its settings
(``config``, ``environment``), logging, private folders, the two databases opened with their
start-up recovery (``stores``), the IPC listeners (``server``, ``socket_watch``), SIGHUP and
the shutdown drain (``lifecycle``), the fleet's limits and its gauges."""
