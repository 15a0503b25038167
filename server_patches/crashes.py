"""Crash and restart one part of a running embedded stack, for tests and chaos runs.

Each helper takes the stack's lock, so it does not race a concurrent ``up``/``down``;
a kill is SIGKILL (a crash, not a shutdown). Runs in the launcher's process.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from server_patches import processes, zookeeper
from server_patches.stack_clickhouse import cluster_members, start_clickhouse_server
from server_patches.stack_files import (
    DEFAULT_START_TIMEOUT_S,
    HOST,
    STACK_FILE,
    StackError,
    StackInfo,
    locked,
    member_name,
    read_stack,
    wait_port_free,
    write_stack,
)


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
    with locked(stack_dir):
        info = _require(stack_dir)
        name = _member(info, shard, replica)
        processes.kill(info.processes.get(name))
        for key in (name, name + "_tcp"):
            if key in info.ports:
                wait_port_free(int(info.ports[key]))
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
    with locked(stack_dir):
        info = _require(stack_dir)
        name = _member(info, shard, replica)
        if processes.is_alive(info.processes.get(name)):
            return info
        ref, logs, config_file, _ = start_clickhouse_server(
            stack_dir,
            port=int(info.ports[name]),
            tcp_port=info.ports.get(name + "_tcp"),
            zk=zookeeper_address_for_clickhouse or info.zookeeper,
            user=info.user,
            password_env=info.password_env,
            max_session_timeout=info.max_session_timeout,
            timeout_s=timeout_s,
            name=name,
            member=cluster_members(info.shards, info.replicas, info.ports)[shard * info.replicas + replica],
            compatibility=info.compatibility,
        )
        config_file = config_file if name == "clickhouse" else info.config_file
        info = dataclasses.replace(
            info, processes={**info.processes, name: ref}, logs={**info.logs, **logs}, config_file=config_file
        )
        write_stack(info)
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
    with locked(stack_dir):
        info = _require(stack_dir)
        processes.kill(info.processes.get("zookeeper"))
        return info


def start_zookeeper(stack_dir: Path | str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> StackInfo:
    """Start ZooKeeper again on the same data dir and port (no-op if running)."""
    stack_dir = Path(stack_dir).resolve()
    with locked(stack_dir):
        info = _require(stack_dir)
        if processes.is_alive(info.processes.get("zookeeper")):
            return info
        port = int(info.ports["zookeeper"])
        wait_port_free(port)
        zk = zookeeper.start_zookeeper(stack_dir / "zookeeper", host=HOST, port=port, timeout_s=timeout_s)
        info = dataclasses.replace(info, processes={**info.processes, "zookeeper": zk.process})
        write_stack(info)
        return info


def restart_zookeeper(stack_dir: Path | str, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> StackInfo:
    """Crash ZooKeeper (SIGKILL) and start it again on the same data and port."""
    kill_zookeeper(stack_dir)
    return start_zookeeper(stack_dir, timeout_s)
