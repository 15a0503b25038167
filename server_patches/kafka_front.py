"""A TLS and SASL front for the dev Kafka broker (librdkafka's mock has neither).

Production brokers require TLS and SASL; librdkafka's mock cluster
(:mod:`server_patches.kafka_broker`) only listens in the clear. This front listens for
Kafka clients with the security of one listener (``SSL``, ``SASL_PLAINTEXT``,
``SASL_SSL``, or ``PLAINTEXT`` for the timestamp lookups alone), terminates TLS, runs
the SASL exchange itself, and then relays Kafka frames both ways to the mock, in
order. On the way back it answers what the mock cannot: ``ListOffsets`` by timestamp
(:mod:`server_patches.kafka_timestamps`; ``ListOffsets`` is advertised up to v5).
The launcher advertises the front's address as the mock broker's
(``rd_kafka_mock_broker_set_host_port``), so the Metadata a client gets back sends
every later connection through the front too.

The SASL exchange is Kafka's (KIP-152), framed requests only:

- ``ApiVersions`` (before authentication) is forwarded to the mock and its answer
  gets ``SaslHandshake`` v1 and ``SaslAuthenticate`` v0-v1 added (the mock has
  neither);
- ``SaslHandshake`` v1 names the mechanism: ``PLAIN`` (RFC 4616) or
  ``SCRAM-SHA-256``/``SCRAM-SHA-512`` (RFC 5802 and 7677, 4096 iterations);
- ``SaslAuthenticate`` frames carry the mechanism's tokens. A wrong password answers
  ``SASL_AUTHENTICATION_FAILED`` (58) and closes the connection, as Kafka does;
  anything else before success closes it.

Passwords live only in :class:`FrontConfig` (masked in its ``repr``) and, for SCRAM,
as the derived keys Kafka itself stores; the log names users, never passwords.

Runs in the broker launcher process, on an asyncio loop in a daemon thread. Stdlib
only: ``ssl``, ``asyncio``, ``hashlib``/``hmac``.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import logging
import os
import secrets
import ssl
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from server_patches.kafka_timestamps import (
    LIST_OFFSETS,
    MAX_LIST_OFFSETS_VERSION,
    find_offset,
    patch_list_offsets,
    requested_timestamps,
)

log = logging.getLogger(__name__)

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 4096

_API_VERSIONS, _SASL_HANDSHAKE, _SASL_AUTHENTICATE = 18, 17, 36
#: (api key, min, max) the front adds to the mock's ApiVersions answer.
_SASL_APIS = ((_SASL_HANDSHAKE, 1, 1), (_SASL_AUTHENTICATE, 0, 1))
_UNSUPPORTED_SASL_MECHANISM, _SASL_AUTHENTICATION_FAILED = 33, 58
_HASHES: dict[str, Callable[..., Any]] = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
_MAX_FRAME = 100 * 1024 * 1024


class FrontError(RuntimeError):
    """The front's configuration is unusable (bad protocol, missing certificate, ...)."""


