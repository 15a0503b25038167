"""``kafka_py`` over TLS and SASL, end to end, against brokers that require them.

Each broker is the dev broker behind the project's TLS/SASL front
(``server_patches/kafka_front.py``), which advertises itself as the broker, so every
connection a client opens (bootstrap, then the partition leader) goes through it.
Certificates are generated per run (``tests/helpers/tls.py``). Records are produced
through the same front, then read through ``kafka_py`` in real Spark reads.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any, Iterator

import pytest

from clickhouse_tx.errors import ConfigurationError
from server_patches.kafka_broker import start_broker, stop_broker
from spark_datasource.kafka.consumers import POOL
from spark_datasource.kafka.errors import KafkaAuthenticationError
from spark_datasource.kafka.fetch import read_partition
from spark_datasource.kafka.options import parse_kafka_options
from spark_datasource.kafka.reader import KafkaBatchReader, KafkaDataSource, KafkaStreamReader
from tests.helpers.kafka import CLIENTS, new_topic, produce
from tests.helpers.tls import TlsFiles, make_tls_files

USER, PASSWORD = "alice", "pw-5e1f0c-hunter2"

# kafka-python 2.3 builds its TLS context with ssl.PROTOCOL_SSLv23, deprecated since
# Python 3.10 (it still negotiates the highest TLS version both sides have).
pytestmark = pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLS is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("pki"))


class SecureBroker:
    """One dev broker behind a front: its address, control URL, log and client settings."""

    def __init__(self, protocol: str, pki: TlsFiles, logs: Path, client_cert: bool = False) -> None:
        self.protocol = protocol
        security: dict[str, Any] = {"protocol": protocol, "users": {USER: PASSWORD}}
        if protocol != "SASL_PLAINTEXT":
            security |= {"certfile": pki.server_cert, "keyfile": pki.server_key}
        if client_cert:
            security["client_cafile"] = pki.ca
        self.log = logs / f"{protocol}-{client_cert}.log"
        self.proc, self.bootstrap, self.control = start_broker(security=security, log_file=self.log)
        self.pki = pki
        self.client_cert = client_cert

    def options(self, mechanism: str | None = None, **extra: str) -> dict[str, str]:
        """``kafka_py`` options reaching this broker (``mechanism`` for SASL)."""
        opts = {"bootstrap.servers": self.bootstrap, "kafka.security.protocol": self.protocol}
        if self.protocol != "SASL_PLAINTEXT":
            opts["kafka.ssl.cafile"] = self.pki.ca
        if self.client_cert:
            opts |= {
                "kafka.ssl.certfile": self.pki.client_cert,
                "kafka.ssl.keyfile": self.pki.client_key,
                "kafka.ssl.password": self.pki.client_key_password,
            }
        if mechanism:
            opts |= {
                "kafka.sasl.mechanism": mechanism,
                "kafka.sasl.plain.username": USER,
                "kafka.sasl.plain.password": PASSWORD,
            }
        return {**opts, **extra}

    def producer(self, mechanism: str | None = None) -> dict[str, Any]:
        """The same settings for a kafka-python producer."""
        return {
            k[len("kafka.") :].replace(".", "_"): v
            for k, v in self.options(mechanism).items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }


@pytest.fixture(scope="module")
def brokers(pki: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``brokers(protocol, client_cert=False)``: started on first use, stopped after the module."""
    started: dict[tuple[str, bool], SecureBroker] = {}
    logs = tmp_path_factory.mktemp("broker-logs")

    def get(protocol: str, client_cert: bool = False) -> SecureBroker:
        if (protocol, client_cert) not in started:
            started[(protocol, client_cert)] = SecureBroker(protocol, pki, logs, client_cert)
        return started[(protocol, client_cert)]

    try:
        yield get
    finally:
        POOL.close_all()  # this process's pooled consumers, before their brokers go
        for b in started.values():
            stop_broker(b.proc)


