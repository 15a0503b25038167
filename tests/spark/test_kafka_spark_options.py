"""Spark's remaining Kafka source options in ``kafka_py``, with Spark's names and semantics.

Timestamps: ``startingTimestamp``, ``startingOffsetsByTimestamp``, ``endingTimestamp``,
``endingOffsetsByTimestamp``, ``startingOffsetsByTimestampStrategy``. The dev broker
(librdkafka's mock) cannot look offsets up by timestamp, so these run against it
behind the project's front (``security={"protocol": "PLAINTEXT"}``), which answers
``ListOffsets`` by timestamp as Kafka does. Then ``minOffsetsPerTrigger`` with
``maxTriggerDelay``, ``includeHeaders``, ``maxRecordsPerPartition``,
``groupIdPrefix``/``kafka.group.id``; and replays after a driver SIGKILL of a batch
planned from a timestamp and of one planned under ``minOffsetsPerTrigger``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pytest
from kafka import KafkaProducer
from pyspark.sql.streaming.datasource import ReadAllAvailable

from clickhouse_tx.errors import ConfigurationError
from server_patches.kafka_broker import start_broker, stop_broker
from spark_datasource.kafka.consumers import POOL
from spark_datasource.kafka.offsets import START_KEY, KafkaOffsetRange
from spark_datasource.kafka.options import parse_kafka_options
from spark_datasource.kafka.reader import KafkaBatchReader, KafkaDataSource, KafkaInputPartition, KafkaStreamReader
from tests.helpers.kafka import CLIENTS, new_topic, produce
from tests.helpers.torture import kill_session, start_child

T0 = 1_700_000_000_000  # ms; the records' timestamps are T0 + 1000 * i
JOB = "tests.helpers.kafka_replay_job"
#: The kill and replay cases run with each client, among the slow ones (``make test-slow``):
#: a driver killed and restarted is what the default suite's one kill case already shows,
#: and each of these costs about a minute.
KILL_CLIENTS = [pytest.param(c, marks=pytest.mark.slow) for c in CLIENTS]


@pytest.fixture(scope="module")
def ts_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """The dev broker behind the front that answers timestamp lookups: (bootstrap, control)."""
    log = tmp_path_factory.mktemp("ts-broker") / "broker.log"
    proc, bootstrap, control = start_broker(security={"protocol": "PLAINTEXT"}, log_file=log)
    try:
        yield bootstrap, control
    finally:
        POOL.close_all()  # this process's pooled consumers, before their broker goes
        stop_broker(proc)


@pytest.fixture(scope="module")
def kspark(spark):
    spark.dataSource.register(KafkaDataSource)
    return spark


def produce_at(bootstrap: str, topic: str, partition: int, stamps: list[int], tag: str = "v") -> None:
    """One record per timestamp (ms), in order, value ``<tag>-<partition>-<i>``."""
    p = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    for i, ts in enumerate(stamps):
        p.send(topic, value=f"{tag}-{partition}-{i}".encode(), partition=partition, timestamp_ms=ts)
    p.flush()
    p.close()


def _offsets(rows) -> dict[int, list[int]]:  # type: ignore[no-untyped-def]
    out: dict[int, list[int]] = {}
    for r in rows:
        out.setdefault(r.partition, []).append(r.offset)
    return {p: sorted(o) for p, o in out.items()}


# ------------------------------------------------------------------ options


BASE = {"bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}


def test_timestamps_take_precedence_over_offsets_as_in_spark() -> None:
    both = parse_kafka_options(
        {
            **BASE,
            "startingTimestamp": "5",
            "startingOffsetsByTimestamp": '{"t": {"0": 7}}',
            "startingOffsets": "earliest",
        }
    )
    assert both.starting_timestamps == 5 and both.timestamp_option(True) == "startingTimestamp"
    by_partition = parse_kafka_options({**BASE, "endingOffsetsByTimestamp": '{"t": {"1": 9, "0": 7}}'}, streaming=False)
    assert by_partition.ending_timestamps == ((("t", 0), 7), (("t", 1), 9))
    assert by_partition.timestamp_option(False) == "endingOffsetsByTimestamp"
    assert parse_kafka_options(BASE).starting_timestamps is None


@pytest.mark.parametrize(
    "extra, streaming, option, message",
    [
        ({"startingTimestamp": "yesterday"}, None, "startingTimestamp", "milliseconds since the epoch"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": -1}}'}, None, "startingOffsetsByTimestamp", ">= 0"),
        ({"startingOffsetsByTimestamp": "[1]"}, None, "startingOffsetsByTimestamp", "expected JSON"),
        ({"endingTimestamp": "5"}, True, "endingTimestamp", "batch reads only"),
        ({"endingOffsetsByTimestamp": '{"t": {"0": 5}}'}, True, "endingOffsetsByTimestamp", "batch reads only"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, None, "startingOffsetsByTimestampStrategy", "latest"),
        ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, True, "minOffsetsPerTrigger", "above"),
        ({"minOffsetsPerTrigger": "10"}, False, "minOffsetsPerTrigger", "streaming reads only"),
        ({"maxTriggerDelay": "5m"}, False, "maxTriggerDelay", "streaming reads only"),
        ({"maxTriggerDelay": "soon"}, True, "maxTriggerDelay", "duration like 15m"),
        ({"includeHeaders": "yes please"}, None, "includeHeaders", "true or false"),
        ({"maxRecordsPerPartition": "0"}, None, "maxRecordsPerPartition", ">= 1"),
        ({"maxRecordsPerPartition": "10", "maxPartitions": "2"}, None, "maxRecordsPerPartition", "maxPartitions"),
        ({"groupIdPrefix": " "}, None, "groupIdPrefix", "a non-empty group id"),
    ],
)
def test_bad_values_of_the_new_options_fail_on_the_driver_naming_the_option(
    extra: dict[str, str], streaming: bool | None, option: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as e:
        parse_kafka_options({**BASE, **extra}, streaming=streaming)
    assert option in str(e.value) and message in str(e.value)


def test_max_trigger_delay_takes_sparks_time_strings_and_defaults_to_15_minutes() -> None:
    def delay(text: str | None) -> int:
        extra = {} if text is None else {"maxTriggerDelay": text}
        return parse_kafka_options({**BASE, **extra}, streaming=True).max_trigger_delay_ms

    assert [delay(t) for t in (None, "15m", "30s", "500ms", "2h", "1d", "250")] == [
        900_000,
        900_000,
        30_000,
        500,
        7_200_000,
        86_400_000,
        250,
    ]


def test_group_id_options_are_accepted_and_never_reach_kafka() -> None:
    opts = parse_kafka_options({**BASE, "groupIdPrefix": "etl", "kafka.group.id": "etl-readers"})
    assert opts.consumer_config()["group_id"] is None  # no group is joined, no offset committed
    assert "group" not in repr(opts.kafka_params)


# ------------------------------------------------------------------ timestamps, pure


# ------------------------------------------------------------------ timestamps, through Spark


def test_a_batch_read_between_two_timestamps_returns_the_records_stamped_in_between(kspark, ts_broker) -> None:
    bootstrap, control = ts_broker
    topic = new_topic(control, 2)
    produce_at(bootstrap, topic, 0, [T0 + 1000 * i for i in range(10)])
    produce_at(bootstrap, topic, 1, [T0 + 500 + 1000 * i for i in range(10)])

    def reader():  # type: ignore[no-untyped-def]
        return kspark.read.format("kafka_py").option("bootstrap.servers", bootstrap).option("subscribe", topic)

    rows = reader().option("startingTimestamp", str(T0 + 3000)).option("endingTimestamp", str(T0 + 6000)).load()
    got = rows.collect()
    # Spark's rule: from the first record at or after the start, to the first at or after the end (excluded).
    assert _offsets(got) == {0: [3, 4, 5], 1: [3, 4, 5]}
    assert all(T0 + 3000 <= int(r.timestamp.timestamp() * 1000) < T0 + 6000 for r in got)
    by_partition = (
        reader()
        .option("startingOffsetsByTimestamp", json.dumps({topic: {"0": T0 + 8000, "1": T0}}))
        .option("endingOffsetsByTimestamp", json.dumps({topic: {"0": T0 + 10**9, "1": T0 + 2000}}))
    )
    assert _offsets(by_partition.load().collect()) == {0: [8, 9], 1: [0, 1]}  # no match at the end: latest


def test_a_starting_timestamp_later_than_every_record_fails_naming_the_option_unless_the_strategy_is_latest(
    kspark, ts_broker
) -> None:
    bootstrap, control = ts_broker
    topic = new_topic(control, 2)
    produce_at(bootstrap, topic, 0, [T0 + 1000 * i for i in range(5)])
    produce_at(bootstrap, topic, 1, [T0 + 9000 + i for i in range(5)])
    options = {"bootstrap.servers": bootstrap, "subscribe": topic, "startingTimestamp": str(T0 + 8000)}
    with pytest.raises(Exception, match=rf"'startingTimestamp': no record of {topic}\[0\]"):
        kspark.read.format("kafka_py").options(**options).load().collect()
    rows = kspark.read.format("kafka_py").options(**options, startingOffsetsByTimestampStrategy="latest").load()
    assert _offsets(rows.collect()) == {1: [0, 1, 2, 3, 4]}


def test_a_stream_starts_at_the_first_record_at_or_after_its_starting_timestamp(kspark, ts_broker, tmp_path) -> None:
    bootstrap, control = ts_broker
    topic = new_topic(control, 2)
    produce_at(bootstrap, topic, 0, [T0 + 1000 * i for i in range(8)])
    produce_at(bootstrap, topic, 1, [T0 + 1000 * i for i in range(3)])
    got: list = []
    q = (
        kspark.readStream.format("kafka_py")
        .options(**{"bootstrap.servers": bootstrap, "subscribe": topic})
        .option("startingTimestamp", str(T0 + 2000))
        .load()
        .writeStream.foreachBatch(lambda df, _: got.extend(df.collect()))
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(180)
    assert q.exception() is None
    assert _offsets(got) == {0: list(range(2, 8)), 1: [2]}


# ------------------------------------------------------------------ min/max trigger


def test_min_offsets_per_trigger_waits_for_enough_records_or_for_max_trigger_delay(broker) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    produce(bootstrap, topic, {0: 4, 1: 4})
    opts = parse_kafka_options(
        {
            "bootstrap.servers": bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "30s",
        },
        streaming=True,
    )
    reader = KafkaStreamReader(opts)
    now = [1000.0]
    reader._clock = lambda: now[0]
    try:
        start = reader.initialOffset()
        first = reader.latestOffset(start, ReadAllAvailable())  # the first trigger is never delayed (Spark)
        assert sum(v for k, v in first[topic].items()) == 8
        produce(bootstrap, topic, {0: 3, 1: 3}, tag="w")  # 6 < 10
        now[0] += 10
        assert reader.latestOffset(first, ReadAllAvailable()) == first  # no batch: too few, too soon
        now[0] += 21  # 31 s since the last batch: maxTriggerDelay has passed
        second = reader.latestOffset(first, ReadAllAvailable())
        assert sum(second[topic].values()) == 14
        produce(bootstrap, topic, {0: 5, 1: 5}, tag="x")  # 10 >= 10: at once
        now[0] += 1
        assert sum(reader.latestOffset(second, ReadAllAvailable())[topic].values()) == 24
    finally:
        reader.stop()


# ------------------------------------------------------------------ headers, partitions, groups


def test_headers_are_left_out_by_default_as_in_spark_and_included_with_include_headers(kspark, broker) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce(bootstrap, topic, {0: 3})
    reader = kspark.read.format("kafka_py").option("bootstrap.servers", bootstrap).option("subscribe", topic)
    plain = reader.load()
    assert "headers" not in plain.columns and plain.count() == 3
    with_headers = reader.option("includeHeaders", "true").load()
    assert with_headers.columns[-1] == "headers"
    assert [[(h.key, bytes(h.value)) for h in r.headers] for r in with_headers.orderBy("offset").collect()] == [
        [("i", b"0")],
        [("i", b"1")],
        [("i", b"2")],
    ]


def test_a_read_with_max_records_per_partition_and_group_options_returns_every_record(kspark, broker) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    sent = produce(bootstrap, topic, {0: 45, 1: 12})
    df = (
        kspark.read.format("kafka_py")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("maxRecordsPerPartition", "10")
        .option("groupIdPrefix", "etl")
        .option("kafka.group.id", "etl-readers")
        .load()
    )
    assert df.rdd.getNumPartitions() == 5 + 2
    rows = df.collect()
    assert {(r.partition, bytes(r.value)) for r in rows} == sent and len(rows) == len(sent)


# ------------------------------------------------------------------ replays after a driver kill


def _wait_for(path: Path, proc, timeout_s: float = 240) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None or path.exists(), f"the job ended before writing {path.name}: {_errors(proc)}"
        assert time.monotonic() < deadline, f"no {path.name} within {timeout_s}s"
        time.sleep(0.2)


def _errors(proc) -> str:  # type: ignore[no-untyped-def]
    """The child's stderr without Spark's warnings (for assertion messages)."""
    text = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    return "\n".join(line for line in text.splitlines() if " WARN " not in line)[-3000:]


def _run(args: dict, cwd: Path) -> int:
    """Run the job to its end or to its own SIGKILL; its exit code (any other failure raises)."""
    proc = start_child(args, cwd=cwd, module=JOB)
    try:
        proc.wait(300)
    finally:
        kill_session(proc)
    assert proc.returncode in (0, -9), _errors(proc)
    return proc.returncode


def _logged_offsets(chk: Path, batch: int) -> dict:
    """The source's offsets of ``batch`` in the checkpoint's offset log (its last line)."""
    return json.loads((chk / "offsets" / str(batch)).read_text().splitlines()[-1])


def _read(out: Path, name: str) -> list[tuple[int, int, bytes]]:
    t = pq.read_table(out / name)
    return sorted(zip(t["partition"].to_pylist(), t["offset"].to_pylist(), t["value"].to_pylist()))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("client", KILL_CLIENTS)
def test_a_first_batch_planned_from_a_timestamp_is_replayed_after_a_driver_kill_from_the_logged_offsets(
    ts_broker, tmp_path: Path, client: str
) -> None:
    """Spark replays batch 0 from a fresh ``initialOffset()``; here that would start
    partition 0 at its new latest offset (14, past the logged end 10). The source logs
    batch 0's start in its end offsets, and the replay reads exactly what was planned."""
    bootstrap, control = ts_broker
    topic = new_topic(control, 2)
    produce_at(bootstrap, topic, 0, [T0 + i for i in range(10)])  # all before the timestamp
    produce_at(bootstrap, topic, 1, [T0 + 1000 * i for i in range(10)])
    out, chk = tmp_path / "out", tmp_path / "chk"
    out.mkdir()
    options = {
        "startingTimestamp": str(T0 + 5000),
        "startingOffsetsByTimestampStrategy": "latest",
        "kafka.client": client,
    }
    job = {"bootstrap": bootstrap, "topic": topic, "options": options, "out": str(out), "chk": str(chk)}
    _run({**job, "tag": "first", "kill_batch": 0}, tmp_path)
    planned = _read(out, "first-batch=0.parquet")
    assert [(p, o) for p, o, _ in planned] == [(1, o) for o in range(5, 10)]
    logged = _logged_offsets(chk, 0)
    assert logged == {topic: {"0": 10, "1": 10}, START_KEY: {topic: {"0": 10, "1": 5}}}
    assert not (chk / "commits" / "0").exists()

    produce_at(bootstrap, topic, 0, [T0 + 100 + i for i in range(4)], tag="late")  # while the driver is down
    assert _run({**job, "tag": "again", "kill_batch": None}, tmp_path) == 0
    assert _read(out, "again-batch=0.parquet") == planned  # the same offsets, the same records
    assert [(p, o) for p, o, _ in _read(out, "again-batch=1.parquet")] == [(0, o) for o in range(10, 14)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("client", KILL_CLIENTS)
def test_a_batch_planned_under_min_offsets_per_trigger_is_replayed_after_a_driver_kill_from_the_logged_offsets(
    broker, tmp_path: Path, client: str
) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 2)
    produce(bootstrap, topic, {0: 15, 1: 15})
    out, chk = tmp_path / "out", tmp_path / "chk"
    out.mkdir()
    options = {
        "startingOffsets": "earliest",
        "minOffsetsPerTrigger": "20",
        "maxTriggerDelay": "10m",
        "kafka.client": client,
    }
    job = {"bootstrap": bootstrap, "topic": topic, "options": options, "out": str(out), "chk": str(chk)}
    proc = start_child({**job, "tag": "first", "kill_batch": 1, "trigger": "processingTime"}, cwd=tmp_path, module=JOB)
    try:
        _wait_for(out / "first-batch=0.parquet", proc)
        produce(bootstrap, topic, {0: 3, 1: 3}, tag="few")
        time.sleep(5)  # about ten triggers
        assert not (out / "first-batch=1.parquet").exists()  # 6 new records < minOffsetsPerTrigger
        produce(bootstrap, topic, {0: 9, 1: 9}, tag="enough")  # 24 >= 20
        proc.wait(240)  # killed in batch 1
    finally:
        kill_session(proc)
    planned = _read(out, "first-batch=1.parquet")
    assert len(planned) == 24
    logged = _logged_offsets(chk, 1)
    assert logged == {topic: {"0": 27, "1": 27}}
    assert {p: max(o for q, o, _ in planned if q == p) + 1 for p in (0, 1)} == {0: 27, 1: 27}

    produce(bootstrap, topic, {0: 2, 1: 3}, tag="late")  # while the driver is down
    assert _run({**job, "tag": "again", "kill_batch": None}, tmp_path) == 0
    assert _read(out, "again-batch=1.parquet") == planned
    assert len(_read(out, "again-batch=2.parquet")) == 5


