"""Carrying out the faults of a chaos schedule on the live stack (runner process).

:class:`ChaosStack` is the one embedded stack the chaos run reuses across schedules,
with a :class:`~spark_datasource.testing.chaos.proxy.FaultProxy` in front of ClickHouse (the
writer's ``url``) and one in front of ZooKeeper (ClickHouse's Keeper address).
:class:`Injector` fires one schedule's faults in a thread, timed from the job's first
sign of life, against whichever job run is current.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Callable

from server_patches import crashes, stack_files
from server_patches import stack as stack_mod
from spark_datasource.testing.chaos.proxy import FaultProxy
from spark_datasource.testing.chaos.schedule import ScheduledFault
from spark_datasource.testing.job_launcher import JobRun, group_members

WORKER_MARKERS = ("pyspark.daemon", "pyspark.worker", "pyspark/daemon.py", "pyspark/worker.py")
#: An executor JVM (``local-cluster``: a child of the driver's JVM, in the job's process group).
EXECUTOR_MARKERS = ("org.apache.spark.executor.CoarseGrainedExecutorBackend",)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ChaosStack:
    """ZooKeeper, two ClickHouse shards (Keeper address: the ZooKeeper proxy), Kafka, and the two proxies.

    Shard 0 is the one server of an unsharded schedule, and the ClickHouse proxy is in
    front of it; a sharded schedule (:attr:`Schedule.shards`) writes to shard 0 through
    the proxy and to shard 1 directly.
    """

    SHARDS = 2

    def __init__(self, stack_dir: Path) -> None:
        self.dir = stack_dir
        zk_port = _free_port()
        self.zk_proxy = FaultProxy(("127.0.0.1", zk_port)).start()
        self.zk_via_proxy = f"127.0.0.1:{self.zk_proxy.port}"
        info = stack_mod.start_stack(
            stack_dir,
            kafka=True,
            zk_port=zk_port,
            zookeeper_address_for_clickhouse=self.zk_via_proxy,
            shards=self.SHARDS,
        )
        self.info = info
        self.url = info.clickhouse_url
        #: direct URLs of the shards (checks and DDL), shard 0 first (== ``url``)
        self.shard_urls = [info.url_of(i) for i in range(self.SHARDS)]
        self.ch_proxy = FaultProxy(("127.0.0.1", info.clickhouse_port)).start()
        self.proxy_url = f"http://127.0.0.1:{self.ch_proxy.port}"

    def writer_shards(self, shards: int) -> str:
        """The writer's ``shards`` option over the first ``shards`` shards (shard 0 through the proxy)."""
        return ",".join([self.proxy_url, *self.shard_urls[1:shards]])

    def restart_clickhouse_after(self, seconds: float, shard: int = 0) -> None:
        crashes.kill_clickhouse(self.dir, shard=shard)
        time.sleep(seconds)
        crashes.start_clickhouse(self.dir, shard=shard, zookeeper_address_for_clickhouse=self.zk_via_proxy)

    def restart_zookeeper_after(self, seconds: float) -> None:
        crashes.kill_zookeeper(self.dir)
        time.sleep(seconds)
        crashes.start_zookeeper(self.dir)

    def heal(self) -> None:
        """Every component up, no proxy fault in force (between schedules)."""
        self.ch_proxy.clear()
        self.zk_proxy.clear()
        info = stack_files.read_stack(self.dir)
        assert info is not None
        alive = info.alive()
        if not alive.get("zookeeper"):
            crashes.start_zookeeper(self.dir)
        for shard, replica, name in info.members:
            if not alive.get(name):
                crashes.start_clickhouse(
                    self.dir, shard=shard, replica=replica, zookeeper_address_for_clickhouse=self.zk_via_proxy
                )

    def close(self) -> None:
        self.ch_proxy.stop()
        self.zk_proxy.stop()
        stack_mod.stop_stack(self.dir)


