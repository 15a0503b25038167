"""Streaming at the speed of the source: ``kafka_py`` batch vs streaming vs each sink mode.

``python -m benchmarks.streaming_speed [--quick]`` runs, on one embedded stack:

1. **Ceiling and availableNow** (one in-process ``local[2]`` SparkSession, one topic
   produced up front): batch ``kafka_py`` → ``noop`` (the source's ceiling, the second
   of two runs), streaming ``kafka_py`` → ``noop``, and streaming → ``clickhouse_tx``
   in each mode (the JSON decoded as ``--decode`` says), all with
   ``Trigger.AvailableNow`` and ``maxOffsetsPerTrigger``.
   Streaming throughput is rows / Σ ``triggerExecution`` of the batches after the
   first (the first one pays the Python workers' start); the per-batch split is the
   mean of each ``StreamingQueryProgress.durationMs`` entry over those batches.
   Then **noop rounds**: the batch job and availableNow → noop under each cut and
   batch size of :data:`VARIANTS`, and the pipeline's job cut at each stage of
   :data:`SPLIT_RUNS` (raw read, JSON parse by ``from_json`` or by the source, Python
   writer, ``none``, ``transaction``), ``--rounds`` times interleaved; the
   streaming/batch ratios are the medians' (the JVM warms up over the first runs).
   Each round also runs the pipeline's events (the JSON decoded in the source) as a
   batch job into ``clickhouse_tx`` as :data:`BATCH_SINKS` says: what the sink costs
   with no micro-batches at all on this machine, where ClickHouse and the broker share
   the cores with Spark. Each decoded streaming run is also given over the batch job
   into the same mode with the same cut (``stream decoded_transaction/batch transaction``).
   Beside them: ``noop`` with the whole topic in one batch (how the ratio to the
   batch job depends on the batch size), and **paced production**: a second topic
   produced at ``--rate`` (as the pipeline runs produce), read by the same range reads
   and availableNow queries with batches of one 5 s trigger. The dev broker (librdkafka's
   mock cluster) answers each Fetch with one producer batch per partition, so records
   produced a few at a time cost one round trip per few records (``docs/performance.md``).
2. **Fixed cost**: a streaming query over batches of a few records per partition
   (8 partitions), into ``noop`` and into ``clickhouse_tx`` in each mode: its mean
   ``triggerExecution`` (after the first batch) is what a micro-batch costs whatever
   its size. Beside it, **Spark's floor**: Spark's ``rate-micro-batch`` source (the
   same records per batch and partitions) into ``noop``, what any micro-batch of this
   session costs before a source or sink adds anything (``--spark-conf
   spark.sql.streaming.checkpointFileManagerClass=...`` measures it, and everything
   else, with another checkpoint file manager: ``docs/performance.md``).
3. **Triggers and latency**: :func:`spark_datasource.testing.pipeline.run_pipeline` (the streaming job
   in its own process, a producer offering a steady ``--rate``) per mode and trigger
   interval: processing rate and end-to-end latency p50/p99, Kafka timestamp → visible
   to a read-committed reader (the pipeline's :class:`~spark_datasource.testing.visibility.VisibilityPoller`),
   over what is produced after a warm-up of :data:`WARMUP_S` (the first batches with
   data start the Python workers; the whole run's figures are kept beside).
4. **Ramp**: per mode at a 1 s trigger, offered rates doubling from ``--ramp-start``
   until a batch takes longer than the trigger (the lag then grows without bound, or
   the job fails when the dev broker drops records it has not read: ~5 MiB per partition);
   the last rate that kept up is the mode's sustained maximum. Then ``transaction`` at
   half its maximum, for the latency at a comfortable load.

Every session runs with :data:`spark_datasource.RECOMMENDED_SPARK_CONF` (Python workers
on Unix domain sockets); ``--spark-conf KEY=VALUE`` changes the session of sections 1
and 2 (``spark.python.unix.domain.socket.enabled=false`` measures without it).

Ratios (streaming/batch, transaction/none) are computed within the run. Writes JSON to
``benchmarks/results/streaming_speed[_quick].json`` and a PNG beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_session import bench_session
from benchmarks.results_file import machine, write_result
from benchmarks.streaming_speed_figures import MODES, RESULTS, ratios
from benchmarks.streaming_speed_pipeline import pipeline_sections
from benchmarks.streaming_speed_plot import plot
from benchmarks.streaming_speed_stream import in_process
from spark_datasource.testing.streaming_job import DECODE_OPTIONS, DEFAULT_DECODE, key_values


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.streaming_speed", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a few minutes: fewer events, triggers 1 and 5 s, modes none and transaction",
    )
    ap.add_argument(
        "--events",
        type=int,
        default=None,
        help="default 400000 (the dev broker keeps ~5 MiB, ~60k events, a partition), quick 150000",
    )
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--max-offsets", type=int, default=50_000, help="maxOffsetsPerTrigger")
    ap.add_argument("--fixed-batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="noop rounds (batch vs availableNow by variant)")
    ap.add_argument("--modes", default=None, help="default none,transaction,staging,dedup")
    ap.add_argument("--triggers", default=None, help="seconds, default 0.5,1,5,10 (quick 1,5)")
    ap.add_argument("--rate", type=float, default=2000.0, help="offered events/s for the trigger runs")
    ap.add_argument("--duration", type=float, default=None, help="seconds per run (default 30, quick 15)")
    ap.add_argument("--ramp-modes", default=None, help="default none,transaction")
    ap.add_argument("--ramp-start", type=float, default=2000.0)
    ap.add_argument("--ramp-steps", type=int, default=None, help="default 6, quick 3")
    ap.add_argument(
        "--decode",
        default=DEFAULT_DECODE,
        choices=tuple(DECODE_OPTIONS),
        help="where the job decodes the JSON in sections 1-4 (the split runs both)",
    )
    ap.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session of sections 1 and 2 (repeatable), e.g. "
        "spark.python.unix.domain.socket.enabled=false to measure without the recommended one",
    )
    ap.add_argument("--skip-pipeline", action="store_true", help="sections 1 and 2 only")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    a.spark_conf = key_values("--spark-conf", a.spark_conf)
    a.events = a.events or (150_000 if a.quick else 400_000)
    a.modes = [m for m in (a.modes or ("none,transaction" if a.quick else ",".join(MODES))).split(",") if m]
    a.triggers = [float(t) for t in (a.triggers or ("1,5" if a.quick else "0.5,1,5,10")).split(",")]
    a.duration = a.duration or (15.0 if a.quick else 30.0)
    a.ramp_modes = [m for m in (a.ramp_modes or "none,transaction").split(",") if m]
    a.ramp_steps = a.ramp_steps or (3 if a.quick else 6)
    return a


def _save(doc: dict[str, Any], a: argparse.Namespace, jpath: Path, t0: float) -> None:
    """Write what has been measured so far (after every section: a long run cut short
    still leaves its figures)."""
    doc["config"] = {
        "events": a.events,
        "partitions": a.partitions,
        "max_offsets_per_trigger": a.max_offsets,
        "noop_rounds": a.rounds,
        "modes": a.modes,
        "triggers": a.triggers,
        "rate": a.rate,
        "duration_s": a.duration,
        "ramp_modes": a.ramp_modes,
        "ramp_start": a.ramp_start,
        "quick": a.quick,
        "decode": a.decode,
        "spark": "local[2]",
        "machine": machine(),
    }
    doc["ratios"] = ratios(doc)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    write_result(jpath, doc)
    plot(doc, jpath.with_suffix(".png"))


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    name = "streaming_speed_quick" if a.quick else "streaming_speed"
    jpath = Path(a.json) if a.json else RESULTS / f"{name}.json"
    t0 = time.monotonic()
    with bench_session("chtx-speed-", t0) as (work, info, say):
        doc: dict[str, Any] = in_process(
            str(info.kafka_bootstrap), info.kafka_control, info.clickhouse_url, a, work, say
        )
        _save(doc, a, jpath, t0)
        if not a.skip_pipeline:
            pipeline_sections(doc, info, a, work, say, lambda: _save(doc, a, jpath, t0))
    _save(doc, a, jpath, t0)
    print(f"wrote {jpath} and {jpath.with_suffix('.png')}")
    for k, v in doc["ratios"].items():
        print(f"  {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
