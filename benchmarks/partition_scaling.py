"""A micro-batch's cost against its number of partitions P, per mode, split executor/driver.

One Spark session (``local[2]``, :data:`spark_datasource.RECOMMENDED_SPARK_CONF`) runs a
stream of Spark's ``rate-micro-batch`` source, ``--rows`` small rows (id, k, v) per
micro-batch cut into P partitions, trigger ``processingTime=0``, into the
``clickhouse_tx`` sink in each mode in turn (one query per mode and P, one warm-up
micro-batch, then ``--batches`` measured ones; ``--rounds`` such queries per mode and P,
the modes interleaved, the best round kept). Per mode and P:

- ``add_batch_ms``: Spark's ``addBatch`` (the tasks' prepares and the driver's commit),
  median over the measured micro-batches, and its ratio to ``none`` at the same P;
- ``commit_ms``: the driver's commit (``commit_seconds`` of the writer's metrics line,
  :mod:`spark_datasource.sink.metrics`), and its steps (registry, decision log, COMMITs
  or MOVEs, markers, forget), medians;
- ``executor_ms``: ``add_batch_ms`` minus ``commit_ms``: the tasks' phase, which spreads
  over a cluster's cores (here 2);
- ``prepare_p50_ms``: the median task's ``prepare``.

``server_request_ms`` calibrates the server: the wall time of one ``SELECT 1``, 8 at a
time (:func:`server_request_ms`). A mode's cost per partition is mostly its requests
per partition times this, so the figures scale to a faster server by that ratio.

A least-squares line through the commit times, ``fixed + per_partition * P`` (ms), per
mode, is what docs/performance.md gives users to size a cluster.

    python -m benchmarks.partition_scaling                       # starts its own stack
    python -m benchmarks.partition_scaling --partitions 8,32,128 --rounds 3

Writes ``benchmarks/results/partition_scaling.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

from benchmarks.bench_session import run_micro_batches
from benchmarks.results_file import machine, save_figure, write_result
from benchmarks.spark_write import run_sql

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "partition_scaling.json"
MODES = ("none", "transaction", "staging", "dedup")
WARMUP = 1
#: The issue's targets at P = 128: micro-batch time over ``none``'s, and the driver's commit.
TARGETS = {"staging": 1.3, "dedup": 1.3, "transaction": 1.15, "commit_128_p50_ms": 200.0}


def _spark() -> Any:  # pyspark.sql.SparkSession
    import spark_datasource
    from spark_datasource.testing.session import local_session

    conf = {
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        "spark.driver.memory": "2g",
    }
    spark = local_session("clickhouse-tx-partition-scaling", conf)
    spark_datasource.register(spark)
    return spark


def _table(url: str, db: str, mode: str, name: str) -> str:
    window = " SETTINGS non_replicated_deduplication_window = 10000" if mode == "dedup" else ""
    run_sql(url, f"CREATE TABLE {db}.{name} (id Int64, k Int32, v Float64) ENGINE = MergeTree ORDER BY id{window}")
    return name


def run_query(
    spark: Any, url: str, db: str, mode: str, parts: int, rows: int, batches: int, work: Path, name: str
) -> list[dict]:
    """One query of ``WARMUP + batches`` micro-batches into ``mode``; per measured batch its
    progress (``durationMs``) joined with the writer's metrics line."""
    from spark_datasource.sink.metrics import read_metrics

    table = _table(url, db, mode, name)
    chk = f"{work}/{table}_{uuid.uuid4().hex[:6]}"
    stream = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", parts)
        .load()
        .selectExpr("value AS id", "cast(value % 1000 AS int) AS k", "cast(value AS double) * 0.5 AS v")
    )
    query = (
        stream.writeStream.trigger(processingTime="0 seconds")
        .option("checkpointLocation", chk)
        .format("clickhouse_tx")
        .options(url=url, database=db, table=table, mode=mode)
        .start()
    )
    count = batches + WARMUP
    progress = run_micro_batches(query, count, 120 + 3 * parts * count, f"{mode} P={parts}")[WARMUP:count]
    metrics = {m["batch"]: m for m in read_metrics(chk) if m["status"] == "committed"}
    _check_rows(url, db, table, metrics, exact=mode in ("transaction", "staging"))
    return [{"progress": p, "metrics": metrics[p["batchId"]]} for p in progress]


