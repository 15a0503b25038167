"""The dev/test Kafka broker: librdkafka's mock cluster, run in a launcher process.

No Apache Kafka broker can be installed on this machine. librdkafka (bundled in the
``confluent-kafka`` wheel) contains a mock cluster that speaks the real Kafka protocol
on TCP: produce, fetch, list offsets, metadata, consumer groups and committed offsets,
idempotent and transactional producers. This module starts it through ``ctypes`` and
keeps it alive until SIGTERM::

    python -m server_patches.kafka_broker --host 127.0.0.1 --port 9092 \\
        --ready-file /tmp/kafka.json --topics events:4,other:1

Limits of the mock that callers must know (see ``docs/kafka.md``):

- Everything lives in memory, in this process; stopping it loses every record.
- Each partition keeps at most 5 MiB or 100 000 record batches; older batches are
  dropped, exactly like retention on a real broker (readers see data loss).
- It refuses CreateTopics/CreatePartitions (``AdminClient.create_topics`` times out
  "waiting for controller"), so topics are created here, through
  ``rd_kafka_mock_topic_create``: on the command line, or at runtime through the
  small HTTP control endpoint (:func:`create_topic`). Topics auto-created by a
  producer's metadata request get 4 partitions.

The mock binds its listener to a random loopback port and has no API to choose it.
To serve a fixed ``--port`` the launcher binds its own listening socket there and
``dup2``s it over the mock's listening descriptor (the mock keeps polling the same
descriptor number, now the new socket), then sets the advertised address with
``rd_kafka_mock_broker_set_host_port``. No proxy, no copy of the traffic.

With ``--front-config`` (``start_broker(security=...)``) the mock has no TLS or SASL
of its own, so :mod:`server_patches.kafka_front` listens on ``--port`` instead,
terminates TLS and SASL and pipes to the mock, and the mock advertises the front's
address so clients reconnect through it.

Imports: stdlib only (``confluent_kafka`` is located, not imported, so the launcher
never starts a second librdkafka client by accident).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping, Sequence

from server_patches.kafka_front import FrontConfig, FrontError, KafkaFront, load_config, write_config

_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_RD_KAFKA_PRODUCER = 0
_ERR_TOPIC_ALREADY_EXISTS = 36

# rd_kafka_resp_err_t values the control endpoint may report, by name.
_ERR_NAMES = {
    0: "NO_ERROR",
    36: "TOPIC_ALREADY_EXISTS",
    37: "INVALID_PARTITIONS",
    38: "INVALID_REPLICATION_FACTOR",
    3: "UNKNOWN_TOPIC_OR_PART",
    1: "OFFSET_OUT_OF_RANGE",
    -186: "_INVALID_ARG",
}


class BrokerError(RuntimeError):
    """The mock broker could not be started, or refused a control request."""


def find_librdkafka() -> Path:
    """Path of the librdkafka shared library bundled with ``confluent-kafka``.

    Raises
    ------
    BrokerError
        If ``confluent-kafka`` is not installed or carries no bundled library.
    """
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is None or spec.origin is None:
        raise BrokerError(
            "confluent-kafka is not installed: the dev Kafka broker needs its "
            "bundled librdkafka (pip install confluent-kafka)"
        )
    pkg = Path(spec.origin).parent
    candidates = sorted(glob.glob(str(pkg.parent / "confluent_kafka.libs" / "librdkafka*.so*")))
    candidates += sorted(glob.glob(str(pkg / "**" / "librdkafka*.so*"), recursive=True))
    if not candidates:
        raise BrokerError(
            f"no librdkafka shared library found next to {pkg} (looked in confluent_kafka.libs/ and the package)"
        )
    return Path(candidates[0])


def _load_library(path: Path) -> ctypes.CDLL:
    """Load librdkafka and declare the signatures this module calls."""
    lib = ctypes.CDLL(str(path))
    vp, cp, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
    sigs: dict[str, tuple[object, list[object]]] = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
        "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_new": (vp, [vp, ctypes.c_int]),
        "rd_kafka_mock_cluster_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
        "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
        "rd_kafka_mock_broker_set_host_port": (None, [vp, i32, cp, ctypes.c_int]),
        "rd_kafka_mock_partition_delete_records": (ctypes.c_int, [vp, cp, i32, ctypes.c_int64]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _listening_fd(port: int) -> int:
    """File descriptor of this process's listening TCP socket on 127.0.0.1:``port``."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # not a socket (or already closed)
        try:
            if (
                probe.family == socket.AF_INET
                and probe.type == socket.SOCK_STREAM
                and probe.getsockname() == ("127.0.0.1", port)
                and probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            ):
                return fd
        except OSError:
            pass
        finally:
            probe.close()
    raise BrokerError(f"mock broker listener on 127.0.0.1:{port} not found in this process")


