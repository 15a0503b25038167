"""CPU-seconds per million events by component, for the pipeline and its peers, from one run.

``python -m benchmarks.cpu_profile`` starts the embedded stack (ClickHouse on chdb,
ZooKeeper, the dev Kafka broker) and runs each subject once on the peers' events and
table (:mod:`benchmarks.peers`: ``--events`` produced up front in ``--partitions``
partitions, the Spark subjects with ``Trigger.AvailableNow`` and ``maxOffsetsPerTrigger``
= ``--batch``, the engine with ``kafka_max_block_size`` = the same), while
:class:`~benchmarks.cpu_sampler.CpuSampler` reads every process's CPU from ``/proc``.

A subject is ``NAME[@CLIENT]``: ``transaction``, ``dedup`` or ``staging`` (the pipeline,
``kafka_py`` → ``format("clickhouse_tx")`` in that mode), ``foreach_batch`` (``kafka_py`` →
``foreachBatch`` + clickhouse-connect), ``foreach_tx``, ``kafka_engine`` (ClickHouse's Kafka
engine, no Spark); ``@kafka-python`` / ``@librdkafka`` is the ``kafka.client`` of the
Spark subjects' source. The default runs the pipeline and ``foreach_batch`` on both
clients (before and after the librdkafka client, same run) and the engine.

Components (:mod:`benchmarks.cpu_sampler`): the Spark JVM (driver and executors), the
executors' Python workers (the source's reads and the sink's writes: one pool), the data
source API's driver-side Python runners, the driver's Python, ClickHouse, ZooKeeper, the
Kafka broker, and ``job_unsampled``: what the job's processes spent that no reading saw
(``RUSAGE_CHILDREN`` of this process over the run, less the readings of the job's tree;
processes that lived between two readings, the last ``--interval`` of each).

Two windows per run: ``whole``, the job's life from its start to its exit (the JVM's
start, the Python workers' first start, every batch; the engine: the view's creation
to the last offset in the table), and ``steady``, from the first micro-batch's commit to
the last one's (the events after the first batch; the engine: the same as ``whole``).
The producer's and the check's work is outside both. Each window also has
``python_started``: per kind of Python worker (:func:`benchmarks.cpu_sampler.python_kind`),
the processes Spark started in it and the CPU-seconds they spent over their life, imports
included; in ``steady`` these are the workers started per micro-batch after the first.
``--trigger`` runs the Spark subjects at a processing-time trigger instead of
``Trigger.AvailableNow`` (the events still produced up front, a batch per trigger), which
shows what idle time between batches does to the workers. ``derived`` in the JSON splits the
Python workers: (pipeline − ``foreach_batch``) on the same client is the sink's own
executor Python, (``kafka-python`` − ``librdkafka``) of one subject is the decode saved.

Writes ``benchmarks/results/cpu_profile.json`` (``--json``) and a stacked-bar PNG beside it.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_session import bench_session
from benchmarks.cpu_sampler import JOB_COMPONENTS, STACK_COMPONENTS, CpuSampler, Totals, started_between
from benchmarks.peers_engine import run_engine
from benchmarks.peers_faults import Servers
from benchmarks.peers_figures import KAFKA_CLIENTS
from benchmarks.peers_spark import run_spark
from benchmarks.results_file import machine, save_figure, write_result

RESULTS = Path(__file__).resolve().parent / "results"

#: Subjects and what they run: the Spark peer and the sink's mode, or the engine.
SUBJECTS: dict[str, tuple[str, str]] = {
    "transaction": ("transaction", "transaction"),
    "dedup": ("transaction", "dedup"),
    "staging": ("transaction", "staging"),
    "foreach_batch": ("foreach_batch", "transaction"),
    "foreach_tx": ("foreach_tx", "transaction"),
    "kafka_engine": ("kafka_engine", ""),
}

DEFAULT_SUBJECTS = (
    "transaction@kafka-python",
    "transaction@librdkafka",
    "foreach_batch@kafka-python",
    "foreach_batch@librdkafka",
    "kafka_engine",
)

#: The components in the order of the bars (bottom up).
COMPONENTS = (*JOB_COMPONENTS, "job_unsampled", *STACK_COMPONENTS.values())


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_profile", description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--events", type=int, default=400_000, help="events per run (the dev broker keeps ~50,000 a partition)"
    )
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=50_000, help="maxOffsetsPerTrigger / kafka_max_block_size")
    ap.add_argument("--subjects", default=",".join(DEFAULT_SUBJECTS), help="NAME[@CLIENT], comma-separated")
    ap.add_argument(
        "--trigger", type=float, default=0.0, help="processing-time trigger of the Spark subjects, s (0: availableNow)"
    )
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between two readings of /proc")
    ap.add_argument("--json", default=str(RESULTS / "cpu_profile.json"))
    a = ap.parse_args(argv)
    a.subjects = [s for s in a.subjects.split(",") if s]
    for s in a.subjects:
        name, _, client = s.partition("@")
        if name not in SUBJECTS or (client and (client not in KAFKA_CLIENTS or name == "kafka_engine")):
            ap.error(f"unknown subject {s!r}: NAME[@CLIENT], NAME one of {', '.join(SUBJECTS)}")
    if a.events <= 0 or a.batch <= 0 or a.partitions <= 0 or a.interval <= 0 or a.trigger < 0:
        ap.error("--events, --batch, --partitions and --interval must be positive, --trigger not negative")
    return a


def per_million(cpu: Mapping[str, float], events: int) -> dict[str, float]:
    """CPU-seconds per million events, per component, and their ``total``."""
    out = {k: round(v * 1e6 / events, 2) for k, v in cpu.items()} if events > 0 else {}
    if out:
        out["total"] = round(sum(out.values()), 2)
    return out


def window(
    totals: Totals, t0: float, t1: float, events: int, extra: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """One window's seconds, events, CPU-seconds and CPU-seconds per million events."""
    cpu = totals.between(t0, t1)
    cpu.update(extra or {})
    cpu = {k: v for k, v in cpu.items() if v > 0}
    return {
        "seconds": round(t1 - t0, 2),
        "events": events,
        "rows_per_s": round(events / (t1 - t0), 1) if t1 > t0 else None,
        "cpu_s": cpu,
        "cpu_s_per_million": per_million(cpu, events),
        "cores_busy": round(sum(cpu.values()) / (t1 - t0), 2) if t1 > t0 else None,
    }


