"""Broker access of the ``kafka_py`` source: kafka-python consumers and their pool.

- :func:`new_consumer`: a connected consumer, after bounded retries
  (``fetchOffset.numRetries``/``fetchOffset.retryIntervalMs``, the project's one retry
  helper); then :class:`~spark_datasource.kafka.errors.KafkaUnavailableError` naming
  ``bootstrap.servers``.
- :class:`ClusterMetadata`: the driver's view of the cluster (topic-partitions, their
  earliest and latest offsets, offsets by timestamp) through one long-lived consumer.
- :class:`ConsumerPool` and :data:`POOL`: the executors' idle consumers (kafka-python's,
  or librdkafka's with ``kafka.client=librdkafka``:
  :mod:`spark_datasource.kafka.librdkafka_fetch`), reused across tasks and
  micro-batches of a reused Python worker.

kafka-python is imported inside the functions, so that an install without the
``[kafka]`` extra imports this module and fails only when a read is planned, and an
executor reading through librdkafka never imports it. The driver's metadata goes through
kafka-python whichever client the executors read with.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import logging
import re
import threading
import time
from typing import Any, Callable, Mapping, Sequence, TypeVar

from spark_datasource.kafka.errors import KafkaUnavailableError
from spark_datasource.kafka.librdkafka_fetch import close_librdkafka, new_librdkafka_consumer, park
from spark_datasource.kafka.offsets import TP
from spark_datasource.kafka.options import KafkaOptions
from spark_datasource.kafka.security import check_access, redact_secrets_in_logs

log = logging.getLogger(__name__)

T = TypeVar("T")


def _with_retries(opts: KafkaOptions, what: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` up to ``fetchOffset.numRetries`` times (the project's one retry helper,
    sleeping up to ``fetchOffset.retryIntervalMs`` between tries, each retry logged); then a
    clear error."""
    from kafka.errors import KafkaError

    from clickhouse_tx.retry import RetryPolicy, retry_call

    interval_s = opts.fetch_offset_retry_interval_ms / 1000
    policy = RetryPolicy(
        max_attempts=max(1, opts.fetch_offset_num_retries),
        max_total_s=float("inf"),
        base_delay_s=interval_s,
        max_delay_s=interval_s,
    )
    started = time.monotonic()
    try:
        return retry_call(fn, policy, retry_on=lambda e: isinstance(e, (KafkaError, OSError)), what=f"kafka_py: {what}")
    except (KafkaError, OSError) as last:
        raise KafkaUnavailableError(
            f"kafka_py: {what} failed {policy.max_attempts} times over "
            f"{time.monotonic() - started:.1f}s; is the broker at "
            f"bootstrap.servers={opts.bootstrap_servers} up? last error: {last!r}"
        ) from last


def new_consumer(opts: KafkaOptions, api_version: tuple[int, ...] | None = None) -> Any:
    """A connected ``kafka.KafkaConsumer`` for ``opts`` (driver or executor).

    ``api_version``, when known from an earlier consumer of the same settings, skips
    kafka-python's broker-version probe, which costs round trips and a sleep.
    """
    from kafka import KafkaConsumer

    cfg = opts.consumer_config()
    if api_version is not None and cfg.get("api_version") is None:
        cfg["api_version"] = api_version
    redact_secrets_in_logs(cfg)
    return _with_retries(opts, "connecting", lambda: KafkaConsumer(**cfg))


