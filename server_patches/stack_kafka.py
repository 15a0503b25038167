"""Start the embedded stack's dev Kafka broker (:mod:`server_patches.kafka_broker`).

Runs in the launcher's process (a test fixture, the CLI), for :mod:`server_patches.stack`.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from server_patches import processes
from server_patches.processes import ProcessRef
from server_patches.stack_files import HOST, StackError, child_env, read_ready


def kafka_available() -> bool:
    """True if the dev Kafka broker module (server_patches/kafka_broker.py) exists."""
    return importlib.util.find_spec("server_patches.kafka_broker") is not None


def start_kafka_broker(stack_dir: Path, *, port: int, timeout_s: float) -> tuple[ProcessRef, str, str | None, str]:
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
    ref = processes.spawn(argv, log_file=log, env=child_env())
    deadline = time.monotonic() + timeout_s
    while True:
        info = read_ready(ready)
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
