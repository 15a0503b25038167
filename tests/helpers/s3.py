"""A real S3 endpoint for tests: a moto server process on a free port, with one bucket.

Shared by the S3 decision-log integration tests and the driver-kill torture through the
session fixture ``s3_endpoint`` in ``tests/conftest.py``. The credentials are moto's
dummies (``test``/``test``); a child process reaches the bucket with :func:`s3_env`.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from typing import Iterator

import pyarrow.fs as pafs

from server_patches.processes import free_port

BUCKET = "chk"
ACCESS_KEY = "test"
SECRET_KEY = "test"


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 30) -> None:
    """Block until ``port`` accepts connections; fail when ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start listening on port {port}") from None
            time.sleep(0.1)


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """``127.0.0.1:<port>`` of a moto S3 server process holding the bucket :data:`BUCKET`."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc, "the moto S3 server")
        endpoint = f"127.0.0.1:{port}"
        filesystem(endpoint).create_dir(BUCKET)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def filesystem(endpoint: str) -> pafs.S3FileSystem:
    """A pyarrow S3 filesystem on the moto ``endpoint``."""
    return pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=endpoint,
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )


def uri(endpoint: str, prefix: str) -> str:
    """``s3://chk/<prefix>?...``: a ``decision_log`` URI on the moto endpoint (credentials from :func:`s3_env`)."""
    return f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"


def s3_env() -> dict[str, str]:
    """Environment variables that give a process (driver, Python worker) the moto credentials."""
    return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