class MockCluster:
    """One single-broker librdkafka mock cluster living in this process.

    Runs in the launcher process only; the cluster's I/O runs on librdkafka's own
    thread, so the Python main thread is free to serve the control endpoint.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lib = _load_library(find_librdkafka())
        self._lock = threading.Lock()
        conf = self._lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(512)
        # Silence the "no bootstrap.servers" warning of the bookkeeping handle.
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", errstr, len(errstr))
        self._rk = self._lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
        if not self._rk:
            raise BrokerError(f"rd_kafka_new failed: {errstr.value.decode(errors='replace')}")
        self._mc = self._lib.rd_kafka_mock_cluster_new(self._rk, 1)
        if not self._mc:
            self._lib.rd_kafka_destroy(self._rk)
            raise BrokerError("rd_kafka_mock_cluster_new failed (see the log above)")
        own = self._lib.rd_kafka_mock_cluster_bootstraps(self._mc).decode()
        mock_port = int(own.split(",")[0].rsplit(":", 1)[1])
        self.host = "127.0.0.1"
        self.port = mock_port
        #: Where the mock itself listens (the advertised address differs behind a front).
        self.listener = (self.host, mock_port)
        if port or host != "127.0.0.1":
            self._rebind(mock_port, host, port)
        self.topics: dict[str, int] = {}

    def advertise(self, host: str, port: int) -> None:
        """Make the broker's Metadata name ``host:port`` (a front's address) instead of its own.

        Clients then open every connection after the bootstrap one there. The mock
        keeps listening where it is (:attr:`listener`), for the front to connect to.
        """
        self._lib.rd_kafka_mock_broker_set_host_port(self._mc, 1, host.encode(), port)
        self.host, self.port = host, port

    def _rebind(self, mock_port: int, host: str, port: int) -> None:
        """Move the mock's listener to ``host:port`` (see the module docstring)."""
        fd = _listening_fd(mock_port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            self.close()
            raise BrokerError(f"cannot listen on {host}:{port}: {e.strerror}") from e
        sock.listen(128)
        sock.setblocking(False)  # the mock accepts from a non-blocking poll loop
        os.dup2(sock.fileno(), fd, inheritable=False)
        bound_port = sock.getsockname()[1]
        sock.close()  # fd now holds the only reference the mock needs
        self.port = bound_port
        advertised = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._lib.rd_kafka_mock_broker_set_host_port(self._mc, 1, advertised.encode(), bound_port)
        self.host = advertised
        self.listener = (advertised, bound_port)

    @property
    def bootstrap(self) -> str:
        """``host:port`` clients connect to."""
        return f"{self.host}:{self.port}"

    def create_topic(self, name: str, partitions: int) -> None:
        """Create ``name`` with ``partitions`` partitions (replication factor 1).

        Raises
        ------
        ValueError
            Bad name or partition count.
        BrokerError
            The mock refused (e.g. the topic exists: ``TOPIC_ALREADY_EXISTS``).
        """
        _check_topic(name, partitions)
        with self._lock:
            err = self._lib.rd_kafka_mock_topic_create(self._mc, name.encode(), partitions, 1)
            if err:
                raise BrokerError(
                    f"cannot create topic {name!r} with {partitions} partitions: {_ERR_NAMES.get(err, err)}"
                )
            self.topics[name] = partitions

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete the records of ``topic``/``partition`` below offset ``before``.

        This is what retention does on a real broker; the mock drops whole record
        batches, so the new log start may stay below ``before``.
        """
        with self._lock:
            err = self._lib.rd_kafka_mock_partition_delete_records(self._mc, topic.encode(), partition, before)
            if err:
                raise BrokerError(
                    f"cannot delete records of {topic!r}[{partition}] before {before}: {_ERR_NAMES.get(err, err)}"
                )

    def close(self) -> None:
        """Destroy the cluster and its bookkeeping handle (idempotent)."""
        if getattr(self, "_mc", None):
            self._lib.rd_kafka_mock_cluster_destroy(self._mc)
            self._mc = None
        if getattr(self, "_rk", None):
            self._lib.rd_kafka_destroy(self._rk)
            self._rk = None


def _check_topic(name: object, partitions: object) -> None:
    if not isinstance(name, str) or not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise ValueError(f"invalid topic name {name!r}: use 1-249 of [A-Za-z0-9._-]")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= 10000:
        raise ValueError(f"invalid partition count {partitions!r} for topic {name!r}: an integer from 1 to 10000")


def parse_topics(spec: str) -> list[tuple[str, int]]:
    """Parse ``name:partitions,name2:partitions`` (``name`` alone means 1 partition)."""
    out: list[tuple[str, int]] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, count = item.partition(":")
        try:
            n = int(count) if count else 1
        except ValueError:
            raise ValueError(f"--topics: bad partition count in {item!r}") from None
        _check_topic(name, n)
        out.append((name, n))
    return out


def _control_handler(cluster: MockCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        """``POST /topics`` {name, partitions}; ``POST /delete-records``; ``GET /health``."""

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep the launcher log for the broker

        def _reply(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {"bootstrap": cluster.bootstrap, "topics": cluster.topics})
            else:
                self._reply(404, {"error": f"no such endpoint {self.path}"})

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("request body must be a JSON object")
                if self.path == "/topics":
                    cluster.create_topic(body["name"], body.get("partitions", 1))
                    self._reply(201, {"created": body["name"]})
                elif self.path == "/delete-records":
                    cluster.delete_records(str(body["topic"]), int(body["partition"]), int(body["before"]))
                    self._reply(200, {"deleted_before": int(body["before"])})
                else:
                    self._reply(404, {"error": f"no such endpoint {self.path}"})
            except (ValueError, KeyError, TypeError) as e:
                self._reply(400, {"error": str(e)})
            except BrokerError as e:
                code = 409 if "TOPIC_ALREADY_EXISTS" in str(e) else 422
                self._reply(code, {"error": str(e)})

    return Handler


def _wait_kafka_ready(bootstrap: str, timeout_s: float) -> None:
    """Block until a Kafka client gets an ApiVersions answer from ``bootstrap``."""
    host, port = bootstrap.rsplit(":", 1)
    # ApiVersions v0 request: size, api_key=18, version=0, correlation_id=1, client_id="ready".
    client = b"ready"
    payload = (
        (18).to_bytes(2, "big")
        + (0).to_bytes(2, "big")
        + (1).to_bytes(4, "big")
        + len(client).to_bytes(2, "big")
        + client
    )
    request = len(payload).to_bytes(4, "big") + payload
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=2) as s:
                s.sendall(request)
                size = int.from_bytes(_recv_exact(s, 4), "big")
                body = _recv_exact(s, size)
                if int.from_bytes(body[:4], "big") == 1:
                    return
        except OSError as e:
            last = e
        time.sleep(0.05)
    raise BrokerError(f"mock broker at {bootstrap} did not answer ApiVersions within {timeout_s:.0f}s: {last}")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("connection closed by the broker")
        buf += chunk
    return buf


def serve(
    host: str,
    port: int,
    ready_file: Path,
    topics: Sequence[tuple[str, int]],
    control_port: int = 0,
    front_config: FrontConfig | None = None,
) -> int:
    """Run the broker and its control endpoint until SIGTERM/SIGINT (launcher process).

    With ``front_config`` the mock listens on a loopback port of its own and a
    :class:`~server_patches.kafka_front.KafkaFront` (TLS and/or SASL) listens on
    ``host:port`` in front of it, advertised as the broker's address.
    """
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = MockCluster(host, port) if front_config is None else MockCluster()
    front: KafkaFront | None = None
    try:
        if front_config is not None:
            front = KafkaFront(front_config, cluster.listener)
            advertised = "127.0.0.1" if host in ("0.0.0.0", "") else host
            cluster.advertise(advertised, front.start(host, port))
        for name, n in topics:
            cluster.create_topic(name, n)
        control = ThreadingHTTPServer((cluster.host, control_port), _control_handler(cluster))
        control.daemon_threads = True
        threading.Thread(target=control.serve_forever, name="kafka-control", daemon=True).start()
        _wait_kafka_ready(f"{cluster.listener[0]}:{cluster.listener[1]}", 30.0)
        info = {
            "pid": os.getpid(),
            "bootstrap": cluster.bootstrap,
            "control": f"http://{cluster.host}:{control.server_address[1]}",
            "security_protocol": front_config.protocol if front_config else "PLAINTEXT",
        }
        tmp = ready_file.with_name(ready_file.name + ".tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, ready_file)  # readers never see a half-written file
        print(f"kafka mock broker ready: {json.dumps(info)}", flush=True)
        while not stop.wait(0.5):
            pass
        control.shutdown()
        control.server_close()
    finally:
        if front is not None:
            front.close()
        cluster.close()
    return 0


# ---------------------------------------------------------------- client side


def create_topic(control_url: str, name: str, partitions: int, timeout_s: float = 10.0) -> None:
    """Create a topic on a running launcher through its control endpoint.

    Raises
    ------
    BrokerError
        The launcher refused (bad name, topic exists) or is unreachable.
    """
    _post(control_url, "/topics", {"name": name, "partitions": partitions}, timeout_s)


def delete_records(control_url: str, topic: str, partition: int, before: int, timeout_s: float = 10.0) -> None:
    """Drop the records of ``topic``/``partition`` below ``before`` (simulated retention)."""
    _post(control_url, "/delete-records", {"topic": topic, "partition": partition, "before": before}, timeout_s)


def _post(control_url: str, path: str, body: dict[str, Any], timeout_s: float) -> None:
    req = urllib.request.Request(
        control_url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")
        try:
            detail = json.loads(detail)["error"]
        except (ValueError, KeyError, TypeError):
            pass
        raise BrokerError(f"kafka control {path} refused ({e.code}): {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise BrokerError(f"kafka control endpoint {control_url} unreachable: {e}") from None


def start_broker(
    host: str = "127.0.0.1",
    port: int = 0,
    topics: Sequence[tuple[str, int]] = (),
    *,
    log_file: Path | None = None,
    ready_timeout_s: float = 30.0,
    control_port: int = 0,
    security: Mapping[str, Any] | None = None,
) -> tuple[subprocess.Popen[Any], str, str]:
    """Start the launcher as a child process and wait until it serves Kafka.

    ``port=0`` lets the kernel choose (no race with other tests). Returns
    ``(proc, bootstrap, control_url)``; stop it with :func:`stop_broker`.
    ``security`` (the JSON form of :class:`~server_patches.kafka_front.FrontConfig`:
    ``protocol``, ``certfile``, ``keyfile``, ``client_cafile``, ``users``) puts a
    TLS/SASL front on ``bootstrap``; it reaches the launcher in a file only its owner
    can read, never on the command line.

    Raises
    ------
    BrokerError
        If the launcher exits or is not ready within ``ready_timeout_s``; the
        message carries the tail of its log.
    """
    workdir = Path(tempfile.mkdtemp(prefix="kafka-broker-"))
    ready = workdir / "ready.json"
    log_path = log_file or workdir / "broker.log"
    argv = [
        sys.executable,
        "-m",
        "server_patches.kafka_broker",
        "--host",
        host,
        "--port",
        str(port),
        "--ready-file",
        str(ready),
        "--control-port",
        str(control_port),
    ]
    if topics:
        argv += ["--topics", ",".join(f"{n}:{p}" for n, p in topics)]
    if security is not None:
        write_config(workdir / "front.json", security)
        argv += ["--front-config", str(workdir / "front.json")]
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + ready_timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_broker(proc)
            tail = Path(log_path).read_text(errors="replace")[-2000:]
            raise BrokerError(
                f"kafka mock broker did not become ready (exit code {proc.returncode}); log {log_path}:\n{tail}"
            )
        time.sleep(0.05)
    info = json.loads(ready.read_text())
    return proc, info["bootstrap"], info["control"]


def stop_broker(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM the launcher, wait, SIGKILL if it hangs (idempotent)."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m server_patches.kafka_broker", description="Run librdkafka's mock Kafka cluster until SIGTERM."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9092, help="0 = any free port")
    p.add_argument(
        "--ready-file",
        type=Path,
        required=True,
        help='written as {"pid","bootstrap","control"} once clients can connect',
    )
    p.add_argument("--topics", default="", help="name:partitions,... created at start")
    p.add_argument("--control-port", type=int, default=0, help="port of the HTTP control endpoint (0 = any free port)")
    p.add_argument(
        "--front-config",
        type=Path,
        default=None,
        help="JSON file (protocol, certfile, keyfile, client_cafile, users): serve SSL/SASL through a front",
    )
    args = p.parse_args(argv)
    try:
        topics = parse_topics(args.topics)
        front = load_config(args.front_config) if args.front_config else None
        return serve(args.host, args.port, args.ready_file, topics, args.control_port, front)
    except (BrokerError, FrontError, ValueError, OSError) as e:
        print(f"kafka_broker: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
