"""Benchmark: what Spark's offset and commit log writes cost on a local checkpoint, by how they are stored.

Spark's floor query of ``streaming_speed`` (``rate-micro-batch`` → ``noop``, 32 rows
over 8 partitions, batches back to back) runs under each variant, in interleaved
rounds on one session, each query on a checkpoint of its own:

- ``default``: Spark's default checkpoint manager (``FileContext``-based) over Hadoop's
  default local file system for it, ``LocalFs``, which keeps a ``.crc`` checksum file
  beside each file and checks it on every read;
- ``raw_local_fs``: the same manager over Hadoop's raw local file system
  (``spark.hadoop.fs.AbstractFileSystem.file.impl=org.apache.hadoop.fs.local.RawLocalFs``):
  no checksum files, so none checked;
- ``filesystem_manager``: Spark's ``FileSystem``-based checkpoint manager
  (``spark.sql.streaming.checkpointFileManagerClass``), an internal Spark class.

Each variant sets both settings itself (at run time: Spark reads them when a query
starts), so its label is what it ran with. Per variant: the mean ``durationMs`` of
``walCommit`` (the offset log), ``commitOffsets`` (the commit log), ``addBatch`` and
``triggerExecution`` over the measured batches of each round, their medians over the
rounds, the ``.crc`` files its checkpoint held, and its batch time over the default's.

    python -m benchmarks.checkpoint_fs --json benchmarks/results/checkpoint_fs.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_file import machine, write_result

FILE_IMPL_KEY = "fs.AbstractFileSystem.file.impl"
MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
_MANAGERS = "org.apache.spark.sql.execution.streaming.checkpointing"
#: variant → (Hadoop's AbstractFileSystem for ``file:``, Spark's checkpoint manager or None for Spark's default)
VARIANTS: Mapping[str, tuple[str, str | None]] = {
    "default": ("org.apache.hadoop.fs.local.LocalFs", None),
    "raw_local_fs": ("org.apache.hadoop.fs.local.RawLocalFs", None),
    "filesystem_manager": ("org.apache.hadoop.fs.local.LocalFs", f"{_MANAGERS}.FileSystemBasedCheckpointFileManager"),
}
KEYS = ("walCommit", "commitOffsets", "addBatch", "triggerExecution")
ROWS = 32


def summarize(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Per variant, the median over ``rounds`` of each round's mean ms, and the batch time's ratio to the default's.

    ``rounds``: one mapping per round, variant → ``{"mean_ms": {key: ms}, "checksum_files": n}``.
    """
    out: dict[str, Any] = {}
    for variant in rounds[0]:
        runs = [r[variant] for r in rounds]
        out[variant] = {
            "median_ms": {k: round(statistics.median(run["mean_ms"][k] for run in runs), 1) for k in KEYS},
            "checksum_files": max(run["checksum_files"] for run in runs),
        }
    base = out["default"]["median_ms"]["triggerExecution"]
    for figures in out.values():
        figures["batch_time_over_default"] = round(figures["median_ms"]["triggerExecution"] / base, 3)
    return out


def use_variant(spark: Any, variant: str) -> None:
    """Store the checkpoints of queries ``spark`` starts from now on as ``variant`` says.

    Driver, before a query starts (Spark builds a query's checkpoint manager when it
    starts, from the session's settings then).
    """
    file_impl, manager = VARIANTS[variant]
    spark.sparkContext._jsc.hadoopConfiguration().set(FILE_IMPL_KEY, file_impl)
    if manager is None:
        spark.conf.unset(MANAGER_KEY)
    else:
        spark.conf.set(MANAGER_KEY, manager)


def _one(spark: Any, variant: str, batches: int, work: Path) -> dict[str, Any]:
    """One floor query under ``variant``, on a checkpoint of its own under ``work``."""
    from benchmarks.streaming_speed_batch import spark_floor

    use_variant(spark, variant)
    chk = Path(tempfile.mkdtemp(prefix=f"{variant}_", dir=work))
    floor = spark_floor(spark, ROWS, chk, lambda _: None, batches)
    return {"mean_ms": {k: floor["mean_ms"][k] for k in KEYS}, "checksum_files": len(list(chk.rglob("*.crc")))}


def run(rounds: int, batches: int) -> dict[str, Any]:
    """Driver: ``rounds`` interleaved rounds of every variant; the result document."""
    from benchmarks.batch_overhead import PARTITIONS
    from spark_datasource.testing.session import local_session

    spark = local_session("clickhouse-tx-checkpoint-fs", {"spark.sql.shuffle.partitions": "2"})
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint_fs_"))
    measured: list[dict[str, Any]] = []
    t0 = time.monotonic()
    names = list(VARIANTS)
    try:
        for i in range(rounds):
            # each round starts with another variant: the first query of a round runs on a
            # JVM that has just stopped a query (the first round's, on a cold one)
            order = names[i % len(names) :] + names[: i % len(names)]
            got = {v: _one(spark, v, batches, work) for v in order}
            measured.append({v: got[v] for v in names})
            print(f"[{time.monotonic() - t0:6.0f} s] round {i}: {measured[-1]}", flush=True)
    finally:
        spark.stop()
    return {
        "benchmark": "checkpoint_fs",
        "query": {"source": "rate-micro-batch", "rows_per_batch": ROWS, "partitions": PARTITIONS, "sink": "noop"},
        "variants": {
            v: {"file_impl": f, "checkpoint_manager": m or "Spark's default"} for v, (f, m) in VARIANTS.items()
        },
        "measured_batches": batches,
        "rounds": measured,
        "summary": summarize(measured),
        "machine": machine(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_fs", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of every variant (default 5)")
    ap.add_argument("--batches", type=int, default=20, help="measured micro-batches per query (default 20)")
    ap.add_argument("--json", default="benchmarks/results/checkpoint_fs.json")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.batches < 1:
        ap.error("--rounds and --batches take a positive number")
    doc = run(a.rounds, a.batches)
    write_result(a.json, doc)
    for variant, figures in doc["summary"].items():
        print(f"  {variant}: {figures}")
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