def _check_rows(url: str, db: str, table: str, metrics: dict[int, dict], *, exact: bool) -> None:
    """Every committed batch's rows are in the table once: a benchmark of a wrong sink is no figure.

    ``none`` and ``dedup`` keep what the tasks of the micro-batch that ``stop`` aborted
    wrote (``dedup`` drops it when a restart replays the batch), so there the committed
    rows are a lower bound.
    """
    got = int(run_sql(url, f"SELECT count() FROM {db}.{table} SETTINGS implicit_transaction = 1").strip())
    want = sum(int(m["rows"]) for m in metrics.values())
    if got != want if exact else got < want:
        raise RuntimeError(f"{db}.{table}: {got} rows, the committed batches hold {want}")


def summarize(batches: Sequence[dict]) -> dict[str, Any]:
    """Medians over the measured micro-batches of one mode and P (pure, unit-tested)."""
    add = [float(b["progress"]["durationMs"]["addBatch"]) for b in batches]
    commit = [1000 * float(b["metrics"]["commit_seconds"]) for b in batches]
    prepare = [float(b["metrics"]["prepare_seconds_p50"]) for b in batches]
    steps: dict[str, list[float]] = {}
    for b in batches:
        for k, v in b["metrics"].get("durations", {}).items():
            steps.setdefault(k, []).append(1000 * float(v))
    return {
        "add_batch_ms": round(statistics.median(add), 1),
        "commit_ms": round(statistics.median(commit), 1),
        "executor_ms": round(statistics.median(a - c for a, c in zip(add, commit)), 1),
        "prepare_p50_ms": round(1000 * statistics.median(prepare), 1),
        "commit_steps_ms": {k: round(statistics.median(v), 1) for k, v in sorted(steps.items())},
        "batches": len(batches),
    }


