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
import subprocess
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
    #: A cluster stack runs shards × replicas ClickHouse servers (``member_name``).
    shards: int = 1
    replicas: int = 1

    @property
    def pids(self) -> dict[str, int]:
        """Component name → pid of the process started for it."""
        return {k: v.pid for k, v in self.processes.items()}

    @property
    def clickhouse_port(self) -> int:
        return int(self.ports["clickhouse"])

    @property
    def is_cluster(self) -> bool:
        return self.shards * self.replicas > 1

    @property
    def members(self) -> list[tuple[int, int, str]]:
        """``(shard, replica, component name)`` of every ClickHouse server, shards then replicas."""
        return [(i, j, member_name(i, j)) for i in range(self.shards) for j in range(self.replicas)]

    def url_of(self, shard: int = 0, replica: int = 0) -> str:
        """The HTTP URL of one ClickHouse server of the stack."""
        return f"http://{HOST}:{self.ports[member_name(shard, replica)]}"

    @property
    def clickhouse_urls(self) -> list[list[str]]:
        """Every server's URL: one list per shard, of its replicas."""
        return [[self.url_of(i, j) for j in range(self.replicas)] for i in range(self.shards)]

    @property
    def shards_option(self) -> str:
        """The writer's ``shards`` option for this stack: ``,`` between shards, ``|`` between replicas."""
        return ",".join("|".join(r) for r in self.clickhouse_urls)

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
            **self._cluster_json(),
        }

    def _cluster_json(self) -> dict[str, Any]:
        """The keys only a cluster stack has (a one-server stack.json stays as it was)."""
        if not self.is_cluster:
            return {}
        return {
            "shards": self.shards,
            "replicas": self.replicas,
            "clickhouse_urls": self.clickhouse_urls,
            "shards_option": self.shards_option,
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
            shards=int(d.get("shards", 1)),
            replicas=int(d.get("replicas", 1)),
        )


def member_name(shard: int, replica: int) -> str:
    """The component name of one ClickHouse server: ``clickhouse`` for the first (the
    one-server stack's name, so a cluster's first server is where a single one would be),
    ``clickhouse-s<shard>r<replica>`` for the others."""
    return "clickhouse" if (shard, replica) == (0, 0) else f"clickhouse-s{shard}r{replica}"


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
    name: str = "clickhouse",
    member: chdb_config.ClusterMember | None = None,
) -> tuple[ProcessRef, dict[str, str], str, int]:
    """Render the config and start the HTTP server on chdb; wait for its ready file and /ping.

    ``max_session_timeout`` None keeps the value of ``config.d/sessions.xml``.
    ``name`` is the component (:func:`member_name`): its directory, log names and
    keys; ``member`` its place in a cluster stack (None: the one server).
    Returns (process, log files, config file, effective max_session_timeout).
    """
    if importlib.util.find_spec("server_patches.http_server") is None:
        raise StackError(
            "server_patches/http_server.py (ClickHouse's HTTP interface on chdb) "
            "is not in this checkout; the stack cannot serve ClickHouse without it"
        )
    if importlib.util.find_spec("chdb") is None:
        # the base install of clickhouse-tx leaves the embedded server out (534 MB)
        raise StackError("the embedded stack needs chdb: pip install 'clickhouse-tx[devstack]'")
    if password_env and password_env not in os.environ:
        raise StackError(f"--password-env names the environment variable {password_env!r}, which is not set")
    ch_dir = stack_dir / name
    data_dir = ch_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    zk_host, zk_port = zk.rsplit(":", 1)
    config_file = chdb_config.write(
        ch_dir / "config.xml",
        zookeeper=[(zk_host, int(zk_port))],
        name=chdb_config.stack_name(stack_dir),
        session_timeout_s=max_session_timeout,
        transactions=transactions,
        member=member,
    )
    # The HTTP server enforces the cap itself: hand it the value the config holds.
    effective_max = int(chdb_config.server_setting(config_file, "max_session_timeout") or 3600)
    ready = ch_dir / "ready.json"
    ready.unlink(missing_ok=True)
    logs = {
        name: str(stack_dir / "logs" / f"{name}.log"),
        f"{name}_stdout": str(stack_dir / "logs" / f"{name}.out"),
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
        logs[name],
    ]
    if user:
        argv += ["--user", user]
    if password_env:
        argv += ["--password-env", password_env]
    ref = processes.spawn(argv, log_file=Path(logs[f"{name}_stdout"]), env=_child_env())
    _wait_for_clickhouse(ref, port, ready, list(logs.values())[::-1], timeout_s)
    return ref, logs, str(config_file), effective_max


