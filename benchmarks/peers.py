"""The sink beside what users would pick instead: the same events into the same table, one run.

``python -m benchmarks.peers [--quick] [--faults]`` starts the embedded stack (ClickHouse
on chdb, ZooKeeper, the dev Kafka broker) and writes the pipeline's JSON events
(:func:`~spark_datasource.testing.source_and_target.event_json`, ``--partitions``
partitions) into the pipeline's MergeTree table
(:func:`~spark_datasource.testing.source_and_target.create_target`) by five peers
(:data:`~benchmarks.peers_figures.PEERS`):

(a) ``transaction``: ``kafka_py`` → ``clickhouse_tx`` mode ``transaction``;
(b) ``foreach_batch``: ``kafka_py`` → ``foreachBatch`` with ``toArrow()`` and
    clickhouse-connect's ``insert_arrow`` (today's practice, at least once);
(c) ``kafka_engine``: ClickHouse's Kafka table engine and a materialized view, the
    consumer group's offsets in Kafka;
(d) ``kafka_engine_keeper``: the same with the offsets in Keeper (``kafka_keeper_path``,
    ``kafka_replica_name``, ``allow_experimental_kafka_offsets_storage_in_keeper``);
(e) ``foreach_tx``: ``kafka_py`` → ``foreachBatch`` with the exactly-once helper
    ``clickhouse_tx_batch`` (one transaction per micro-batch, keyed by its batch id).

1. **Throughput**, ``--rounds`` rounds interleaved (a, b, e, c, d at each batch size, then
   the next round): ``--events`` produced up front, the Spark peers with
   ``Trigger.AvailableNow``, ``maxOffsetsPerTrigger`` = each of ``--batch-sizes`` and,
   with ``--max-partitions``, the source's ``maxPartitions`` (rows / Σ
   ``triggerExecution``: the JVM's start is left out, the first batch's Python workers
   are in), the engine with ``kafka_max_block_size`` = the same size and
   its other settings at the server's defaults (recorded under ``config.engine``): rows /
   the time from the view's creation until every offset is in the table.
2. **Latency** at a 1 s trigger (the engine: ``kafka_flush_interval_ms`` = 1000) with
   the events produced at half of each peer's sustained rate (its best throughput):
   Kafka timestamp → visible to a read-committed reader, p50/p99, after a warm-up.
3. With ``--faults``, **under faults**: each peer once, ``--fault-events`` produced at a
   steady rate over ``--fault-duration`` seconds (so every peer is mid-stream when hit;
   the Spark peers at a 1 s trigger, the engine at its default flush), ClickHouse
   SIGKILLed and started again after 2 s at 30 % and 65 % of that duration after the
   run started, and for (a), (b) and (e) the driver SIGKILLed twice and restarted
   on its checkpoint: once in the window where a batch's rows are written but Spark's
   commit log does not record it yet (``peers_spark.DRIVER_KILLS``), once at random (a
   job that fails by itself, a query stopped by the ClickHouse kill, is restarted too,
   as a supervisor would).

``--kafka-client`` sets the Spark peers' ``kafka.client`` (``kafka_py``'s default,
``auto``, otherwise); a Spark peer named ``PEER@CLIENT`` in ``--peers``
(``transaction@kafka-python``) reads with that client, so one run holds the same peer on
both clients, interleaved. Besides best over best (``ratios``, over (b) and over (c)),
the JSON has ``round_ratios``: the ratios within each round and their median.

Every run is checked the same way: every Kafka offset in the table exactly once, the
event ids against what was produced
(:func:`~spark_datasource.testing.pipeline_report.record_check`). Writes
``benchmarks/results/peers[_quick].json`` (after every run) and a PNG beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_session import bench_session
from benchmarks.peers_engine import run_engine
from benchmarks.peers_faults import FaultPlan, Servers
from benchmarks.peers_figures import (
    KAFKA_CLIENTS,
    PEERS,
    SPARK_PEERS,
    base_peer,
    known_peer,
    latency_plan,
    markdown_table,
    ratios,
    round_ratios,
    summarise,
    sustained_rate,
)
from benchmarks.peers_plot import plot
from benchmarks.peers_spark import DRIVER_KILLS, run_spark
from benchmarks.results_file import machine, write_result
from clickhouse_tx.verify.verifier import ClickHouseReader
from spark_datasource.testing.streaming_job import key_values

RESULTS = Path(__file__).resolve().parent / "results"

#: How a section reports a finished run (a timestamped line on stdout).
Say = Callable[[str], None]

#: Server settings the engine peers run with unless a run sets them (stated in the JSON).
ENGINE_DEFAULTS = (
    "stream_flush_interval_ms",
    "kafka_max_wait_ms",
    "max_insert_block_size",
    "stream_poll_timeout_ms",
    "max_block_size",
)


#: The latency warm-up of the engine peers: no Python workers start, only the consumer
#: joins its group (the throughput runs drain 400,000 events in ~7 s, join included).
ENGINE_WARMUP_S = 3.0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: few events, small batches, one round")
    ap.add_argument("--events", type=int, default=None, help="events per throughput run (default 400000, quick 20000)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=None, help="interleaved throughput rounds (default 2, quick 1)")
    ap.add_argument("--batch-sizes", default=None, help="records per micro-batch (default 50000,200000)")
    ap.add_argument(
        "--peers",
        default=",".join(PEERS),
        help="a comma-separated subset of " + ", ".join(PEERS) + "; a Spark peer as PEER@CLIENT "
        "(transaction@kafka-python) reads with that kafka.client, so one run can hold both clients",
    )
    ap.add_argument(
        "--kafka-client",
        choices=KAFKA_CLIENTS,
        default=None,
        help="kafka_py's kafka.client for the Spark peers without @CLIENT (default: the source's own, auto)",
    )
    ap.add_argument("--duration", type=float, default=None, help="seconds measured per latency run (30, quick 10)")
    ap.add_argument(
        "--warmup", type=float, default=None, help="seconds before latency counts (10, quick 5; the engine at most 3)"
    )
    ap.add_argument("--faults", action="store_true", help="also run each peer under faults (section 3)")
    ap.add_argument("--fault-events", type=int, default=None, help="events per fault run (default --events / 4)")
    ap.add_argument(
        "--fault-duration",
        type=float,
        default=None,
        help="seconds over which a fault run's events are produced (60, quick 20)",
    )
    ap.add_argument(
        "--max-partitions",
        type=int,
        default=None,
        help="kafka_py maxPartitions of the Spark peers (default: the source's own cut; "
        "docs/kafka.md recommends the executors' cores for throughput)",
    )
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the Spark peers' sessions (repeatable)",
    )
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--json", default=None, help="default benchmarks/results/peers[_quick].json")
    a = ap.parse_args(argv)
    a.events = a.events or (20_000 if a.quick else 400_000)
    a.rounds = a.rounds or (1 if a.quick else 2)
    default_sizes = f"{a.events // 4},{a.events // 2}" if a.quick else "50000,200000"
    a.batch_sizes = [int(x) for x in (a.batch_sizes or default_sizes).split(",") if x]
    a.peers = [p for p in a.peers.split(",") if p]
    a.duration = a.duration or (10.0 if a.quick else 30.0)
    a.warmup = a.warmup if a.warmup is not None else (5.0 if a.quick else 10.0)
    a.fault_events = a.fault_events or max(1000, a.events // 4)
    a.fault_duration = a.fault_duration or (20.0 if a.quick else 60.0)
    unknown = [p for p in a.peers if not known_peer(p)]
    if unknown or a.events <= 0 or a.partitions <= 0 or not a.batch_sizes or min(a.batch_sizes) <= 0:
        ap.error(
            f"--peers takes {', '.join(PEERS)} (Spark peers also as PEER@{'|'.join(KAFKA_CLIENTS)}); "
            "--events, --partitions, --batch-sizes must be positive"
        )
    if a.max_partitions is not None and a.max_partitions <= 0:
        ap.error("--max-partitions must be positive")
    a.spark_conf = tuple(f"{k}={v}" for k, v in key_values("--spark-conf", a.spark_conf).items())
    a.source_options = () if a.max_partitions is None else (f"maxPartitions={a.max_partitions}",)
    if a.kafka_client:
        a.source_options += (f"kafka.client={a.kafka_client}",)
    return a


def _run(srv: Servers, peer: str, **kw: Any) -> dict[str, Any]:
    """One run of ``peer``: the Spark job or the engine, the same check either way."""
    engine = dict(kw.pop("engine", {}))
    if base_peer(peer) in SPARK_PEERS:
        return run_spark(srv, peer, **kw)
    kw.pop("batch", None)
    kw.pop("trigger", None)
    return run_engine(srv, peer, settings=engine, **kw)


def _fmt(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"FAILED {r['error'][:300]}"
    parts = [f"{r['rows_per_s']:,.0f} rows/s"] if r.get("rows_per_s") else []
    if r.get("p50_ms") is not None:
        parts.append(f"p50 {r['p50_ms']:,.0f} ms, p99 {r['p99_ms']:,.0f} ms")
    parts.append(f"rows {r.get('rows_in_clickhouse')}, dup {r.get('duplicates')} lost {r.get('lost')}")
    return ", ".join(parts)


def throughput(doc: dict[str, Any], srv: Servers, a: argparse.Namespace, say: Say, save: Callable[[], None]) -> None:
    """Section 1: rounds of (peer × batch size), interleaved."""
    for rnd in range(a.rounds):
        for size in a.batch_sizes:
            for peer in a.peers:
                r = _run(srv, peer, events=a.events, batch=size, engine={"kafka_max_block_size": size})
                r.update(round=rnd, batch=size)
                doc["throughput"].append(r)
                say(f"round {rnd + 1} {peer} at {size:,}: {_fmt(r)}")
                save()


def latency(doc: dict[str, Any], srv: Servers, a: argparse.Namespace, say: Say, save: Callable[[], None]) -> None:
    """Section 2: each peer at half its sustained rate, 1 s trigger (engine: 1 s flush)."""
    for peer in a.peers:
        warmup = a.warmup if base_peer(peer) in SPARK_PEERS else min(a.warmup, ENGINE_WARMUP_S)
        rate, events = latency_plan(sustained_rate(doc["throughput"], peer), a.duration, warmup, a.partitions)
        r = _run(
            srv,
            peer,
            events=events,
            batch=None,
            trigger=1.0,
            rate=rate,
            warmup_s=warmup,
            engine={"kafka_flush_interval_ms": 1000},
        )
        doc["latency"][peer] = r
        say(f"latency {peer} at {rate:,.0f}/s: {_fmt(r)}")
        save()


def faults(doc: dict[str, Any], srv: Servers, a: argparse.Namespace, say: Say, save: Callable[[], None]) -> None:
    """Section 3: each peer under ClickHouse kills (and, for Spark, driver kills)."""
    n = a.fault_events
    rate = round(n / a.fault_duration, 1)
    runs: dict[str, Any] = {}
    doc["faults"] = {"events": n, "rate": rate, "runs": runs}
    for peer in a.peers:
        at = (round(0.3 * a.fault_duration, 1), round(0.65 * a.fault_duration, 1))
        plan = FaultPlan(at_s=at, driver_kills=DRIVER_KILLS.get(base_peer(peer), ()))
        doc["faults"]["plan"] = {"clickhouse_kill_after_start_s": plan.at_s, "clickhouse_down_s": plan.down_s}
        r = _run(srv, peer, events=n, batch=None, trigger=1.0, rate=rate, faults=plan)
        runs[peer] = r
        kills = len(r.get("clickhouse_kills") or [])
        say(f"faults {peer}: {kills} ClickHouse kills, {r.get('crashes', 0)} driver kills: {_fmt(r)}")
        save()


def kafka_client_in_use(client: str | None) -> str:
    """What ``kafka.client`` the Spark peers without ``@CLIENT`` read with: the option, or
    what ``auto`` picks here (librdkafka when ``confluent_kafka`` imports; every
    ``kafka.*`` setting of these runs has a librdkafka equivalent)."""
    if client and client != "auto":
        return client
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "auto: kafka-python"
    return "auto: librdkafka"


def _engine_defaults(url: str) -> dict[str, str]:
    reader = ClickHouseReader(url)
    try:
        rows = reader.rows(
            "SELECT name, value FROM system.settings WHERE name IN {n:Array(String)}",
            {"n": list(ENGINE_DEFAULTS)},
            committed=False,
        )
    finally:
        reader.close()
    return {r["name"]: r["value"] for r in rows}


def _save(doc: dict[str, Any], a: argparse.Namespace, jpath: Path, t0: float) -> None:
    """Write what is measured so far (a run cut short keeps its figures), then the PNG."""
    doc["config"].update(machine=machine(), quick=a.quick)
    doc["summary"] = summarise(doc)
    doc["ratios"] = ratios(doc["summary"], a.batch_sizes)
    doc["round_ratios"] = round_ratios(doc)
    doc["table_md"] = markdown_table(doc["summary"], a.batch_sizes)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    write_result(jpath, doc)
    plot(doc, jpath.with_suffix(".png"))


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    jpath = Path(a.json) if a.json else RESULTS / ("peers_quick.json" if a.quick else "peers.json")
    t0 = time.monotonic()
    with bench_session("chtx-peers-", t0) as (work, info, say):
        srv = Servers(
            work / "stack",
            info.clickhouse_url,
            str(info.kafka_bootstrap),
            info.kafka_control,
            a.partitions,
            work,
            a.source_options,
            a.spark_conf,
        )
        cfg = {k: getattr(a, k) for k in ("events", "partitions", "rounds", "batch_sizes", "peers", "duration")}
        cfg.update(warmup_s=a.warmup, spark="local[2]", engine=_engine_defaults(info.clickhouse_url))
        cfg.update(spark_source_options=list(a.source_options), kafka_client=kafka_client_in_use(a.kafka_client))
        cfg.update(spark_conf=list(a.spark_conf))
        doc: dict[str, Any] = {"config": cfg, "throughput": [], "latency": {}, "faults": None}

        def save() -> None:
            _save(doc, a, jpath, t0)

        throughput(doc, srv, a, say, save)
        if not a.skip_latency:
            latency(doc, srv, a, say, save)
        if a.faults:
            faults(doc, srv, a, say, save)
    _save(doc, a, jpath, t0)
    print(doc["table_md"])
    print(f"wrote {jpath} and {jpath.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
