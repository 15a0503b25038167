"""Peers (c) and (d) of :mod:`benchmarks.peers`: ClickHouse's Kafka table engine and a
materialized view into the pipeline's MergeTree table, offsets in Kafka or in Keeper.

No Spark: the server consumes the topic itself. One run creates a topic and the target
(the harness's :func:`~spark_datasource.testing.source_and_target.create_target`, the
table every peer writes), produces the events (all up front, or at a rate in a thread),
creates the Kafka table and the view, waits until every offset is in the table (or the
table stops growing), drops the view and the Kafka table (the consumer stops), and
checks every record as the Spark runs are checked
(:func:`~spark_datasource.testing.pipeline_report.record_check`).

Calling process of the benchmark; the server does the work.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks.peers_faults import ClickHouseKiller, FaultPlan, Servers, count_rows
from benchmarks.peers_figures import rows_per_s
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.client.sql import qualified, quote_string, split_table
from clickhouse_tx.interfaces import Target
from clickhouse_tx.retry import RetryPolicy, retry_call
from clickhouse_tx.verify.verifier import ClickHouseReader
from spark_datasource.testing.pipeline_report import record_check
from spark_datasource.testing.source_and_target import create_target, create_topic, produce
from spark_datasource.testing.visibility import VisibilityPoller, latencies_ms, percentile

#: The events' JSON as the Kafka table reads it (``kafka_format = 'JSONEachRow'``).
QUEUE_COLUMNS = "event_id Int64, user_id Int64, amount Float64, ts Int64"

#: The view's SELECT: the pipeline job's columns (``streaming_job.TABLE_COLUMNS``) from
#: the JSON and the Kafka table's virtual columns.
VIEW_SELECT = (
    "SELECT event_id, user_id, amount, fromUnixTimestamp64Milli(ts, 'UTC') AS event_time, "
    "_topic AS topic, toInt32(_partition) AS `partition`, toInt64(_offset) AS `offset`, "
    "_timestamp_ms AS kafka_ts FROM {queue}"
)

#: Seconds the table may stay the same, once everything is produced, before a run gives
#: up waiting for the missing offsets (they are then counted as lost). After a SIGKILL
#: the engine's consumer rejoins its group only once the killed member's session timed
#: out (librdkafka's ``session.timeout.ms``, 45 s), so a run with two kills waits longer.
STALL_S = 180.0


def engine_ddl(table: str, bootstrap: str, topic: str, keeper: bool, settings: Mapping[str, int]) -> dict[str, str]:
    """The statements of one engine peer: ``queue`` (the Kafka table), ``view``, ``drop``.

    ``keeper``: offsets in Keeper (``kafka_keeper_path``, ``kafka_replica_name``; the
    CREATE needs ``allow_experimental_kafka_offsets_storage_in_keeper``), else the
    consumer group's offsets in Kafka. ``settings``: more ``kafka_*`` settings (block
    size, flush interval), named by the caller and stated in the results.
    """
    db, t = split_table(table)
    queue, view = qualified(db, f"{t}_queue"), qualified(db, f"{t}_view")
    engine = {
        "kafka_broker_list": quote_string(bootstrap),
        "kafka_topic_list": quote_string(topic),
        "kafka_group_name": quote_string(f"peers_{t}"),
        "kafka_format": "'JSONEachRow'",
        **{k: str(int(v)) for k, v in settings.items()},
    }
    if keeper:
        engine["kafka_keeper_path"] = quote_string(f"/clickhouse/peers/{db}/{t}")
        engine["kafka_replica_name"] = "'r1'"
    body = ", ".join(f"{k} = {v}" for k, v in engine.items())
    return {
        "queue": f"CREATE TABLE {queue} ({QUEUE_COLUMNS}) ENGINE = Kafka SETTINGS {body}",
        "view": f"CREATE MATERIALIZED VIEW {view} TO {qualified(db, t)} AS {VIEW_SELECT.format(queue=queue)}",
        "drop": f"DROP TABLE IF EXISTS {view}; DROP TABLE IF EXISTS {queue}",
    }


def _client(url: str) -> ClickHouseHTTP:
    return ClickHouseHTTP(Target(url=url, database="", table=""))


def _wait_all(url: str, table: str, events: Callable[[], int | None], poll_s: float = 0.1) -> float | None:
    """Poll until every produced offset is in ``table``; the time it was first seen, or
    None when the table stopped growing for :data:`STALL_S` (losses) after production ended.

    ``events()`` is the number produced once production ended, None before.
    """
    reader = ClickHouseReader(url, timeout_s=30)
    src = qualified(*split_table(table))
    last, since = -2, time.monotonic()
    try:
        while True:
            t = time.time()
            n = count_rows(reader, f"SELECT count() AS n FROM {src}")
            total = events()
            # distinct offsets only once the rows are there: a duplicate adds to count() too
            distinct = f"SELECT uniqExact(`partition`, `offset`) AS n FROM {src}"
            if total is not None and n >= total and count_rows(reader, distinct) >= total:
                return t
            if n != last:
                last, since = n, time.monotonic()
            elif total is not None and time.monotonic() - since > STALL_S:
                return None
            time.sleep(poll_s)
    finally:
        reader.close()


#: DDL while a killed server comes back: about a minute of attempts, a second or two apart.
DDL_RETRY = RetryPolicy(max_attempts=60, max_total_s=120.0, base_delay_s=1.0, max_delay_s=2.0)


def _settle_ddl(url: str, sql: str, settings: Mapping[str, Any] | None = None) -> None:
    """Run ``sql`` (statements split on ``;``), retrying while a restarted server comes back."""
    client = _client(url)
    try:
        for stmt in (s.strip() for s in sql.split(";") if s.strip()):
            retry_call(
                functools.partial(client.command, stmt, settings=dict(settings or {})),
                DDL_RETRY,
                retry_on=lambda exc: True,  # a server still starting answers in many ways
                what="engine DDL",
            )
    finally:
        client.close()


def run_engine(
    srv: Servers,
    peer: str,
    *,
    events: int,
    settings: Mapping[str, int],
    rate: float | None = None,
    warmup_s: float = 0.0,
    faults: FaultPlan | None = None,
    marks: dict[str, float] | None = None,
) -> dict[str, Any]:
    """One run of peer ``kafka_engine`` or ``kafka_engine_keeper``; its figures and its check.

    Up front (``rate`` None): the time from the view's creation until every offset is
    in the table gives the throughput. At ``rate``: the latency of what is produced
    after ``warmup_s``, Kafka timestamp → visible. ``faults``: ClickHouse killed and
    restarted at the plan's times. ``marks``, when given, gets the wall-clock times
    (``time.time()``) of the view's creation (``start``) and of every offset in the
    table (``end``): the window :mod:`benchmarks.cpu_profile` counts.
    """
    keeper = peer == "kafka_engine_keeper"
    name = srv.fresh_name(peer)
    topic, table = f"peers_{name}", f"peers.{name}"
    create_topic(srv.bootstrap, srv.control, topic, srv.partitions)
    create_target(srv.url, table, "transaction")
    ddl = engine_ddl(table, srv.bootstrap, topic, keeper, settings)
    produced: list[int | None] = [None]
    if rate is None:
        produced[0] = produce(srv.bootstrap, topic, events, srv.partitions)
    _settle_ddl(srv.url, ddl["queue"], {"allow_experimental_kafka_offsets_storage_in_keeper": 1} if keeper else None)
    t0 = time.time()
    _settle_ddl(srv.url, ddl["view"])
    producer = None
    if rate is not None:

        def _produce() -> None:
            produced[0] = produce(srv.bootstrap, topic, events, srv.partitions, rate=rate)

        producer = threading.Thread(target=_produce, daemon=True)
        producer.start()
    killer = ClickHouseKiller(srv, table, faults) if faults else None
    poller = VisibilityPoller(srv.url, table, 0.1) if rate is not None and faults is None else None
    with poller or contextlib.nullcontext(), killer or contextlib.nullcontext():
        t_all = _wait_all(srv.url, table, lambda: produced[0])
    if marks is not None:
        marks.update(start=t0, **({"end": t_all} if t_all else {}))
    if producer is not None:
        producer.join(60)
    _settle_ddl(srv.url, ddl["drop"])
    n = produced[0] or 0
    out: dict[str, Any] = {
        "peer": peer,
        "table": table,
        "topic": topic,
        "events": n,
        "settings": dict(settings),
        "offsets_in": "keeper" if keeper else "kafka",
        "seconds": round(t_all - t0, 3) if t_all else None,
        "complete": t_all is not None,
        "rows_per_s": rows_per_s(n, t_all - t0) if t_all and rate is None else None,
        **record_check(srv.url, table, srv.bootstrap, topic, srv.partitions, n),
    }
    if killer is not None:
        out["clickhouse_kills"] = killer.kills
    if poller is not None:
        lat = latencies_ms(srv.url, table, poller.samples, t0 + warmup_s)
        out.update(rate=rate, p50_ms=percentile(lat, 50), p99_ms=percentile(lat, 99), records=len(lat))
    out["ok"] = out["duplicates"] == 0 and out["lost"] == 0 and t_all is not None
    return out
