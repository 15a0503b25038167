"""The embedded local stack: ZooKeeper, ClickHouse's HTTP interface on chdb, dev Kafka.

One stack lives in one directory::

    DIR/stack.json            what runs: URLs, ports, pids (+ start times), data dirs
    DIR/zookeeper/            zoo.cfg, data/ (kept across restarts), zookeeper.log
    DIR/clickhouse/           config.xml (rendered from config.d), data/ (kept)
    DIR/kafka/                the broker's ready file (it keeps topics in memory)
    DIR/logs/                 stdout/stderr and logs of every process

Every process runs in its own session, so it outlives the launcher (a CLI call or a
test run); :func:`stop_stack` (``python -m server_patches down``) stops them all.
Starting is idempotent: what is already running is kept, what is dead is started
again on the same data directory and, when free, the same ports.

All functions here run in the launcher's process (a test fixture, the CLI); nothing
is sent to Spark executors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Mapping

from server_patches import chdb_config, processes, zookeeper
from server_patches.processes import ProcessRef

HOST = "127.0.0.1"
STACK_FILE = "stack.json"
COMPONENTS = ("zookeeper", "clickhouse", "kafka")
#: Stop order: clients before the ZooKeeper they talk to.
STOP_ORDER = ("kafka", "clickhouse", "zookeeper")
DEFAULT_START_TIMEOUT_S = 120.0
DEFAULT_STOP_TIMEOUT_S = 20.0


class StackError(RuntimeError):
    """The stack could not be started, found or stopped; the message says which part."""


@dataclasses.dataclass(frozen=True)
class StackInfo:
    """What a running stack offers and where its pieces live (the content of stack.json).

    ``password_env`` is the *name* of the environment variable holding the password;
    the password itself is never stored.
    """

    dir: Path
    clickhouse_url: str
    zookeeper: str
    kafka_bootstrap: str | None
    processes: Mapping[str, ProcessRef]
    ports: Mapping[str, int]
    data_dirs: Mapping[str, str]
    logs: Mapping[str, str]
    config_file: str
    user: str | None = None
    password_env: str | None = None
    max_session_timeout: int = 3600
    #: The dev broker's HTTP control endpoint (creates topics), when Kafka runs.
    kafka_control: str | None = None

    @property
    def pids(self) -> dict[str, int]:
        """Component name → pid of the process started for it."""
        return {k: v.pid for k, v in self.processes.items()}

    @property
    def clickhouse_port(self) -> int:
        return int(self.ports["clickhouse"])

    def alive(self) -> dict[str, bool]:
        """Component name → whether the process we started for it still runs."""
        return {k: processes.is_alive(v) for k, v in self.processes.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "clickhouse_url": self.clickhouse_url,
            "zookeeper": self.zookeeper,
            "kafka_bootstrap": self.kafka_bootstrap,
            "kafka_control": self.kafka_control,
            "pids": self.pids,
            "processes": {k: v.to_json() for k, v in self.processes.items()},
            "ports": dict(self.ports),
            "data_dirs": dict(self.data_dirs),
            "logs": dict(self.logs),
            "config_file": self.config_file,
            "user": self.user,
            "password_env": self.password_env,
            "max_session_timeout": self.max_session_timeout,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "StackInfo":
        return cls(
            dir=Path(str(d["dir"])),
            clickhouse_url=str(d["clickhouse_url"]),
            zookeeper=str(d["zookeeper"]),
            kafka_bootstrap=d.get("kafka_bootstrap"),
            kafka_control=d.get("kafka_control"),
            processes={k: ProcessRef.from_json(v) for k, v in dict(d.get("processes") or {}).items()},
            ports={k: int(v) for k, v in dict(d.get("ports") or {}).items()},
            data_dirs=dict(d.get("data_dirs") or {}),
            logs=dict(d.get("logs") or {}),
            config_file=str(d.get("config_file", "")),
            user=d.get("user"),
            password_env=d.get("password_env"),
            max_session_timeout=int(d.get("max_session_timeout", 3600)),
        )


# ---------------------------------------------------------------------------- files


def _stack_file(stack_dir: Path) -> Path:
    return Path(stack_dir) / STACK_FILE


def read_stack(stack_dir: Path | str) -> StackInfo | None:
    """The stack recorded in ``stack_dir/stack.json``, or None if there is none."""
    f = _stack_file(Path(stack_dir).resolve())
    try:
        return StackInfo.from_json(json.loads(f.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError) as e:
        raise StackError(f"{f} is not a stack description ({e}); remove it or use another --dir") from e


def _write_stack(info: StackInfo) -> None:
    f = _stack_file(info.dir)
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(json.dumps(info.to_json(), sort_keys=True, indent=1) + "\n")
    tmp.replace(f)


@contextlib.contextmanager
def _locked(stack_dir: Path) -> Iterator[None]:
    """Serialise up/down/restart on one stack directory (across processes)."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    with open(stack_dir / ".stack.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _pick_port(what: str, wanted: int | None, previous: int | None) -> int:
    """The requested port (must be free), else the previous one if free, else a new one."""
    if wanted is not None:
        if not processes.port_is_free(HOST, wanted):
            raise StackError(f"{what} port {HOST}:{wanted} is already in use")
        return wanted
    if previous is not None and processes.port_is_free(HOST, previous):
        return previous
    return processes.free_port(HOST)


