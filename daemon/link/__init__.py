"""The broker link: the WebSocket (``websocket``) and its protocol state machine
(``linkstate``), the relay that keeps one link open (``relay``), and what runs over each:
the sender (outbox → broker), the receiver (broker → inbox, ordered by ``receive_order``).
``live_link`` is the link as the services ask the broker through it; ``dial`` is a one-shot
exchange for join and the cold path. Reaches the databases only through ``daemon.service``."""
