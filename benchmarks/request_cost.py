"""What one HTTP request costs the client and the server: the floor under every commit step.

The driver's commit of a micro-batch is a count of requests (``benchmarks.commit_latency``
lists them: 20 for 8 partitions in mode ``transaction``), so its latency cannot fall
below what one request costs times what cannot run at once. Per arm, a worker process
sends, one after the other:

- ``sequential``: ``SELECT 1`` through ``ClickHouseHTTP.command``, one at a time;
- ``session_checks``: the driver's session check (``SELECT transactionID()`` with
  ``session_check=1``) in 8 open transactions at once, as a commit of 8 partitions
  does, timed per round of 8;
- ``raw``: ``SELECT 1`` through ``http.client`` on one kept-alive connection, the floor
  of any Python client.

For each it reports wall milliseconds and the client's CPU milliseconds per request
(``os.times`` of the worker), and the server's CPU per request (``/proc/<pid>/stat`` of
the ClickHouse process, read around the worker). Arms are ``current`` (this tree) and
``baseline`` (``--baseline-rev``'s ``clickhouse_tx``), alternated ABBA on one server.

    python -m benchmarks.request_cost --baseline-rev HEAD --json benchmarks/results/request_cost.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any, Callable

from benchmarks.commit_latency import abba, arms, worker_env
from benchmarks.cpu_sampler import parse_stat
from benchmarks.results_file import machine, write_result

SESSIONS = 8


def _cpu_ms() -> float:
    t = os.times()
    return (t.user + t.system) * 1000


WARM_UP = 5


def _timed(fn: Callable[[], object], n: int, per: int = 1) -> dict[str, float]:
    """Wall and this process's CPU per request over ``n`` calls of ``fn`` (each ``per``
    requests), after :data:`WARM_UP` calls; ``sent``: every request, warm-up included."""
    for _ in range(WARM_UP):
        fn()
    wall, cpu = time.perf_counter(), _cpu_ms()
    for _ in range(n):
        fn()
    requests = n * per
    return {
        "wall_ms": round((time.perf_counter() - wall) * 1000 / requests, 3),
        "client_cpu_ms": round((_cpu_ms() - cpu) / requests, 3),
        "sent": (WARM_UP + n) * per,
    }


def worker(url: str, n: int) -> dict[str, Any]:
    """One arm: the three measures, and ``requests_sent`` (every request of the arm, by
    which the parent divides the server's CPU)."""
    import clickhouse_tx
    from clickhouse_tx.client.http import ClickHouseHTTP
    from clickhouse_tx.interfaces import Target

    target = Target(url=url, database="default", table="x", session_timeout_s=60)
    client = ClickHouseHTTP(target)
    got: dict[str, Any] = {"code": str(Path(clickhouse_tx.__file__).parent)}
    got["sequential"] = _timed(lambda: client.command("SELECT 1"), n)
    sessions = [ClickHouseHTTP(target, session_id=f"cost_{uuid.uuid4().hex}") for _ in range(SESSIONS)]
    for s in sessions:
        s.command("BEGIN TRANSACTION")
    with concurrent.futures.ThreadPoolExecutor(SESSIONS) as pool:
        check = lambda s: s.command("SELECT transactionID()", session_check=True)  # noqa: E731
        got["session_checks"] = _timed(lambda: list(pool.map(check, sessions)), max(1, n // SESSIONS), SESSIONS)
        got["session_checks"]["round_of_8_wall_ms"] = round(got["session_checks"]["wall_ms"] * SESSIONS, 2)
    for s in sessions:
        s.command("ROLLBACK", session_check=True)
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80)

    def raw() -> bytes:
        conn.request("POST", "/", body=b"SELECT 1")
        return conn.getresponse().read()

    got["raw"] = _timed(raw, n)
    got["requests_sent"] = sum(m.pop("sent") for m in (got["sequential"], got["session_checks"], got["raw"]))
    got["requests_sent"] += 2 * SESSIONS  # their BEGINs and ROLLBACKs
    return got


def _server_cpu_ms(pid: int) -> float:
    return parse_stat(Path(f"/proc/{pid}/stat").read_text())[1] * 1000


def run_arm(code: str | None, url: str, n: int, server_pid: int | None) -> dict[str, Any]:
    before = _server_cpu_ms(server_pid) if server_pid else None
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.request_cost", "--worker", url, str(n)],
        env=worker_env(code),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tempfile.gettempdir(),
    )
    if res.returncode:
        raise SystemExit(f"worker failed ({code or 'current'}):\n{res.stderr[-4000:]}")
    got = json.loads(res.stdout.strip().splitlines()[-1])
    sent = got.pop("requests_sent")
    if before is not None and server_pid:
        got["server_cpu_ms_per_request"] = round((_server_cpu_ms(server_pid) - before) / sent, 3)
    return got


def bench(url: str, server_pid: int | None, rounds: int, n: int, baseline_rev: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ctx-request-cost-") as base_dir:
        baseline_rev, codes = arms(baseline_rev, base_dir)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
        for r, name, code in abba(codes, rounds):
            got = run_arm(code, url, n, server_pid)
            runs[name].append(got)
            print(f"  round {r + 1}/{rounds} {name:8s}: {json.dumps(got)}", file=sys.stderr, flush=True)
    summary = {name: _median_of(arm) for name, arm in runs.items()}
    return {
        "benchmark": "request_cost",
        "baseline_rev": baseline_rev,
        "rounds": rounds,
        "requests_per_measure": n,
        **summary,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
    }


def _median_of(arm: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds of one arm."""
    out: dict[str, Any] = {}
    for key, value in arm[0].items():
        if isinstance(value, str):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = {k: round(statistics.median(r[key][k] for r in arm), 3) for k in value}
        else:
            out[key] = round(statistics.median(r[key] for r in arm), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        print(json.dumps(worker(argv[1], int(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=400, help="requests per measure and round")
    ap.add_argument("--baseline-rev", default=None, help="git revision whose clickhouse_tx is the baseline")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from server_patches.stack import running_stack

    with tempfile.TemporaryDirectory(prefix="ctx-bench-stack-") as d, running_stack(d) as stack:
        result = bench(stack.clickhouse_url, stack.pids["clickhouse"], args.rounds, args.requests, args.baseline_rev)
    print(json.dumps(result, indent=2))
    if args.json:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