@pytest.fixture(scope="module")
def kspark(spark):
    spark.dataSource.register(KafkaDataSource)
    return spark


def _batch_read(kspark, options: dict[str, str], topic: str) -> set[tuple[int, bytes]]:
    rows = kspark.read.format("kafka_py").options(**options, subscribe=topic).load().collect()
    got = [(r.partition, bytes(r.value)) for r in rows]
    assert len(got) == len(set(got))
    return set(got)


def _stream_read(kspark, options: dict[str, str], topic: str, chk: Path) -> list[tuple[int, int, bytes]]:
    got: list[tuple[int, int, bytes]] = []

    def each(df, _batch_id: int) -> None:
        got.extend((r.partition, r.offset, bytes(r.value)) for r in df.collect())

    q = (
        kspark.readStream.format("kafka_py")
        .options(**options, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="20")
        .load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None
    return got


# ------------------------------------------------------------------ one test per mechanism


def test_a_batch_read_over_ssl_trusting_only_the_ca_returns_every_record(kspark, brokers) -> None:
    b = brokers("SSL")
    topic = new_topic(b.control, 3)
    sent = produce(b.bootstrap, topic, {0: 30, 1: 11, 2: 4}, client=b.producer())
    assert _batch_read(kspark, b.options(), topic) == sent


def test_a_batch_read_over_ssl_with_a_client_certificate_and_an_encrypted_key_returns_every_record(
    kspark, brokers
) -> None:
    b = brokers("SSL", client_cert=True)
    topic = new_topic(b.control, 2)
    sent = produce(b.bootstrap, topic, {0: 25, 1: 9}, client=b.producer())
    assert _batch_read(kspark, b.options(), topic) == sent


def test_a_streaming_read_over_sasl_plaintext_with_plain_reads_every_record_once_in_order(
    kspark, brokers, tmp_path: Path
) -> None:
    b = brokers("SASL_PLAINTEXT")
    topic = new_topic(b.control, 2)
    sent = produce(b.bootstrap, topic, {0: 33, 1: 18}, client=b.producer("PLAIN"))
    got = _stream_read(kspark, b.options("PLAIN"), topic, tmp_path / "chk")
    assert {(p, v) for p, _, v in got} == sent and len(got) == len(sent)
    for part, n in ((0, 33), (1, 18)):
        assert [o for p, o, _ in got if p == part] == list(range(n))


def test_a_batch_read_over_sasl_ssl_with_scram_sha_256_returns_every_record(kspark, brokers) -> None:
    b = brokers("SASL_SSL")
    topic = new_topic(b.control, 2)
    sent = produce(b.bootstrap, topic, {0: 40, 1: 2}, client=b.producer("SCRAM-SHA-256"))
    assert _batch_read(kspark, b.options("SCRAM-SHA-256"), topic) == sent


def test_a_batch_and_a_streaming_read_over_sasl_ssl_with_scram_sha_512_return_every_record(
    kspark, brokers, tmp_path: Path
) -> None:
    b = brokers("SASL_SSL")
    topic = new_topic(b.control, 3)
    sent = produce(b.bootstrap, topic, {0: 12, 1: 0, 2: 29}, client=b.producer("SCRAM-SHA-512"))
    assert _batch_read(kspark, b.options("SCRAM-SHA-512"), topic) == sent
    got = _stream_read(kspark, b.options("SCRAM-SHA-512"), topic, tmp_path / "chk")
    assert {(p, v) for p, _, v in got} == sent and len(got) == len(sent)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    "protocol, client_cert, mechanism",
    [
        ("SSL", False, None),
        ("SSL", True, None),
        ("SASL_PLAINTEXT", False, "PLAIN"),
        ("SASL_SSL", False, "SCRAM-SHA-256"),
        ("SASL_SSL", True, "SCRAM-SHA-512"),
    ],
)
def test_every_protocol_and_mechanism_reads_every_record_with_either_client(
    brokers, client: str, protocol: str, client_cert: bool, mechanism: str | None
) -> None:
    """Without Spark: the driver plans, each planned range is read as an executor reads it."""
    b = brokers(protocol, client_cert)
    topic = new_topic(b.control, 2)
    sent = produce(b.bootstrap, topic, {0: 9, 1: 4}, client=b.producer(mechanism))
    opts = parse_kafka_options(
        {**b.options(mechanism), "subscribe": topic, "kafka.client": client, "minRecordsPerPartition": "1"},
        streaming=False,
    )
    assert opts.client == client
    got = [
        (p, bytes(v))
        for part in KafkaBatchReader(opts).partitions()
        for batch in read_partition(opts, part.planned)
        for p, v in zip(batch["partition"].to_pylist(), batch["value"].to_pylist())
    ]
    assert sorted(got) == sorted(sent)