def test_a_replayed_first_batch_plans_from_its_logged_start_whatever_start_spark_passes() -> None:
    reader = KafkaStreamReader(parse_kafka_options(BASE, streaming=True))
    end = {"t": {"0": 10, "1": 10}, START_KEY: {"t": {"0": 10, "1": 5}}}
    fresh_initial = {"t": {"0": 14, "1": 5}}  # what initialOffset() resolves to on the replay
    assert reader.partitions(fresh_initial, end) == [KafkaInputPartition(KafkaOffsetRange("t", 1, 5, 10))]
    assert reader.partitions(end, {"t": {"0": 14, "1": 10}}) == [KafkaInputPartition(KafkaOffsetRange("t", 0, 10, 14))]


def test_a_batch_reader_resolves_timestamps_on_the_driver_before_any_task(ts_broker) -> None:
    bootstrap, control = ts_broker
    topic = new_topic(control, 1)
    produce_at(bootstrap, topic, 0, [T0 + 1000 * i for i in range(6)])
    opts = parse_kafka_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "startingTimestamp": str(T0 + 1500)}, streaming=False
    )
    assert KafkaBatchReader(opts).partitions() == [KafkaInputPartition(KafkaOffsetRange(topic, 0, 2, 6))]


def test_after_a_first_batch_that_logged_its_start_a_stream_with_nothing_new_runs_no_batch(broker) -> None:
    bootstrap, control = broker
    topic = new_topic(control, 1)
    produce(bootstrap, topic, {0: 3})
    opts = parse_kafka_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"}, streaming=True
    )
    reader = KafkaStreamReader(opts)
    try:
        first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        assert first == {topic: {"0": 3}, START_KEY: {topic: {"0": 0}}}
        assert reader.latestOffset(first, ReadAllAvailable()) is first  # Spark compares the JSON: no batch
    finally:
        reader.stop()
