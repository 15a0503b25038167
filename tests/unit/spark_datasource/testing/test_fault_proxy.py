"""The chaos proxy's faults, each against a real local echo server over real sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from spark_datasource.testing.chaos.proxy import FaultProxy, write_control

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


class EchoServer:
    """Echoes every chunk back; counts the chunks it received (what it 'processed')."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.received = 0
        self.stop = threading.Event()
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by the fixture
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                self.received += 1
                try:
                    conn.sendall(data)
                except OSError:
                    return


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    srv = EchoServer()
    yield srv
    srv.stop.set()
    srv.acceptor.join(5)
    srv.sock.close()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", echo.port)) as p:
        yield p


def _connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def test_without_a_fault_the_proxy_forwards_both_ways(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as s:
        s.sendall(b"hello")
        assert _recv_exactly(s, 5) == b"hello"


def test_a_reset_kills_open_connections_and_those_opened_during_its_window_with_an_rst(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    s = _connect(proxy.port)
    s.sendall(b"x")
    assert _recv_exactly(s, 1) == b"x"
    proxy.inject("reset", 1.0)
    time.sleep(0.3)
    with pytest.raises(ConnectionResetError):
        s.sendall(b"y")
        s.recv(1)
    s.close()
    # The proxy accepts and resets at once, so on loopback the RST may beat
    # connect()'s return: a reset at connect or at the first read is the same fault.
    with pytest.raises(ConnectionResetError), _connect(proxy.port) as s2:
        s2.sendall(b"z")
        s2.recv(1)
    time.sleep(0.8)  # the window is over: new connections work again
    with _connect(proxy.port) as s3:
        s3.sendall(b"ok")
        assert _recv_exactly(s3, 2) == b"ok"
    assert proxy.stats["resets"] >= 2


def test_a_dropped_reply_reaches_the_server_but_the_client_sees_its_connection_die(
    proxy: FaultProxy, echo: EchoServer
) -> None:
    with _connect(proxy.port) as s:
        proxy.inject("drop_reply", 2.0)
        s.sendall(b"request")
        with pytest.raises((ConnectionResetError, ConnectionError)):
            data = s.recv(100)
            if not data:
                raise ConnectionError("closed")
    assert echo.received == 1, "the server processed the request"
    assert proxy.stats["replies_dropped"] == 1


def test_a_stall_holds_the_bytes_past_the_clients_timeout_then_delivers_them(proxy: FaultProxy) -> None:
    with _connect(proxy.port, timeout=0.5) as s:
        proxy.inject("stall", 1.5)
        s.sendall(b"held")
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            s.recv(4)
        s.settimeout(5)
        assert _recv_exactly(s, 4) == b"held"
        assert time.monotonic() - t0 >= 1.2


def test_a_slow_link_moves_about_rate_bytes_per_second(proxy: FaultProxy) -> None:
    payload = b"a" * 20_000
    proxy.inject("slow", 30.0, rate=10_000)
    with _connect(proxy.port, timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(payload)
        assert _recv_exactly(s, len(payload)) == payload
        took = time.monotonic() - t0
    # 20 kB at 10 kB/s each way, pipelined: about 2 s, never well under 1.5 s. The
    # upper bound only says the bytes came through inside the 30 s window, so a
    # loaded machine cannot fail it.
    assert 1.5 <= took <= 25, took


def test_a_proxy_in_another_process_obeys_its_control_file(echo: EchoServer, tmp_path: Path) -> None:
    control = tmp_path / "control.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_datasource.testing.chaos.proxy",
            "--target",
            f"127.0.0.1:{echo.port}",
            "--control",
            str(control),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("LISTENING "), line
        port = int(line.split()[1])
        with _connect(port) as s:
            s.sendall(b"a")
            assert _recv_exactly(s, 1) == b"a"
            write_control(control, "reset", 5.0)
            time.sleep(0.5)
            with pytest.raises(ConnectionResetError):
                s.sendall(b"b")
                s.recv(1)
        write_control(control, "clear")
        time.sleep(0.5)
        with _connect(port) as s:
            s.sendall(b"c")
            assert _recv_exactly(s, 1) == b"c"
    finally:
        proc.kill()
        proc.wait()
