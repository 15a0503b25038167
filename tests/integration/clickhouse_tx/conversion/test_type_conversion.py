"""Spark-shaped data into ordinary ClickHouse column types, on the embedded stack.

For each ClickHouse type: a column of values that fit lands exactly (every value read
back), and a partition with one value that does not fit fails with the column named
while the table stays unchanged, in modes ``transaction``, ``staging`` and ``dedup``.
The data has Spark's shapes (int64 for every integer, nullable, microsecond UTC
timestamps); the conversion plan is built the way the writer builds it on the driver
(``describe_table`` + ``conversion_columns``) and travels with the coordinator.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.conversion.schema import check_schema, conversion_columns, describe_table
from clickhouse_tx.errors import ValueDoesNotFitError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX
from spark_datasource.testing.credentials import target_fields, writer_options

MODES = ["transaction", "staging", "dedup"]
UTC = dt.UTC
I64 = pa.int64()
TS = pa.timestamp("us", tz="UTC")


def t(*a: int) -> dt.datetime:
    return dt.datetime(*a, tzinfo=UTC)


# ClickHouse type -> (Spark-shaped data that fits, toString() of each stored value,
#                     data with one value that does not fit, that value as the error prints it)
CASES: dict[str, tuple[pa.Array, list[str], pa.Array, str]] = {
    "UInt64": (pa.array([0, 2**63 - 1], I64), ["0", str(2**63 - 1)], pa.array([-1], I64), "-1"),
    "UInt32": (pa.array([0, 2**32 - 1], I64), ["0", str(2**32 - 1)], pa.array([2**32], I64), str(2**32)),
    "UInt8": (pa.array([0, 255], I64), ["0", "255"], pa.array([256], I64), "256"),
    "Int32": (
        pa.array([-(2**31), 2**31 - 1], I64),
        [str(-(2**31)), str(2**31 - 1)],
        pa.array([2**31], I64),
        str(2**31),
    ),
    "Int16": (pa.array([-32768, 32767], pa.int32()), ["-32768", "32767"], pa.array([40000], pa.int32()), "40000"),
    "Float32": (pa.array([1.5, -0.25]), ["1.5", "-0.25"], pa.array([1e39]), "1e+39"),
    "Date": (
        pa.array([dt.date(1970, 1, 1), dt.date(2149, 6, 6)]),
        ["1970-01-01", "2149-06-06"],
        pa.array([dt.date(1969, 12, 31)]),
        "datetime.date(1969, 12, 31)",
    ),
    "DateTime": (
        pa.array([t(1970, 1, 1), t(2024, 2, 29, 23, 59, 59, 999_999)], TS),
        ["1970-01-01 00:00:00", "2024-02-29 23:59:59"],
        pa.array([t(1969, 12, 31, 23, 59, 59)], TS),
        "1969, 12, 31, 23, 59, 59",
    ),
    "DateTime('Asia/Tokyo')": (
        pa.array([t(2024, 1, 1, 0, 0, 0)], TS),
        ["2024-01-01 09:00:00"],
        pa.array([t(2200, 1, 1)], TS),
        "2200, 1, 1",
    ),
    "DateTime64(3)": (
        pa.array([t(1960, 1, 1, 0, 0, 0, 1_999), t(2299, 12, 31, 23, 59, 59, 999_999)], TS),
        ["1960-01-01 00:00:00.001", "2299-12-31 23:59:59.999"],
        pa.array([t(1899, 12, 31)], TS),
        "1899, 12, 31",
    ),
    "LowCardinality(String)": (pa.array(["a", "b"]), ["a", "b"], pa.array([None], pa.string()), "None"),
    "Bool": (pa.array([True, False]), ["true", "false"], pa.array([None], pa.bool_()), "None"),
    "Decimal(18, 2)": (
        pa.array([Decimal("1.5"), Decimal("-9999999999999999.99")], pa.decimal128(38, 10)),
        ["1.5", "-9999999999999999.99"],
        pa.array([Decimal("0.125")], pa.decimal128(38, 10)),
        "Decimal('0.1250000000')",
    ),
    "Map(String, UInt64)": (
        pa.array([[("a", 1), ("b", 2**62)], []], pa.map_(pa.string(), I64)),
        [f"{{'a':1,'b':{2**62}}}", "{}"],
        pa.array([[("a", -5)]], pa.map_(pa.string(), I64)),
        "-5",
    ),
    "Enum8('a' = 1, 'b' = 2)": (pa.array(["a", "b"]), ["a", "b"], pa.array(["c"]), "'c'"),
    "FixedString(3)": (pa.array(["abc", "xyz"]), ["abc", "xyz"], pa.array(["abcd"]), "'abcd'"),
    "UUID": (
        pa.array(["61f0c404-5cb3-11e7-907b-a6006ad3dba0"]),
        ["61f0c404-5cb3-11e7-907b-a6006ad3dba0"],
        pa.array(["not-a-uuid"]),
        "'not-a-uuid'",
    ),
    "IPv4": (
        pa.array(["10.0.0.1", "255.255.255.255"]),
        ["10.0.0.1", "255.255.255.255"],
        pa.array(["10.0.0.256"]),
        "'10.0.0.256'",
    ),
    "IPv6": (pa.array(["::1", "2001:db8::1"]), ["::1", "2001:db8::1"], pa.array(["x::1"]), "'x::1'"),
    "Array(UInt8)": (
        pa.array([[1, 255], []], pa.list_(I64)),
        ["[1,255]", "[]"],
        pa.array([[1, 256]], pa.list_(I64)),
        "256",
    ),
    "Tuple(a UInt16, b String)": (
        pa.array([{"a": 7, "b": "x"}], pa.struct([("a", I64), ("b", pa.string())])),
        ["(7,'x')"],
        pa.array([{"a": -7, "b": "x"}], pa.struct([("a", I64), ("b", pa.string())])),
        "-7",
    ),
}
PATHS = {"Map(String, UInt64)": "`v.value`", "Array(UInt8)": "`v[]`", "Tuple(a UInt16, b String)": "`v.a`"}


@pytest.fixture
def admin(clickhouse_url: str, database: str) -> Iterator[ClickHouseHTTP]:
    c = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="typed", **target_fields()))
    yield c
    c.close()


def typed_table(admin: ClickHouseHTTP, database: str, ch_type: str, name: str) -> Target:
    admin.command(
        f"CREATE TABLE {q.qualified(database, name)} (id UInt64, v {ch_type}) "
        "ENGINE = MergeTree PARTITION BY id % 2 ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 1000"
    )
    return Target(url=admin.target.url, database=database, table=name, **target_fields())


def plan_for(admin: ClickHouseHTTP, target: Target, schema: pa.Schema) -> ConversionPlan:
    """What the writer does on the driver, once per query."""
    info = describe_table(admin, target.database, target.table)
    check_schema(info, schema)
    return ConversionPlan(info.display, conversion_columns(info, schema))


def spark_batch(values: pa.Array, first_id: int = 0) -> pa.RecordBatch:
    ids = pa.array(range(first_id, first_id + len(values)), I64)
    return pa.record_batch([ids, values], schema=pa.schema([("id", I64), ("v", values.type)]))


def stored(admin: ClickHouseHTTP, target: Target) -> list[str]:
    fq = q.qualified(target.database, target.table)
    return [
        r["s"]
        for r in admin.query_json(f"SELECT toString(v) AS s FROM {fq} ORDER BY id SETTINGS implicit_transaction = 1")
    ]


def leftovers(admin: ClickHouseHTTP, database: str) -> list[str]:
    return [
        r["name"]
        for r in admin.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
        if r["name"].startswith(STAGE_PREFIX)
    ]


@pytest.mark.parametrize("ch_type", list(CASES))
def test_values_that_fit_land_exactly_in_every_exactly_once_mode(admin, database, tmp_path: Path, ch_type):
    good, expected, _, _ = CASES[ch_type]
    for i, mode in enumerate(MODES):
        target = typed_table(admin, database, ch_type, f"typed_{mode}")
        batch = spark_batch(good)
        co = build_coordinator(
            target, mode, f"q{i}", str(tmp_path / mode), conversion=plan_for(admin, target, batch.schema)
        )
        co.validate(batch.schema)
        msgs = [co.prepare(WriteContext(f"q{i}", 0, 0, 0), iter([batch]))]
        co.commit_batch(0, msgs)
        assert stored(admin, target) == expected, mode


@pytest.mark.parametrize("ch_type", list(CASES))
def test_a_value_that_does_not_fit_fails_naming_the_column_and_leaves_the_table_unchanged(
    admin, database, tmp_path: Path, ch_type
):
    good, expected, bad, shown = CASES[ch_type]
    for i, mode in enumerate(MODES):
        target = typed_table(admin, database, ch_type, f"typed_{mode}")
        # A good batch first, so a mode that streams would already have sent rows.
        batches = [spark_batch(good), spark_batch(bad, first_id=len(good))]
        co = build_coordinator(
            target, mode, f"q{i}", str(tmp_path / mode), conversion=plan_for(admin, target, batches[0].schema)
        )
        with pytest.raises(ValueDoesNotFitError) as e:
            co.prepare(WriteContext(f"q{i}", 0, 0, 0), iter(batches))
        msg = str(e.value)
        assert f"{database}.typed_{mode}: value " in msg and shown in msg, mode
        assert f"column {PATHS.get(ch_type, '`v`')} at row {len(good)} " in msg, mode
        assert f"ClickHouse type {ch_type}" in msg and e.value.xid, mode
        assert stored(admin, target) == [], mode
        assert leftovers(admin, database) == [], mode


def _spark_schema(*fields: tuple[str, object, bool]):
    from pyspark.sql import types as T

    return T.StructType([T.StructField(n, dt, nullable) for n, dt, nullable in fields])


def test_the_writer_builds_its_plan_on_the_driver_from_the_tables_own_types(
    admin, clickhouse_url: str, database: str
) -> None:
    from pyspark.sql import types as T

    from spark_datasource.options.writer_options import WriterOptions
    from spark_datasource.sink.setup import prepare_target

    typed_table(admin, database, "DateTime", "events")
    opts = WriterOptions.parse(
        {
            "url": clickhouse_url,
            "database": database,
            "table": "events",
            "batch_size": "1000",
            "batch_bytes": "4096",
            "strict_precision": "true",
            **writer_options(),
        },
        streaming=False,
    )
    plan = prepare_target(opts, _spark_schema(("id", T.LongType(), False), ("v", T.TimestampType(), True)))
    assert plan == ConversionPlan(
        f"{database}.events",
        (("id", "UInt64"), ("v", "DateTime")),
        strict_precision=True,
        batch_rows=1000,
        batch_bytes=4096,
    )


def test_routing_into_tables_whose_column_types_differ_is_refused_on_the_driver(
    admin, clickhouse_url: str, database: str
) -> None:
    from pyspark.sql import types as T

    from clickhouse_tx.errors import ConfigurationError
    from spark_datasource.options.writer_options import WriterOptions
    from spark_datasource.sink.setup import prepare_target

    typed_table(admin, database, "UInt8", "a")
    typed_table(admin, database, "UInt16", "b")
    typed_table(admin, database, "UInt8", "c")
    schema = _spark_schema(("id", T.LongType(), False), ("v", T.LongType(), True), ("dest", T.StringType(), False))
    base = {"url": clickhouse_url, "database": database, "table": "a", "table_column": "dest", **writer_options()}
    same = prepare_target(WriterOptions.parse({**base, "tables": "a,c"}, streaming=False), schema)
    assert same.columns == (("id", "UInt64"), ("v", "UInt8"))
    with pytest.raises(ConfigurationError, match="routed tables have different column types"):
        prepare_target(WriterOptions.parse({**base, "tables": "a,b"}, streaming=False), schema)


# ------------------------------------------------------------------ dead letters (transaction)


def _dead_letters(admin: ClickHouseHTTP, database: str) -> list[dict]:
    return admin.query_json(
        f"SELECT txn_id, batch, `partition`, xid, `row`, `column`, reason, row_json, `table` "
        f"FROM {q.qualified(database, 'dlq')} ORDER BY `row` SETTINGS implicit_transaction = 1"
    )


def _dead_letter_setup(admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str):
    """A UInt8 target, a ``dlq`` table, a batch with two misfits (rows 1 and 3) and a
    coordinator factory whose plan sends misfits to ``dlq``."""
    from clickhouse_tx.conversion.dead_letters import dead_letter_ddl

    target = typed_table(admin, database, "UInt8", "typed")
    admin.command(dead_letter_ddl(database, "dlq", dedup_window=mode == "dedup"))
    batch = spark_batch(pa.array([1, 300, 2, -1, 3], I64))
    base = plan_for(admin, target, batch.schema)
    plan = ConversionPlan(base.table, base.columns, dead_letter_table=(database, "dlq"))

    def coordinator():
        return build_coordinator(target, mode, "q", str(tmp_path), conversion=plan)

    return target, batch, coordinator


def _replay_commits_rows_and_dead_letters_once(admin, database: str, target, batch, coordinator) -> list[dict]:
    """Attempt 1 of partition 0 of batch 5 prepares and commits (twice: the second changes
    nothing); the good rows and both dead letters are stored once, under its xid."""
    again = coordinator().prepare(WriteContext("q", 5, 0, 1), iter([batch]))
    coordinator().commit_batch(5, [again])
    coordinator().commit_batch(5, [again])  # a replayed commit changes nothing
    assert stored(admin, target) == ["1", "2", "3"]
    letters = _dead_letters(admin, database)
    assert [(d["row"], d["column"], d["xid"], d["batch"], d["partition"]) for d in letters] == [
        (1, "v", again.xid, 5, 0),
        (3, "v", again.xid, 5, 0),
    ]
    assert letters[0]["row_json"] == '{"id": 1, "v": 300}' and "outside the range of UInt8" in letters[0]["reason"]
    return letters


def test_dead_letters_commit_with_their_partition_exactly_once_across_an_aborted_attempt(
    admin, database: str, tmp_path: Path
) -> None:
    target, batch, coordinator = _dead_letter_setup(admin, database, tmp_path, "transaction")

    # Attempt 0 prepares (rows and dead letters in its open transaction), then the batch aborts.
    first = coordinator().prepare(WriteContext("q", 5, 0, 0), iter([batch]))
    assert first.details["dead_letters"] == 2 and first.rows == 3
    assert _dead_letters(admin, database) == [] and stored(admin, target) == []
    coordinator().abort_batch(5, [first])
    # The replay commits: good rows and dead letters together, once.
    letters = _replay_commits_rows_and_dead_letters_once(admin, database, target, batch, coordinator)
    assert {d["table"] for d in letters} == {f"{database}.typed"} and {d["txn_id"] for d in letters} == {"q"}


def test_in_dedup_mode_a_replayed_partition_writes_its_dead_letters_once(admin, database: str, tmp_path: Path) -> None:
    target, batch, coordinator = _dead_letter_setup(admin, database, tmp_path, "dedup")

    first = coordinator().prepare(WriteContext("q", 5, 0, 0), iter([batch]))
    assert first.details["dead_letters"] == 2
    # The task attempt is lost after writing (dedup's rows are visible at once); a retry
    # of the partition writes the same rows and dead letters again, and both are dropped.
    again = coordinator().prepare(WriteContext("q", 5, 0, 1), iter([batch]))
    coordinator().commit_batch(5, [again])
    assert stored(admin, target) == ["1", "2", "3"]
    assert [(d["row"], d["column"], d["xid"]) for d in _dead_letters(admin, database)] == [
        (1, "v", first.xid),
        (3, "v", first.xid),
    ]


def test_in_staging_mode_dead_letters_move_with_their_partition_once_across_a_rollback(
    admin, database: str, tmp_path: Path
) -> None:
    from clickhouse_tx.modes.staging.tables import DEAD_LETTER_STAGE_PREFIX, dead_letter_stage_name

    target, batch, coordinator = _dead_letter_setup(admin, database, tmp_path, "staging")

    def dl_stages() -> list[str]:
        return [
            r["name"]
            for r in admin.query_json(
                "SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database}
            )
            if r["name"].startswith(DEAD_LETTER_STAGE_PREFIX)
        ]

    # Attempt 0 stages rows and dead letters (two stages, nothing visible), then the batch aborts.
    first = coordinator().prepare(WriteContext("q", 5, 0, 0), iter([batch]))
    assert first.details["dead_letters"] == 2 and first.rows == 3
    assert dl_stages() == [dead_letter_stage_name(first.xid)]
    assert _dead_letters(admin, database) == [] and stored(admin, target) == []
    coordinator().abort_batch(5, [first])
    assert dl_stages() == [] and leftovers(admin, database) == []
    # The replay commits: good rows and dead letters moved together, once.
    _replay_commits_rows_and_dead_letters_once(admin, database, target, batch, coordinator)
    assert dl_stages() == [] and leftovers(admin, database) == []


def test_in_staging_mode_a_commit_cut_after_the_rows_moved_rolls_forward_the_dead_letters_once(
    admin, database: str, tmp_path: Path
) -> None:
    from clickhouse_tx.conversion.dead_letters import dead_letter_ddl
    from clickhouse_tx.modes.staging.mode import StagingMode
    from clickhouse_tx.modes.staging.tables import stage_name

    target = typed_table(admin, database, "UInt8", "typed")
    admin.command(dead_letter_ddl(database, "dlq"))
    batch = spark_batch(pa.array([1, 300, 2, -1, 3], I64))
    plan = plan_for(admin, target, batch.schema)
    plan = ConversionPlan(plan.table, plan.columns, dead_letter_table=(database, "dlq"))
    p = build_coordinator(target, "staging", "q", str(tmp_path), conversion=plan).prepare(
        WriteContext("q", 5, 0, 0), iter([batch])
    )
    mode = StagingMode()
    # A driver that died after moving the rows' partitions, before the dead letters':
    # a rollback is refused (the rows are in), the roll-forward moves the rest once.
    for pid in mode._partitions(admin, database, stage_name(p.xid)):
        admin.command(
            f"ALTER TABLE {q.qualified(database, stage_name(p.xid))} MOVE PARTITION ID "
            f"{q.quote_string(pid)} TO TABLE {q.qualified(database, 'typed')}"
        )
    with pytest.raises(Exception, match="roll it forward"):
        mode.rollback(target, p)
    assert _dead_letters(admin, database) == []
    mode.commit(target, p)
    mode.commit(target, p)
    assert stored(admin, target) == ["1", "2", "3"]
    assert [(d["row"], d["xid"]) for d in _dead_letters(admin, database)] == [(1, p.xid), (3, p.xid)]


def test_gc_drops_the_dead_letter_stage_of_a_staging_prepare_no_batch_decided(
    admin, database: str, clickhouse_url: str, tmp_path: Path
) -> None:
    from clickhouse_tx.conversion.dead_letters import dead_letter_ddl
    from clickhouse_tx.modes.staging.tables import dead_letter_stage_name
    from tests.helpers.cli import run_cli as _cli

    target = typed_table(admin, database, "UInt8", "typed")
    admin.command(dead_letter_ddl(database, "dlq"))
    batch = spark_batch(pa.array([1, 300, 2], I64))
    plan = plan_for(admin, target, batch.schema)
    plan = ConversionPlan(plan.table, plan.columns, dead_letter_table=(database, "dlq"))
    chk = str(tmp_path / "chk")
    # Batch 0 commits (the query's decision log exists); an executor prepared batch 1,
    # then its driver died before deciding it.
    co = build_coordinator(target, "staging", "q", chk, conversion=plan)
    co.commit_batch(0, [co.prepare(WriteContext("q", 0, 0, 0), iter([spark_batch(pa.array([7], I64), 100)]))])
    p = build_coordinator(target, "staging", "q", chk, conversion=plan).prepare(
        WriteContext("q", 1, 0, 0), iter([batch])
    )
    names = {
        r["name"]
        for r in admin.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
    }
    assert dead_letter_stage_name(p.xid) in names and leftovers(admin, database)
    gc = _cli(
        "gc",
        "--url",
        clickhouse_url,
        "--table",
        f"{database}.typed",
        "--mode",
        "staging",
        "--checkpoint",
        chk,
        "--txn-id",
        "q",
        "--older-than",
        "0",
        "--json",
    )
    assert gc.returncode == 0, gc.stdout + gc.stderr
    names = {
        r["name"]
        for r in admin.query_json("SELECT name FROM system.tables WHERE database = {d:String}", params={"d": database})
    }
    assert dead_letter_stage_name(p.xid) not in names and leftovers(admin, database) == []
    assert _dead_letters(admin, database) == [] and stored(admin, target) == ["7"]