@dataclasses.dataclass(frozen=True)
class FrontConfig:
    """One secure listener: its protocol, TLS files and SASL users.

    ``client_cafile`` makes the TLS listener require a client certificate signed by
    that CA. ``users`` maps user names to passwords (``repr`` masks them).
    """

    protocol: str
    certfile: str | None = None
    keyfile: str | None = None
    client_cafile: str | None = None
    users: Mapping[str, str] = dataclasses.field(default_factory=dict)
    mechanisms: tuple[str, ...] = MECHANISMS

    def __repr__(self) -> str:
        return (
            f"FrontConfig(protocol={self.protocol!r}, certfile={self.certfile!r}, "
            f"client_cafile={self.client_cafile!r}, users={sorted(self.users)!r} (passwords masked), "
            f"mechanisms={self.mechanisms!r})"
        )

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FrontConfig:
        """Build and check a config from its JSON form (the launcher's ``--front-config`` file)."""
        cfg = cls(
            protocol=str(doc.get("protocol", "")),
            certfile=doc.get("certfile"),
            keyfile=doc.get("keyfile"),
            client_cafile=doc.get("client_cafile"),
            users={str(k): str(v) for k, v in dict(doc.get("users") or {}).items()},
            mechanisms=tuple(doc.get("mechanisms") or MECHANISMS),
        )
        cfg.check()
        return cfg

    def check(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise FrontError(f"front protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")
        if self.tls and not (self.certfile and self.keyfile):
            raise FrontError(f"front protocol {self.protocol} needs certfile and keyfile")
        if self.sasl and not self.users:
            raise FrontError(f"front protocol {self.protocol} needs at least one user")
        unknown = [m for m in self.mechanisms if m not in MECHANISMS]
        if unknown:
            raise FrontError(f"front mechanisms {unknown} unknown; known: {', '.join(MECHANISMS)}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server-side TLS context, or None for ``SASL_PLAINTEXT``."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        assert self.certfile and self.keyfile
        ctx.load_cert_chain(self.certfile, self.keyfile)
        if self.client_cafile:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.client_cafile)
        return ctx


# ---------------------------------------------------------------- SASL mechanisms


@dataclasses.dataclass(frozen=True)
class ScramCredential:
    """What a SCRAM server keeps of a password (RFC 5802 §3): never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(cls, mechanism: str, password: str, salt: bytes, iterations: int = SCRAM_ITERATIONS) -> ScramCredential:
        h = _HASHES[mechanism]
        salted = hashlib.pbkdf2_hmac(h().name, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", h).digest()
        return cls(salt, iterations, h(client_key).digest(), hmac.new(salted, b"Server Key", h).digest())


class AuthFailed(Exception):
    """The client's credentials are wrong; the message names the user, never a password."""


class PlainSession:
    """PLAIN (RFC 4616): one token ``authzid NUL user NUL password``."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = users
        self.done = False
        self.user = ""

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("malformed PLAIN token")
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        self.user = user
        expected = self._users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthFailed(f"invalid credentials for user {user!r}")
        if authzid and authzid != user:
            raise AuthFailed(f"user {user!r} may not act as {authzid!r}")
        self.done = True
        return b""


class ScramSession:
    """SCRAM-SHA-256/512 server (RFC 5802 §5, RFC 7677): two client messages."""

    def __init__(self, mechanism: str, credentials: Mapping[str, ScramCredential]) -> None:
        self._hash = _HASHES[mechanism]
        self._credentials = credentials
        self._first_bare = self._server_first = self._nonce = ""
        self._cred: ScramCredential | None = None
        self.done = False
        self.user = ""

    def step(self, token: bytes) -> bytes:
        text = token.decode("utf-8", "replace")
        return self._first(text) if self._cred is None else self._final(text)

    def _first(self, text: str) -> bytes:
        gs2, _, bare = text.partition(",")
        authzid, _, bare = bare.partition(",")
        if gs2 not in ("n", "y") or authzid:
            raise AuthFailed("unsupported SCRAM gs2 header (channel binding or authzid)")
        attrs = dict(a.split("=", 1) for a in bare.split(",") if "=" in a)
        self.user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
        cred = self._credentials.get(self.user)
        if cred is None or not attrs.get("r"):
            raise AuthFailed(f"invalid credentials for user {self.user!r}")
        self._cred = cred
        self._first_bare = bare
        self._nonce = attrs["r"] + secrets.token_urlsafe(18)
        salt = base64.b64encode(cred.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={cred.iterations}"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        assert self._cred is not None
        without_proof, _, proof_b64 = text.rpartition(",p=")
        attrs = dict(a.split("=", 1) for a in without_proof.split(",") if "=" in a)
        if attrs.get("r") != self._nonce or not proof_b64:
            raise AuthFailed(f"SCRAM nonce mismatch for user {self.user!r}")
        message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.new(self._cred.stored_key, message, self._hash).digest()
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise AuthFailed(f"malformed SCRAM proof from user {self.user!r}") from None
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if len(proof) != len(signature) or not hmac.compare_digest(
            self._hash(client_key).digest(), self._cred.stored_key
        ):
            raise AuthFailed(f"invalid credentials for user {self.user!r}")
        self.done = True
        server_signature = hmac.new(self._cred.server_key, message, self._hash).digest()
        return b"v=" + base64.b64encode(server_signature)


# ---------------------------------------------------------------- Kafka framing


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _request_header(frame: bytes) -> tuple[int, int, int, int]:
    """(api_key, api_version, correlation_id, offset of the body) of a request (header v1)."""
    api_key, version, correlation = struct.unpack_from(">hhi", frame, 0)
    (client_len,) = struct.unpack_from(">h", frame, 8)
    return api_key, version, correlation, 10 + max(0, client_len)


def _read_string(frame: bytes, at: int) -> str:
    (n,) = struct.unpack_from(">h", frame, at)
    return frame[at + 2 : at + 2 + n].decode("utf-8", "replace")


def _read_bytes(frame: bytes, at: int) -> bytes:
    (n,) = struct.unpack_from(">i", frame, at)
    return frame[at + 4 : at + 4 + max(0, n)]


def patch_api_versions(response: bytes, sasl: bool = True) -> bytes:
    """An ApiVersions v0-v2 response (after its correlation id) as the front answers it.

    ``SaslHandshake`` v1 and ``SaslAuthenticate`` v0-v1 added when ``sasl``, and
    ``ListOffsets`` capped at v5 (the versions whose timestamp answers the front
    patches). The entries are fixed-size (key, min, max) triples; an error answer (to
    a version the mock does not know) passes unchanged.
    """
    error, count = struct.unpack_from(">hi", response, 0)
    if error != 0 or count < 0:
        return response
    end = 6 + 6 * count
    entries = [struct.unpack_from(">hhh", response, 6 + 6 * i) for i in range(count)]
    added = _SASL_APIS if sasl else ()
    keys = {k for k, _, _ in added}
    entries = sorted([e for e in entries if e[0] not in keys] + list(added))
    entries = [
        (k, lo, min(hi, MAX_LIST_OFFSETS_VERSION)) if k == LIST_OFFSETS else (k, lo, hi) for k, lo, hi in entries
    ]
    body = b"".join(struct.pack(">hhh", *e) for e in entries)
    return struct.pack(">hi", 0, len(entries)) + body + response[end:]


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if not 0 <= size <= _MAX_FRAME:
        raise ConnectionError(f"bad frame size {size}")
    return await reader.readexactly(size)


def _write_frame(writer: asyncio.StreamWriter, correlation: int, body: bytes) -> None:
    writer.write(struct.pack(">ii", len(body) + 4, correlation) + body)


# ---------------------------------------------------------------- the server


class KafkaFront:
    """The listener: accepts clients, authenticates them, pipes them to the mock.

    :meth:`start` binds and runs the loop in a daemon thread (launcher process, once);
    each client connection gets its own connection to ``backend``.
    """

    def __init__(self, config: FrontConfig, backend: tuple[str, int]) -> None:
        config.check()
        self.config = config
        self.backend = backend
        self._ssl = config.ssl_context()
        self._scram = {
            mech: {
                user: ScramCredential.derive(mech, password, os.urandom(16)) for user, password in config.users.items()
            }
            for mech in _HASHES
            if mech in config.mechanisms
        }
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); returns the bound port."""
        tls: dict[str, Any] = {"ssl": self._ssl, "ssl_handshake_timeout": 10} if self._ssl else {}
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, host, port, reuse_address=True, **tls)
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        threading.Thread(target=self._loop.run_forever, name="kafka-front", daemon=True).start()
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            b_reader, b_writer = await asyncio.open_connection(*self.backend)
        except OSError as e:
            log.warning("kafka front: backend %s:%d unreachable: %s", *self.backend, e)
            writer.close()
            return
        try:
            if self.config.sasl and not await self._authenticate(reader, writer, b_reader, b_writer, peer):
                return
            pending: asyncio.Queue[tuple[int, int, bytes]] = asyncio.Queue()
            await asyncio.gather(_requests(reader, b_writer, pending), self._responses(b_reader, writer, pending))
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, struct.error) as e:
            log.info("kafka front: connection from %s ended: %s", peer, type(e).__name__)
        finally:
            for w in (writer, b_writer):
                w.close()

    async def _authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        b_reader: asyncio.StreamReader,
        b_writer: asyncio.StreamWriter,
        peer: object,
    ) -> bool:
        """Run the SASL exchange on a new connection; True once the client is authenticated."""
        session: PlainSession | ScramSession | None = None
        while True:
            frame = await _read_frame(reader)
            api_key, version, correlation, body = _request_header(frame)
            if api_key == _API_VERSIONS and session is None:
                b_writer.write(struct.pack(">i", len(frame)) + frame)
                answer = await _read_frame(b_reader)
                _write_frame(writer, correlation, patch_api_versions(answer[4:]) if version <= 2 else answer[4:])
            elif api_key == _SASL_HANDSHAKE and session is None and version == 1:
                mechanism = _read_string(frame, body)
                session = self._session(mechanism)
                error = 0 if session is not None else _UNSUPPORTED_SASL_MECHANISM
                names = b"".join(_string(m) for m in self.config.mechanisms)
                _write_frame(writer, correlation, struct.pack(">hi", error, len(self.config.mechanisms)) + names)
                if session is None:
                    log.warning("kafka front: %s asked for unsupported SASL mechanism %r", peer, mechanism)
                    return False
            elif api_key == _SASL_AUTHENTICATE and session is not None and version in (0, 1):
                if not self._auth_step(writer, session, version, correlation, _read_bytes(frame, body), peer):
                    return False
                if session.done:
                    log.info("kafka front: %s authenticated as %r", peer, session.user)
                    return True
            else:
                log.warning("kafka front: %s sent api %d v%d before authenticating; closing", peer, api_key, version)
                return False
            await writer.drain()

    async def _responses(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, pending: asyncio.Queue[tuple[int, int, bytes]]
    ) -> None:
        """Relay the mock's answers in order, patching ApiVersions and ListOffsets by timestamp."""
        try:
            while True:
                frame = await _read_frame(src)
                api_key, version, request = pending.get_nowait()
                answer = frame[4:]
                if api_key == _API_VERSIONS and version <= 2:
                    answer = patch_api_versions(answer, sasl=self.config.sasl)
                elif api_key == LIST_OFFSETS and 1 <= version <= MAX_LIST_OFFSETS_VERSION:
                    answer = await self._timestamp_answers(request, version, answer)
                dst.write(struct.pack(">i", len(answer) + 4) + frame[:4] + answer)
                await dst.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError, asyncio.QueueEmpty):
            pass
        finally:
            dst.close()

    async def _timestamp_answers(self, request: bytes, version: int, answer: bytes) -> bytes:
        """``answer`` with the offset of each partition asked by timestamp found in its log."""
        asked = {tp: ts for tp, ts in requested_timestamps(request, version).items() if ts >= 0}
        if not asked:
            return answer
        found = {tp: await find_offset(self.backend, tp[0], tp[1], ts) for tp, ts in asked.items()}
        return patch_list_offsets(answer, version, found)

    def _session(self, mechanism: str) -> PlainSession | ScramSession | None:
        if mechanism not in self.config.mechanisms:
            return None
        if mechanism == "PLAIN":
            return PlainSession(self.config.users)
        return ScramSession(mechanism, self._scram[mechanism])

    @staticmethod
    def _auth_step(
        writer: asyncio.StreamWriter,
        session: PlainSession | ScramSession,
        version: int,
        correlation: int,
        token: bytes,
        peer: object,
    ) -> bool:
        """Answer one SaslAuthenticate request; False (after the error answer) on bad credentials."""
        lifetime = struct.pack(">q", 0) if version >= 1 else b""
        try:
            reply = session.step(token)
        except AuthFailed as e:
            log.warning("kafka front: %s failed SASL authentication: %s", peer, e)
            message = f"Authentication failed: {e}"
            body = struct.pack(">h", _SASL_AUTHENTICATION_FAILED) + _string(message) + struct.pack(">i", 0) + lifetime
            _write_frame(writer, correlation, body)
            return False
        _write_frame(
            writer, correlation, struct.pack(">h", 0) + _string(None) + struct.pack(">i", len(reply)) + reply + lifetime
        )
        return True