def fit_line(points: Sequence[tuple[int, float]]) -> dict[str, float]:
    """Least-squares ``fixed + per_partition * P`` through ``(P, ms)`` points (pure)."""
    n = len(points)
    mx = sum(p for p, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((p - mx) ** 2 for p, _ in points)
    slope = sum((p - mx) * (v - my) for p, v in points) / sxx if sxx else 0.0
    return {"fixed_ms": round(my - slope * mx, 1), "per_partition_ms": round(slope, 2)}


def report(results: dict[str, dict[int, dict[str, Any]]], rows: int) -> dict[str, Any]:
    """The JSON document: per mode and P the summary, ratios to ``none``, fitted lines, targets."""
    for by_p in results.values():
        for p, s in by_p.items():
            if "none" in results and p in results["none"]:
                s["ratio_to_none"] = round(s["add_batch_ms"] / results["none"][p]["add_batch_ms"], 3)
    fits = {
        mode: {
            "commit": fit_line([(p, s["commit_ms"]) for p, s in sorted(by_p.items())]),
            "add_batch": fit_line([(p, s["add_batch_ms"]) for p, s in sorted(by_p.items())]),
        }
        for mode, by_p in results.items()
        if len(by_p) > 1
    }
    at128 = {m: by_p[128] for m, by_p in results.items() if 128 in by_p}
    met = {f"{m}_ratio_at_128": at128[m].get("ratio_to_none", 0) <= t for m, t in TARGETS.items() if m in at128}
    met.update({f"{m}_commit_128_ms": s["commit_ms"] < TARGETS["commit_128_p50_ms"] for m, s in at128.items()})
    return {
        "benchmark": "partition_scaling",
        "rows_per_batch": rows,
        "warmup_batches": WARMUP,
        "master": "local[2]",
        "results": {m: {str(p): s for p, s in sorted(by_p.items())} for m, by_p in results.items()},
        "fits": fits,
        "targets": TARGETS,
        "targets_met": met,
        "machine": machine(),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Two panels against P: the micro-batch (``addBatch``) and the driver's commit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, by_p in doc["results"].items():
        ps = sorted(int(p) for p in by_p)
        axes[0].plot(ps, [by_p[str(p)]["add_batch_ms"] for p in ps], marker="o", label=mode)
        axes[1].plot(ps, [by_p[str(p)]["commit_ms"] for p in ps], marker="o", label=mode)
    for ax, title in zip(axes, ("micro-batch (addBatch), ms", "driver's commit, ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("partitions per micro-batch (P)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{doc['rows_per_batch']:,} rows per micro-batch, local[2], one machine")
    return save_figure(fig, path)


def server_request_ms(url: str, requests: int = 400, at_once: int = 8) -> float:
    """What one small request costs the server here: ``SELECT 1`` ``requests`` times,
    ``at_once`` at a time (the commit's parallelism), wall ms per request. Every
    per-partition cost above is a count of requests times about this."""
    import concurrent.futures

    from clickhouse_tx.client.http import ClickHouseHTTP
    from clickhouse_tx.interfaces import Target

    local = threading.local()

    def one(_: int) -> None:
        if getattr(local, "c", None) is None:
            local.c = ClickHouseHTTP(Target(url=url, database="default", table="x"))
        local.c.command("SELECT 1")

    with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
        list(pool.map(one, range(at_once)))  # connections up
        t0 = time.perf_counter()
        list(pool.map(one, range(requests)))
    return round(1000 * (time.perf_counter() - t0) / requests, 2)


def run(url: str, parts: Sequence[int], modes: Sequence[str], rows: int, batches: int, rounds: int) -> dict[str, Any]:
    """Every mode at every P, ``rounds`` times, modes interleaved within each round; per
    mode and P the round with the lowest ``addBatch`` (background merges and drops of the
    server's other tables land on one round, not on every one)."""
    work = Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    spark = _spark()
    db = f"bench_{uuid.uuid4().hex[:8]}"
    run_sql(url, f"CREATE DATABASE {db}")
    results: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in modes}
    t0 = time.monotonic()
    try:
        for p in parts:
            for r in range(rounds):
                for mode in modes:
                    s = summarize(run_query(spark, url, db, mode, p, rows, batches, work, f"{mode}_{p}_r{r}"))
                    best = results[mode].get(p)
                    seen = [*(best or {}).get("rounds_add_batch_ms", []), s["add_batch_ms"]]
                    results[mode][p] = {**(s if best is None or s["add_batch_ms"] < best["add_batch_ms"] else best)}
                    results[mode][p]["rounds_add_batch_ms"] = seen
                    print(
                        f"[{time.monotonic() - t0:5.0f} s] P={p:4d} round {r + 1} {mode:12s} "
                        f"addBatch {s['add_batch_ms']:8.0f} ms, commit {s['commit_ms']:7.0f} ms, "
                        f"executor {s['executor_ms']:8.0f} ms",
                        flush=True,
                    )
        request_ms = server_request_ms(url)
    finally:
        run_sql(url, f"DROP DATABASE IF EXISTS {db} SYNC")
        spark.stop()
    return {**report(results, rows), "rounds": rounds, "batches_per_round": batches, "server_request_ms": request_ms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", default="8,32,128,512", help="comma-separated values of P")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rows", type=int, default=64_000, help="rows per micro-batch")
    ap.add_argument("--batches", type=int, default=2, help="measured micro-batches per query")
    ap.add_argument("--rounds", type=int, default=2, help="queries per mode and P, modes interleaved")
    ap.add_argument("--url", help="ClickHouse HTTP url (default: start a private stack)")
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"--modes: {', '.join(unknown)} unknown; the modes are {', '.join(MODES)}")
    parts = [int(p) for p in a.partitions.split(",") if p]
    if a.url:
        doc = run(a.url, parts, modes, a.rows, a.batches, a.rounds)
    else:
        from server_patches.stack import running_stack

        with tempfile.TemporaryDirectory(prefix="bench_stack_") as d, running_stack(Path(d)) as info:
            doc = run(info.clickhouse_url, parts, modes, a.rows, a.batches, a.rounds)
    out = write_result(a.out, doc)
    plot(doc, out.with_suffix(".png"))
    print(json.dumps({"fits": doc["fits"], "targets_met": doc["targets_met"]}, indent=2))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
