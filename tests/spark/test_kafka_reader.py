"""The ``kafka_py`` source: options, and real reads through the dev broker and Spark.

Everything here runs against the dev broker (librdkafka's mock cluster in its own
process) and, where Spark's behaviour is the point, a local SparkSession. The pure
offset planning is tested with plain dicts in ``tests/unit/test_kafka_offsets.py``.
"""

from __future__ import annotations

import json
import logging
import pickle
import socket
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kafka import KafkaProducer
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from clickhouse_tx.errors import ConfigurationError
from server_patches.kafka_broker import create_topic
from spark_datasource.kafka.consumers import POOL, ConsumerPool, new_consumer
from spark_datasource.kafka.errors import KafkaDataLossError, KafkaUnavailableError
from spark_datasource.kafka.fetch import read_range
from spark_datasource.kafka.offsets import KafkaOffsetRange
from spark_datasource.kafka.options import parse_kafka_options
from spark_datasource.kafka.reader import KafkaBatchReader, KafkaDataSource, KafkaStreamReader
from tests.helpers.kafka import CLIENTS, new_topic, produce, produce_then_delete_head, rows_of

# ------------------------------------------------------------------ options


@pytest.fixture(scope="module", autouse=True)
def _pooled_consumers_closed_before_the_broker_stops(broker: tuple[str, str]) -> Iterator[None]:
    """Reads without a pool of their own leave consumers in this process's pool; a
    librdkafka one would keep reconnecting to the stopped broker, logging each try."""
    yield
    POOL.close_all()


BASE = {"bootstrap.servers": "127.0.0.1:9092", "subscribe": "a"}


def test_the_source_reads_read_committed_by_default() -> None:
    assert parse_kafka_options(BASE).consumer_config()["isolation_level"] == "read_committed"
    opted_out = parse_kafka_options({**BASE, "kafka.isolation.level": "read_uncommitted"})
    assert opted_out.consumer_config()["isolation_level"] == "read_uncommitted"
    with pytest.raises(ConfigurationError, match="kafka.isolation.level='committed'.*read_committed"):
        parse_kafka_options({**BASE, "kafka.isolation.level": "committed"})


