"""The dev Kafka broker (librdkafka's mock cluster) against a real Kafka client.

Every test talks Kafka protocol over TCP with kafka-python 2.3.x, the client the
``kafka_py`` source uses; the broker runs in its own launcher process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from server_patches.kafka_broker import (
    BrokerError,
    create_topic,
    delete_records,
    parse_topics,
    start_broker,
    stop_broker,
)

pytestmark = pytest.mark.embedded_only("tests the project's dev Kafka broker itself")


@pytest.fixture(scope="module")
def broker() -> Iterator[tuple[str, str]]:
    """A broker on a kernel-chosen port with topic ``seeded`` (3 partitions)."""
    proc, bootstrap, control = start_broker(topics=[("seeded", 3)])
    try:
        yield bootstrap, control
    finally:
        stop_broker(proc)


def _topic() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def _consumer(bootstrap: str) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, allow_auto_create_topics=False, request_timeout_ms=10_000
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_topics_given_at_start_exist_with_their_partition_counts(broker: tuple[str, str]) -> None:
    c = _consumer(broker[0])
    try:
        assert c.partitions_for_topic("seeded") == {0, 1, 2}
    finally:
        c.close()


def test_a_topic_created_through_the_control_endpoint_has_the_requested_partitions(broker: tuple[str, str]) -> None:
    bootstrap, control = broker
    name = _topic()
    create_topic(control, name, 7)
    c = _consumer(bootstrap)
    try:
        assert c.partitions_for_topic(name) == set(range(7))
    finally:
        c.close()


def test_produced_records_are_fetched_back_with_key_value_headers_and_offsets(broker: tuple[str, str]) -> None:
    bootstrap, control = broker
    name = _topic()
    create_topic(control, name, 2)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(20):
        p.send(name, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, headers=[("n", str(i).encode())])
    p.flush()
    p.close()

    c = _consumer(bootstrap)
    try:
        tps = [TopicPartition(name, 0), TopicPartition(name, 1)]
        c.assign(tps)
        c.seek_to_beginning()
        got: list = []
        deadline = time.monotonic() + 30
        while len(got) < 20 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                got.extend(recs)
    finally:
        c.close()
    seen = {(r.partition, r.offset, r.key, r.value, tuple(r.headers)) for r in got}
    expected = {(i % 2, i // 2, b"k%d" % i, b"v%d" % i, (("n", str(i).encode()),)) for i in range(20)}
    assert seen == expected


def test_end_offsets_count_the_records_produced_to_each_partition(broker: tuple[str, str]) -> None:
    bootstrap, control = broker
    name = _topic()
    create_topic(control, name, 3)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    for part, n in ((0, 5), (1, 0), (2, 11)):
        for _ in range(n):
            p.send(name, value=b"x", partition=part)
    p.flush()
    p.close()
    c = _consumer(bootstrap)
    try:
        tps = [TopicPartition(name, i) for i in range(3)]
        assert c.end_offsets(tps) == dict(zip(tps, (5, 0, 11)))
        assert c.beginning_offsets(tps) == dict(zip(tps, (0, 0, 0)))
    finally:
        c.close()


def test_deleting_records_moves_the_log_start_offset_like_retention(broker: tuple[str, str]) -> None:
    bootstrap, control = broker
    name = _topic()
    create_topic(control, name, 1)
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    for i in range(10):
        p.send(name, value=b"%d" % i, partition=0).get(timeout=10)  # one batch per record
    p.close()
    delete_records(control, name, 0, 4)
    c = _consumer(bootstrap)
    try:
        tp = TopicPartition(name, 0)
        assert c.beginning_offsets([tp]) == {tp: 4}
        assert c.end_offsets([tp]) == {tp: 10}
    finally:
        c.close()


def test_creating_an_existing_topic_is_refused_naming_the_topic(broker: tuple[str, str]) -> None:
    _, control = broker
    with pytest.raises(BrokerError, match=r"'seeded'.*TOPIC_ALREADY_EXISTS"):
        create_topic(control, "seeded", 3)


def test_an_invalid_topic_name_is_refused_by_the_control_endpoint(broker: tuple[str, str]) -> None:
    _, control = broker
    with pytest.raises(BrokerError, match="invalid topic name"):
        create_topic(control, "bad name!", 1)
    with pytest.raises(BrokerError, match="invalid partition count"):
        create_topic(control, _topic(), 0)


def test_the_topics_option_parses_names_and_partition_counts() -> None:
    assert parse_topics("a:3, b ,c.d-e_f:12") == [("a", 3), ("b", 1), ("c.d-e_f", 12)]
    with pytest.raises(ValueError, match="bad partition count"):
        parse_topics("a:x")
    with pytest.raises(ValueError, match="invalid topic name"):
        parse_topics("a b:1")


def test_the_command_line_serves_on_the_fixed_port_and_writes_the_ready_file(tmp_path: Path) -> None:
    port = _free_port()
    ready = tmp_path / "ready.json"
    with open(tmp_path / "broker.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "server_patches.kafka_broker",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--ready-file",
                str(ready),
                "--topics",
                "fixed:2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, (tmp_path / "broker.log").read_text()
            assert time.monotonic() < deadline, "no ready file"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        assert info["pid"] == proc.pid
        assert info["bootstrap"] == f"127.0.0.1:{port}"
        assert info["control"].startswith("http://127.0.0.1:")
        # Metadata must advertise the fixed port too, or clients would reconnect elsewhere.
        p = KafkaProducer(bootstrap_servers=info["bootstrap"])
        meta = p.send("fixed", value=b"hello", partition=1).get(timeout=10)
        p.close()
        assert (meta.partition, meta.offset) == (1, 0)
        c = _consumer(info["bootstrap"])
        try:
            brokers = {(b.host, b.port) for b in c._client.cluster.brokers()}
        finally:
            c.close()
        assert brokers == {("127.0.0.1", port)}
    finally:
        proc.terminate()
        assert proc.wait(15) == 0  # SIGTERM is a clean shutdown
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))  # the port is free again


def test_a_port_in_use_fails_start_up_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(BrokerError, match=f"cannot listen on 127.0.0.1:{port}"):
            start_broker(port=port, log_file=tmp_path / "broker.log", ready_timeout_s=20)
