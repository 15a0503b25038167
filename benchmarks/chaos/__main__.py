"""``python -m benchmarks.chaos`` (``make chaos``): seeded fault schedules over the real stack.

Environment (or the options of the same name): ``CHAOS_SCHEDULES`` (default 100)
schedules, seeds ``CHAOS_SEED`` (default 1) upwards; schedule ``s`` is
:func:`spark_datasource.testing.chaos.schedule.plan` of ``s``, so ``CHAOS_SEED=s CHAOS_SCHEDULES=1``
replays it. ``CHAOS_LANES`` (default 2) lanes run schedules side by side, each lane on
its own embedded stack (ZooKeeper, ClickHouse on chdb, the dev Kafka broker) with
fault-injecting proxies in front of ClickHouse and ZooKeeper, so a fault of one
schedule never reaches another's. Prints one line per schedule, then a table; writes
``benchmarks/results/chaos-<date>.json``; exits 1 if any schedule found a duplicate,
a loss, a leftover or an error (its replay command is printed).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from benchmarks.results_file import write_result
from spark_datasource.testing.chaos.inject import ChaosStack
from spark_datasource.testing.chaos.runner import run_schedule, stop_all_jobs
from spark_datasource.testing.chaos.schedule import KINDS, plan
from spark_datasource.testing.job_launcher import ROOT


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--schedules", type=int, default=int(os.environ.get("CHAOS_SCHEDULES", "100")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "1")))
    ap.add_argument(
        "--lanes",
        type=int,
        default=int(os.environ.get("CHAOS_LANES", "2")),
        help="schedules run side by side, each lane on its own stack (default 2)",
    )
    ap.add_argument("--events", type=int, default=3000, help="events per schedule")
    ap.add_argument("--json", default=None, help="default benchmarks/results/chaos-<date>.json")
    ap.add_argument("--work-dir", default=None, help="stack, checkpoints and job logs (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (job logs of failed schedules)")
    a = ap.parse_args(argv)
    if a.schedules <= 0:
        ap.error("--schedules (CHAOS_SCHEDULES) must be positive")
    if a.lanes <= 0:
        ap.error("--lanes (CHAOS_LANES) must be positive")
    return a


def replay_command(seed: int) -> str:
    return f"make chaos CHAOS_SEED={seed} CHAOS_SCHEDULES=1"


def _line(i: int, total: int, rec: dict) -> str:
    faults = ",".join(e["kind"] for e in rec["injected"]) or "-"
    verdict = "ok" if rec["ok"] else "FAIL " + " | ".join(rec["problems"])[:400]
    return (
        f"[{i + 1}/{total}] seed {rec['seed']} {rec['job']}/{rec['mode']}: injected {faults}; "
        f"restarts {rec['restarts']}, dup {rec.get('duplicates', '?')}, lost {rec.get('lost', '?')}, "
        f"{rec['wall_s']} s: {verdict}"
    )


def summarize(records: list[dict], wall_s: float) -> dict:
    """The run's totals (what the table shows and the JSON holds besides every schedule)."""
    by_kind = collections.Counter(e["kind"] for r in records for e in r["injected"])
    return {
        "schedules": len(records),
        "failed": [r["seed"] for r in records if not r["ok"]],
        "faults_by_kind": {k: by_kind.get(k, 0) for k in KINDS},
        "faults_planned": sum(len(r["planned"]) for r in records),
        "faults_injected": sum(by_kind.values()),
        "job_restarts": sum(r["restarts"] for r in records),
        "recovers": sum(r["recovers"] for r in records),
        "duplicates": sum(r.get("duplicates", 0) for r in records),
        "lost": sum(r.get("lost", 0) for r in records),
        "leftovers": sum(
            r.get("stage_tables", 0) + r.get("open_transactions", 0) + r.get("registry_entries", 0) for r in records
        ),
        "wall_s": round(wall_s, 1),
        "mean_schedule_s": round(wall_s / max(1, len(records)), 1),
    }


