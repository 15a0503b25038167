"""A Spark standalone cluster (one Master, Workers) and a Spark Connect server, as processes.

Both are started from the pyspark package itself (``SPARK_HOME`` = the package
directory, which has ``bin/``, ``jars/`` and ``sbin/``), on free ports, each JVM in a
session (process group) of its own, with its stdout/stderr in a log file under the
given directory. :func:`stop_cluster` / :func:`stop_connect_server` SIGKILL those
process groups: a Worker's executors (``CoarseGrainedExecutorBackend`` JVMs, children
of the Worker) and their Python daemons live in the Worker's group.

Used by the session fixtures of ``tests/cluster``; nothing here imports Spark, so the
pytest process stays free of a JVM.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from server_patches.processes import free_port
from tests.helpers.s3 import wait_for_port

ROOT = Path(__file__).resolve().parents[2]
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_home() -> Path:
    """The pyspark package directory, which is a complete ``SPARK_HOME``."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "pyspark is not installed"
    return Path(spec.origin).parent


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark JVM started here: this interpreter and this checkout for Python."""
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONNECT_MODE": "0",  # a classic JVM application (pyspark 4 may default to Connect)
        "SPARK_DAEMON_MEMORY": "384m",  # the Master's and Workers' own heaps, not executors'
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    env.update(extra)
    return env


def _spawn(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """Start a JVM (``spark-class`` execs java, so the pid is the JVM's) in its own session."""
    with log.open("ab") as out:
        return subprocess.Popen(
            args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=log.parent
        )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


@dataclasses.dataclass
class StandaloneCluster:
    """A running standalone cluster: ``master_url`` (``spark://...``) for applications."""

    master_url: str
    web_url: str
    log_dir: Path
    master: subprocess.Popen
    workers: list[subprocess.Popen]

    def state(self) -> dict[str, Any]:
        """The Master's JSON status (workers, applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=10) as r:
            return dict(json.load(r))

    def alive_workers(self) -> int:
        return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")


def start_cluster(
    log_dir: Path, workers: int = 2, cores: int = 1, memory: str = "768m", worker_env: dict[str, str] | None = None
) -> StandaloneCluster:
    """A Master and ``workers`` Workers of ``cores`` cores and ``memory`` each, registered.

    Where: the calling process (a session fixture), once per test run; about 10 s here.
    Logs: ``log_dir/master.log``, ``log_dir/worker-<i>.log``; work dirs ``log_dir/work-<i>``.
    ``worker_env`` overrides :func:`spark_env` for the Workers, whose executors inherit
    their environment (``PYTHONPATH=""``: executors without this checkout).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    spark_class = str(spark_home() / "bin" / "spark-class")
    port, web = free_port(), free_port()
    master = _spawn(
        [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        + ["--port", str(port), "--webui-port", str(web)],
        log_dir / "master.log",
        spark_env(),
    )
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web}", log_dir, master, [])
    try:
        wait_for_port(port, master, "the Spark Master", timeout_s=90)
        wait_for_port(web, master, "the Spark Master's web UI", timeout_s=90)
        for i in range(workers):
            cluster.workers.append(_start_worker(cluster, i, cores, memory, worker_env or {}))
        _wait(lambda: cluster.alive_workers() == workers, 120, f"{workers} workers registering with the Master")
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def _start_worker(cluster: StandaloneCluster, i: int, cores: int, memory: str, env: dict[str, str]) -> subprocess.Popen:
    work = cluster.log_dir / f"work-{i}"
    work.mkdir(exist_ok=True)
    args = [str(spark_home() / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker"]
    args += ["--host", "127.0.0.1", "--webui-port", str(free_port()), "--cores", str(cores)]
    args += ["--memory", memory, "--work-dir", str(work), cluster.master_url]
    return _spawn(args, cluster.log_dir / f"worker-{i}.log", spark_env(**env))


def stop_cluster(cluster: StandaloneCluster) -> None:
    """SIGKILL every Worker's process group (with its executors), then the Master's."""
    for w in cluster.workers:
        _kill_group(w)
    _kill_group(cluster.master)


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if cond():
                return
        except OSError:
            pass  # the Master's web UI not up yet
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process readable in /proc."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        table[int(d)] = (ppid, cmd)
    return table


def executor_pids(cluster: StandaloneCluster) -> list[int]:
    """Pids of the executor JVMs the Workers of ``cluster`` run now (their direct children)."""
    workers = {w.pid for w in cluster.workers}
    return sorted(pid for pid, (ppid, cmd) in _proc_table().items() if ppid in workers and EXECUTOR_CLASS in cmd)


def _flag(cmdline: str, flag: str) -> str | None:
    words = cmdline.split()
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def busy_executor_pid(cluster: StandaloneCluster, ui_url: str) -> int | None:
    """The pid of an executor JVM running a task now (the driver's REST API at ``ui_url``), or None."""
    with urllib.request.urlopen(f"{ui_url}/api/v1/applications", timeout=10) as r:
        app = json.load(r)[0]["id"]
    with urllib.request.urlopen(f"{ui_url}/api/v1/applications/{app}/executors", timeout=10) as r:
        busy = {e["id"] for e in json.load(r) if e["id"] != "driver" and e["isActive"] and e["activeTasks"] > 0}
    table = _proc_table()
    for pid in executor_pids(cluster):
        cmd = table.get(pid, (0, ""))[1]
        if _flag(cmd, "--app-id") == app and _flag(cmd, "--executor-id") in busy:
            return pid
    return None


def wait_for_executors(cluster: StandaloneCluster, count: int, timeout_s: float = 120) -> list[int]:
    """Block until ``count`` executor JVMs run; their pids."""
    _wait(lambda: len(executor_pids(cluster)) >= count, timeout_s, f"{count} executors")
    return executor_pids(cluster)


def app_conf(cluster: StandaloneCluster, **extra: str) -> dict[str, str]:
    """Spark settings of an application on ``cluster`` whose executors run this project's Python.

    One core and 512 MiB per executor (a Worker offers 768 MiB); the executors' Python
    workers run this interpreter with this checkout first on ``PYTHONPATH``.
    """
    conf = {
        "spark.master": cluster.master_url,
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.memory": "768m",
        "spark.driver.host": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": str(ROOT),
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
    }
    for k in ("CLICKHOUSE_TX_TEST_FAULTS", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        if k in os.environ:
            conf[f"spark.executorEnv.{k}"] = os.environ[k]
    conf.update(extra)
    return conf


@dataclasses.dataclass
class ConnectServer:
    """A running Spark Connect server: ``remote`` (``sc://...``) for clients."""

    remote: str
    log: Path
    proc: subprocess.Popen


def start_connect_server(log_dir: Path, master: str = "local[2]", **conf: str) -> ConnectServer:
    """A Spark Connect server (``spark-submit --class ...SparkConnectServer``) on a free port.

    Where: the calling process (a session fixture), once per test run; 15-30 s here.
    Its Python workers (where the data sources' readers, writers and driver-side
    commits run) use this interpreter and this checkout, like a cluster's executors.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    jar = next((spark_home() / "jars").glob("spark-connect_*.jar"))
    settings = {
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.memory": "1g",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": sys.executable,
        **conf,
    }
    args = [str(spark_home() / "bin" / "spark-submit"), "--master", master]
    args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "clickhouse-tx-connect"]
    for k, v in settings.items():
        args += ["--conf", f"{k}={v}"]
    log = log_dir / "connect-server.log"
    # the launcher sizes the Connect server's heap like a daemon's (SPARK_DAEMON_MEMORY)
    proc = _spawn([*args, str(jar)], log, spark_env(SPARK_DAEMON_MEMORY=settings["spark.driver.memory"]))
    try:
        wait_for_port(port, proc, "the Spark Connect server", timeout_s=180)
    except BaseException:
        _kill_group(proc)
        raise
    return ConnectServer(f"sc://127.0.0.1:{port}", log, proc)


def stop_connect_server(server: ConnectServer) -> None:
    """SIGKILL the server's process group (its JVM and Python workers)."""
    _kill_group(server.proc)