def commit_times(run_dir: Path) -> list[float]:
    """The modification times of the run's Spark commit-log entries, in batch order."""
    files = [f for f in run_dir.glob("*/checkpoint_*/commits/*") if f.name.isdigit()]
    return [f.stat().st_mtime for f in sorted(files, key=lambda f: int(f.name))]


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cpu_self() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def profile_one(srv: Servers, stack: Mapping[str, int], subject: str, a: argparse.Namespace) -> dict[str, Any]:
    """One run of ``subject`` under the sampler; its windows (see the module's docstring)."""
    name, _, client = subject.partition("@")
    peer, mode = SUBJECTS[name]
    run_dir = srv.work / subject.replace("@", "_")
    run_dir.mkdir(parents=True, exist_ok=True)
    run_srv = dataclasses.replace(srv, work=run_dir)
    children0, self0 = _cpu_children(), _cpu_self()
    marks: dict[str, float] = {}
    with CpuSampler(stack, a.interval) as sampler:
        if peer == "kafka_engine":
            r = run_engine(run_srv, peer, events=a.events, settings={"kafka_max_block_size": a.batch}, marks=marks)
        else:
            r = run_spark(
                run_srv,
                f"{peer}@{client}" if client else peer,
                events=a.events,
                batch=a.batch,
                mode=mode,
                trigger=a.trigger,
                job_timeout_s=max(900.0, 2 * a.trigger * (a.events // a.batch + 2)),
            )
    out: dict[str, Any] = {
        "subject": subject,
        "peer": peer,
        "mode": mode or None,
        "kafka_client": client or None,
        "rows_per_s": r.get("rows_per_s"),
        "steady_rps": r.get("steady_rps"),
        "ok": r.get("ok"),
        "duplicates": r.get("duplicates"),
        "lost": r.get("lost"),
        "harness_cpu_s": round(_cpu_self() - self0, 2),
        "readings": len(sampler.totals.times),
    }
    if "error" in r:
        out["error"] = r["error"]
    totals = sampler.totals
    if peer == "kafka_engine":
        if "end" in marks:
            out["whole"] = window(totals, marks["start"], marks["end"], a.events)
            out["steady"] = out["whole"]
        return out
    if not sampler.job_seen:
        return out
    t0, t1 = sampler.job_seen[0] - a.interval, sampler.job_seen[-1] + a.interval
    whole = totals.between(t0, t1)
    unsampled = _cpu_children() - children0 - sum(whole.get(c, 0.0) for c in JOB_COMPONENTS)
    out["whole"] = window(totals, t0, t1, a.events, {"job_unsampled": round(max(0.0, unsampled), 3)})
    python = sampler.python.values()
    out["whole"]["python_started"] = started_between(python, t0, t1)
    commits = commit_times(run_dir)
    if len(commits) >= 2:
        out["steady"] = window(totals, commits[0], commits[-1], a.events - min(a.batch, a.events))
        out["steady"]["python_started"] = started_between(python, commits[0], commits[-1])
        out["batches"] = len(commits)
    return out


def _workers(runs: Sequence[Mapping[str, Any]], subject: str, win: str) -> float | None:
    for r in runs:
        if r["subject"] == subject and win in r:
            return float(r[win]["cpu_s_per_million"].get("python_workers", 0.0))
    return None


def derived(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The Python workers split by difference (CPU-seconds per million events, per window):
    ``sink_workers`` = pipeline − ``foreach_batch`` on one client (the sink's executor
    Python; ``foreach_batch`` writes from the driver), ``decode_saved`` = kafka-python −
    librdkafka of one subject."""
    out: dict[str, float] = {}
    subjects = [r["subject"] for r in runs]
    for win in ("whole", "steady"):
        for s in subjects:
            name, _, client = s.partition("@")
            if name in ("transaction", "dedup", "staging"):
                fb = "foreach_batch" + (f"@{client}" if client else "")
                x, y = _workers(runs, s, win), _workers(runs, fb, win)
                if x is not None and y is not None:
                    out[f"sink_workers {s} {win}"] = round(x - y, 2)
            if client == "kafka-python":
                lib = f"{name}@librdkafka"
                x, y = _workers(runs, s, win), _workers(runs, lib, win)
                if x is not None and y is not None:
                    out[f"decode_saved {name} {win}"] = round(x - y, 2)
    return out


def plot(doc: Mapping[str, Any], path: Path) -> None:
    """Two panels (whole run, after the first batch): a stacked bar per subject."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = doc["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(18, 6.5), sharey=False)
    for ax, win, title in (
        (axes[0], "whole", "whole job (JVM start, first batch included)"),
        (axes[1], "steady", "after the first micro-batch"),
    ):
        labels = [r["subject"] for r in runs]
        bottom = [0.0] * len(runs)
        for comp in COMPONENTS:
            vals = [float((r.get(win) or {}).get("cpu_s_per_million", {}).get(comp, 0.0)) for r in runs]
            if any(vals):
                ax.bar(range(len(runs)), vals, 0.6, bottom=bottom, label=comp)
                bottom = [b + v for b, v in zip(bottom, vals)]
        for x, total in enumerate(bottom):
            ax.annotate(f"{total:,.0f}", (x, total), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        ax.set_xticks(range(len(runs)), labels, rotation=20, ha="right")
        ax.set_ylabel("CPU-seconds per million events")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    handles, names = axes[0].get_legend_handles_labels()
    # beside the bars, the top of the stack first
    axes[1].legend(handles[::-1], names[::-1], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    cfg = doc["config"]
    fig.suptitle(
        f"CPU by component: {cfg['events']:,} events, {cfg['partitions']} partitions, batches of {cfg['batch']:,}, "
        f"local[2], load average {cfg.get('machine', {}).get('load_average')} at the end",
        fontsize=10,
    )
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    jpath = Path(a.json)
    t0 = time.monotonic()
    with bench_session("chtx-cpu-", t0) as (work, info, say):
        srv = Servers(
            work / "stack", info.clickhouse_url, str(info.kafka_bootstrap), info.kafka_control, a.partitions, work
        )
        stack = {STACK_COMPONENTS[k]: ref.pid for k, ref in info.processes.items() if k in STACK_COMPONENTS}
        cfg = {k: getattr(a, k) for k in ("events", "partitions", "batch", "subjects", "trigger", "interval")}
        cfg.update(spark="local[2]", load_average_at_start=machine()["load_average"])
        doc: dict[str, Any] = {"config": cfg, "runs": []}
        for subject in a.subjects:
            r = profile_one(srv, stack, subject, a)
            doc["runs"].append(r)
            pm = {w: (r.get(w) or {}).get("cpu_s_per_million", {}).get("total") for w in ("whole", "steady")}
            started = sum(k["started"] for k in (r.get("steady") or {}).get("python_started", {}).values())
            say(
                f"{subject}: {r.get('rows_per_s')} rows/s, CPU-s per million events {pm}, dup {r.get('duplicates')}, "
                f"Python workers started after the first batch {started}"
            )
            doc["config"]["machine"] = machine()
            doc["derived"] = derived(doc["runs"])
            doc["wall_s"] = round(time.monotonic() - t0, 1)
            write_result(jpath, doc)
            plot(doc, jpath.with_suffix(".png"))
    print(f"wrote {jpath} and {jpath.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
