"""Start one ClickHouse HTTP server of the embedded stack (chdb behind the HTTP front).

Runs in the launcher's process (a test fixture, the CLI), for :mod:`server_patches.stack`
and :mod:`server_patches.crashes`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

from server_patches import chdb_config, processes
from server_patches.processes import ProcessRef
from server_patches.stack_files import HOST, StackError, child_env, member_name, read_ready


def ping(url: str, timeout_s: float = 2.0) -> bool:
    """True if ``GET {url}/ping`` answers ``Ok.`` (ClickHouse's health endpoint)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/ping", timeout=timeout_s) as r:
            return r.status == 200 and r.read().strip() == b"Ok."
    except (OSError, urllib.error.URLError):
        return False


def start_clickhouse_server(
    stack_dir: Path,
    *,
    port: int,
    zk: str,
    tcp_port: int | None = None,
    user: str | None,
    password_env: str | None,
    max_session_timeout: int | None,
    timeout_s: float,
    transactions: bool = True,
    name: str = "clickhouse",
    member: chdb_config.ClusterMember | None = None,
    compatibility: str | None = None,
) -> tuple[ProcessRef, dict[str, str], str, int]:
    """Render the config and start the HTTP server on chdb; wait for its ready file and /ping.

    ``max_session_timeout`` None keeps the value of ``config.d/sessions.xml``.
    ``name`` is the component (:func:`member_name`): its directory, log names and
    keys; ``member`` its place in a cluster stack (None: the one server); ``tcp_port``
    its native port (:mod:`server_patches.native_port`), None for none; ``compatibility``
    goes into the engine's default profile (:func:`chdb_config.render_users`) unless None.
    Returns (process, log files, config file, effective max_session_timeout).
    """
    if importlib.util.find_spec("server_patches.http_server") is None:
        raise StackError(
            "server_patches/http_server.py (ClickHouse's HTTP interface on chdb) "
            "is not in this checkout; the stack cannot serve ClickHouse without it"
        )
    if importlib.util.find_spec("chdb") is None:
        # the base install of clickhouse-tx leaves the embedded server out (it is large)
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
        compatibility=compatibility,
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
    argv += _options(tcp_port=tcp_port, user=user, password_env=password_env)
    ref = processes.spawn(argv, log_file=Path(logs[f"{name}_stdout"]), env=child_env())
    wait_for_clickhouse(ref, port, ready, list(logs.values())[::-1], timeout_s)
    return ref, logs, str(config_file), effective_max


def _options(**values: object) -> list[str]:
    """``--tcp-port 9000 --user alice ...``: the server's option for each value given (not None or empty)."""
    return [arg for k, v in values.items() if v not in (None, "") for arg in (f"--{k.replace('_', '-')}", str(v))]


def wait_for_clickhouse(ref: ProcessRef, port: int, ready: Path, logs: list[str], timeout_s: float) -> None:
    """Until the server wrote its ready file and answers /ping; its log tails if it does not."""
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + timeout_s

    def tails() -> str:
        return "".join(f"\n--- {f}:\n" + processes.log_tail(Path(f)) for f in logs)

    while not (read_ready(ready) and ping(url)):
        if not processes.is_alive(ref):
            raise StackError(f"the ClickHouse HTTP server exited during start-up (port {port})" + tails())
        if time.monotonic() >= deadline:
            processes.kill(ref)
            raise StackError(f"the ClickHouse HTTP server did not answer {url}/ping within {timeout_s:.0f} s" + tails())
        time.sleep(0.1)


def cluster_members(shards: int, replicas: int, ports: Mapping[str, int]) -> list[chdb_config.ClusterMember | None]:
    """Each server's place in the cluster, in :func:`member_name` order (``[None]``: one server)."""
    if shards * replicas == 1:
        return [None]
    servers = tuple(tuple((HOST, int(ports[member_name(i, j)])) for j in range(replicas)) for i in range(shards))
    return [chdb_config.ClusterMember(i, j, servers) for i in range(shards) for j in range(replicas)]