def _expects_answer(api_key: int, version: int, frame: bytes, body: int) -> bool:
    """False for the one request Kafka never answers: a Produce with acks=0."""
    if api_key != 0:
        return True
    at = body
    if version >= 3:
        (n,) = struct.unpack_from(">h", frame, at)  # transactional id
        at += 2 + max(0, n)
    return struct.unpack_from(">h", frame, at)[0] != 0


async def _requests(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, pending: asyncio.Queue[tuple[int, int, bytes]]
) -> None:
    """Forward the client's requests to the mock, noting each (api, version, body) an answer is due for."""
    try:
        while True:
            frame = await _read_frame(src)
            api_key, version, _, body = _request_header(frame)
            if _expects_answer(api_key, version, frame, body):
                pending.put_nowait((api_key, version, frame[body:]))
            dst.write(struct.pack(">i", len(frame)) + frame)
            await dst.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        pass
    finally:
        dst.close()


def load_config(path: Path) -> FrontConfig:
    """The front's configuration from its JSON file (written 0600 by :func:`write_config`)."""
    import json

    return FrontConfig.from_dict(json.loads(path.read_text()))


def write_config(path: Path, config: Mapping[str, Any]) -> None:
    """Write ``config`` (JSON, passwords included) readable by its owner only."""
    import json

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(config), f)