def job_processes(run: JobRun, markers: tuple[str, ...]) -> list[int]:
    """Pids of the job's processes whose command line holds one of ``markers`` (from /proc)."""
    out = []
    for pid in group_members(run.pgid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(m in cmd for m in markers):
            out.append(pid)
    return out


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
    except OSError:
        return 0
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def busy_executors(run: JobRun) -> list[int]:
    """The job's executor JVMs that have a Python worker daemon: they have run Python tasks."""
    executors = set(job_processes(run, EXECUTOR_MARKERS))
    return sorted({_parent(pid) for pid in job_processes(run, WORKER_MARKERS)} & executors)


class Injector:
    """Fires the timed faults of one schedule in a thread (runner process, once per schedule).

    ``current`` gives the job run alive now (faults hit whichever run is current);
    ``kill_driver`` is the runner's way to SIGKILL the job (it then restarts it).
    ``log`` collects what was injected, one dict per fault.
    """

    def __init__(
        self,
        stack: ChaosStack,
        faults: list[ScheduledFault],
        current: Callable[[], JobRun | None],
        kill_driver: Callable[[JobRun], None],
        rng: random.Random,
    ) -> None:
        self.stack = stack
        self.faults = faults
        self.current = current
        self.kill_driver = kill_driver
        self.rng = rng
        self.log: list[dict] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = 0.0

    def start(self, t0: float) -> None:
        self.t0 = t0
        self.thread.start()

    def finish(self) -> None:
        """No fault starts from now on; wait for one in progress (an outage) to end."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(120)

    def _run(self) -> None:
        for f in self.faults:
            while not self.stop.is_set() and time.monotonic() < self.t0 + f.at_s:
                time.sleep(0.05)
            if self.stop.is_set():
                return
            try:
                detail = self._fire(f)
            except Exception as e:  # recorded, and the schedule fails on it
                detail = f"error: {type(e).__name__}: {e}"
            self.log.append({"kind": f.kind, "at_s": round(time.monotonic() - self.t0, 2), "detail": detail})

    def _wait_for(self, find: Callable[[], list[int]], run: JobRun, timeout_s: float = 60.0) -> list[int]:
        """The pids ``find`` gives, waiting for one to exist while the run lives (start-up is slow)."""
        deadline = time.monotonic() + timeout_s
        while run.proc.poll() is None and time.monotonic() < deadline and not self.stop.is_set():
            workers = find()
            if workers:
                return workers
            time.sleep(0.1)
        return []

    def _fire(self, f: ScheduledFault) -> str:
        proxies = {"ch": self.stack.ch_proxy, "zk": self.stack.zk_proxy}
        link, _, what = f.kind.partition("_")
        if link in proxies:
            proxies[link].inject(what, f.seconds, rate=f.rate)
            return f"{f.seconds:.1f} s" + (f" at {f.rate} B/s" if f.rate else "")
        if f.kind == "kill_clickhouse":
            self.stack.restart_clickhouse_after(f.seconds)
            return f"down {f.seconds:.1f} s"
        if f.kind == "kill_shard":
            shard = self.rng.randrange(self.stack.SHARDS)
            self.stack.restart_clickhouse_after(f.seconds, shard)
            return f"shard {shard} down {f.seconds:.1f} s"
        if f.kind == "kill_zookeeper":
            self.stack.restart_zookeeper_after(f.seconds)
            return f"down {f.seconds:.1f} s"
        run = self.current()
        if run is None or run.proc.poll() is not None:
            return "no job running"
        if f.kind == "kill_driver":
            self.kill_driver(run)
            return f"run {run.index}"
        if f.kind == "kill_executor":
            # an executor in the middle of the job's work, else (none yet) any executor
            workers = self._wait_for(lambda: busy_executors(run), run) or job_processes(run, EXECUTOR_MARKERS)
            if not workers:
                return "no executor JVM alive"
        else:
            workers = self._wait_for(lambda: job_processes(run, WORKER_MARKERS), run)
            if not workers:
                return "no Python worker alive"
        pid = self.rng.choice(workers)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"pid {pid} of {len(workers)}"