def _wait_for_clickhouse(ref: ProcessRef, port: int, ready: Path, logs: list[str], timeout_s: float) -> None:
    """Until the server wrote its ready file and answers /ping; its log tails if it does not."""
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout_s

    def tails() -> str:
        return "".join(f"\n--- {f}:\n" + processes.log_tail(Path(f)) for f in logs)

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
    shards: int | None = None,
    replicas: int | None = None,
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
    shards, replicas
        A cluster stack: ``shards`` × ``replicas`` ClickHouse servers on the one
        ZooKeeper, each with its own data directory and port, and the same config
        (``macros``, a ``remote_servers`` cluster ``clickhouse_tx``); see
        :attr:`StackInfo.clickhouse_urls` and :attr:`StackInfo.shards_option`.
        None keeps what the directory ran before (1 × 1 for a new one). ``port``
        is the first server's.
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
        launch.shards, launch.replicas = _cluster_shape(prev, bool(alive.get("clickhouse")), shards, replicas)
        if prev:
            user = user if user is not None else prev.user
            password_env = password_env if password_env is not None else prev.password_env
        clickhouse = {
            "user": user,
            "password_env": password_env,
            "max_session_timeout": max_session_timeout,
            "transactions": transactions,
            "zk_addr": zookeeper_address_for_clickhouse,
        }
        launch.start_all(zk_port, port, kafka=kafka, clickhouse=clickhouse)
        info = launch.info(user=user, password_env=password_env)
        _write_stack(info)
        return info


def _cluster_shape(prev: StackInfo | None, running: bool, shards: int | None, replicas: int | None) -> tuple[int, int]:
    """(shards, replicas) to run: as asked, else as before, else 1 × 1; a running stack keeps its shape."""
    shards = shards if shards is not None else (prev.shards if prev else 1)
    replicas = replicas if replicas is not None else (prev.replicas if prev else 1)
    if shards < 1 or replicas < 1:
        raise StackError(f"--shards and --replicas must be at least 1, not {shards} and {replicas}")
    if prev and running and (shards, replicas) != (prev.shards, prev.replicas):
        raise StackError(
            f"the stack in {prev.dir} runs {prev.shards} shard(s) × {prev.replicas} replica(s), "
            f"not {shards} × {replicas}; run `down` first"
        )
    return shards, replicas


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


def _cluster_members(shards: int, replicas: int, ports: Mapping[str, int]) -> list[chdb_config.ClusterMember | None]:
    """Each server's place in the cluster, in :func:`member_name` order (``[None]``: one server)."""
    if shards * replicas == 1:
        return [None]
    servers = tuple(tuple((HOST, int(ports[member_name(i, j)])) for j in range(replicas)) for i in range(shards))
    return [chdb_config.ClusterMember(i, j, servers) for i in range(shards) for j in range(replicas)]


def _create_znodes(zk: str, paths: list[str]) -> None:
    """Create each path (and its ancestors) in ZooKeeper with its own CLI; existing ones stay."""
    todo: list[str] = []
    for path in paths:
        parts = path.strip("/").split("/")
        todo += [
            "/" + "/".join(parts[: k + 1]) for k in range(len(parts)) if "/" + "/".join(parts[: k + 1]) not in todo
        ]
    script = "".join(f'create {p} ""\n' for p in todo) + "quit\n"
    argv = [zookeeper.find_java(), "-cp", zookeeper.classpath(), "org.apache.zookeeper.ZooKeeperMain", "-server", zk]
    done = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise StackError(f"could not create the shards' ZooKeeper roots {paths}: {done.stderr[-2000:]}")


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
    shards: int = 1
    replicas: int = 1

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
        """Start every ClickHouse server unless it runs against the current ZooKeeper (or ``zk_addr``)."""
        names = [member_name(i, j) for i in range(self.shards) for j in range(self.replicas)]
        for n in names:
            if self.alive.get(n) and zk_changed:
                # Its config points at the old ZooKeeper port: restart it on the new one.
                processes.stop(self.procs[n], DEFAULT_STOP_TIMEOUT_S)
                self.alive[n] = False
        self._member_ports(names, wanted_port)
        if len(names) > 1:
            name = chdb_config.stack_name(self.stack_dir)
            _create_znodes(self.zk_addr, [chdb_config.shard_root(name, i) for i in range(self.shards)])
        for n, member in zip(names, _cluster_members(self.shards, self.replicas, self.ports)):
            if self.alive.get(n):
                continue
            ref, ch_logs, config_file, max_timeout = _start_clickhouse(
                self.stack_dir,
                port=self.ports[n],
                zk=zk_addr or self.zk_addr,
                user=user,
                password_env=password_env,
                max_session_timeout=max_session_timeout,
                timeout_s=self.timeout_s,
                transactions=transactions,
                name=n,
                member=member,
            )
            if n == "clickhouse":
                self.config_file, self.max_session_timeout = config_file, max_timeout
            self.started.append(ref)
            self.procs[n] = ref
            self.logs.update(ch_logs)

    def _member_ports(self, names: list[str], wanted_first: int | None) -> None:
        """A port for every server not running: the wanted one (first server), else the
        previous one when free, else a new one no other server of the stack has."""
        for n in names:
            if self.alive.get(n):
                continue
            taken = {p for k, p in self.ports.items() if k != n}
            port = _pick_port("ClickHouse", wanted_first if n == "clickhouse" else None, self.ports.get(n))
            while port in taken:
                port = processes.free_port(HOST)
            self.ports[n] = port

    def start_all(self, zk_port: int | None, port: int | None, *, kafka: bool, clickhouse: dict[str, Any]) -> None:
        """ZooKeeper, the ClickHouse servers (``clickhouse``: :meth:`clickhouse`'s keywords),
        then Kafka if asked; what this call started is stopped again if one fails."""
        try:
            zk_changed = self.zookeeper(zk_port)
            self.clickhouse(port, zk_changed=zk_changed, **clickhouse)
            if kafka:
                self.kafka()
        except BaseException:
            self.kill_started()
            raise

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
                **{
                    member_name(i, j): str(self.stack_dir / member_name(i, j) / "data")
                    for i in range(self.shards)
                    for j in range(self.replicas)
                },
                "zookeeper": str(self.stack_dir / "zookeeper" / "data"),
            },
            logs=self.logs,
            config_file=self.config_file,
            user=user,
            password_env=password_env,
            max_session_timeout=self.max_session_timeout,
            shards=self.shards,
            replicas=self.replicas,
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
            servers = [n for _, _, n in info.members]
            for name in ("kafka", *servers, "zookeeper"):
                ref = info.processes.get(name)
                if ref is not None and alive.get(name):
                    was_running.append(name)
                    processes.stop(ref, timeout_s)
        if purge:
            servers = [n for _, _, n in info.members] if info else ["clickhouse"]
            for sub in ("zookeeper", "kafka", "logs", *servers):
                shutil.rmtree(stack_dir / sub, ignore_errors=True)
            _stack_file(stack_dir).unlink(missing_ok=True)
        return was_running


