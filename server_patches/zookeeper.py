"""Launch and stop a standalone ZooKeeper (Debian's ``zookeeper`` 3.8 jars, Java 17).

ClickHouse transactions keep their log in ZooKeeper and KeeperMap tables keep their
rows there, so the embedded stack runs one ZooKeeper per stack directory, with its
own data directory (it survives restarts) and its own client port.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Sequence

from server_patches import processes
from server_patches.processes import ProcessRef

JAVA_DIR = Path(os.environ.get("CLICKHOUSE_TX_JAVA_DIR", "/usr/share/java"))

#: The jars QuorumPeerMain needs at runtime (logging goes to slf4j-nop: ZooKeeper's
#: own log is silent; failures still reach stderr, which we keep in the log file).
CLASSPATH_JARS: tuple[str, ...] = (
    "zookeeper.jar",
    "zookeeper-jute.jar",
    "netty-handler.jar",
    "netty-common.jar",
    "netty-buffer.jar",
    "netty-transport.jar",
    "netty-codec.jar",
    "netty-resolver.jar",
    "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar",
    "slf4j-api.jar",
    "slf4j-nop.jar",
    "metrics-core.jar",
    "commons-cli.jar",
    "snappy-java.jar",
)

INSTALL_HINT = "run `make test` (its bootstrap installs them) or `apt-get install openjdk-17-jre-headless zookeeper`"


class ZooKeeperError(RuntimeError):
    """ZooKeeper could not be started (missing Java or jars, busy port, no answer)."""


@dataclasses.dataclass(frozen=True)
class ZooKeeperProcess:
    """A running ZooKeeper we started."""

    process: ProcessRef
    host: str
    port: int
    data_dir: Path
    log_file: Path

    @property
    def address(self) -> str:
        """``host:port``, as ClickHouse's ``<zookeeper><node>`` and clients want it."""
        return f"{self.host}:{self.port}"


def find_java() -> str:
    """Path of the ``java`` executable (``$JAVA_HOME/bin/java`` first, then ``PATH``)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperError(f"ZooKeeper needs Java, but `java` is not on PATH: {INSTALL_HINT}")
    return java


def classpath(java_dir: Path = JAVA_DIR) -> str:
    """The ``-cp`` value for ZooKeeper; raise naming the missing jars if any."""
    missing = [j for j in CLASSPATH_JARS if not (java_dir / j).is_file()]
    if missing:
        raise ZooKeeperError(f"ZooKeeper jars missing from {java_dir}: {', '.join(missing)}; {INSTALL_HINT}")
    return os.pathsep.join(str(java_dir / j) for j in CLASSPATH_JARS)


def write_config(path: Path, data_dir: Path, host: str, port: int) -> None:
    """Write a standalone ``zoo.cfg``: one server, no admin HTTP server, ruok/stat only."""
    path.write_text(
        "\n".join(
            [
                "tickTime=2000",
                f"dataDir={data_dir}",
                f"clientPort={port}",
                f"clientPortAddress={host}",
                "maxClientCnxns=0",
                "admin.enableServer=false",
                "4lw.commands.whitelist=ruok,stat",
                # Old snapshots and logs would grow without bound across test runs.
                "autopurge.snapRetainCount=3",
                "autopurge.purgeInterval=1",
                "",
            ]
        )
    )


def four_letter_word(host: str, port: int, word: str, timeout_s: float = 1.0) -> str | None:
    """Send a ZooKeeper four-letter command; the reply, or None if nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(word.encode())
            s.shutdown(socket.SHUT_WR)
            chunks = []
            while True:
                b = s.recv(4096)
                if not b:
                    break
                chunks.append(b)
            return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return None


def is_healthy(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if ZooKeeper on ``host:port`` answers ``ruok`` and serves requests.

    ``ruok`` alone answers ``imok`` while the server is still loading its database;
    ``stat`` says "not currently serving requests" until it can take sessions.
    """
    if four_letter_word(host, port, "ruok", timeout_s) != "imok":
        return False
    stat = four_letter_word(host, port, "stat", timeout_s) or ""
    return stat.startswith("Zookeeper version")


def start_zookeeper(
    base_dir: Path, *, host: str = "127.0.0.1", port: int | None = None, heap_mb: int = 256, timeout_s: float = 60.0
) -> ZooKeeperProcess:
    """Start ZooKeeper with data in ``base_dir/data`` and wait until it serves requests.

    Parameters
    ----------
    base_dir
        Holds ``zoo.cfg``, ``data/`` (kept across restarts) and ``zookeeper.log``.
    port
        Client port; a free one is chosen when None. A busy port is an error.
    timeout_s
        How long to wait for ``imok`` before stopping the process and raising.

    Raises
    ------
    ZooKeeperError
        Java or the jars are missing, the port is taken, or ZooKeeper did not become
        healthy in time (the message carries the tail of its log).
    """
    java = find_java()
    cp = classpath()
    base_dir = Path(base_dir).resolve()
    data_dir = base_dir / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    if port is None:
        port = processes.free_port(host)
    elif not processes.port_is_free(host, port):
        raise ZooKeeperError(f"ZooKeeper client port {host}:{port} is already in use")
    cfg = base_dir / "zoo.cfg"
    write_config(cfg, data_dir, host, port)
    log_file = base_dir / "zookeeper.log"
    argv: Sequence[str] = [
        java,
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        "-Dzookeeper.admin.enableServer=false",
        "-cp",
        cp,
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        str(cfg),
    ]
    ref = processes.spawn(argv, log_file=log_file, cwd=base_dir)
    zk = ZooKeeperProcess(ref, host, port, data_dir, log_file)
    deadline = time.monotonic() + timeout_s
    while not is_healthy(host, port):
        if not processes.is_alive(ref):
            raise ZooKeeperError(
                f"ZooKeeper exited during start-up (port {port}); last lines of {log_file}:\n"
                + processes.log_tail(log_file)
            )
        if time.monotonic() >= deadline:
            processes.kill(ref)
            raise ZooKeeperError(
                f"ZooKeeper did not answer `ruok` on {host}:{port} within {timeout_s:.0f} s; "
                f"last lines of {log_file}:\n" + processes.log_tail(log_file)
            )
        time.sleep(0.1)
    return zk


def stop_zookeeper(zk: ZooKeeperProcess | ProcessRef | None, timeout_s: float = 15.0) -> None:
    """Stop ZooKeeper (SIGTERM, then SIGKILL after ``timeout_s``). Its data stays."""
    ref = zk.process if isinstance(zk, ZooKeeperProcess) else zk
    processes.stop(ref, timeout_s)
