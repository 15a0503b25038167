"""The driver's commit of a batch (``transaction``, 8 partitions, unless told): p50/p99 and where the time goes.

Starts a private embedded stack, then runs rounds that alternate two workers, each a
subprocess that prepares ``--commits`` small batches of ``--partitions`` partitions through
:func:`clickhouse_tx.factory.build_coordinator` and times ``commit_batch`` on a fresh
coordinator (as Spark builds one per commit):

- ``current``: the ``clickhouse_tx`` of this tree;
- ``baseline``: the ``clickhouse_tx`` of ``--baseline-rev`` (``git archive`` into a
  temp dir, put first on ``PYTHONPATH``), against the same server in the same run.

Each commit is broken down by step: the coordinator's own step durations
(``CommitReport.durations``: plan, session check, decision write, commit, rollback,
mark done) and, per I/O call (``mode.commit``, ``registry.transition_many``,
``log.write``, ...), its count, its summed time and the HTTP round trips made inside
it. Calls run in parallel, so summed call times may exceed the wall time.

    python -m benchmarks.commit_latency --json benchmarks/results/commit_latency.json
    python -m benchmarks.commit_latency --mode dedup --partitions 128 --commits 5 --baseline-rev <rev>
    python -m benchmarks.commit_latency --mode transaction,staging,dedup,none --partitions 8,32,128 \
        --rounds 2 --commits 5 --baseline-rev <rev> --json benchmarks/results/commit_latency_sweep.json

With several modes or partition counts, every pair runs on the one server and the result
adds each mode's slope: the least-squares ms per partition of its p50, per arm.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.results_file import run_on_server

REPO = Path(__file__).resolve().parent.parent
DDL = (
    "CREATE TABLE IF NOT EXISTS {db}.{t} (id Int64, payload String) ENGINE = MergeTree ORDER BY id "
    "SETTINGS non_replicated_deduplication_window = 100000"  # mode dedup needs one; the others ignore it
)
PARTITIONS = 8
ROWS_PER_PARTITION = 1000


def _pct(xs: list[float], q: float) -> float:
    """The harness's percentile (0..100, linear), so the figures compare with the others."""
    from spark_datasource.testing.visibility import percentile

    got = percentile(xs, q)
    return float("nan") if got is None else got


# ----------------------------------------------------------------------------- worker


class Spans:
    """Time spent per I/O call name, and the HTTP round trips made inside each (one commit)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.local = threading.local()
        self.on = False
        self.reset()

    def reset(self) -> None:
        self.ms: dict[str, float] = collections.defaultdict(float)
        self.calls: dict[str, int] = collections.defaultdict(int)
        self.http: dict[str, int] = collections.defaultdict(int)

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        outer = getattr(self.local, "name", None)
        self.local.name = name if outer is None else outer
        t = time.perf_counter()
        try:
            yield
        finally:
            self.local.name = outer
            if self.on and outer is None:  # only the outermost call counts (no double counting)
                with self.lock:
                    self.ms[name] += (time.perf_counter() - t) * 1000
                    self.calls[name] += 1

    def count_http(self) -> None:
        if self.on:
            with self.lock:
                self.http[getattr(self.local, "name", None) or "other"] += 1


class Timed:
    """A proxy timing every method call of ``inner`` as ``<label>.<method>``."""

    def __init__(self, inner: Any, label: str, spans: Spans) -> None:
        self._inner, self._label, self._spans = inner, label, spans

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        @functools.wraps(attr)
        def call(*a: Any, **kw: Any) -> Any:
            with self._spans.span(f"{self._label}.{name}"):
                return attr(*a, **kw)

        return call


def count_requests(spans: Spans) -> None:
    """Count every HTTP request of this process against the innermost open span."""
    import requests

    orig: Callable[..., Any] = requests.Session.request

    def request(self: Any, *a: Any, **kw: Any) -> Any:
        spans.count_http()
        return orig(self, *a, **kw)

    requests.Session.request = request  # type: ignore[method-assign]


def instrument(coord: Any, spans: Spans) -> None:
    """Wrap a coordinator's three I/O objects (mode, registry, decision log) in :class:`Timed`."""
    mode, reg = Timed(coord.mode_io, "mode", spans), Timed(coord.registry, "registry", spans)
    log = Timed(coord.log, "log", spans)
    coord.context = dataclasses.replace(coord.context, mode_io=mode, registry=reg, log=log)


def prepare_all(coord: Any, txn: str, batch: int, parts: list[Any], run: str) -> list[Any]:
    """Prepare every partition of ``batch``, 4 at a time (as executors would, under one run id)."""
    from clickhouse_tx.interfaces import WriteContext

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(
            pool.map(lambda ip: coord.prepare(WriteContext(txn, batch, ip[0], 0, run), iter(ip[1])), enumerate(parts))
        )


