"""CPU-seconds by component, from ``/proc/<pid>/stat``: the sampler of :mod:`benchmarks.cpu_profile`.

A thread reads every process's ``utime + stime`` every ``interval_s`` and files it under a
component: the stack's servers by their pids (ClickHouse, ZooKeeper, the Kafka broker,
with their descendants), and every other descendant of this process (the streaming job
a run starts) by its command line (:func:`component_of`). A process's last reading
stays in its component's total once it is gone, so the totals only grow; what a process
spent after its last reading, and processes that lived between two readings, are not
in them (:func:`benchmarks.cpu_profile` counts that remainder from ``RUSAGE_CHILDREN``).

Python workers forked by ``pyspark.daemon`` keep the daemon's command line, so the
executors' read (``kafka_py``) and write (the sink) share one component: a worker
serves both kinds of task.

The Spark JVM's threads are also read (``/proc/<pid>/task``) and filed by their names
(:func:`jvm_thread_group`) into :attr:`CpuSampler.jvm_threads`: the JIT's compilers, the
garbage collector, the executors' task threads, the driver's micro-batch loop and the rest;
a split of ``spark_jvm``, not beside it.

Each Python process of the job is also kept by itself (:attr:`CpuSampler.python`: its
kind from :func:`python_kind`, when a reading first saw it, its CPU-seconds at the last),
so a run can count the workers Spark started in a window and what they cost
(:func:`started_between`).

Calling process of the benchmark (a thread beside a run). Linux only.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

#: Components of the streaming job's process tree, in the order of the bars.
JOB_COMPONENTS = (
    "spark_jvm",
    "python_workers",
    "python_datasource_runners",
    "driver_python",
)
#: The stack's servers (``StackInfo.processes`` keys → component).
STACK_COMPONENTS = {"clickhouse": "clickhouse", "zookeeper": "zookeeper", "kafka": "kafka_broker"}


def parse_stat(text: str) -> tuple[int, float, int]:
    """(ppid, CPU-seconds of the process itself, start time in ticks) from a
    ``/proc/<pid>/stat`` line (the command name may hold spaces and parentheses)."""
    rest = text[text.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): ppid 4, utime 14, stime 15, starttime 22
    ppid, utime, stime, start = int(rest[1]), int(rest[11]), int(rest[12]), int(rest[19])
    return ppid, (utime + stime) / CLOCK_TICKS, start


def component_of(argv: list[str]) -> str:
    """The component of a process of the streaming job, from its command line.

    ``java`` → the Spark JVM (driver and executors, ``local[2]``); ``pyspark.daemon
    pyspark.worker`` and its forks, or ``pyspark.worker`` → the executors' Python
    workers (the source's reads and the sink's writes); any other ``pyspark.daemon`` or
    ``pyspark.sql.*`` module → the data source API's driver-side Python runners
    (planning reads and writes, the streaming source and sink runners, the commit);
    anything else → the driver's own Python (the job's script; ``foreachBatch``'s
    function runs there).
    """
    if not argv:
        return "driver_python"
    if os.path.basename(argv[0]).startswith("java"):
        return "spark_jvm"
    mods = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-m"]
    mod = mods[0] if mods else ""
    if mod == "pyspark.daemon":
        rest = argv[argv.index("pyspark.daemon") + 1 :]
        return "python_workers" if not rest or rest[0] == "pyspark.worker" else "python_datasource_runners"
    if mod == "pyspark.worker":
        return "python_workers"
    if mod.startswith("pyspark."):
        return "python_datasource_runners"
    return "driver_python"


#: The groups of the Spark JVM's threads (:func:`jvm_thread_group`), in the order of the JSON.
JVM_THREAD_GROUPS = ("jit", "gc", "tasks", "stream_execution", "other")


def jvm_thread_group(name: str) -> str:
    """A Spark JVM thread's group by its name (``/proc``'s ``comm``, cut at 15 bytes).

    ``jit``: HotSpot's C1 and C2 compilers; ``gc``: the collector's threads and the VM
    thread (safepoints; a serial collector's collections); ``tasks``: the executors' task
    threads (rows to and from Arrow, projections, the Python runners' I/O);
    ``stream_execution``: the driver's micro-batch loop (planning, offsets, the commit
    log); ``other``: the rest (scheduler, RPC, listeners, ...).
    """
    if name.startswith(("C1 CompilerThre", "C2 CompilerThre")):
        return "jit"
    if name.startswith(("GC Thread", "G1 ", "VM Thread")):
        return "gc"
    if name.startswith("Executor task"):
        return "tasks"
    if name.startswith("stream executio"):
        return "stream_execution"
    return "other"


def _thread_times(pid: int) -> dict[int, tuple[str, float]]:
    """tid → (name, CPU-seconds) of every thread of ``pid`` now."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        out[int(tid)] = (text[text.index("(") + 1 : text.rindex(")")], parse_stat(text)[1])
    return out


def python_kind(argv: list[str], parent_argv: list[str]) -> str | None:
    """A Python process of the job by what it runs; None for any other process.

    ``pyspark.daemon MODULE`` is a daemon (``worker daemon``) or, with its parent's
    command line, a worker it forked (``worker``, ``write_into_data_source``, ...: the
    last part of ``MODULE``); ``-m pyspark.X`` a worker Spark started by itself (the
    streaming source's runner). The driver's own Python is not counted.
    """
    if component_of(argv) not in ("python_workers", "python_datasource_runners"):
        return None
    if "pyspark.daemon" in argv:
        rest = argv[argv.index("pyspark.daemon") + 1 :]
        name = (rest[0] if rest else "pyspark.worker").rsplit(".", 1)[-1]
        return name if parent_argv == argv else f"{name} daemon"
    return argv[argv.index("-m") + 1].rsplit(".", 1)[-1]


@dataclasses.dataclass
class PythonProcess:
    """One Python process of the job: its kind, the time a reading first saw it, and
    its CPU-seconds at the last reading (imports and work alike)."""

    kind: str
    first_seen: float
    cpu_s: float = 0.0


def started_between(python: Iterable[PythonProcess], t0: float, t1: float) -> dict[str, dict[str, float]]:
    """Per kind, the processes first seen in ``[t0, t1]`` and the CPU-seconds they spent
    over their whole life (the last reading)."""
    out: dict[str, dict[str, float]] = {}
    for p in python:
        if t0 <= p.first_seen <= t1:
            k = out.setdefault(p.kind, {"started": 0, "cpu_s": 0.0})
            k["started"] += 1
            k["cpu_s"] = round(k["cpu_s"] + p.cpu_s, 3)
    return dict(sorted(out.items()))


class Totals:
    """Readings of cumulative CPU-seconds per component at wall-clock times, and the
    totals at any time between them (linear between the two readings around it)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.rows: list[dict[str, float]] = []

    def add(self, t: float, totals: Mapping[str, float]) -> None:
        self.times.append(t)
        self.rows.append(dict(totals))

    def at(self, t: float) -> dict[str, float]:
        """The totals at ``t`` (clamped to the first and last readings)."""
        if not self.times:
            return {}
        i = bisect.bisect_left(self.times, t)
        if i <= 0:
            return dict(self.rows[0])
        if i >= len(self.times):
            return dict(self.rows[-1])
        t0, t1 = self.times[i - 1], self.times[i]
        w = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        a, b = self.rows[i - 1], self.rows[i]
        return {k: a.get(k, 0.0) + w * (b.get(k, 0.0) - a.get(k, 0.0)) for k in set(a) | set(b)}

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU-seconds per component from ``t0`` to ``t1``."""
        a, b = self.at(t0), self.at(t1)
        return {k: round(max(0.0, b.get(k, 0.0) - a.get(k, 0.0)), 3) for k in sorted(set(a) | set(b))}


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """Every pid below ``roots`` in the ``pid → ppid`` map (the roots not included)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


class CpuSampler:
    """The sampling thread (a context manager). ``stack``: component → pid of the stack's
    servers. ``job_seen``: the readings' times at which some job process was alive.
    ``python``: the job's Python processes (:class:`PythonProcess`) by (pid, start).
    ``jvm_threads``: the Spark JVM's CPU-seconds per thread group (:data:`JVM_THREAD_GROUPS`)."""

    def __init__(self, stack: Mapping[str, int], interval_s: float = 0.2) -> None:
        self.stack, self.interval_s = dict(stack), interval_s
        self.totals = Totals()
        self.jvm_threads = Totals()
        self._threads: dict[tuple[int, int, int], tuple[str, float]] = {}
        self.job_seen: list[float] = []
        self.python: dict[tuple[int, int], PythonProcess] = {}
        self._last: dict[tuple[int, int], tuple[str, float]] = {}
        self._argv: dict[tuple[int, int], list[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="cpu-sampler")

    def __enter__(self) -> CpuSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def _argv_of(self, key: tuple[int, int], parent: tuple[int, int] | None) -> list[str]:
        """The command line now: read at every reading, as ``spark-submit``'s shell
        becomes the JVM by ``exec`` (same pid, same start); a process gone keeps its
        last one, a process without one (a kernel thread, a zombie) its parent's."""
        try:
            raw = Path(f"/proc/{key[0]}/cmdline").read_bytes()
            argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        except OSError:
            argv = []
        if argv:
            self._argv[key] = argv
        elif key not in self._argv:
            self._argv[key] = self._argv.get(parent, []) if parent else []
        return self._argv[key]

    def sample(self) -> None:
        """One reading of every process of this process's tree and the stack's."""
        stats: dict[int, tuple[int, float, int]] = {}
        for d in os.scandir("/proc"):
            if d.name.isdigit():
                try:
                    stats[int(d.name)] = parse_stat(Path(f"/proc/{d.name}/stat").read_text())
                except (OSError, ValueError, IndexError):
                    continue
        parents = {pid: s[0] for pid, s in stats.items()}
        stack_pids: dict[int, str] = {}
        for comp, pid in self.stack.items():
            for p in {pid} | descendants(parents, [pid]):
                stack_pids[p] = comp
        mine = descendants(parents, [os.getpid()]) - set(stack_pids)
        # the stack's own trees are not the job's, even where they hang below this process
        job = mine - descendants(parents, stack_pids)
        t = time.time()
        for pid in sorted(job):  # parents before their forks, mostly: lower pids first
            ppid, cpu, start = stats[pid]
            key = (pid, start)
            pstat = stats.get(ppid)
            parent = (ppid, pstat[2]) if pstat else None
            argv = self._argv_of(key, parent)
            self._last[key] = (component_of(argv), cpu)
            if self._last[key][0] == "spark_jvm":
                for tid, (name, tcpu) in _thread_times(pid).items():
                    self._threads[(pid, start, tid)] = (jvm_thread_group(name), tcpu)
            proc = self.python.get(key)
            if proc is None:
                kind = python_kind(argv, self._argv_of(parent, None) if parent else [])
                if kind is not None:
                    proc = self.python[key] = PythonProcess(kind, t)
            if proc is not None:
                proc.cpu_s = cpu
        for pid, comp in stack_pids.items():
            if pid in stats:
                self._last[(pid, stats[pid][2])] = (comp, stats[pid][1])
        totals: dict[str, float] = {}
        for comp, cpu in self._last.values():
            totals[comp] = totals.get(comp, 0.0) + cpu
        self.totals.add(t, totals)
        groups: dict[str, float] = {}
        for group, cpu in self._threads.values():
            groups[group] = groups.get(group, 0.0) + cpu
        self.jvm_threads.add(t, groups)
        if job:
            self.job_seen.append(t)