# ------------------------------------------------------------------ refusals, on the driver


def test_a_wrong_password_fails_the_spark_read_on_the_driver_naming_the_option_and_not_the_password(
    kspark, brokers
) -> None:
    b = brokers("SASL_SSL")
    topic = new_topic(b.control, 1)
    options = b.options("SCRAM-SHA-256", **{"kafka.sasl.plain.password": "wrong-7d2c91"})
    with pytest.raises(Exception) as e:
        kspark.read.format("kafka_py").options(**options, subscribe=topic).load().collect()
    text = str(e.value)
    assert "KafkaAuthenticationError" in text and "'kafka.sasl.plain.password'" in text
    assert f"user {USER!r}" in text and "SCRAM-SHA-256" in text
    assert "wrong-7d2c91" not in text and PASSWORD not in text


def test_an_untrusted_broker_certificate_fails_the_spark_read_on_the_driver_naming_kafka_ssl_cafile(
    kspark, brokers, pki
) -> None:
    b = brokers("SSL")
    topic = new_topic(b.control, 1)
    with pytest.raises(Exception) as e:
        (
            kspark.readStream.format("kafka_py")
            .options(**b.options(**{"kafka.ssl.cafile": pki.other_ca}), subscribe=topic)
            .load()
            .writeStream.format("noop")
            .trigger(availableNow=True)
            .start()
            .awaitTermination(120)
        )
    text = str(e.value)
    assert "'kafka.ssl.cafile'" in text and "not trusted" in text


def test_a_refused_password_fails_at_once_rather_than_after_kafka_pythons_endless_reconnects(brokers) -> None:
    b = brokers("SASL_PLAINTEXT")
    opts = parse_kafka_options(
        {**b.options("PLAIN", **{"kafka.sasl.plain.password": "nope"}), "subscribe": "x"}, streaming=True
    )
    reader = KafkaStreamReader(opts)
    try:
        with pytest.raises(KafkaAuthenticationError, match="refused SASL PLAIN authentication of user 'alice'"):
            reader.initialOffset()
    finally:
        reader.stop()


# ------------------------------------------------------------------ secrets