def stack_status(stack_dir: Path | str) -> dict[str, Any]:
    """What runs in ``stack_dir``: per component ``{"alive", "pid"}`` plus URLs.

    A ClickHouse server (``clickhouse``, and in a cluster stack every
    ``clickhouse-s<i>r<j>``) is alive only if its process runs *and* ``/ping`` answers.
    """
    info = read_stack(stack_dir)
    if info is None:
        return {"dir": str(Path(stack_dir).resolve()), "running": False, "components": {}}
    alive = info.alive()
    for i, j, name in info.members:
        if alive.get(name):
            alive[name] = ping(info.url_of(i, j))
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
        **({"clickhouse_urls": info.clickhouse_urls, "shards_option": info.shards_option} if info.is_cluster else {}),
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


def _member(info: StackInfo, shard: int, replica: int) -> str:
    if not (0 <= shard < info.shards and 0 <= replica < info.replicas):
        raise StackError(
            f"the stack in {info.dir} has {info.shards} shard(s) × {info.replicas} replica(s): "
            f"no server at shard {shard}, replica {replica}"
        )
    return member_name(shard, replica)


def kill_clickhouse(stack_dir: Path | str, *, shard: int = 0, replica: int = 0) -> StackInfo:
    """SIGKILL one ClickHouse HTTP server (a crash: sessions and open transactions die).

    ``shard``, ``replica``: which server of a cluster stack (the first by default).
    """
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        info = _require(stack_dir)
        name = _member(info, shard, replica)
        processes.kill(info.processes.get(name))
        _wait_port_free(int(info.ports[name]))
        return info


def start_clickhouse(
    stack_dir: Path | str,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    *,
    shard: int = 0,
    replica: int = 0,
    zookeeper_address_for_clickhouse: str | None = None,
) -> StackInfo:
    """Start one ClickHouse server again on the same data dir, port and ZooKeeper (no-op if running).

    ``zookeeper_address_for_clickhouse`` as in :func:`start_stack`.
    """
    stack_dir = Path(stack_dir).resolve()
    with _locked(stack_dir):
        info = _require(stack_dir)
        name = _member(info, shard, replica)
        if processes.is_alive(info.processes.get(name)):
            return info
        ref, logs, config_file, _ = _start_clickhouse(
            stack_dir,
            port=int(info.ports[name]),
            zk=zookeeper_address_for_clickhouse or info.zookeeper,
            user=info.user,
            password_env=info.password_env,
            max_session_timeout=info.max_session_timeout,
            timeout_s=timeout_s,
            name=name,
            member=_cluster_members(info.shards, info.replicas, info.ports)[shard * info.replicas + replica],
        )
        config_file = config_file if name == "clickhouse" else info.config_file
        info = dataclasses.replace(
            info, processes={**info.processes, name: ref}, logs={**info.logs, **logs}, config_file=config_file
        )
        _write_stack(info)
        return info


def restart_clickhouse(
    stack_dir: Path | str, timeout_s: float = DEFAULT_START_TIMEOUT_S, *, shard: int = 0, replica: int = 0
) -> StackInfo:
    """Crash one ClickHouse server (SIGKILL) and start it again on the same data, port and ZooKeeper."""
    kill_clickhouse(stack_dir, shard=shard, replica=replica)
    return start_clickhouse(stack_dir, timeout_s, shard=shard, replica=replica)


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
