"""The embedded local stack's lifecycle: start, stop, status of ZooKeeper, ClickHouse, Kafka.

Every process runs in its own session, so it outlives the launcher (a CLI call or a
test run); :func:`stop_stack` (``python -m server_patches down``) stops them all.
Starting is idempotent: what is already running is kept, what is dead is started
again on the same data directory and, when free, the same ports. The directory layout
is in :mod:`server_patches.stack_files`; crashing one part for a test is
:mod:`server_patches.crashes`.

All functions here run in the launcher's process (a test fixture, the CLI); nothing
is sent to Spark executors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from pathlib import Path
from typing import Any, Iterator

from server_patches import chdb_config, processes, zk_client, zookeeper
from server_patches.processes import ProcessRef
from server_patches.stack_clickhouse import cluster_members, ping, start_clickhouse_server
from server_patches.stack_files import (
    DEFAULT_START_TIMEOUT_S,
    DEFAULT_STOP_TIMEOUT_S,
    HOST,
    PORT_NAMES,
    StackError,
    StackInfo,
    check_compatibility,
    locked,
    member_name,
    pick_port,
    read_stack,
    refuse_changes_to_a_running_stack,
    stack_file,
    write_stack,
)
from server_patches.stack_kafka import start_kafka_broker


def start_stack(
    stack_dir: Path | str,
    *,
    kafka: bool = False,
    port: int | None = None,
    zk_port: int | None = None,
    tcp_port: int | None = None,
    user: str | None = None,
    password_env: str | None = None,
    max_session_timeout: int | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    transactions: bool = True,
    shards: int | None = None,
    replicas: int | None = None,
    zookeeper_address_for_clickhouse: str | None = None,
    compatibility: str | None = None,
) -> StackInfo:
    """Start (or complete) the stack in ``stack_dir`` and return what runs.

    Idempotent: components already running are kept. ZooKeeper and ClickHouse data
    persist in ``stack_dir`` across stops and starts.

    Parameters
    ----------
    kafka
        Also start the dev Kafka broker (its topics live in memory only).
    port, zk_port, tcp_port
        ClickHouse HTTP, ZooKeeper client and ClickHouse native ports; by default the
        previous ones when free, else free ones. On the native port the server answers
        as far as chdb allows (:mod:`server_patches.native_port`).
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
    compatibility
        ClickHouse's ``compatibility`` in the engine's default profile (``"25.8"``; docs/server.md); None: as before.

    Raises
    ------
    StackError, zookeeper.ZooKeeperError
        A component did not start; the message carries its log tail. Components
        started by this call are stopped again before raising.
    """
    stack_dir = Path(stack_dir).resolve()
    compatibility = check_compatibility(compatibility)
    with locked(stack_dir):
        prev = read_stack(stack_dir)
        alive = prev.alive() if prev else {}
        wanted = {"clickhouse": port, "zookeeper": zk_port, "clickhouse_tcp": tcp_port}
        if prev and alive.get("clickhouse"):
            refuse_changes_to_a_running_stack(prev, wanted, user=user, password_env=password_env, compat=compatibility)
        launch = _Launch.resume(stack_dir, prev, alive, timeout_s)
        launch.shards, launch.replicas = _cluster_shape(prev, bool(alive.get("clickhouse")), shards, replicas)
        kept = _kept(prev, user=user, password_env=password_env, compatibility=compatibility)
        clickhouse = {
            **kept,
            "max_session_timeout": max_session_timeout,
            "transactions": transactions,
            "zk_addr": zookeeper_address_for_clickhouse,
        }
        launch.start_all(wanted, kafka=kafka, clickhouse=clickhouse)
        info = launch.info(**kept)
        write_stack(info)
        return info


def _kept(prev: StackInfo | None, **given: str | None) -> dict[str, str | None]:
    """The given values, each one not given (None) as ``prev`` recorded it: a stack
    started again keeps its user and its compatibility unless told otherwise."""
    return {k: getattr(prev, k) if v is None and prev is not None else v for k, v in given.items()}


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
        zk_p = pick_port("ZooKeeper", wanted_port, self.ports.get("zookeeper"))
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
        wanted_ports: dict[str, int | None],
        *,
        zk_changed: bool,
        user: str | None,
        password_env: str | None,
        max_session_timeout: int | None,
        transactions: bool,
        zk_addr: str | None = None,
        compatibility: str | None = None,
    ) -> None:
        """Start every ClickHouse server unless it runs against the current ZooKeeper (or ``zk_addr``)."""
        names = [member_name(i, j) for i in range(self.shards) for j in range(self.replicas)]
        for n in names:
            if self.alive.get(n) and zk_changed:
                # Its config points at the old ZooKeeper port: restart it on the new one.
                processes.stop(self.procs[n], DEFAULT_STOP_TIMEOUT_S)
                self.alive[n] = False
        self._member_ports(names, wanted_ports)
        # ClickHouse refuses to start under a ZooKeeper root that does not exist yet
        name = chdb_config.stack_name(self.stack_dir)
        roots = [chdb_config.zookeeper_root(name, i if len(names) > 1 else None) for i in range(self.shards)]
        try:
            zk_client.create_paths(zk_addr or self.zk_addr, roots)
        except (OSError, zk_client.ZooKeeperRequestError) as exc:
            raise StackError(f"could not create the ZooKeeper roots {roots}: {exc}") from exc
        for n, member in zip(names, cluster_members(self.shards, self.replicas, self.ports)):
            if self.alive.get(n):
                continue
            ref, ch_logs, config_file, max_timeout = start_clickhouse_server(
                self.stack_dir,
                port=self.ports[n],
                tcp_port=self.ports[n + "_tcp"],
                zk=zk_addr or self.zk_addr,
                user=user,
                password_env=password_env,
                max_session_timeout=max_session_timeout,
                timeout_s=self.timeout_s,
                transactions=transactions,
                name=n,
                member=member,
                compatibility=compatibility,
            )
            if n == "clickhouse":
                self.config_file, self.max_session_timeout = config_file, max_timeout
            self.started.append(ref)
            self.procs[n] = ref
            self.logs.update(ch_logs)

    def _member_ports(self, names: list[str], wanted: dict[str, int | None]) -> None:
        """An HTTP and a native port (``<name>_tcp``) for every server not running: the
        wanted ones (first server), else the previous ones when free, else new ones no
        other server of the stack has."""
        for key in [k for n in names if not self.alive.get(n) for k in (n, n + "_tcp")]:
            taken = {p for k, p in self.ports.items() if k != key}
            port = pick_port(PORT_NAMES.get(key, "ClickHouse"), wanted.get(key), self.ports.get(key))
            while port in taken:
                port = processes.free_port(HOST)
            self.ports[key] = port

    def start_all(self, wanted: dict[str, int | None], *, kafka: bool, clickhouse: dict[str, Any]) -> None:
        """ZooKeeper, the ClickHouse servers (``clickhouse``: :meth:`clickhouse`'s keywords),
        then Kafka if asked; what this call started is stopped again if one fails."""
        try:
            zk_changed = self.zookeeper(wanted["zookeeper"])
            self.clickhouse(wanted, zk_changed=zk_changed, **clickhouse)
            if kafka:
                self.kafka()
        except BaseException:
            self.kill_started()
            raise

    def kafka(self) -> None:
        """Start the dev Kafka broker unless it runs."""
        if self.alive.get("kafka"):
            return
        k_p = pick_port("Kafka", None, self.ports.get("kafka"))
        ref, self.kafka_bootstrap, self.kafka_control, klog = start_kafka_broker(
            self.stack_dir, port=k_p, timeout_s=self.timeout_s
        )
        self.started.append(ref)
        self.procs["kafka"] = ref
        self.ports["kafka"] = k_p
        self.logs["kafka"] = klog

    def kill_started(self) -> None:
        for ref in reversed(self.started):
            processes.kill(ref)

    def info(self, *, user: str | None, password_env: str | None, compatibility: str | None) -> StackInfo:
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
            compatibility=compatibility,
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
    with locked(stack_dir):
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
            stack_file(stack_dir).unlink(missing_ok=True)
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
        "compatibility": info.compatibility,
        **({"clickhouse_urls": info.clickhouse_urls, "shards_option": info.shards_option} if info.is_cluster else {}),
    }


@contextlib.contextmanager
def running_stack(stack_dir: Path | str, **kwargs: Any) -> Iterator[StackInfo]:
    """``with running_stack(dir, kafka=True) as info:`` — started on entry, stopped on exit."""
    try:
        yield start_stack(stack_dir, **kwargs)
    finally:
        stop_stack(stack_dir)