@pytest.mark.parametrize("client", CLIENTS)
def test_no_password_reaches_a_log_line_an_error_or_a_repr(
    brokers, caplog: pytest.LogCaptureFixture, client: str
) -> None:
    """Good and wrong passwords, SASL and the TLS key's, at DEBUG on every logger.

    kafka-python logs each request at DEBUG, the PLAIN token (user NUL user NUL
    password) included; the source masks it. The front's log names users only.
    """
    b = brokers("SASL_SSL", client_cert=True)
    topic = new_topic(b.control, 2)
    produce(b.bootstrap, topic, {0: 5, 1: 5}, client=b.producer("PLAIN"))
    wrong = "wrong-pw-0a9d77"
    secrets = (PASSWORD, wrong, b.pki.client_key_password)
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG):
        good = parse_kafka_options({**b.options("PLAIN"), "subscribe": topic, "kafka.client": client}, streaming=False)
        reader = KafkaBatchReader(good)
        rows = sum(batch.num_rows for p in reader.partitions() for batch in read_partition(good, p.planned))
        bad = parse_kafka_options(
            {**b.options("PLAIN", **{"kafka.sasl.plain.password": wrong}), "subscribe": topic}, streaming=False
        )
        with pytest.raises(KafkaAuthenticationError) as e:
            KafkaBatchReader(bad).partitions()
        shown += [str(e.value), repr(e.value)]
    assert rows == 10
    assert any("SaslAuthenticateRequest" in r.getMessage() for r in caplog.records)  # the token was logged, masked
    shown += [r.getMessage() for r in caplog.records] + [caplog.text]
    source = KafkaDataSource({**b.options("PLAIN"), "subscribe": topic})
    shown += [repr(good), repr(bad), repr(reader), repr(source), repr(source.kafka_options), str(good.kafka_params)]
    shown.append(b.log.read_text(errors="replace"))
    for text in shown:
        for secret in secrets:
            assert secret not in text
    assert "failed SASL authentication" in b.log.read_text()  # the front logged the refusal, by user


def test_passwords_can_come_from_the_driver_environment_instead_of_options(
    brokers, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = brokers("SASL_SSL", client_cert=True)
    topic = new_topic(b.control, 1)
    produce(b.bootstrap, topic, {0: 7}, client=b.producer("SCRAM-SHA-512"))
    options = {k: v for k, v in b.options("SCRAM-SHA-512").items() if not k.endswith("password")}
    with pytest.raises(ConfigurationError, match="'kafka.sasl.plain.password'.*KAFKA_PY_SASL_PASSWORD"):
        parse_kafka_options({**options, "subscribe": topic})
    monkeypatch.setenv("KAFKA_PY_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("KAFKA_PY_SSL_PASSWORD", b.pki.client_key_password)
    opts = parse_kafka_options({**options, "subscribe": topic}, streaming=False)
    assert PASSWORD not in repr(opts) and b.pki.client_key_password not in repr(opts)
    shipped = pickle.loads(pickle.dumps(opts))  # what an executor gets: it needs no environment
    monkeypatch.delenv("KAFKA_PY_SASL_PASSWORD")
    monkeypatch.delenv("KAFKA_PY_SSL_PASSWORD")
    parts = KafkaBatchReader(shipped).partitions()
    assert sum(batch.num_rows for p in parts for batch in read_partition(shipped, p.planned)) == 7


# ------------------------------------------------------------------ option checks


BASE = {"bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}


@pytest.mark.parametrize(
    "extra, option, message",
    [
        ({"kafka.security.protocol": "TLS"}, "kafka.security.protocol", "expected one of PLAINTEXT, SSL"),
        ({"kafka.security.protocol": "SASL_SSL"}, "kafka.sasl.mechanism", "expected one of PLAIN, SCRAM-SHA-256"),
        (
            {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "GSSAPI"},
            "kafka.sasl.mechanism",
            "got 'GSSAPI'",
        ),
        (
            {"kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN"},
            "kafka.sasl.plain.username",
            "is required",
        ),
        (
            {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN", "kafka.sasl.plain.username": "u"},
            "kafka.sasl.plain.password",
            "is required",
        ),
        ({"kafka.sasl.mechanism": "PLAIN"}, "kafka.sasl.mechanism", "needs kafka.security.protocol SASL_"),
        (
            {"kafka.security.protocol": "SSL", "kafka.ssl.cafile": "/no/such/ca.pem"},
            "kafka.ssl.cafile",
            "cannot read",
        ),
    ],
)
def test_bad_security_options_fail_on_the_driver_naming_the_option(
    extra: dict[str, str], option: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_PY_SASL_PASSWORD", raising=False)
    with pytest.raises(ConfigurationError) as e:
        parse_kafka_options({**BASE, **extra})
    assert repr(option) in str(e.value) and message in str(e.value)