def worker(
    url: str, db: str, table: str, logroot: str, commits: int, first_batch: int, mode: str, partitions: int
) -> dict[str, Any]:
    import pyarrow as pa

    import clickhouse_tx
    from clickhouse_tx.factory import build_coordinator
    from clickhouse_tx.interfaces import Target

    spans = Spans()
    count_requests(spans)
    target = Target(url=url, database=db, table=table)
    txn = f"lat-{uuid.uuid4().hex[:8]}"
    out: dict[str, Any] = {"code": str(Path(clickhouse_tx.__file__).parent), "commits": []}
    for b in range(first_batch, first_batch + commits):
        coord = build_coordinator(target, mode, txn, logroot)
        parts = [
            pa.table({"id": pa.array(range(i * ROWS_PER_PARTITION, (i + 1) * ROWS_PER_PARTITION), pa.int64())})
            .append_column("payload", pa.array(["x"] * ROWS_PER_PARTITION))
            .to_batches()
            for i in range(partitions)
        ]
        msgs = prepare_all(coord, txn, b, parts, run=txn)
        fresh = build_coordinator(target, mode, txn, logroot)  # as Spark does
        instrument(fresh, spans)
        spans.reset()
        spans.on = True
        t = time.perf_counter()
        report = fresh.commit_batch(b, msgs)
        ms = (time.perf_counter() - t) * 1000
        spans.on = False
        assert len(report.committed) == partitions, report
        out["commits"].append(
            {
                "ms": ms,
                "steps_ms": {k: v * 1000 for k, v in report.durations.items()},
                "calls": {k: {"n": spans.calls[k], "ms": spans.ms[k], "http": spans.http.get(k, 0)} for k in spans.ms},
                "http": sum(spans.http.values()),
                "http_outside_calls": spans.http.get("other", 0),
            }
        )
    return out


# ----------------------------------------------------------------------------- parent


def baseline_tree(rev: str, into: str) -> str:
    """``clickhouse_tx`` of ``rev`` unpacked under ``into`` (importable from there)."""
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "clickhouse_tx"], check=True, capture_output=True
    ).stdout
    path = os.path.join(into, "tar")
    Path(path).write_bytes(tar)
    with tarfile.open(path) as t:
        t.extractall(into, filter="data")
    return into


def arms(baseline_rev: str | None, into: str) -> tuple[str | None, dict[str, str | None]]:
    """The baseline's short commit (not a branch that moves on) and the arms: ``current`` (code
    None) and, with ``baseline_rev``, ``baseline`` (its ``clickhouse_tx`` under ``into``)."""
    if not baseline_rev:
        return None, {"current": None}
    rev_parse = ["git", "-C", str(REPO), "rev-parse", "--short", baseline_rev]
    rev = subprocess.run(rev_parse, check=True, capture_output=True, text=True).stdout.strip()
    return rev, {"baseline": baseline_tree(rev, into), "current": None}


def abba(codes: dict[str, str | None], rounds: int) -> Iterator[tuple[int, str, str | None]]:
    """(round, arm, code) in ABBA order: interleaved, so drift and load hit every arm
    alike, and no arm always runs second (meeting the merges of the other's parts)."""
    for r in range(rounds):
        for name, code in list(codes.items())[:: 1 if r % 2 == 0 else -1]:
            yield r, name, code


