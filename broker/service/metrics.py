"""The broker's Prometheus series (spec names where the spec gives them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from tidemesh.broker.store.base import Store
from tidemesh.core.metrics import BATCH_BUCKETS, CallbackGauge, CollectorRegistry, Samples

FILL_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


class Metrics:
    def __init__(self, active: Samples, store: Store) -> None:
        r = self.registry = CollectorRegistry()
        self.accepts = Counter("cm_broker_accept_total", "Sends answered, by status.",
                               ["status"], registry=r)
        self.duplicates = Counter("cm_broker_dedupe_duplicate_total",
                                  "Sends answered 200 duplicate (fingerprint matched).",
                                  ["mesh_id"], registry=r)
        self.mismatch = Counter("cm_broker_dedupe_fingerprint_mismatch_total",
                                "Sends answered 409 idempotency_key_reused: a known key "
                                "with another request fingerprint.",
                                ["client_id", "mesh_id"], registry=r)
        self.expired = Counter("cm_broker_dedupe_expired_deleted_total",
                               "Dedupe rows deleted by retention once past their expires_at.",
                               registry=r)
        self.pruned = Counter("cm_broker_history_pruned_total",
                              "Messages pruned by retention; their dedupe rows flip "
                              "history_available to false (a retry still dedupes).", registry=r)
        self.rejected = Counter("cm_broker_handshake_rejected_total",
                                "Connections closed during the handshake, by reason.",
                                ["reason"], registry=r)
        self.clones = Counter("cm_broker_clone_suspected_total",
                              "New sessions of a member whose live session came from another "
                              "host (a cloned data dir), by clone.policy.", ["policy"],
                              registry=r)
        self.bad_frames = Counter("cm_broker_bad_frames_total", "Frames that failed a schema.",
                                  registry=r)
        self.delivered = Counter("cm_broker_deliveries_sent_total",
                                 "Deliveries sent, alone or in deliver_batch frames.",
                                 registry=r)
        self.deliver_batch = Histogram("cm_broker_deliver_batch_size",
                                       "Deliveries in each frame pushed to a recipient.",
                                       registry=r, buckets=BATCH_BUCKETS)
        self.accept_duration = Histogram("cm_broker_accept_duration_seconds",
                                         "Duration of each group-commit transaction that "
                                         "held an accept.", registry=r)
        self.accept_batch = Histogram("cm_broker_accept_batch_size",
                                      "Sends (rows) decided in each accept transaction.",
                                      registry=r, buckets=BATCH_BUCKETS)
        self.accept_frames = Histogram("cm_broker_accept_frames",
                                       "Queued writes in each group commit that held an "
                                       "accept: a send or send_batch frame counts once.",
                                       registry=r, buckets=BATCH_BUCKETS)
        # Fair load. Labelled by mesh at most: a label per member would grow without bound.
        self.rate_limited = Counter("cm_broker_rate_limited_total",
                                    "Sends answered 429 rate_limited (over the member's "
                                    "send budget).", ["mesh_id"], registry=r)
        self.fast_path = Counter("cm_broker_dedupe_fast_path_total",
                                 "Retries answered from the dedupe table before the rate "
                                 "limiter (B0).", registry=r)
        self.bucket_fill = Histogram("cm_broker_rate_bucket_fill",
                                     "A member's token bucket after each admission, as a "
                                     "fraction of its burst (0: empty).", registry=r,
                                     buckets=FILL_BUCKETS)
        self.background_errors = Counter("cm_broker_background_errors_total",
                                         "Failures of background jobs (each retried), by job "
                                         "and kind: transient (network, store) or bug.",
                                         ["task", "kind"], registry=r)
        # Backpressure: a connection's frames go out through its own bounded queue.
        self.presence_dropped = Counter("cm_broker_presence_dropped_total",
                                        "Presence events dropped from a full send queue "
                                        "(the oldest first).", registry=r)
        self.slow_readers = Counter("cm_broker_slow_readers_closed_total",
                                    "Connections cut off (4012 slow_reader) for taking no "
                                    "frame within limits.slow_reader_s.", registry=r)
        self.silent_closed = Counter("cm_broker_silent_connections_closed_total",
                                     "Connections closed (4015 silent) after nothing was heard "
                                     "from them, not even a ping, for server.idle_timeout_s.",
                                     registry=r)
        self.presence_resyncs = Counter("cm_broker_presence_resyncs_total",
                                        "Presence snapshots sent again to a connection whose "
                                        "full queue dropped a numbered presence batch.",
                                        registry=r)
        self.presence_entries = Counter("cm_broker_presence_entries_total",
                                        "Presence entries queued for daemons, counted once "
                                        "per daemon told: each member of a snapshot (kind "
                                        "snapshot) and each event of a batch or alone (kind "
                                        "event). N members connecting at once cost about N² "
                                        "of them.", ["kind"], registry=r)
        self.presence_failed = Counter("cm_broker_presence_failed_total",
                                       "Presence events the other brokers were not told (the "
                                       "database could not be reached); counted, not logged.",
                                       registry=r)
        self.handshakes_waiting = Gauge("cm_broker_handshakes_waiting",
                                        "Hellos received that wait for a handshake slot "
                                        "(server.handshake_concurrency).", registry=r)
        self.handshakes_running = Gauge("cm_broker_handshakes_running",
                                        "Handshakes being authenticated now.", registry=r)
        self.revocations = Counter("cm_broker_revoked_connections_closed_total",
                                   "Connections closed because their member was revoked.",
                                   registry=r)
        CallbackGauge("cm_broker_connections_active", "Authenticated connections.", [], active, r)
        rows = store.accept_rows
        CallbackGauge("cm_broker_group_commit_batches", "Accept transactions since start.", [],
                      lambda: [({}, float(rows.transactions))], r)
        CallbackGauge("cm_broker_group_commit_sends", "Sends in those transactions since start.",
                      [], lambda: [({}, float(rows.rows))], r)
        self.store = store
        store.stats.on_batch = self.observe_commit

    def observe_commit(self, frames: int, seconds: float) -> None:
        """After each group commit of the store's writer. On SQLite every write has that
        writer (acks, hand-outs, subscriptions): only a transaction that held an accept is
        an accept's, else the histograms would time acks under the accept's name."""
        sends = self.store.accept_rows.committed()
        if sends:
            self.accept_frames.observe(frames)
            self.accept_duration.observe(seconds)
            self.accept_batch.observe(sends)
