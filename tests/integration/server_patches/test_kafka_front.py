"""The TLS/SASL front of the dev broker (``server_patches/kafka_front.py``).

The SCRAM server is checked against kafka-python's own SCRAM client (pure, no
network); the listener against kafka-python connections and raw sockets speaking
Kafka frames.
"""

from __future__ import annotations

import socket
import ssl
import struct
from pathlib import Path
from typing import Any, Iterator

import pytest
from kafka.conn import BrokerConnection
from kafka.sasl.scram import ScramClient

from server_patches.kafka_broker import start_broker, stop_broker
from server_patches.kafka_front import (
    AuthFailed,
    FrontConfig,
    FrontError,
    PlainSession,
    ScramCredential,
    ScramSession,
    patch_api_versions,
)
from tests.helpers.tls import TlsFiles, make_tls_files

pytestmark = pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLS is deprecated:DeprecationWarning")

USERS = {"alice": "pw-alice-31", "bob": "pw-bob-77"}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_scram_server_accepts_kafka_pythons_client_and_proves_itself_to_it(mechanism: str) -> None:
    creds = {u: ScramCredential.derive(mechanism, p, b"salt-%d" % i) for i, (u, p) in enumerate(USERS.items())}
    client = ScramClient("alice", USERS["alice"], mechanism)
    server = ScramSession(mechanism, creds)
    server_first = server.step(client.first_message())
    client.process_server_first_message(server_first)
    server_final = server.step(client.final_message())
    client.process_server_final_message(server_final)  # raises if the server's signature is wrong
    assert server.done and server.user == "alice"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_scram_server_refuses_a_wrong_password_and_an_unknown_user(mechanism: str) -> None:
    creds = {"alice": ScramCredential.derive(mechanism, USERS["alice"], b"s")}
    client = ScramClient("alice", "not-it", mechanism)
    server = ScramSession(mechanism, creds)
    client.process_server_first_message(server.step(client.first_message()))
    with pytest.raises(AuthFailed, match="invalid credentials for user 'alice'"):
        server.step(client.final_message())
    with pytest.raises(AuthFailed, match="'mallory'"):
        ScramSession(mechanism, creds).step(ScramClient("mallory", "x", mechanism).first_message())


def test_plain_checks_user_and_password() -> None:
    assert PlainSession(USERS).step(b"alice\0alice\0pw-alice-31") == b""
    with pytest.raises(AuthFailed, match="'alice'") as e:
        PlainSession(USERS).step(b"\0alice\0pw-bob-77")
    assert "pw-" not in str(e.value)


def test_the_front_config_masks_passwords_and_refuses_an_incomplete_listener() -> None:
    cfg = FrontConfig("SASL_PLAINTEXT", users=USERS)
    assert all(p not in repr(cfg) for p in USERS.values()) and "alice" in repr(cfg)
    with pytest.raises(FrontError, match="certfile and keyfile"):
        FrontConfig.from_dict({"protocol": "SASL_SSL", "users": USERS})
    with pytest.raises(FrontError, match="must be one of PLAINTEXT, SSL"):
        FrontConfig.from_dict({"protocol": "TLS"})


def test_the_sasl_apis_are_added_to_the_mocks_api_versions_answer_and_list_offsets_capped_at_v5() -> None:
    entries = struct.pack(">hhh", 2, 0, 7) + struct.pack(">hhh", 3, 0, 12) + struct.pack(">hhh", 18, 0, 2)
    mock = struct.pack(">hi", 0, 3) + entries + b"\0\0\0\0"

    def decoded(answer: bytes) -> list[tuple[int, ...]]:
        error, count = struct.unpack_from(">hi", answer)
        assert error == 0 and answer.endswith(b"\0\0\0\0")  # throttle time kept
        return [struct.unpack_from(">hhh", answer, 6 + 6 * i) for i in range(count)]

    assert decoded(patch_api_versions(mock)) == [(2, 0, 5), (3, 0, 12), (17, 1, 1), (18, 0, 2), (36, 0, 1)]
    assert decoded(patch_api_versions(mock, sasl=False)) == [(2, 0, 5), (3, 0, 12), (18, 0, 2)]
    refused = struct.pack(">hi", 35, 1) + struct.pack(">hhh", 18, 0, 2)
    assert patch_api_versions(refused) == refused


# ------------------------------------------------------------------ the listener


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    log = tmp_path_factory.mktemp("front") / "broker.log"
    proc, bootstrap, _ = start_broker(
        security={"protocol": "SASL_PLAINTEXT", "users": USERS, "mechanisms": ["SCRAM-SHA-256"]}, log_file=log
    )
    try:
        yield bootstrap, log
    finally:
        stop_broker(proc)


