"""Create ZooKeeper nodes over ZooKeeper's own client protocol (jute), without a JVM.

The stack needs one thing of ZooKeeper before a ClickHouse server starts: its root
(``<zookeeper><root>``, the chroot), which ClickHouse refuses to start under when it
does not exist. ZooKeeper's CLI would cost a JVM start per stack; this speaks the few
messages a create takes (``ConnectRequest``, ``CreateRequest``, ``closeSession``, as
``zookeeper.jute`` defines them) on one connection.
"""

from __future__ import annotations

import socket
import struct

_CREATE, _CLOSE = 1, -11
_OK, _NODE_EXISTS = 0, -110
_PERMS_ALL = 31  # READ | WRITE | CREATE | DELETE | ADMIN
_PERSISTENT = 0


class ZooKeeperRequestError(RuntimeError):
    """ZooKeeper refused a request (its error code is in the message)."""


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">i", len(b)) + b


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">i", len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("ZooKeeper closed the connection")
        out += chunk
    return bytes(out)


def _recv(sock: socket.socket) -> bytes:
    (length,) = struct.unpack(">i", _recv_exact(sock, 4))
    return _recv_exact(sock, length)


def create_request(xid: int, path: str) -> bytes:
    """A persistent, world-writable ``create`` of ``path`` with empty data."""
    acl = struct.pack(">ii", 1, _PERMS_ALL) + _string("world") + _string("anyone")
    return (
        struct.pack(">ii", xid, _CREATE) + _string(path) + struct.pack(">i", 0) + acl + struct.pack(">i", _PERSISTENT)
    )


def ancestors_and_self(path: str) -> list[str]:
    """``/a/b/c`` -> ``['/a', '/a/b', '/a/b/c']``."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[: k + 1]) for k in range(len(parts))]


def create_paths(address: str, paths: list[str], timeout_s: float = 10.0) -> None:
    """Create each of ``paths`` and its ancestors on the ZooKeeper at ``host:port``; existing ones stay."""
    host, _, port = address.rpartition(":")
    todo = list(dict.fromkeys(p for path in paths for p in ancestors_and_self(path)))
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        # ConnectRequest: protocol version, last zxid seen, session timeout, session id, password
        _send(sock, struct.pack(">iqiq", 0, 0, int(timeout_s * 1000), 0) + struct.pack(">i", 16) + bytes(16))
        _recv(sock)
        for xid, path in enumerate(todo, start=1):
            _send(sock, create_request(xid, path))
            _, _, err = struct.unpack(">iqi", _recv(sock)[:16])
            if err not in (_OK, _NODE_EXISTS):
                raise ZooKeeperRequestError(f"ZooKeeper at {address} refused to create {path}: error {err}")
        _send(sock, struct.pack(">ii", len(todo) + 1, _CLOSE))
