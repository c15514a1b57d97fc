"""The IPC surface: route table, thin handlers, middleware. Calls ``daemon.service``; never
``daemon.store``."""