def _frame(api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation, 4) + b"test" + body
    return struct.pack(">i", len(payload)) + payload


def _recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed mid-frame")
        data += chunk
    return data


def _answer(s: socket.socket) -> bytes:
    return _recv_exact(s, struct.unpack(">i", _recv_exact(s, 4))[0])


def test_an_unsupported_mechanism_is_answered_with_the_enabled_ones_and_the_connection_closed(sasl_broker) -> None:
    host, port = sasl_broker[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_frame(17, 1, 7, struct.pack(">h", 5) + b"PLAIN"))
        answer = _answer(s)
        correlation, error, count = struct.unpack_from(">ihi", answer)
        assert (correlation, error, count) == (7, 33, 1)  # UNSUPPORTED_SASL_MECHANISM
        assert answer[10:].endswith(b"SCRAM-SHA-256")
        assert s.recv(1) == b""  # closed


def test_a_request_other_than_api_versions_before_authentication_closes_the_connection(sasl_broker) -> None:
    host, port = sasl_broker[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_frame(3, 1, 1, struct.pack(">i", -1)))  # Metadata, all topics
        assert s.recv(1) == b""
    assert "before authenticating; closing" in sasl_broker[1].read_text()


def test_a_wrong_password_is_answered_with_sasl_authentication_failed(sasl_broker) -> None:
    from kafka.errors import SaslAuthenticationFailedError

    host, port = sasl_broker[0].rsplit(":", 1)
    errors: list[Any] = []

    class Conn(BrokerConnection):
        def close(self, error: Any = None) -> None:
            errors.append(error)
            super().close(error)

    settings = dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob")
    good = Conn(host, int(port), socket.AF_UNSPEC, sasl_plain_password=USERS["bob"], api_version=(2, 4), **settings)
    assert good.connect_blocking(10)
    good.close()
    bad = Conn(host, int(port), socket.AF_UNSPEC, sasl_plain_password="nope", api_version=(2, 4), **settings)
    assert not bad.connect_blocking(10)
    assert any(isinstance(e, SaslAuthenticationFailedError) for e in errors)


def test_a_tls_front_requiring_client_certificates_refuses_a_client_without_one(pki, tmp_path: Path) -> None:
    security = {"protocol": "SSL", "certfile": pki.server_cert, "keyfile": pki.server_key, "client_cafile": pki.ca}
    proc, bootstrap, _ = start_broker(security=security, log_file=tmp_path / "broker.log")
    try:
        host, port = bootstrap.rsplit(":", 1)
        ctx = ssl.create_default_context(cafile=pki.ca)
        with (
            pytest.raises((ssl.SSLError, ConnectionError)),
            ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host) as s,
        ):
            s.sendall(_frame(18, 0, 1, b""))
            if not s.recv(4):
                raise ConnectionError("closed without an answer")
        ctx.load_cert_chain(pki.client_cert, pki.client_key, password=pki.client_key_password)
        with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10), server_hostname=host) as s:
            s.sendall(_frame(18, 0, 1, b""))
            assert struct.unpack_from(">ih", _answer(s)) == (1, 0)  # the mock's ApiVersions answer
    finally:
        stop_broker(proc)


def test_a_timestamp_lookup_through_the_front_answers_the_first_record_at_or_after_it_as_kafka_does(
    tmp_path: Path,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from server_patches.kafka_broker import create_topic

    proc, bootstrap, control = start_broker(security={"protocol": "PLAINTEXT"}, log_file=tmp_path / "broker.log")
    try:
        create_topic(control, "t", 1)
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        for i in range(10):  # one batch per record
            producer.send("t", b"v%d" % i, partition=0, timestamp_ms=1_000_000 + 10 * i).get(10)
        for i in range(5):  # one batch of five records
            producer.send("t", b"w%d" % i, partition=0, timestamp_ms=2_000_000 + 10 * i)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        tp = TopicPartition("t", 0)
        found = {ts: consumer.offsets_for_times({tp: ts})[tp] for ts in (0, 1_000_015, 1_000_091, 2_000_015, 9**9)}
        assert consumer.end_offsets([tp])[tp] == 15  # latest and earliest still come from the mock
        consumer.close()
    finally:
        stop_broker(proc)
    assert {ts: (f.offset, f.timestamp) if f else None for ts, f in found.items()} == {
        0: (0, 1_000_000),
        1_000_015: (2, 1_000_020),
        1_000_091: (10, 2_000_000),
        2_000_015: (12, 2_000_020),  # inside a batch
        9**9: None,  # no record that recent
    }
