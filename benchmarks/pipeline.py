"""The end-to-end demo: Kafka → Spark → ClickHouse exactly once, through driver crashes.

``python -m benchmarks.pipeline`` (what ``make demo`` runs) parses its options into a
:class:`~spark_datasource.testing.pipeline_config.PipelineConfig` and runs
:func:`spark_datasource.testing.pipeline.run_pipeline` once: the embedded stack (or
``--url``/``--bootstrap`` servers), a topic and a target table, the events, the
streaming job SIGKILLed ``--crash`` times (at a protocol step or at a random moment)
and restarted on the same checkpoint, then the check of every record. It prints a
summary table, writes ``--json``, and exits 1 on duplicates or losses (``none`` mode,
being at-least-once, fails on losses only).

Everything it starts (stack, jobs) is stopped on exit, Ctrl-C and errors included.
The torture tests and the checkpoint sweep use :mod:`spark_datasource.testing.pipeline`, not
this command.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.results_file import write_result
from clickhouse_tx.testing.faults import STREAMING_STEPS
from spark_datasource.testing.foreach_sinks import SINKS
from spark_datasource.testing.pipeline import run_pipeline
from spark_datasource.testing.pipeline_config import MODES, PipelineConfig
from spark_datasource.testing.pipeline_report import summary_table
from spark_datasource.testing.streaming_job import DECODE_OPTIONS, DEFAULT_DECODE


def _add_job_options(ap: argparse.ArgumentParser) -> None:
    """The streaming job's source, sink and decode options."""
    ap.add_argument(
        "--source-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="kafka_py option, e.g. maxPartitions=2 (repeatable)",
    )
    ap.add_argument(
        "--kafka-client",
        default=None,
        choices=("auto", "librdkafka", "kafka-python"),
        help="kafka_py's kafka.client (default: the source's own, auto: librdkafka when confluent-kafka is "
        "installed); the same as --source-option kafka.client=...",
    )
    ap.add_argument(
        "--sink",
        default="clickhouse_tx",
        choices=SINKS,
        help="foreach_insert, foreach_connect: at-least-once foreachBatch sinks that bypass the writer",
    )
    ap.add_argument(
        "--decode",
        default=DEFAULT_DECODE,
        choices=tuple(DECODE_OPTIONS),
        help="where the job decodes the events' JSON: kafka_py's value.format=json, or Spark's from_json",
    )


def _parse(argv: Sequence[str] | None) -> tuple[PipelineConfig, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pipeline", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--mode", default="transaction", choices=MODES)
    ap.add_argument("--trigger", type=float, default=2.0, help="processingTime interval, seconds (0: availableNow)")
    ap.add_argument("--crash", type=int, default=2, help="SIGKILL and restart the job this many times")
    ap.add_argument(
        "--crash-points",
        default="mixed",
        help="random | steps | mixed | comma-separated steps of: " + ", ".join(STREAMING_STEPS),
    )
    ap.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=None,
        help="records per micro-batch (default: events/10 when producing up front)",
    )
    ap.add_argument("--rate", type=float, default=None, help="produce at this many events/s while the job runs")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--url", default=None, help="existing ClickHouse (with --bootstrap): no stack is started")
    ap.add_argument("--bootstrap", default=None, help="existing Kafka")
    ap.add_argument("--kafka-control", default=None, help="the dev broker's control url (topic creation)")
    ap.add_argument("--table", default=None, help="database.table (default: a fresh pipeline.events_*)")
    ap.add_argument("--work-dir", default=None, help="checkpoints, logs, stack (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary work dir")
    ap.add_argument("--latency", action="store_true", help="poll visibility and report end-to-end latency")
    ap.add_argument("--writer-option", action="append", default=[], metavar="KEY=VALUE")
    _add_job_options(ap)
    ap.add_argument("--job-timeout", type=float, default=900.0)
    ap.add_argument("--json", default=None, metavar="FILE", help="write the figures as JSON")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    if a.events <= 0 or a.partitions <= 0 or a.crash < 0:
        ap.error("--events and --partitions must be positive, --crash not negative")
    if (a.url is None) != (a.bootstrap is None):
        ap.error("--url and --bootstrap go together (both existing servers) or neither (embedded stack)")
    cfg = PipelineConfig(
        events=a.events,
        partitions=a.partitions,
        mode=a.mode,
        trigger=a.trigger,
        crashes=a.crash,
        crash_points=a.crash_points,
        max_offsets_per_trigger=a.max_offsets_per_trigger,
        rate=a.rate,
        seed=a.seed,
        url=a.url,
        bootstrap=a.bootstrap,
        kafka_control=a.kafka_control,
        table=a.table,
        work_dir=a.work_dir,
        keep=a.keep,
        measure_latency=a.latency,
        job_timeout_s=a.job_timeout,
        quiet=a.quiet,
        writer_options=tuple(a.writer_option),
        source_options=tuple(a.source_option) + ((f"kafka.client={a.kafka_client}",) if a.kafka_client else ()),
        sink=a.sink,
        decode=a.decode,
    )
    return cfg, a


def main(argv: Sequence[str] | None = None) -> int:
    cfg, a = _parse(argv)
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the job and the stack
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        result = run_pipeline(cfg)
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except Exception as e:  # the CLI reports, the finally blocks clean up
        print(f"pipeline failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(summary_table(result))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        write_result(a.json, result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
