"""Peers (a), (b) and (e) of :mod:`benchmarks.peers`: the pipeline's streaming job, one run each
through :func:`spark_datasource.testing.pipeline.run_pipeline`.

(a) writes with ``format("clickhouse_tx")`` in mode ``transaction``; (b) is the same
job's ``foreachBatch`` with ``toArrow()`` and clickhouse-connect's ``insert_arrow``
(``streaming_job`` sink ``foreach_connect``); (e) the same ``foreachBatch`` with the
exactly-once helper ``clickhouse_tx_batch`` (sink ``foreach_tx``). The harness produces the events, runs the
job in its own process (SIGKILLing and restarting it as planned, restarting it when it
fails by itself under a fault) and checks every record.

Calling process of the benchmark; Spark runs in the child job.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Any

from benchmarks.peers_faults import ClickHouseKiller, FaultPlan, Servers
from benchmarks.peers_figures import base_peer, peer_client
from spark_datasource.testing.foreach_sinks import FOREACH_FAULT_STEP
from spark_datasource.testing.pipeline import run_pipeline
from spark_datasource.testing.pipeline_config import PipelineConfig

#: The streaming job's ``--sink`` of each Spark peer.
SINK = {"transaction": "clickhouse_tx", "foreach_batch": "foreach_connect", "foreach_tx": "foreach_tx"}

#: Where each Spark peer's driver is killed under faults: once its batch's rows are
#: written and before Spark's commit log records the batch (every COMMIT of the
#: writer's done; clickhouse-connect's INSERT returned), then at a random moment.
DRIVER_KILLS = {
    "transaction": ("before_mark_done", "random"),
    "foreach_batch": (FOREACH_FAULT_STEP, "random"),
    "foreach_tx": (FOREACH_FAULT_STEP, "random"),
}

#: Restarts of a job that failed by itself (a query stopped by a ClickHouse kill) in a
#: run under faults: what a supervisor would do.
RESTARTS_ON_FAILURE = 6


def source_options(shared: tuple[str, ...], peer: str) -> tuple[str, ...]:
    """The ``KEY=VALUE`` options of ``peer``'s ``kafka_py`` source: the run's ``shared``
    ones, with ``kafka.client`` set by a ``PEER@CLIENT`` name in place of the run's."""
    client = peer_client(peer)
    if client is None:
        return shared
    return (*(kv for kv in shared if not kv.startswith("kafka.client=")), f"kafka.client={client}")


def run_spark(
    srv: Servers,
    peer: str,
    *,
    events: int,
    batch: int | None,
    trigger: float = 0.0,
    rate: float | None = None,
    warmup_s: float = 0.0,
    faults: FaultPlan | None = None,
    job_timeout_s: float = 900.0,
    mode: str = "transaction",
    spark_conf: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One run of a Spark peer; its figures and the harness's check of every record.

    ``trigger`` 0 with the events produced up front: ``Trigger.AvailableNow`` in batches
    of ``batch`` records (throughput: rows over the batches' summed ``triggerExecution``).
    ``rate``: a steady stream at that rate and a processing-time ``trigger`` (latency
    after ``warmup_s``). ``mode``: the sink's mode (peer ``transaction``'s job in
    ``dedup`` or ``staging``; :mod:`benchmarks.cpu_profile`). ``faults``: ClickHouse killed at the plan's times and the
    driver SIGKILLed at the plan's points. The job's source gets ``srv.source_options``
    (:func:`source_options`); its session ``srv.spark_conf`` and then ``spark_conf``
    (``KEY=VALUE`` Spark settings, the later one winning).
    """
    name = srv.fresh_name(base_peer(peer))
    table = f"peers.{name}"
    cfg = PipelineConfig(
        events=events,
        partitions=srv.partitions,
        mode=mode,
        trigger=trigger,
        crashes=len(faults.driver_kills) if faults else 0,
        crash_points=",".join(faults.driver_kills) if faults else "random",
        max_offsets_per_trigger=batch,
        rate=rate,
        seed=zlib.crc32(name.encode()),
        url=srv.url,
        bootstrap=srv.bootstrap,
        kafka_control=srv.control,
        table=table,
        work_dir=str(srv.work / name),
        measure_latency=rate is not None and faults is None,
        warmup_s=warmup_s,
        job_timeout_s=job_timeout_s,
        quiet=True,
        sink=SINK[base_peer(peer)],
        restart_failed=RESTARTS_ON_FAILURE if faults else 0,
        source_options=source_options(srv.source_options, peer),
        spark_conf=(*srv.spark_conf, *spark_conf),
    )
    killer = ClickHouseKiller(srv, table, faults) if faults else None
    try:
        with killer or contextlib.nullcontext():
            r = run_pipeline(cfg)
    except Exception as e:  # record and go on with the benchmark
        return {"peer": peer, "batch": batch, "table": table, "ok": False, "error": f"{type(e).__name__}: {e}"[:600]}
    lat = r.get("latency_ms") or {}
    out = {
        "peer": peer,
        "batch": batch,
        "rows_per_s": r["processing_rps"],
        "end_to_end_rows_per_s": r["throughput_rps"],
        "rate": rate,
        "p50_ms": lat.get("p50"),
        "p99_ms": lat.get("p99"),
        "records": lat.get("records"),
        **{k: v for k, v in r.items() if k not in ("kafka_end_offsets", "latency_ms", "anomalies")},
        "anomalies": r["anomalies"][:5],
    }
    if killer is not None:
        out["clickhouse_kills"] = killer.kills
    return out
