"""The embedded stack's description and directory: ``stack.json``, its lock, ports, child env.

One stack lives in one directory::

    DIR/stack.json            what runs: URLs, ports, pids (+ start times), data dirs
    DIR/zookeeper/            zoo.cfg, data/ (kept across restarts), zookeeper.log
    DIR/clickhouse/           config.xml (rendered from config.d), data/ (kept)
    DIR/kafka/                the broker's ready file (it keeps topics in memory)
    DIR/logs/                 stdout/stderr and logs of every process

All functions here run in the launcher's process (a test fixture, the CLI).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from server_patches import processes
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
    #: ClickHouse's ``compatibility`` in the engine's default profile (``"25.8"``), or None.
    compatibility: str | None = None

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
            "compatibility": self.compatibility,
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
            compatibility=d.get("compatibility"),
        )


_COMPATIBILITY = re.compile(r"[0-9]+\.[0-9]+")


def check_compatibility(value: str | None) -> str | None:
    """``value`` if it is a ClickHouse version for the ``compatibility`` setting
    (``major.minor``, e.g. ``25.8``), None for None; else :class:`StackError` saying so.

    Checked before anything starts: with a wrong value the engine refuses to start
    (``Error initializing EmbeddedServer``, code 36), with the cause only in its log.
    """
    if value is None:
        return None
    text = str(value).strip()
    if not _COMPATIBILITY.fullmatch(text):
        raise StackError(
            f"--compatibility {value!r} is not a ClickHouse version: give major.minor, e.g. 25.8 "
            "(ClickHouse's compatibility setting; docs/server.md)"
        )
    return text


def member_name(shard: int, replica: int) -> str:
    """The component name of one ClickHouse server: ``clickhouse`` for the first (the
    one-server stack's name, so a cluster's first server is where a single one would be),
    ``clickhouse-s<shard>r<replica>`` for the others."""
    return "clickhouse" if (shard, replica) == (0, 0) else f"clickhouse-s{shard}r{replica}"


PORT_NAMES = {"clickhouse": "ClickHouse", "zookeeper": "ZooKeeper", "clickhouse_tcp": "ClickHouse native"}


def refuse_changes_to_a_running_stack(
    prev: StackInfo,
    wanted_ports: dict[str, int | None],
    *,
    user: str | None,
    password_env: str | None,
    compat: str | None = None,
) -> None:
    """``up`` on a running stack may not move its ports or change its user or compatibility."""
    for key, wanted in wanted_ports.items():
        if wanted is not None and prev.ports.get(key) != wanted:
            raise StackError(
                f"the stack in {prev.dir} already runs {PORT_NAMES[key]} on port "
                f"{prev.ports.get(key)}, not {wanted}; run `down` first"
            )
    if (user, password_env) != (prev.user, prev.password_env) and (user or password_env):
        raise StackError(
            f"the stack in {prev.dir} already runs with user {prev.user!r}; run `down` first to change the user"
        )
    if compat is not None and compat != prev.compatibility:
        raise StackError(
            f"the stack in {prev.dir} already runs with compatibility {prev.compatibility!r}, "
            f"not {compat!r}; run `down` first"
        )


# ---------------------------------------------------------------------------- files


def stack_file(stack_dir: Path) -> Path:
    return Path(stack_dir) / STACK_FILE


def read_stack(stack_dir: Path | str) -> StackInfo | None:
    """The stack recorded in ``stack_dir/stack.json``, or None if there is none."""
    f = stack_file(Path(stack_dir).resolve())
    try:
        return StackInfo.from_json(json.loads(f.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError) as e:
        raise StackError(f"{f} is not a stack description ({e}); remove it or use another --dir") from e


def write_stack(info: StackInfo) -> None:
    f = stack_file(info.dir)
    tmp = f.with_name(f.name + ".tmp")
    tmp.write_text(json.dumps(info.to_json(), sort_keys=True, indent=1) + "\n")
    tmp.replace(f)


@contextlib.contextmanager
def locked(stack_dir: Path) -> Iterator[None]:
    """Serialise up/down/restart on one stack directory (across processes)."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    with open(stack_dir / ".stack.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pick_port(what: str, wanted: int | None, previous: int | None) -> int:
    """The requested port (must be free), else the previous one if free, else a new one."""
    if wanted is not None:
        if not processes.port_is_free(HOST, wanted):
            raise StackError(f"{what} port {HOST}:{wanted} is already in use")
        return wanted
    if previous is not None and processes.port_is_free(HOST, previous):
        return previous
    return processes.free_port(HOST)


def wait_port_free(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not processes.port_is_free(HOST, port):
        if time.monotonic() >= deadline:
            raise StackError(f"port {HOST}:{port} is still in use {timeout_s:.0f} s after its server died")
        time.sleep(0.05)


def read_ready(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None  # absent or half-written


def child_env() -> dict[str, str]:
    """The launcher's environment, plus this checkout on PYTHONPATH for ``-m``."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