@pytest.mark.parametrize(
    "options, option, message",
    [
        ({"subscribe": "a"}, "bootstrap.servers", "is required"),
        ({"bootstrap.servers": "nohost"}, "bootstrap.servers", "host:port"),
        ({**BASE, "assign": '{"a": [0]}'}, "subscribe", "exactly one of"),
        ({"bootstrap.servers": "h:1"}, "subscribe", "exactly one of"),
        ({**BASE, "startingOffsets": "{bad"}, "startingOffsets", "expected"),
        ({**BASE, "startingOffsets": '{"a": {"0": -3}}'}, "startingOffsets", ">= -2"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", ">= 1"),
        ({**BASE, "minPartitions": "many"}, "minPartitions", "integer"),
        ({**BASE, "failOnDataLoss": "maybe"}, "failOnDataLoss", "true or false"),
        ({**BASE, "subscribePatern": "x"}, "subscribepatern", "unknown option"),
        ({**BASE, "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit", "cannot be set"),
        ({**BASE, "kafka.no.such.thing": "1"}, "kafka.no.such.thing", "no setting"),
        ({**BASE, "kafka.request.timeout.ms": "soon"}, "kafka.request.timeout.ms", "integer"),
        ({**BASE, "assign": None, "subscribe": None, "ASSIGN": '{"a": []}'}, "assign", "non-empty"),
    ],
)
def test_bad_options_fail_with_an_error_naming_the_option(options: dict, option: str, message: str) -> None:
    options = {k: v for k, v in options.items() if v is not None}
    with pytest.raises(ConfigurationError) as e:
        parse_kafka_options(options)
    assert option in str(e.value)
    assert message in str(e.value)


def test_batch_and_stream_only_options_are_rejected_in_the_other_kind_of_read() -> None:
    with pytest.raises(ConfigurationError, match="'startingOffsets'.*batch"):
        parse_kafka_options({**BASE, "startingOffsets": "latest"}, streaming=False)
    with pytest.raises(ConfigurationError, match="'endingOffsets'.*batch reads only"):
        parse_kafka_options({**BASE, "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(ConfigurationError, match="'maxOffsetsPerTrigger'.*streaming"):
        parse_kafka_options({**BASE, "maxOffsetsPerTrigger": "5"}, streaming=False)


def test_kafka_prefixed_options_reach_kafka_python_typed_and_secrets_stay_out_of_repr() -> None:
    opts = parse_kafka_options(
        {
            **BASE,
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.plain.username": "u",
            "kafka.sasl.plain.password": "hunter2",
            "kafka.request.timeout.ms": "1234",
            "kafka.check.crcs": "false",
        }
    )
    cfg = opts.consumer_config()
    assert cfg["security_protocol"] == "SASL_PLAINTEXT"
    assert cfg["sasl_plain_password"] == "hunter2"
    assert cfg["request_timeout_ms"] == 1234 and cfg["check_crcs"] is False
    assert "hunter2" not in repr(opts)
    assert pickle.loads(pickle.dumps(opts)) == opts


def test_option_names_are_case_insensitive_like_spark() -> None:
    opts = parse_kafka_options({"BOOTSTRAP.SERVERS": "h:1", "SubScribe": "b,a,b", "STARTINGOFFSETS": '{"a": {"1": 4}}'})
    assert opts.subscribe == ("a", "b")
    assert opts.starting_offsets == ((("a", 1), 4),)


# ------------------------------------------------------------------ the broker


@pytest.mark.parametrize("client", CLIENTS)
def test_replaying_the_same_offsets_reads_exactly_the_same_records(broker: tuple[str, str], client: str) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 3)
    produce(bootstrap, topic, {0: 40, 1: 25, 2: 0})
    opts = parse_kafka_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "minPartitions": "4", "kafka.client": client},
        streaming=True,
    )
    reader = KafkaStreamReader(opts)
    try:
        start = reader.initialOffset()  # default startingOffsets=latest for a stream
        assert start == {topic: {"0": 40, "1": 25, "2": 0}}
        start = {topic: {"0": 3, "1": 0, "2": 0}}
        end = reader.latestOffset(start, ReadMaxRows(50))
        assert sum(end[topic].values()) - 3 == 50
        first = [rows_of(list(reader.read(p))) for p in reader.partitions(start, end)]
        # A fresh, unpickled reader (as after a driver restart) plans and reads the same.
        again_reader = pickle.loads(pickle.dumps(reader))
        again = [rows_of(list(again_reader.read(p))) for p in again_reader.partitions(start, end)]
    finally:
        reader.stop()
    assert first == again
    flat = [r for part in first for r in part]
    assert len(flat) == len(set(flat)) == 50
    assert min(o for p, o, _ in flat if p == 0) == 3


def test_a_stream_with_no_new_records_returns_the_start_offset(broker: tuple[str, str]) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    produce(bootstrap, topic, {0: 3})
    reader = KafkaStreamReader(
        parse_kafka_options({"bootstrap.servers": bootstrap, "subscribe": topic}, streaming=True)
    )
    try:
        start = reader.initialOffset()
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert reader.partitions(start, start) == []
    finally:
        reader.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_records_deleted_before_they_are_read_fail_the_read_unless_failondataloss_is_false(
    broker: tuple[str, str], client: str
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce_then_delete_head(bootstrap, control, topic, 20, deleted=8)
    rng = KafkaOffsetRange(topic, 0, 2, 20)
    strict = parse_kafka_options({"bootstrap.servers": bootstrap, "subscribe": topic, "kafka.client": client})
    with pytest.raises(KafkaDataLossError, match=rf"\[2, 8\) of {topic}\[0\].*failOnDataLoss"):
        list(read_range(strict, rng))
    lenient = parse_kafka_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "failOnDataLoss": "false", "kafka.client": client}
    )
    rows = rows_of(list(read_range(lenient, rng)))
    assert [o for _, o, _ in rows] == list(range(8, 20))