def table(summary: dict) -> str:
    rows = [(k, summary[k]) for k in ("schedules", "faults_planned", "faults_injected")]
    rows += [(f"  {k}", n) for k, n in summary["faults_by_kind"].items()]
    rows += [(k, summary[k]) for k in ("job_restarts", "recovers", "duplicates", "lost", "leftovers")]
    rows += [("failed schedules", len(summary["failed"])), ("wall", f"{summary['wall_s']} s")]
    rows += [("per schedule", f"{summary['mean_schedule_s']} s")]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


class _Progress:
    """What the lanes share: the seeds left, the records, and the console (one lock)."""

    def __init__(self, total: int, records: list[dict]) -> None:
        self.total = total
        self.records = records
        self.stop = threading.Event()
        self._lock = threading.Lock()

    def next_seed(self, seeds: list[int]) -> int | None:
        with self._lock:
            return seeds.pop(0) if seeds and not self.stop.is_set() else None

    def say(self, line: str) -> None:
        with self._lock:
            print(line, flush=True)

    def done(self, rec: dict) -> None:
        with self._lock:
            self.records.append(rec)
            print(_line(len(self.records) - 1, self.total, rec), flush=True)
            if not rec["ok"]:
                print(f"  replay: {replay_command(rec['seed'])}", flush=True)


def _lane(lane: int, stack: ChaosStack, seeds: list[int], a: argparse.Namespace, work: Path, out: _Progress) -> None:
    """One lane: take the next seed until none is left (or the run stops), on this lane's stack."""
    while (seed := out.next_seed(seeds)) is not None:
        sch = plan(seed, events=a.events)
        out.say(f"[lane {lane}] {sch.describe()}")
        rec = run_schedule(stack, sch, work / f"seed-{sch.seed}")
        rec["lane"] = lane
        out.done(rec)


def _run_all(a: argparse.Namespace, work: Path, records: list[dict]) -> None:
    """Run the schedules over ``a.lanes`` lanes, appending each record to ``records`` as it ends."""
    lanes = min(a.lanes, a.schedules)
    stacks: list[ChaosStack] = []
    out = _Progress(a.schedules, records)
    seeds = list(range(a.seed, a.seed + a.schedules))
    try:
        for i in range(lanes):
            stacks.append(ChaosStack(work / f"stack-{i}" if lanes > 1 else work / "stack"))
            st = stacks[-1]
            print(f"stack {i}: ClickHouse {st.shard_urls} (writer via {st.proxy_url}), Keeper via {st.zk_via_proxy}")
        threads = [
            threading.Thread(target=_lane, args=(i, st, seeds, a, work, out), daemon=True)
            for i, st in enumerate(stacks)
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # a timed join, so SIGTERM/Ctrl-C reach this thread
                t.join(1.0)
    except KeyboardInterrupt:
        out.stop.set()
        stop_all_jobs()
        raise
    finally:
        for st in stacks:
            st.close()
        records.sort(key=lambda r: r["seed"])


def main(argv: Sequence[str] | None = None) -> int:
    a = _args(argv)
    # SIGTERM unwinds like Ctrl-C, so the stack and the jobs are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="chtx-chaos-"))
    t0 = time.monotonic()
    records: list[dict] = []
    interrupted = False
    try:
        _run_all(a, work, records)
    except KeyboardInterrupt:  # report the schedules that finished
        interrupted = True
        print(f"interrupted after {len(records)} schedules; the stack was stopped", file=sys.stderr)
    finally:
        if a.work_dir is None and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarize(records, time.monotonic() - t0)
    summary["interrupted"] = interrupted
    print(table(summary))
    for seed in summary["failed"]:
        print(f"FAILED seed {seed}: replay with `{replay_command(seed)}`")
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    out = a.json or str(ROOT / "benchmarks" / "results" / f"chaos-{date}.json")
    result = {"seed": a.seed, "events": a.events, "lanes": a.lanes, "summary": summary, "schedules": records}
    write_result(out, result)
    print(f"wrote {out}")
    if interrupted:
        return 130
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
