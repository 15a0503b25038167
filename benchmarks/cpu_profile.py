"""CPU-seconds per million events by component, for the pipeline and its peers, from one run.

``python -m benchmarks.cpu_profile`` starts the embedded stack (ClickHouse on chdb,
ZooKeeper, the dev Kafka broker) and runs each subject once on the peers' events and
table (:mod:`benchmarks.peers`: ``--events`` produced up front in ``--partitions``
partitions, the Spark subjects with ``Trigger.AvailableNow`` and ``maxOffsetsPerTrigger``
= ``--batch``, the engine with ``kafka_max_block_size`` = the same), while
:class:`~benchmarks.cpu_sampler.CpuSampler` reads every process's CPU from ``/proc``.

A subject is ``NAME[@CLIENT][+VARIANT]``: ``transaction``, ``dedup`` or ``staging`` (the pipeline,
``kafka_py`` → ``format("clickhouse_tx")`` in that mode), ``foreach_batch`` (``kafka_py`` →
``foreachBatch`` + clickhouse-connect), ``foreach_tx``, ``kafka_engine`` (ClickHouse's Kafka
engine, no Spark); ``@kafka-python`` / ``@librdkafka`` is the ``kafka.client`` of the
Spark subjects' source; ``+VARIANT`` adds the Spark settings ``--variant VARIANT:KEY=VALUE``
gives that name (``transaction@librdkafka+big:spark.sql.execution.arrow.maxRecordsPerBatch=50000``)
to the job's session, over ``--spark-conf KEY=VALUE`` (every Spark subject's). The default
runs the pipeline and ``foreach_batch`` on both clients (before and after the librdkafka
client, same run) and the engine. ``--rounds N`` runs the subjects N times, interleaved (all
subjects, then all again); ``summary`` in the JSON holds each subject's median over the rounds.

Components (:mod:`benchmarks.cpu_sampler`): the Spark JVM (driver and executors), the
executors' Python workers (the source's reads and the sink's writes: one pool), the data
source API's driver-side Python runners, the driver's Python, ClickHouse, ZooKeeper, the
Kafka broker, and ``job_unsampled``: what the job's processes spent that no reading saw
(``RUSAGE_CHILDREN`` of this process over the run, less the readings of the job's tree;
processes that lived between two readings, the last ``--interval`` of each). The Spark
JVM is also split by its threads (``spark_jvm_threads_per_million`` in each window: the
JIT, the collector, the executors' task threads, the micro-batch loop, the rest;
:func:`benchmarks.cpu_sampler.jvm_thread_group`).

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
import itertools
import os
import resource
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_session import bench_session
from benchmarks.cpu_profile_plot import plot
from benchmarks.cpu_sampler import (
    JOB_COMPONENTS,
    JVM_THREAD_GROUPS,
    STACK_COMPONENTS,
    CpuSampler,
    Totals,
    started_between,
)
from benchmarks.peers_engine import run_engine
from benchmarks.peers_faults import Servers
from benchmarks.peers_figures import KAFKA_CLIENTS
from benchmarks.peers_spark import run_spark
from benchmarks.results_file import machine, write_result
from spark_datasource.testing.streaming_job import key_values

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


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cpu_profile", description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--events", type=int, default=400_000, help="events per run (the dev broker keeps ~50,000 a partition)"
    )
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=50_000, help="maxOffsetsPerTrigger / kafka_max_block_size")
    ap.add_argument("--subjects", default=",".join(DEFAULT_SUBJECTS), help="NAME[@CLIENT][+VARIANT], comma-separated")
    ap.add_argument(
        "--trigger", type=float, default=0.0, help="processing-time trigger of the Spark subjects, s (0: availableNow)"
    )
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between two readings of /proc")
    ap.add_argument(
        "--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting of every Spark subject"
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="VARIANT:KEY=VALUE",
        help="a Spark setting of the subjects NAME[@CLIENT]+VARIANT (repeatable, also for one VARIANT)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="runs of every subject, interleaved")
    ap.add_argument("--json", default=str(RESULTS / "cpu_profile.json"))
    a = ap.parse_args(argv)
    a.spark_conf = key_values("--spark-conf", a.spark_conf)
    a.variants = variants(a.variant, ap.error)
    a.subjects = [s for s in a.subjects.split(",") if s]
    for s in a.subjects:
        name, client, variant = split_subject(s)
        if name not in SUBJECTS or (client and (client not in KAFKA_CLIENTS or name == "kafka_engine")):
            ap.error(f"unknown subject {s!r}: NAME[@CLIENT][+VARIANT], NAME one of {', '.join(SUBJECTS)}")
        if variant and (variant not in a.variants or name == "kafka_engine"):
            ap.error(f"subject {s!r}: no --variant {variant}:KEY=VALUE for it, or not a Spark subject")
    if a.events <= 0 or a.batch <= 0 or a.partitions <= 0 or a.interval <= 0 or a.trigger < 0 or a.rounds <= 0:
        ap.error("--events, --batch, --partitions, --interval and --rounds must be positive, --trigger not negative")
    return a


def split_subject(subject: str) -> tuple[str, str, str]:
    """``NAME[@CLIENT][+VARIANT]`` as (name, client, variant), the absent ones empty."""
    head, _, variant = subject.partition("+")
    name, _, client = head.partition("@")
    return name, client, variant


def variants(given: Sequence[str], error: Any) -> dict[str, dict[str, str]]:
    """``--variant VARIANT:KEY=VALUE`` arguments as {variant: {key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for v in given:
        name, colon, kv = v.partition(":")
        if not colon or not name or "@" in name or "+" in name or "," in name:
            error(f"--variant {v!r}: expected VARIANT:KEY=VALUE")
        out.setdefault(name, {}).update(key_values("--variant", [kv]))
    return out


def per_million(cpu: Mapping[str, float], events: int) -> dict[str, float]:
    """CPU-seconds per million events, per component, and their ``total``."""
    out = {k: round(v * 1e6 / events, 2) for k, v in cpu.items()} if events > 0 else {}
    if out:
        out["total"] = round(sum(out.values()), 2)
    return out


def window(
    totals: Totals,
    t0: float,
    t1: float,
    events: int,
    extra: Mapping[str, float] | None = None,
    jvm_threads: Totals | None = None,
) -> dict[str, Any]:
    """One window's seconds, events, CPU-seconds and CPU-seconds per million events;
    with ``jvm_threads``, the Spark JVM's CPU-seconds per million events by thread group."""
    cpu = totals.between(t0, t1)
    cpu.update(extra or {})
    cpu = {k: v for k, v in cpu.items() if v > 0}
    split: dict[str, Any] = {}
    if jvm_threads is not None:
        threads = jvm_threads.between(t0, t1)
        split["spark_jvm_threads_per_million"] = {
            g: round(threads.get(g, 0.0) * 1e6 / events, 2) if events > 0 else None for g in JVM_THREAD_GROUPS
        }
    return {
        "seconds": round(t1 - t0, 2),
        "events": events,
        "rows_per_s": round(events / (t1 - t0), 1) if t1 > t0 else None,
        "cpu_s": cpu,
        "cpu_s_per_million": per_million(cpu, events),
        "cores_busy": round(sum(cpu.values()) / (t1 - t0), 2) if t1 > t0 else None,
        **split,
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
    name, client, variant = split_subject(subject)
    peer, mode = SUBJECTS[name]
    conf = {**a.spark_conf, **a.variants.get(variant, {})}
    base = subject.replace("@", "_").replace("+", "_")
    # a fresh directory per round: commit_times reads only this run's checkpoint
    run_dir = next(d for n in itertools.count() if not (d := srv.work / (f"{base}.{n}" if n else base)).exists())
    run_dir.mkdir(parents=True)
    load0 = round(os.getloadavg()[0], 2)
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
                spark_conf=tuple(f"{k}={v}" for k, v in conf.items()),
            )
    out: dict[str, Any] = {
        "subject": subject,
        "peer": peer,
        "mode": mode or None,
        "kafka_client": client or None,
        "spark_conf": conf if peer != "kafka_engine" else {},
        "rows_per_s": r.get("rows_per_s"),
        "steady_rps": r.get("steady_rps"),
        "ok": r.get("ok"),
        "duplicates": r.get("duplicates"),
        "lost": r.get("lost"),
        "harness_cpu_s": round(_cpu_self() - self0, 2),
        "load_average_1min": [load0, round(os.getloadavg()[0], 2)],  # at the start and at the end
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
    jvm = sampler.jvm_threads
    out["whole"] = window(totals, t0, t1, a.events, {"job_unsampled": round(max(0.0, unsampled), 3)}, jvm)
    python = sampler.python.values()
    out["whole"]["python_started"] = started_between(python, t0, t1)
    commits = commit_times(run_dir)
    if len(commits) >= 2:
        out["steady"] = window(totals, commits[0], commits[-1], a.events - min(a.batch, a.events), jvm_threads=jvm)
        out["steady"]["python_started"] = started_between(python, commits[0], commits[-1])
        out["batches"] = len(commits)
    return out


def _workers(runs: Sequence[Mapping[str, Any]], subject: str, win: str) -> float | None:
    """The median over the rounds of ``subject``'s Python workers in window ``win``."""
    xs = [
        float(r[win]["cpu_s_per_million"].get("python_workers", 0.0))
        for r in runs
        if r["subject"] == subject and win in r
    ]
    return statistics.median(xs) if xs else None


def summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per subject and window, the median over its rounds of each component's CPU-seconds per
    million events (and of the total), with the rounds' totals beside it."""
    out: dict[str, dict[str, Any]] = {}
    for subject in dict.fromkeys(r["subject"] for r in runs):
        mine = [r for r in runs if r["subject"] == subject]
        out[subject] = {}
        for win in ("whole", "steady"):
            pms = [r[win]["cpu_s_per_million"] for r in mine if win in r]
            if pms:
                comps = dict.fromkeys(k for pm in pms for k in pm)
                med = {k: round(statistics.median(pm.get(k, 0.0) for pm in pms), 2) for k in comps}
                out[subject][win] = {"median": med, "totals": [pm.get("total") for pm in pms], "runs": len(pms)}
                threads = [
                    r[win]["spark_jvm_threads_per_million"] for r in mine if "spark_jvm_threads_per_million" in r[win]
                ]
                if threads:
                    out[subject][win]["spark_jvm_threads_median"] = {
                        g: round(statistics.median(t.get(g) or 0.0 for t in threads), 2) for g in JVM_THREAD_GROUPS
                    }
    return out


def derived(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The Python workers split by difference (CPU-seconds per million events, per window):
    ``sink_workers`` = pipeline − ``foreach_batch`` on one client (the sink's executor
    Python; ``foreach_batch`` writes from the driver), ``decode_saved`` = kafka-python −
    librdkafka of one subject."""
    out: dict[str, float] = {}
    subjects = dict.fromkeys(r["subject"] for r in runs)
    for win in ("whole", "steady"):
        for s in subjects:
            name, client, variant = split_subject(s)
            if name in ("transaction", "dedup", "staging"):
                fb = "foreach_batch" + (f"@{client}" if client else "")
                x, y = _workers(runs, s, win), _workers(runs, fb, win)
                if x is not None and y is not None:
                    out[f"sink_workers {s} {win}"] = round(x - y, 2)
            if client == "kafka-python":
                lib = f"{name}@librdkafka" + (f"+{variant}" if variant else "")
                x, y = _workers(runs, s, win), _workers(runs, lib, win)
                if x is not None and y is not None:
                    out[f"decode_saved {name}{'+' + variant if variant else ''} {win}"] = round(x - y, 2)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    jpath = Path(a.json)
    t0 = time.monotonic()
    with bench_session("chtx-cpu-", t0) as (work, info, say):
        srv = Servers(
            work / "stack", info.clickhouse_url, str(info.kafka_bootstrap), info.kafka_control, a.partitions, work
        )
        stack = {STACK_COMPONENTS[k]: ref.pid for k, ref in info.processes.items() if k in STACK_COMPONENTS}
        keys = ("events", "partitions", "batch", "subjects", "trigger", "interval", "rounds", "spark_conf", "variants")
        cfg = {k: getattr(a, k) for k in keys}
        cfg.update(spark="local[2]", load_average_at_start=machine()["load_average"])
        doc: dict[str, Any] = {"config": cfg, "runs": []}
        for rnd, subject in ((n, s) for n in range(a.rounds) for s in a.subjects):
            r = {"round": rnd, **profile_one(srv, stack, subject, a)}
            doc["runs"].append(r)
            pm = {w: (r.get(w) or {}).get("cpu_s_per_million", {}).get("total") for w in ("whole", "steady")}
            started = sum(k["started"] for k in (r.get("steady") or {}).get("python_started", {}).values())
            say(
                f"{subject}: {r.get('rows_per_s')} rows/s, CPU-s per million events {pm}, dup {r.get('duplicates')}, "
                f"Python workers started after the first batch {started}"
            )
            doc["config"]["machine"] = machine()
            doc["derived"] = derived(doc["runs"])
            doc["summary"] = summary(doc["runs"])
            doc["wall_s"] = round(time.monotonic() - t0, 1)
            write_result(jpath, doc)
            plot(doc, jpath.with_suffix(".png"))
    print(f"wrote {jpath} and {jpath.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