def _produce_transactions(bootstrap: str, topic: str, outcomes: list[bool], n: int = 3) -> list[bytes]:
    """One transaction of ``n`` records per outcome (True commit, False abort); the committed values."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(10)
    committed = []
    for i, commit in enumerate(outcomes):
        p.begin_transaction()
        values = [b"%s-%d-%d" % (b"c" if commit else b"a", i, j) for j in range(n)]
        for v in values:
            p.produce(topic, v, partition=0)
        p.flush()
        (p.commit_transaction if commit else p.abort_transaction)(10)
        committed += values if commit else []
    return committed


@pytest.mark.parametrize("client", CLIENTS)
def test_a_default_read_is_read_committed_at_the_broker_and_reads_past_transaction_markers(
    broker: tuple[str, str], client: str
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    committed = _produce_transactions(bootstrap, topic, [True, True, True])
    # The mock broker writes transaction markers with CRC 0, which a real broker never does.
    opts = parse_kafka_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "kafka.check.crcs": "false", "kafka.client": client}
    )
    consumer = new_consumer(opts)  # the driver's metadata consumer: kafka-python with either client
    try:
        assert consumer.config["isolation_level"] == "read_committed"
        tp = __import__("kafka").TopicPartition(topic, 0)
        end = consumer.end_offsets([tp])[tp]  # ListOffsets v2 with READ_COMMITTED: accepted
    finally:
        consumer.close()
    assert end == 12  # 9 records and 3 markers (at offsets 3, 7, 11)
    rows = rows_of(list(read_range(opts, KafkaOffsetRange(topic, 0, 0, end))))
    # The markers' offsets are gaps of invisible records, not data loss (failOnDataLoss=true).
    assert [v for _, _, v in rows] == committed
    assert [o for _, o, _ in rows] == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    # Ranges that end on a marker (as a micro-batch's end at the last stable offset does),
    # with records after it, through one pooled consumer: each is exact and ends at once.
    pool = ConsumerPool()
    try:
        pieces = [rows_of(list(read_range(opts, KafkaOffsetRange(topic, 0, s, s + 4), pool))) for s in (0, 4, 8)]
        assert rows_of(list(read_range(opts, KafkaOffsetRange(topic, 0, 3, 4), pool))) == []  # the marker only
    finally:
        pool.close_all()
    assert [[o for _, o, _ in piece] for piece in pieces] == [[0, 1, 2], [4, 5, 6], [8, 9, 10]]
    assert (pool.stats.created, pool.stats.reused) == (1, 3)


def test_both_clients_read_the_same_rows_past_an_aborted_transaction(broker: tuple[str, str]) -> None:
    """The dev broker (librdkafka's mock) keeps no aborted-transaction index, so it returns
    aborted records under read_committed too (a real broker lets the client drop them):
    what is checked is that both clients read the same rows and skip the markers."""
    bootstrap, control = broker
    topic = new_topic(control, 1)
    committed = _produce_transactions(bootstrap, topic, [True, False, True])
    got = {}
    for client in CLIENTS:
        opts = parse_kafka_options(
            {"bootstrap.servers": bootstrap, "subscribe": topic, "kafka.check.crcs": "false", "kafka.client": client}
        )
        got[client] = rows_of(list(read_range(opts, KafkaOffsetRange(topic, 0, 0, 12), ConsumerPool())))
    assert got["kafka-python"] == got["librdkafka"]
    assert [o for _, o, _ in got["librdkafka"]] == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert set(committed) <= {v for _, _, v in got["librdkafka"]}


@pytest.mark.timeout(90)
def test_a_broker_that_is_down_fails_with_an_error_naming_bootstrap_servers(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    opts = parse_kafka_options(
        {
            "bootstrap.servers": dead,
            "subscribe": "x",
            "fetchOffset.numRetries": "2",
            "fetchOffset.retryIntervalMs": "100",
        },
        streaming=False,
    )
    with (
        caplog.at_level(logging.WARNING, logger="clickhouse_tx.retry"),
        pytest.raises(KafkaUnavailableError, match=rf"bootstrap.servers={dead}"),
    ):
        KafkaBatchReader(opts).partitions()
    # each retry is logged, by the project's one retry helper
    assert [
        r.getMessage().split(" (")[1].split(")")[0] for r in caplog.records if r.getMessage().startswith("kafka_py:")
    ] == ["attempt 1 of 2"]


# ------------------------------------------------------------------ through Spark


@pytest.fixture(scope="module")
def kspark(spark):
    spark.dataSource.register(KafkaDataSource)
    return spark


@pytest.mark.parametrize("client", CLIENTS)
def test_a_batch_read_returns_exactly_the_produced_records(kspark, broker, client: str) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 3)
    sent = produce(bootstrap, topic, {0: 50, 1: 7, 2: 31})
    df = (
        kspark.read.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("kafka.client", client)
        .load()
    )
    rows = df.collect()
    assert {(r.partition, bytes(r.value)) for r in rows} == sent
    assert len(rows) == len(sent)
    by_part: dict[int, list[int]] = {}
    for r in rows:
        by_part.setdefault(r.partition, []).append(r.offset)
        assert r.topic == topic
        assert bytes(r.key) == b"k%d" % r.offset
        assert [(h.key, bytes(h.value)) for h in r.headers] == [("i", str(r.offset).encode())]
        assert r.timestamp is not None
    assert {p: sorted(o) for p, o in by_part.items()} == {0: list(range(50)), 1: list(range(7)), 2: list(range(31))}
    # endingOffsets bounds the read.
    part = (
        kspark.read.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("assign", json.dumps({topic: [0]}))
        .option("kafka.client", client)
        .option("startingOffsets", json.dumps({topic: {"0": 10}}))
        .option("endingOffsets", json.dumps({topic: {"0": 15}}))
        .load()
    )
    assert sorted(r.offset for r in part.collect()) == [10, 11, 12, 13, 14]


def _json_read(kspark, bootstrap: str, topic: str, schema: str):
    return (
        kspark.read.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("value.format", "json")
        .option("value.schema", schema)
        .load()
    )


def test_json_values_decoded_in_the_source_are_the_rows_from_json_gives(kspark, broker) -> None:
    from pyspark.sql import functions as F

    bootstrap, control = broker
    topic = new_topic(control, 2)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(300):
        doc = {"event_id": i, "user_id": i % 7, "amount": i / 4, "label": f"l{i}"}
        if i % 50 == 0:
            del doc["user_id"]  # a missing field is null in both
        p.send(topic, json.dumps(doc).encode(), partition=i % 2)
    p.send(topic, None, key=b"tombstone", partition=0)
    p.flush()
    p.close()
    schema = "event_id BIGINT, user_id BIGINT, amount DOUBLE, label STRING"
    decoded = _json_read(kspark, bootstrap, topic, schema)
    assert decoded.schema["value"].dataType.simpleString() == (
        "struct<event_id:bigint,user_id:bigint,amount:double,label:string>"
    )
    got = {(r.partition, r.offset): r.value for r in decoded.collect()}
    raw = kspark.read.format("kafka_py").option("bootstrap.servers", bootstrap).option("subscribe", topic).load()
    parsed = raw.select("partition", "offset", F.from_json(F.col("value").cast("string"), schema).alias("value"))
    want = {(r.partition, r.offset): r.value for r in parsed.collect()}
    assert len(got) == 301
    assert got == want
    assert sum(v is None for v in got.values()) == 1  # the tombstone


def test_a_json_value_that_does_not_fit_the_schema_fails_the_read_naming_its_offset(kspark, broker) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(40):
        p.send(topic, b'{"event_id": %s}' % (b'"x"' if i == 33 else str(i).encode()), partition=0)
    p.flush()
    p.close()
    with pytest.raises(Exception, match=rf"the value at {topic}\[0\] offset 33 does not decode"):
        _json_read(kspark, bootstrap, topic, "event_id BIGINT").collect()


def test_a_bad_option_fails_when_the_dataframe_is_defined(kspark) -> None:
    with pytest.raises(Exception, match="maxOffsetsPerTrigger"):
        (
            kspark.readStream.format("kafka_py")
            .option("bootstrap.servers", "h:1")
            .option("subscribe", "t")
            .option("maxOffsetsPerTrigger", "-5")
            .load()
        )


def _run_stream(
    kspark, bootstrap: str, topic: str, chk: Path, out: Path, max_per: int, fail_on_batch: int | None = None
) -> list[int]:
    """Run the stream with availableNow; each batch is written to out/batch=<id>.parquet.

    Writing by batch id (overwrite) is idempotent, the way a real exactly-once sink
    is. ``fail_on_batch`` makes that batch raise after recording what it saw.
    Returns the batch ids run.
    """
    ran: list[int] = []

    def sink(df, batch_id: int) -> None:
        rows = df.select("partition", "offset", "value").toArrow()
        ran.append(batch_id)
        if batch_id == fail_on_batch:
            pq.write_table(rows, out / f"failed-{batch_id}.parquet")
            raise RuntimeError(f"injected failure in batch {batch_id}")
        pq.write_table(rows, out / f"batch={batch_id}.parquet")

    q = (
        kspark.readStream.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_per))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(chk))
        .trigger(availableNow=True)
        .start()
    )
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    return ran


def _committed(out: Path) -> dict[int, pa.Table]:
    return {int(f.stem.split("=")[1]): pq.read_table(f) for f in sorted(out.glob("batch=*"))}


def test_a_stream_reads_every_record_once_in_order_across_limited_micro_batches(kspark, broker, tmp_path: Path) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    sent = produce(bootstrap, topic, {0: 120, 1: 60})
    out = tmp_path / "out"
    out.mkdir()
    ran = _run_stream(kspark, bootstrap, topic, tmp_path / "chk", out, max_per=50)
    batches = _committed(out)
    assert ran == sorted(batches) and len(batches) == 4  # 180 records, 50 per trigger
    assert all(t.num_rows <= 50 for t in batches.values())
    rows = [
        (p, o, bytes(v))
        for b in sorted(batches)
        for p, o, v in zip(*(batches[b][c].to_pylist() for c in ("partition", "offset", "value")))
    ]
    assert len(rows) == len(sent)
    assert {(p, v) for p, _, v in rows} == sent
    for part, n in ((0, 120), (1, 60)):
        assert [o for p, o, _ in rows if p == part] == list(range(n))  # in order, no gaps


def test_a_restarted_stream_replays_the_failed_batch_identically_and_continues(kspark, broker, tmp_path: Path) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    sent = produce(bootstrap, topic, {0: 70, 1: 30})
    out, chk = tmp_path / "out", tmp_path / "chk"
    out.mkdir()

    with pytest.raises(Exception, match="injected failure in batch 1"):
        _run_stream(kspark, bootstrap, topic, chk, out, max_per=40, fail_on_batch=1)
    assert sorted(_committed(out)) == [0]

    sent |= produce(bootstrap, topic, {0: 15, 1: 5}, tag="late")  # arrives while stopped
    ran = _run_stream(kspark, bootstrap, topic, chk, out, max_per=40)
    assert ran[0] == 1  # the failed batch is replayed first, with the same id
    failed = pq.read_table(out / "failed-1.parquet").sort_by([("partition", "ascending"), ("offset", "ascending")])
    replayed = _committed(out)[1].sort_by([("partition", "ascending"), ("offset", "ascending")])
    assert replayed.equals(failed)  # same offsets -> exactly the same records

    batches = _committed(out)
    rows = [
        (p, o, bytes(v))
        for b in sorted(batches)
        for p, o, v in zip(*(batches[b][c].to_pylist() for c in ("partition", "offset", "value")))
    ]
    assert len(rows) == len(sent) == 120
    assert {(p, v) for p, _, v in rows} == sent
    for part, n in ((0, 85), (1, 35)):
        assert sorted(o for p, o, _ in rows if p == part) == list(range(n))


def test_subscribe_pattern_plans_ranges_for_every_matching_topic(broker) -> None:
    bootstrap, control = broker
    prefix = f"pat_{uuid.uuid4().hex[:6]}"
    for suffix, parts in (("x", 2), ("y", 1)):
        create_topic(control, f"{prefix}_{suffix}", parts)
    produce(bootstrap, f"{prefix}_x", {0: 3, 1: 4})
    produce(bootstrap, f"{prefix}_y", {0: 5})
    opts = parse_kafka_options(
        {"bootstrap.servers": bootstrap, "subscribePattern": f"{prefix}_.*", "minRecordsPerPartition": "1"},
        streaming=False,
    )
    assert [p.planned for p in KafkaBatchReader(opts).partitions()] == [
        KafkaOffsetRange(f"{prefix}_x", 0, 0, 3),
        KafkaOffsetRange(f"{prefix}_x", 1, 0, 4),
        KafkaOffsetRange(f"{prefix}_y", 0, 0, 5),
    ]


# ------------------------------------------------------------------ maxPartitions


def test_max_partitions_below_min_partitions_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError, match="'maxPartitions'.*minPartitions=4"):
        parse_kafka_options({**BASE, "minPartitions": "4", "maxPartitions": "2"})
    assert parse_kafka_options({**BASE, "maxPartitions": "2"}).max_partitions == 2


def test_a_read_with_max_partitions_returns_every_record_once_in_fewer_spark_partitions(kspark, broker) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 5)
    sent = produce(bootstrap, topic, {0: 30, 1: 7, 2: 19, 3: 0, 4: 11})
    df = (
        kspark.read.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("maxPartitions", "2")
        .option("minRecordsPerPartition", "1")
        .load()
    )
    assert df.rdd.getNumPartitions() == 2
    rows = df.select("partition", "offset", "value").collect()
    assert sorted((r.partition, bytes(r.value)) for r in rows) == sorted(sent)
    for part, n in ((0, 30), (1, 7), (2, 19), (4, 11)):
        assert [r.offset for r in rows if r.partition == part] == list(range(n))  # in order


# ------------------------------------------------------------------ minRecordsPerPartition


def test_min_records_per_partition_below_one_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="minRecordsPerPartition"):
        parse_kafka_options({**BASE, "minRecordsPerPartition": "0"})


def test_a_stream_of_small_batches_over_several_kafka_partitions_runs_one_task_per_batch_and_reads_every_record_once(
    kspark, broker, tmp_path
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 4)
    sent = produce(bootstrap, topic, {0: 5, 1: 3, 2: 6, 3: 2})
    got: list[tuple[int, int]] = []
    parts: list[int] = []

    def each(df, _batch_id) -> None:  # type: ignore[no-untyped-def]
        parts.append(df.rdd.getNumPartitions())
        got.extend((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    q = (
        kspark.readStream.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(300)
    assert q.exception() is None
    assert parts and set(parts) == {1}
    assert sorted(got) == sorted((p, o) for p, n in ((0, 5), (1, 3), (2, 6), (3, 2)) for o in range(n))
    assert len(got) == len(sent)
