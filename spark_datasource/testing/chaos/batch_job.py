"""The chaos runs' batch job: a resumable ``clickhouse_tx`` batch write of generated events.

A Spark driver program (``python -m spark_datasource.testing.chaos.batch_job``), started, killed and
restarted by :mod:`spark_datasource.testing.chaos.runner` through
:class:`spark_datasource.testing.job_launcher.JobLauncher`; it speaks the streaming job's stdout
protocol (``READY``, ``DONE``). Event ``i`` (``0 <= i < events``) is written as topic
``batch``, partition ``i % partitions``, offset ``i // partitions``, so the same
checks as for the Kafka jobs apply. The write is resumable: the same
``transactional_id`` and ``decision_log`` on every run, and the same partitioning
(``spark.range`` with ``partitions`` slices), so a re-run after a crash finishes the
batch and never writes a row twice.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

from spark_datasource.testing import credentials
from spark_datasource.testing.streaming_job import key_values

BATCH_TOPIC = "batch"


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m spark_datasource.testing.chaos.batch_job", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--url", required=True, help="ClickHouse HTTP url (unused when --writer-option gives shards)")
    ap.add_argument("--table", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--events", type=int, required=True)
    ap.add_argument("--partitions", type=int, required=True)
    ap.add_argument("--txn-id", required=True)
    ap.add_argument("--decision-log", required=True)
    ap.add_argument("--writer-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--master", default="local[2]", help="e.g. local[2,4]: a failed task is tried up to 4 times")
    ap.add_argument("--fault-step", default=None)
    ap.add_argument("--fault-action", default="kill")
    ap.add_argument("--fault-once-file", default=None)
    return ap.parse_args(argv)


def _emit(kind: str, doc: dict) -> None:
    sys.stdout.write(f"{kind} {json.dumps(doc, sort_keys=True)}\n")
    sys.stdout.flush()


def _options(a: argparse.Namespace) -> dict[str, str]:
    opts = {
        "url": a.url,
        "table": a.table,
        "mode": a.mode,
        "transactional_id": a.txn_id,
        "decision_log": a.decision_log,
        "allow_nullable_into_non_nullable": "true",
        **credentials.writer_options(),  # the run's user and password (make test-external), if any
    }
    if a.fault_step:
        opts.update({"fault.step": a.fault_step, "fault.action": a.fault_action})
        if a.fault_once_file:
            opts["fault.once_file"] = a.fault_once_file
    opts.update(key_values("--writer-option", a.writer_option))
    if "shards" in opts:  # a cluster's writer names its shards instead of one url
        del opts["url"]
    return opts


def run(argv: Sequence[str] | None = None) -> int:
    """Write the events once (driver, once per run); 0 when the write committed."""
    from spark_datasource.testing.streaming_job import build_session

    a = _args(argv)
    started = time.monotonic()
    spark = build_session(a.master)
    import spark_datasource

    spark_datasource.register(spark)
    p = a.partitions
    df = spark.range(0, a.events, 1, p).selectExpr(
        "id AS event_id",
        "id * 7919 % 100000 AS user_id",
        "cast(id % 10000 AS double) / 100 AS amount",
        "timestamp_millis(1700000000000 + id) AS event_time",
        f"'{BATCH_TOPIC}' AS topic",
        f"cast(id % {p} AS int) AS `partition`",
        f"id div {p} AS `offset`",
        "timestamp_millis(1700000000000 + id) AS kafka_ts",
    )
    _emit("READY", {"seconds": round(time.monotonic() - started, 3)})
    try:
        df.write.format("clickhouse_tx").options(**_options(a)).mode("append").save()
    except Exception as e:  # the parent restarts the job; the message tells it about recover
        print(f"batch write failed: {e}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    _emit("DONE", {"batches": 1, "seconds": round(time.monotonic() - started, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(run())
