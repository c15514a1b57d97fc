"""Hooks (spec §6): executables in the per-mesh ``hooks/`` folder run for events. ``files``
reads the folder, ``runner`` runs one process, ``capability`` holds reply tokens, and
``service`` keeps the effectively-once ledger moving. Decisions live in core/hooks.py."""