def worker_env(code: str | None) -> dict[str, str]:
    """An arm's worker's environment: ``code`` first on ``PYTHONPATH``. Run the worker
    outside the repository: ``-m`` puts the cwd first on ``sys.path``."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (code, str(REPO)) if p))


def run_worker(
    code: str | None, url: str, db: str, table: str, commits: int, first_batch: int, mode: str, partitions: int
) -> dict[str, Any]:
    env = worker_env(code)
    logroot = tempfile.mkdtemp(prefix="ctx-commit-lat-log-")
    args = [sys.executable, "-m", "benchmarks.commit_latency", "--worker", url, db, table, logroot]
    args += [str(commits), str(first_batch), mode, str(partitions)]
    res = subprocess.run(args, env=env, cwd=logroot, capture_output=True, text=True, timeout=900)
    if res.returncode:
        raise SystemExit(f"worker failed ({code or 'current'}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def summarize(commits: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [c["ms"] for c in commits]
    steps = sorted({k for c in commits for k in c["steps_ms"]})
    calls = sorted({k for c in commits for k in c["calls"]})

    def med(xs: list[float]) -> float:
        return round(statistics.median(xs), 2)

    return {
        "commits": len(lat),
        "p50_ms": round(_pct(lat, 50), 1),
        "p99_ms": round(_pct(lat, 99), 1),
        "mean_ms": round(statistics.mean(lat), 1),
        "http_requests_median": med([c["http"] for c in commits]),
        "steps_ms_median": {k: med([c["steps_ms"].get(k, 0.0) for c in commits]) for k in steps},
        "io_calls_median": {
            k: {
                "calls": med([c["calls"].get(k, {}).get("n", 0) for c in commits]),
                "summed_ms": med([c["calls"].get(k, {}).get("ms", 0.0) for c in commits]),
                "http_requests": med([c["calls"].get(k, {}).get("http", 0) for c in commits]),
            }
            for k in calls
        },
    }


def bench(
    url: str,
    rounds: int,
    commits: int,
    baseline_rev: str | None,
    mode: str = "transaction",
    partitions: int = PARTITIONS,
) -> dict[str, Any]:
    from clickhouse_tx.client.http import ClickHouseHTTP
    from clickhouse_tx.interfaces import Target

    db = f"bench_{uuid.uuid4().hex[:8]}"
    admin = ClickHouseHTTP(Target(url=url, database="default", table="x"))
    admin.command(f"CREATE DATABASE {db}")
    admin.command(DDL.format(db=db, t="t"))
    with tempfile.TemporaryDirectory(prefix="ctx-commit-lat-base-") as base_dir:
        baseline_rev, codes = arms(baseline_rev, base_dir)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
        try:
            batch = 0
            for r, name, code in abba(codes, rounds):
                got = run_worker(code, url, db, "t", commits, batch, mode, partitions)
                batch += commits
                runs[name] += got["commits"]
                lat = [c["ms"] for c in got["commits"]]
                print(
                    f"  round {r + 1}/{rounds} {name:8s}: p50 {_pct(lat, 50):6.1f} ms "
                    f"p99 {_pct(lat, 99):6.1f} ms ({got['code']})",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            admin.command(f"DROP DATABASE IF EXISTS {db} SYNC")
    from benchmarks.results_file import machine

    got = {name: summarize(cs) for name, cs in runs.items()}
    if "baseline" in got:
        base, cur = got["baseline"], got["current"]
        got["current_over_baseline"] = {k: round(cur[k] / base[k], 3) for k in ("p50_ms", "p99_ms", "mean_ms")}
    return {
        "benchmark": "commit_latency",
        "mode": mode,
        "partitions": partitions,
        "rows_per_partition": ROWS_PER_PARTITION,
        "rounds": rounds,
        "commits_per_round": commits,
        "baseline_rev": baseline_rev,
        # the commit of 8 partitions within 20 ms; of 128 under 200 ms (docs/performance.md)
        "target_p50_ms": {PARTITIONS: 20, 128: 200}.get(partitions),
        **got,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
    }


def slope_ms_per_partition(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of p50 (ms) over the partition count: what one more partition costs."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    return round(sum((x - mx) * (y - my) for x, y in points) / den, 3) if den else float("nan")


def sweep(
    url: str, rounds: int, commits: int, baseline_rev: str | None, modes: list[str], partitions: list[int]
) -> dict[str, Any]:
    """:func:`bench` for every mode and partition count on one server, and each mode's slope per arm."""
    runs = []
    for mode in modes:
        for parts in partitions:
            print(f"== {mode}, {parts} partitions", file=sys.stderr, flush=True)
            runs.append(bench(url, rounds, commits, baseline_rev, mode, parts))
    slopes: dict[str, dict[str, float]] = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        arms = [a for a in ("baseline", "current") if a in mine[0]]
        slopes[mode] = {a: slope_ms_per_partition([(r["partitions"], r[a]["p50_ms"]) for r in mine]) for a in arms}
    table = [
        {
            "mode": r["mode"],
            "partitions": r["partitions"],
            **{f"{a}_p50_ms": r[a]["p50_ms"] for a in ("baseline", "current") if a in r},
        }
        for r in runs
    ]
    from benchmarks.results_file import machine

    return {
        "benchmark": "commit_latency_sweep",
        "baseline_rev": runs[0]["baseline_rev"],
        "rounds": rounds,
        "commits_per_round": commits,
        "p50_ms": table,
        "slope_ms_per_partition": slopes,
        "runs": runs,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        url, db, table, logroot, commits, first, mode, partitions = argv[1:9]
        print(json.dumps(worker(url, db, table, logroot, int(commits), int(first), mode, int(partitions))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--commits", type=int, default=30, help="commits per worker per round")
    ap.add_argument("--baseline-rev", default=None, help="git revision whose clickhouse_tx is the baseline")
    ap.add_argument("--url", help="an existing server (default: start the embedded stack)")
    ap.add_argument("--mode", default="transaction", help="a mode, or several: transaction,staging,dedup,none")
    ap.add_argument("--partitions", default=str(PARTITIONS), help="a count, or several: 8,32,128")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    modes, parts = args.mode.split(","), [int(p) for p in args.partitions.split(",")]
    if len(modes) == 1 and len(parts) == 1:
        run = functools.partial(bench, mode=modes[0], partitions=parts[0])
    else:
        run = functools.partial(sweep, modes=modes, partitions=parts)
    run_on_server(args.url, lambda url: run(url, args.rounds, args.commits, args.baseline_rev), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