def _wait_port_free(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not processes.port_is_free(HOST, port):
        if time.monotonic() >= deadline:
            raise StackError(f"port {HOST}:{port} is still in use {timeout_s:.0f} s after its server died")
        time.sleep(0.05)


def _read_ready(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None  # absent or half-written


def _child_env() -> dict[str, str]:
    """The launcher's environment, plus this checkout on PYTHONPATH for ``-m``."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ----------------------------------------------------------------------- ClickHouse


def ping(url: str, timeout_s: float = 2.0) -> bool:
    """True if ``GET {url}/ping`` answers ``Ok.`` (ClickHouse's health endpoint)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/ping", timeout=timeout_s) as r:
            return r.status == 200 and r.read().strip() == b"Ok."
    except (OSError, urllib.error.URLError):
        return False


def _start_clickhouse(
    stack_dir: Path,
    *,
    port: int,
    zk: str,
    user: str | None,
    password_env: str | None,
    max_session_timeout: int | None,
    timeout_s: float,
    transactions: bool = True,
) -> tuple[ProcessRef, dict[str, str], str, int]:
    """Render the config and start the HTTP server on chdb; wait for its ready file and /ping.

    ``max_session_timeout`` None keeps the value of ``config.d/sessions.xml``.
    Returns (process, log files, config file, effective max_session_timeout).
    """
    if importlib.util.find_spec("server_patches.http_server") is None:
        raise StackError(
            "server_patches/http_server.py (ClickHouse's HTTP interface on chdb) "
            "is not in this checkout; the stack cannot serve ClickHouse without it"
        )
    if password_env and password_env not in os.environ:
        raise StackError(f"--password-env names the environment variable {password_env!r}, which is not set")
    ch_dir = stack_dir / "clickhouse"
    data_dir = ch_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    zk_host, zk_port = zk.rsplit(":", 1)
    config_file = chdb_config.write(
        ch_dir / "config.xml",
        zookeeper=[(zk_host, int(zk_port))],
        name=chdb_config.stack_name(stack_dir),
        session_timeout_s=max_session_timeout,
        transactions=transactions,
    )
    # The HTTP server enforces the cap itself: hand it the value the config holds.
    effective_max = int(chdb_config.server_setting(config_file, "max_session_timeout") or 3600)
    ready = ch_dir / "ready.json"
    ready.unlink(missing_ok=True)
    logs = {
        "clickhouse": str(stack_dir / "logs" / "clickhouse.log"),
        "clickhouse_stdout": str(stack_dir / "logs" / "clickhouse.out"),
    }
    argv = [
        sys.executable,
        "-m",
        "server_patches.http_server",
        "--data-dir",
        str(data_dir),
        "--config-file",
        str(config_file),
        "--host",
        HOST,
        "--port",
        str(port),
        "--ready-file",
        str(ready),
        "--max-session-timeout",
        str(effective_max),
        "--log-file",
        logs["clickhouse"],
    ]
    if user:
        argv += ["--user", user]
    if password_env:
        argv += ["--password-env", password_env]
    ref = processes.spawn(argv, log_file=Path(logs["clickhouse_stdout"]), env=_child_env())
    _wait_for_clickhouse(ref, port, ready, logs, timeout_s)
    return ref, logs, str(config_file), effective_max


def _wait_for_clickhouse(ref: ProcessRef, port: int, ready: Path, logs: Mapping[str, str], timeout_s: float) -> None:
    """Until the server wrote its ready file and answers /ping; its log tails if it does not."""
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout_s

    def tails() -> str:
        return (
            f"\n--- {logs['clickhouse_stdout']}:\n"
            + processes.log_tail(Path(logs["clickhouse_stdout"]))
            + f"\n--- {logs['clickhouse']}:\n"
            + processes.log_tail(Path(logs["clickhouse"]))
        )

    while not (_read_ready(ready) and ping(url)):
        if not processes.is_alive(ref):
            raise StackError(f"the ClickHouse HTTP server exited during start-up (port {port})" + tails())
        if time.monotonic() >= deadline:
            processes.kill(ref)
            raise StackError(f"the ClickHouse HTTP server did not answer {url}/ping within {timeout_s:.0f} s" + tails())
        time.sleep(0.1)


# ---------------------------------------------------------------------------- Kafka


def kafka_available() -> bool:
    """True if the dev Kafka broker module (server_patches/kafka_broker.py) exists."""
    return importlib.util.find_spec("server_patches.kafka_broker") is not None


def _start_kafka(stack_dir: Path, *, port: int, timeout_s: float) -> tuple[ProcessRef, str, str | None, str]:
    """Start the dev Kafka broker; wait for its ready file.

    Returns (ref, bootstrap, control URL or None, log file).
    """
    if not kafka_available():
        raise StackError(
            "--kafka needs server_patches/kafka_broker.py (the dev Kafka broker), which is not in this checkout"
        )
    kdir = stack_dir / "kafka"
    kdir.mkdir(parents=True, exist_ok=True)
    ready = kdir / "ready.json"
    ready.unlink(missing_ok=True)
    log = stack_dir / "logs" / "kafka.log"
    argv = [
        sys.executable,
        "-m",
        "server_patches.kafka_broker",
        "--host",
        HOST,
        "--port",
        str(port),
        "--ready-file",
        str(ready),
    ]
    ref = processes.spawn(argv, log_file=log, env=_child_env())
    deadline = time.monotonic() + timeout_s
    while True:
        info = _read_ready(ready)
        if info and info.get("bootstrap"):
            return ref, str(info["bootstrap"]), info.get("control"), str(log)
        if not processes.is_alive(ref):
            raise StackError(
                f"the Kafka broker exited during start-up (port {port}); last lines "
                f"of {log}:\n" + processes.log_tail(log)
            )
        if time.monotonic() >= deadline:
            processes.kill(ref)
            raise StackError(
                f"the Kafka broker wrote no ready file within {timeout_s:.0f} s; "
                f"last lines of {log}:\n" + processes.log_tail(log)
            )
        time.sleep(0.1)


# ------------------------------------------------------------------------ the stack


def start_stack(
    stack_dir: Path | str,
    *,
    kafka: bool = False,
    port: int | None = None,
    zk_port: int | None = None,
    user: str | None = None,
    password_env: str | None = None,
    max_session_timeout: int | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    transactions: bool = True,
    zookeeper_address_for_clickhouse: str | None = None,
) -> StackInfo:
    """Start (or complete) the stack in ``stack_dir`` and return what runs.

    Idempotent: components already running are kept. ZooKeeper and ClickHouse data
    persist in ``stack_dir`` across stops and starts.

    Parameters
    ----------
    kafka
        Also start the dev Kafka broker (its topics live in memory only).
    port, zk_port
        ClickHouse HTTP and ZooKeeper client ports; by default the previous ones
        when free, else free ones.
    user, password_env
        Require this user, with the password read from the environment variable
        named ``password_env`` (the password is never written anywhere).
    max_session_timeout
        Longest ``session_timeout`` clients may ask for; None keeps the value of
        ``config.d/sessions.xml``.
    transactions
        False starts ClickHouse without experimental transactions (as most servers
        run); only when it starts here, a restart turns them on again.
    zookeeper_address_for_clickhouse
        ``host:port`` ClickHouse uses as its Keeper instead of the stack's ZooKeeper,
        e.g. a fault-injecting proxy in front of it (``make chaos``); only when
        ClickHouse starts here (:func:`start_clickhouse` takes it again).

    Raises
    ------
    StackError, zookeeper.ZooKeeperError
        A component did not start; the message carries its log tail. Components
        started by this call are stopped again before raising.
    """
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        prev = read_stack(stack_dir)
        alive = prev.alive() if prev else {}
        if prev and alive.get("clickhouse"):
            _refuse_changes_to_a_running_stack(prev, port=port, zk_port=zk_port, user=user, password_env=password_env)
        launch = _Launch.resume(stack_dir, prev, alive, timeout_s)
        if prev:
            user = user if user is not None else prev.user
            password_env = password_env if password_env is not None else prev.password_env
        try:
            zk_changed = launch.zookeeper(zk_port)
            launch.clickhouse(
                port,
                zk_changed=zk_changed,
                user=user,
                password_env=password_env,
                max_session_timeout=max_session_timeout,
                transactions=transactions,
                zk_addr=zookeeper_address_for_clickhouse,
            )
            if kafka:
                launch.kafka()
        except BaseException:
            launch.kill_started()
            raise
        info = launch.info(user=user, password_env=password_env)
        _write_stack(info)
        return info


def _refuse_changes_to_a_running_stack(
    prev: StackInfo, *, port: int | None, zk_port: int | None, user: str | None, password_env: str | None
) -> None:
    """``up`` on a running stack may not move its ports or change its user."""
    for what, key, wanted in (("ClickHouse", "clickhouse", port), ("ZooKeeper", "zookeeper", zk_port)):
        if wanted is not None and prev.ports.get(key) != wanted:
            raise StackError(
                f"the stack in {prev.dir} already runs {what} on port "
                f"{prev.ports.get(key)}, not {wanted}; run `down` first"
            )
    if (user, password_env) != (prev.user, prev.password_env) and (user or password_env):
        raise StackError(
            f"the stack in {prev.dir} already runs with user {prev.user!r}; run `down` first to change the user"
        )


@dataclasses.dataclass
class _Launch:
    """One ``start_stack`` call: what already runs, what it starts, in order (ZooKeeper,
    ClickHouse, Kafka), and what to kill again if a later part fails."""

    stack_dir: Path
    alive: dict[str, bool]
    timeout_s: float
    procs: dict[str, ProcessRef]
    ports: dict[str, int]
    logs: dict[str, str]
    config_file: str = ""
    max_session_timeout: int = 3600
    kafka_bootstrap: str | None = None
    kafka_control: str | None = None
    started: list[ProcessRef] = dataclasses.field(default_factory=list)

    @classmethod
    def resume(cls, stack_dir: Path, prev: StackInfo | None, alive: dict[str, bool], timeout_s: float) -> "_Launch":
        launch = cls(
            stack_dir,
            dict(alive),
            timeout_s,
            dict(prev.processes) if prev else {},
            dict(prev.ports) if prev else {},
            dict(prev.logs) if prev else {},
        )
        if prev:
            launch.config_file, launch.max_session_timeout = prev.config_file, prev.max_session_timeout
            if alive.get("kafka"):
                launch.kafka_bootstrap, launch.kafka_control = prev.kafka_bootstrap, prev.kafka_control
        return launch

    def zookeeper(self, wanted_port: int | None) -> bool:
        """Start ZooKeeper unless it runs; True if it now listens on another port."""
        if self.alive.get("zookeeper"):
            return False
        zk_p = _pick_port("ZooKeeper", wanted_port, self.ports.get("zookeeper"))
        changed = zk_p != self.ports.get("zookeeper")
        zk = zookeeper.start_zookeeper(self.stack_dir / "zookeeper", host=HOST, port=zk_p, timeout_s=self.timeout_s)
        self.started.append(zk.process)
        self.procs["zookeeper"] = zk.process
        self.ports["zookeeper"] = zk.port
        self.logs["zookeeper"] = str(zk.log_file)
        return changed

    @property
    def zk_addr(self) -> str:
        return f"{HOST}:{self.ports['zookeeper']}"

    def clickhouse(
        self,
        wanted_port: int | None,
        *,
        zk_changed: bool,
        user: str | None,
        password_env: str | None,
        max_session_timeout: int | None,
        transactions: bool,
        zk_addr: str | None = None,
    ) -> None:
        """Start ClickHouse unless it runs against the current ZooKeeper (or ``zk_addr``)."""
        if self.alive.get("clickhouse") and zk_changed:
            # Its config points at the old ZooKeeper port: restart it on the new one.
            processes.stop(self.procs["clickhouse"], DEFAULT_STOP_TIMEOUT_S)
            self.alive["clickhouse"] = False
        if self.alive.get("clickhouse"):
            return
        ch_p = _pick_port("ClickHouse", wanted_port, self.ports.get("clickhouse"))
        ref, ch_logs, self.config_file, self.max_session_timeout = _start_clickhouse(
            self.stack_dir,
            port=ch_p,
            zk=zk_addr or self.zk_addr,
            user=user,
            password_env=password_env,
            max_session_timeout=max_session_timeout,
            timeout_s=self.timeout_s,
            transactions=transactions,
        )
        self.started.append(ref)
        self.procs["clickhouse"] = ref
        self.ports["clickhouse"] = ch_p
        self.logs.update(ch_logs)

    def kafka(self) -> None:
        """Start the dev Kafka broker unless it runs."""
        if self.alive.get("kafka"):
            return
        k_p = _pick_port("Kafka", None, self.ports.get("kafka"))
        ref, self.kafka_bootstrap, self.kafka_control, klog = _start_kafka(
            self.stack_dir, port=k_p, timeout_s=self.timeout_s
        )
        self.started.append(ref)
        self.procs["kafka"] = ref
        self.ports["kafka"] = k_p
        self.logs["kafka"] = klog

    def kill_started(self) -> None:
        for ref in reversed(self.started):
            processes.kill(ref)

    def info(self, *, user: str | None, password_env: str | None) -> StackInfo:
        if not self.kafka_bootstrap:
            self.procs.pop("kafka", None)
        return StackInfo(
            dir=self.stack_dir,
            clickhouse_url=f"http://{HOST}:{self.ports['clickhouse']}",
            zookeeper=self.zk_addr,
            kafka_bootstrap=self.kafka_bootstrap,
            kafka_control=self.kafka_control,
            processes=self.procs,
            ports=self.ports,
            data_dirs={
                "clickhouse": str(self.stack_dir / "clickhouse" / "data"),
                "zookeeper": str(self.stack_dir / "zookeeper" / "data"),
            },
            logs=self.logs,
            config_file=self.config_file,
            user=user,
            password_env=password_env,
            max_session_timeout=self.max_session_timeout,
        )


def stop_stack(stack_dir: Path | str, *, purge: bool = False, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> list[str]:
    """Stop every process of the stack (SIGTERM, then SIGKILL after ``timeout_s``).

    Data stays unless ``purge``, which deletes the data, logs and ``stack.json``.
    Returns the names of the components that were running. A directory without a
    stack is not an error (stopping is idempotent).
    """
    stack_dir = Path(stack_dir).resolve()
    if not stack_dir.exists():
        return []
    with _locked(stack_dir):
        info = read_stack(stack_dir)
        was_running: list[str] = []
        if info:
            alive = info.alive()
            for name in STOP_ORDER:
                ref = info.processes.get(name)
                if ref is not None and alive.get(name):
                    was_running.append(name)
                    processes.stop(ref, timeout_s)
        if purge:
            for sub in ("zookeeper", "clickhouse", "kafka", "logs"):
                shutil.rmtree(stack_dir / sub, ignore_errors=True)
            _stack_file(stack_dir).unlink(missing_ok=True)
        return was_running


def stack_status(stack_dir: Path | str) -> dict[str, Any]:
    """What runs in ``stack_dir``: per component ``{"alive", "pid"}`` plus URLs.

    ``clickhouse`` is alive only if its process runs *and* ``/ping`` answers.
    """
    info = read_stack(stack_dir)
    if info is None:
        return {"dir": str(Path(stack_dir).resolve()), "running": False, "components": {}}
    alive = info.alive()
    if alive.get("clickhouse"):
        alive["clickhouse"] = ping(info.clickhouse_url)
    if alive.get("zookeeper"):
        host, port = info.zookeeper.rsplit(":", 1)
        alive["zookeeper"] = zookeeper.is_healthy(host, int(port))
    comps = {k: {"alive": alive[k], "pid": info.processes[k].pid} for k in info.processes}
    return {
        "dir": str(info.dir),
        "running": bool(comps) and all(c["alive"] for c in comps.values()),
        "components": comps,
        "clickhouse_url": info.clickhouse_url,
        "zookeeper": info.zookeeper,
        "kafka_bootstrap": info.kafka_bootstrap,
    }


@contextlib.contextmanager
def running_stack(stack_dir: Path | str, **kwargs: Any) -> Iterator[StackInfo]:
    """``with running_stack(dir, kafka=True) as info:`` — started on entry, stopped on exit."""
    try:
        yield start_stack(stack_dir, **kwargs)
    finally:
        stop_stack(stack_dir)


# ------------------------------------------------------------- crash helpers (tests)


def _require(stack_dir: Path | str) -> StackInfo:
    info = read_stack(stack_dir)
    if info is None:
        raise StackError(f"no stack in {Path(stack_dir).resolve()} (no {STACK_FILE}); run `up` first")
    return info


def kill_clickhouse(stack_dir: Path | str) -> StackInfo:
    """SIGKILL the ClickHouse HTTP server (a crash: sessions and open transactions die)."""
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        info = _require(stack_dir)
        processes.kill(info.processes.get("clickhouse"))
        _wait_port_free(info.clickhouse_port)
        return info


def start_clickhouse(
    stack_dir: Path | str,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    *,
    zookeeper_address_for_clickhouse: str | None = None,
) -> StackInfo:
    """Start ClickHouse again on the same data dir, port and ZooKeeper (no-op if running).

    ``zookeeper_address_for_clickhouse`` as in :func:`start_stack`.
    """
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        info = _require(stack_dir)
        if processes.is_alive(info.processes.get("clickhouse")):
            return info
        ref, logs, config_file, _ = _start_clickhouse(
            stack_dir,
            port=info.clickhouse_port,
            zk=zookeeper_address_for_clickhouse or info.zookeeper,
            user=info.user,
            password_env=info.password_env,
            max_session_timeout=info.max_session_timeout,
            timeout_s=timeout_s,
        )
        info = dataclasses.replace(
            info, processes={**info.processes, "clickhouse": ref}, logs={**info.logs, **logs}, config_file=config_file
        )
        _write_stack(info)
        return info


def restart_clickhouse(stack_dir: Path | str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> StackInfo:
    """Crash ClickHouse (SIGKILL) and start it again on the same data, port and ZooKeeper."""
    kill_clickhouse(stack_dir)
    return start_clickhouse(stack_dir, timeout_s)


def kill_zookeeper(stack_dir: Path | str) -> StackInfo:
    """SIGKILL ZooKeeper (ClickHouse stays up and loses its Keeper session)."""
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        info = _require(stack_dir)
        processes.kill(info.processes.get("zookeeper"))
        return info


def start_zookeeper(stack_dir: Path | str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> StackInfo:
    """Start ZooKeeper again on the same data dir and port (no-op if running)."""
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        info = _require(stack_dir)
        if processes.is_alive(info.processes.get("zookeeper")):
            return info
        port = int(info.ports["zookeeper"])
        _wait_port_free(port)
        zk = zookeeper.start_zookeeper(stack_dir / "zookeeper", host=HOST, port=port, timeout_s=timeout_s)
        info = dataclasses.replace(info, processes={**info.processes, "zookeeper": zk.process})
        _write_stack(info)
        return info


def restart_zookeeper(stack_dir: Path | str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> StackInfo:
    """Crash ZooKeeper (SIGKILL) and start it again on the same data and port."""
    kill_zookeeper(stack_dir)
    return start_zookeeper(stack_dir, timeout_s)