def settings_key(opts: KafkaOptions) -> str:
    """A digest of everything that makes two consumers interchangeable.

    Covers the bootstrap servers and every kafka-python setting, secrets included, so a
    changed password never reuses a consumer; being a digest, the key never carries a
    secret into a log line or an error.
    """
    cfg = opts.consumer_config()
    text = repr(sorted((k, repr(v)) for k, v in cfg.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _connected(consumer: object, client: str) -> bool:
    """True while a pooled consumer still holds a live broker connection.

    kafka-python reconnects on its own, but only after a request times out; a consumer
    whose every connection is gone (broker restarted, socket reset while idle) is
    cheaper to replace than to wait for. librdkafka reconnects in its own threads, at
    once: its consumers are always taken as they are.
    """
    if client == "librdkafka":
        return True
    conns = getattr(getattr(consumer, "_client", None), "_conns", None)
    if not conns:
        return False
    return any(conn.connected() for conn in list(conns.values()))


@dataclasses.dataclass
class PoolStats:
    """Counters of one :class:`ConsumerPool` (what the tests and the benchmark read)."""

    created: int = 0
    reused: int = 0
    replaced: int = 0
    closed_idle: int = 0
    discarded: int = 0


class ConsumerPool:
    """Idle consumers of one Python worker, reused across tasks and batches.

    Spark reuses Python workers (``spark.python.worker.reuse``, on by default), so a
    consumer left here by one task serves the next range of the same topic-partition in
    a later task or micro-batch of this worker: no new TCP connection, no version probe,
    no metadata round trip, and often records already prefetched at the right position.
    Keyed by (:func:`settings_key`, client, topic, partition). A consumer is handed out
    to one reader at a time and positioned at the range's start by every read (a
    kafka-python one by ``seek``, a librdkafka one by its assignment), so what it returns
    depends only on the range (replays read the same records). A librdkafka consumer is
    unassigned when it comes back, so it fetches nothing while idle. Consumers idle for more
    than ``idle_s`` are closed at the next checkout or give-back; one whose broker
    connections are all gone is replaced at checkout; one that raised is closed, never
    returned. At most ``max_idle`` stay open per worker (the oldest are closed).

    Runs on executors (the module-level :data:`POOL`); tests build their own.
    """

    def __init__(self, idle_s: float = 60.0, max_idle: int = 64) -> None:
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.stats = PoolStats()
        self._idle: dict[tuple[str, str, str, int], tuple[float, Any]] = {}
        self._versions: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()

    def checkout(self, opts: KafkaOptions, tp: TP, client: str = "kafka-python") -> tuple[Any, bool]:
        """A consumer for ``tp`` and whether it came from the pool.

        A new kafka-python one is assigned ``tp`` with no position yet; a pooled one is
        where its last read stopped. A librdkafka one is unassigned: the read assigns it.
        Only a kafka-python checkout imports kafka-python: a worker that reads through
        librdkafka never pays for its import.
        """
        settings = settings_key(opts)
        key = (settings, client, tp[0], tp[1])
        with self._lock:
            self._close_idle_locked(time.monotonic())
            entry = self._idle.pop(key, None)
        if entry is not None:
            consumer = entry[1]
            if _connected(consumer, client):
                self.stats.reused += 1
                return consumer, True
            self.stats.replaced += 1
            _close_quietly(consumer, client)
        if client == "librdkafka":
            self.stats.created += 1
            return new_librdkafka_consumer(opts), False
        from kafka import TopicPartition

        consumer = new_consumer(opts, self._versions.get(settings))
        version = consumer.config.get("api_version")
        if version is not None:
            self._versions[settings] = tuple(version)
        consumer.assign([TopicPartition(*tp)])
        self.stats.created += 1
        return consumer, False

    def give_back(self, opts: KafkaOptions, tp: TP, consumer: Any, client: str = "kafka-python") -> None:
        """Keep ``consumer`` for the next range of ``tp`` (after a read that did not raise)."""
        key = (settings_key(opts), client, tp[0], tp[1])
        if client == "librdkafka":
            try:
                park(consumer)
            except Exception as e:  # a consumer that cannot stop fetching is not kept
                log.debug("kafka_py: unassigning a librdkafka consumer failed: %r", e)
                self.discard(consumer, client)
                return
        now = time.monotonic()
        with self._lock:
            old = self._idle.pop(key, None)
            self._idle[key] = (now, consumer)
            self._close_idle_locked(now)
            while len(self._idle) > self.max_idle:
                oldest = min(self._idle, key=lambda k: self._idle[k][0])
                _close_quietly(self._idle.pop(oldest)[1], oldest[1])
                self.stats.closed_idle += 1
        if old is not None:
            _close_quietly(old[1], client)

    def discard(self, consumer: Any, client: str) -> None:
        """Close a consumer of ``client`` that failed mid-read; it is never reused."""
        self.stats.discarded += 1
        _close_quietly(consumer, client)

    def idle_count(self) -> int:
        with self._lock:
            return len(self._idle)

    def close_idle(self) -> None:
        """Close every consumer idle for more than ``idle_s`` (also run on each checkout)."""
        with self._lock:
            self._close_idle_locked(time.monotonic())

    def close_all(self) -> None:
        """Close every pooled consumer (at worker exit, and in tests)."""
        with self._lock:
            entries = list(self._idle.items())
            self._idle.clear()
        for key, (_, consumer) in entries:
            _close_quietly(consumer, key[1])

    def _close_idle_locked(self, now: float) -> None:
        for key in [k for k, (t, _) in self._idle.items() if now - t > self.idle_s]:
            _close_quietly(self._idle.pop(key)[1], key[1])
            self.stats.closed_idle += 1


def _close_quietly(consumer: Any, client: str) -> None:
    """Close a consumer of ``client`` (kafka-python's, without committing, or librdkafka's)."""
    try:
        if client == "librdkafka":
            close_librdkafka(consumer)
        else:
            consumer.close(autocommit=False)
    except Exception as e:  # closing a broken consumer must not fail a read
        log.debug("kafka_py: closing a pooled consumer failed: %r", e)


#: This Python worker's consumers (executors); closed when the worker exits.
POOL = ConsumerPool()
atexit.register(POOL.close_all)


class ClusterMetadata:
    """Driver-side view of the cluster: topic-partitions and their offsets.

    Lives in the driver's stream-reader worker for the whole query (one TCP
    connection reused across triggers); recreated if the broker drops it.
    """

    def __init__(self, opts: KafkaOptions) -> None:
        self.opts = opts
        self._consumer: Any = None

    def _c(self) -> Any:
        if self._consumer is None:
            # Before kafka-python, which retries a refused password forever and an
            # untrusted certificate like a dead broker: fail at once, naming the option.
            cfg = self.opts.consumer_config()
            redact_secrets_in_logs(cfg)
            check_access(cfg, self.opts.bootstrap_servers)
            self._consumer = new_consumer(self.opts)
        return self._consumer

    def topic_partitions(self) -> list[TP]:
        """The topic-partitions this read covers, sorted (fresh metadata every call)."""
        if self.opts.assign is not None:
            return sorted((t, p) for t, parts in self.opts.assign for p in parts)

        def fetch() -> list[TP]:
            c = self._c()
            names = c.topics()  # always a fresh metadata request: sees new partitions
            if self.opts.subscribe is not None:
                wanted = [t for t in self.opts.subscribe if t in names]
            else:
                rx = re.compile(self.opts.subscribe_pattern or "")
                wanted = sorted(t for t in names if rx.fullmatch(t))
            return sorted((t, p) for t in wanted for p in (c.partitions_for_topic(t) or ()))

        return _with_retries(self.opts, "listing topic partitions", fetch)

    def earliest(self, tps: Sequence[TP]) -> dict[TP, int]:
        return self._offsets(tps, "beginning_offsets")

    def offsets_for_times(self, stamps: Mapping[TP, int]) -> dict[TP, int | None]:
        """The first offset at or after each timestamp (ms), None where no record is that recent."""
        if not stamps:
            return {}
        from kafka import TopicPartition

        def fetch() -> dict[TP, int | None]:
            got = self._c().offsets_for_times({TopicPartition(t, p): ts for (t, p), ts in stamps.items()})
            return {(tp.topic, tp.partition): None if found is None else int(found.offset) for tp, found in got.items()}

        return _with_retries(self.opts, "looking offsets up by timestamp", fetch)

    def latest(self, tps: Sequence[TP]) -> dict[TP, int]:
        return self._offsets(tps, "end_offsets")

    def _offsets(self, tps: Sequence[TP], method: str) -> dict[TP, int]:
        if not tps:
            return {}
        from kafka import TopicPartition

        def fetch() -> dict[TP, int]:
            got = getattr(self._c(), method)([TopicPartition(t, p) for t, p in tps])
            return {(tp.topic, tp.partition): int(o) for tp, o in got.items()}

        return _with_retries(self.opts, f"fetching {method.replace('_', ' ')}", fetch)

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None
