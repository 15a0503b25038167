"""A fault-injecting TCP proxy: test tooling for ``make chaos``, not part of the product.

:class:`FaultProxy` listens on a local port and forwards every connection to one
target (ClickHouse's HTTP port for the writer, ZooKeeper's client port for
ClickHouse). One thread accepts; one thread per connection moves bytes both ways
with ``select``, so every socket of a connection is touched by one thread only (a
reset never races a ``recv`` of another thread).

Faults, each for a window of ``seconds`` (:meth:`FaultProxy.inject`):

``reset``
    Every open connection is reset (RST: ``SO_LINGER`` 0, then close) on both
    sides, and so is each connection accepted during the window.
``drop_reply``
    Requests are forwarded; the first reply bytes the target sends back are thrown
    away and both sides are reset: the target processed the request, the client
    sees its connection die without an answer.
``stall``
    No byte moves either way until the window ends (the kernel buffers fill, the
    peers block); meant to outlast the clients' timeouts.
``slow``
    Bytes move at ``rate`` bytes per second per direction and connection.

Control from the same process: :meth:`FaultProxy.inject`, :meth:`FaultProxy.clear`.
From another process: run ``python -m spark_datasource.testing.chaos.proxy --listen-port P
--target HOST:PORT --control FILE`` and call :func:`write_control` on ``FILE``; the
proxy polls the file every 50 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

FAULTS = ("reset", "drop_reply", "stall", "slow")
TICK_S = 0.05
CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault window: ``kind`` until ``until`` (``time.monotonic``), ``rate`` for ``slow``."""

    kind: str
    until: float
    rate: int = 0
    seq: int = 0  # a reset resets the connections opened before it once


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST instead of a FIN (``SO_LINGER`` on, 0 seconds)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class FaultProxy:
    """A TCP proxy from ``127.0.0.1:listen_port`` to ``target`` that injects faults on demand.

    Start it with :meth:`start` (or as a context manager); :attr:`port` is the port it
    listens on (a free one when ``listen_port`` is 0). Counters of what it did are in
    :attr:`stats`.
    """

    def __init__(
        self, target: tuple[str, int], listen_port: int = 0, *, control_file: str | Path | None = None
    ) -> None:
        self.target = target
        self._listen = socket.create_server(("127.0.0.1", listen_port), reuse_port=False)
        self._listen.settimeout(TICK_S)
        self.port: int = self._listen.getsockname()[1]
        self.control_file = Path(control_file) if control_file else None
        self._control_seen: float | None = None
        self._fault: Fault | None = None
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.stats = {"connections": 0, "resets": 0, "replies_dropped": 0, "upstream_refused": 0}

    # ------------------------------------------------------------------ control

    def inject(self, kind: str, seconds: float, *, rate: int = 0) -> None:
        """Start fault ``kind`` now, for ``seconds`` (any thread; replaces a running fault)."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}: one of {', '.join(FAULTS)}")
        if kind == "slow" and rate <= 0:
            raise ValueError("the slow fault needs rate > 0 (bytes per second)")
        with self._lock:
            self._seq += 1
            self._fault = Fault(kind, time.monotonic() + seconds, rate, self._seq)

    def clear(self) -> None:
        """End the current fault now (stalled bytes move again)."""
        with self._lock:
            self._fault = None

    def current(self) -> Fault | None:
        """The fault in force now, or None."""
        with self._lock:
            f = self._fault
        return f if f is not None and time.monotonic() < f.until else None

    def _poll_control(self) -> None:
        """Apply the control file when it changed (written by :func:`write_control`)."""
        if self.control_file is None:
            return
        try:
            mtime = self.control_file.stat().st_mtime_ns
            if mtime == self._control_seen:
                return
            doc = json.loads(self.control_file.read_text())
        except (OSError, ValueError):
            return
        self._control_seen = mtime
        if doc.get("kind") in (None, "clear"):
            self.clear()
        else:
            self.inject(str(doc["kind"]), float(doc.get("seconds", 1.0)), rate=int(doc.get("rate", 0)))

    # ------------------------------------------------------------------ running

    def start(self) -> FaultProxy:
        t = threading.Thread(target=self._accept_loop, name=f"fault-proxy-{self.port}", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        """Stop accepting and end every connection (called once, by the owner)."""
        self._stop.set()
        for t in list(self._threads):
            t.join(5)
        self._listen.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            self._poll_control()
            try:
                client, _ = self._listen.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.stats["connections"] += 1
            t = threading.Thread(target=self._serve, args=(client,), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, client: socket.socket) -> None:
        """One connection, both directions, until either side closes or a fault ends it."""
        born = self._seq
        f = self.current()
        if f is not None and f.kind == "reset":
            self.stats["resets"] += 1
            _reset(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self.stats["upstream_refused"] += 1
            _reset(client)
            return
        _Pump(self, client, upstream, born).run()


class _Pump:
    """The byte mover of one connection (its own thread)."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket, born: int) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.born = born
        now = time.monotonic()
        # token bucket of the slow fault, per direction (keyed by the reading socket)
        self.budget = {id(client): 0.0, id(upstream): 0.0}
        self.last = {id(client): now, id(upstream): now}

    def run(self) -> None:
        socks = [self.client, self.upstream]
        try:
            while not self.proxy._stop.is_set():
                f = self.proxy.current()
                if f is not None and f.kind == "reset" and f.seq > self.born:
                    self.proxy.stats["resets"] += 1
                    return self._reset_both()
                if f is not None and f.kind == "stall":
                    time.sleep(TICK_S)
                    continue
                readable, _, _ = select.select(socks, [], [], TICK_S)
                for src in readable:
                    if not self._move(src, f):
                        return None
        except OSError:
            pass
        finally:
            for s in socks:
                s.close()
        return None

    def _reset_both(self) -> None:
        _reset(self.client)
        _reset(self.upstream)

    def _move(self, src: socket.socket, f: Fault | None) -> bool:
        """Forward what ``src`` has; False when the connection is over."""
        dst = self.upstream if src is self.client else self.client
        size = CHUNK
        if f is not None and f.kind == "slow":
            now = time.monotonic()
            key = id(src)
            self.budget[key] = min(self.budget[key] + (now - self.last[key]) * f.rate, float(f.rate))
            self.last[key] = now
            size = int(self.budget[id(src)])
            if size < 1:
                time.sleep(TICK_S)
                return True
        data = src.recv(size)
        if not data:
            return False
        if f is not None and f.kind == "drop_reply" and src is self.upstream:
            self.proxy.stats["replies_dropped"] += 1
            self._reset_both()
            return False
        if f is not None and f.kind == "slow":
            self.budget[id(src)] -= len(data)
        dst.sendall(data)
        return True


def write_control(path: str | Path, kind: str, seconds: float = 1.0, *, rate: int = 0) -> None:
    """Tell the proxy polling ``path`` to start fault ``kind`` (or ``clear``), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"kind": kind, "seconds": seconds, "rate": rate, "at": time.time_ns()}))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m spark_datasource.testing.chaos.proxy", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--listen-port", type=int, default=0)
    ap.add_argument("--target", required=True, metavar="HOST:PORT")
    ap.add_argument("--control", required=True, metavar="FILE", help="JSON control file (see write_control)")
    a = ap.parse_args(argv)
    host, port = a.target.rsplit(":", 1)
    proxy = FaultProxy((host, int(port)), a.listen_port, control_file=a.control).start()
    print(f"LISTENING {proxy.port}", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
