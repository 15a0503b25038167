"""Writing into ``Replicated*MergeTree`` targets: stage tables of their own, and no write
that reports success for rows the server did not take.

The embedded engine creates Replicated tables but never activates their replicas (chdb
has no interserver endpoint): every replica is read-only, as a real server's is while
it has no Keeper session. So these tests show what the embedded engine can: the DDL of
stages for every form of engine clause, and every mode refusing or failing with
``TABLE_IS_READ_ONLY`` with nothing claimed written. Moving a stage into a writable
Replicated target is certified by ``make test-external`` against a real cluster
(``tests/torture/test_replicated_kill.py``).
"""

from __future__ import annotations

import dataclasses
import http.client
import time
import uuid
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import TABLE_IS_READ_ONLY
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ClickHouseTxError, ServerBusyError, ServerError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext
from clickhouse_tx.modes.staging.tables import STAGE_PATH_SUFFIX, create_stage_table
from spark_datasource.testing.credentials import target_fields
from tests.helpers.tables import batches, rows

pytestmark = pytest.mark.embedded_only("needs replicas that are read-only, as the embedded engine's always are")

#: Every form of engine clause a Replicated target is written with: (engine, UUID needed).
ENGINES = {
    "literal path": "ReplicatedMergeTree('/clickhouse/tables/{run}/events', 'r1')",
    "macro path": "ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/{{database}}/{{table}}', '{{replica}}')",
    "no arguments": "ReplicatedMergeTree",
}
#: The server fails an insert into a read-only replica at once instead of retrying for minutes.
NO_KEEPER_RETRIES = {"insert_keeper_max_retries": "0"}


def _replicated_table(admin: ClickHouseHTTP, database: str, form: str, table: str = "events") -> Target:
    engine = ENGINES[form].format(run=f"{database}_{uuid.uuid4().hex[:8]}")
    # Without arguments the server's default path takes {uuid}: a plain CREATE may use it
    # only with a UUID given (or ON CLUSTER, or a Replicated database), as on any server.
    given = f" UUID {q.quote_string(str(uuid.uuid4()))}" if form == "no arguments" else ""
    admin.command(
        f"CREATE TABLE {q.qualified(database, table)}{given} (id UInt64, s String) "
        f"ENGINE = {engine} PARTITION BY id % 4 ORDER BY id SETTINGS replicated_deduplication_window = 1000"
    )
    return Target(url=admin.target.url, database=database, table=table, **target_fields())


def _replica(admin: ClickHouseHTTP, database: str, table: str) -> dict[str, object] | None:
    found = admin.query_json(
        "SELECT zookeeper_path, replica_name, is_readonly FROM system.replicas "
        "WHERE database = {d:String} AND table = {t:String}",
        params={"d": database, "t": table},
    )
    return found[0] if found else None


def _count(admin: ClickHouseHTTP, target: Target) -> int:
    return int(admin.query_json(f"SELECT count() AS c FROM {q.qualified(target.database, target.table)}")[0]["c"])


@pytest.mark.parametrize("form", list(ENGINES))
def test_a_stage_of_a_replicated_target_takes_a_keeper_path_of_its_own_beside_the_targets(
    admin: ClickHouseHTTP, database: str, form: str
) -> None:
    _replicated_table(admin, database, form)
    target_replica = _replica(admin, database, "events")
    assert target_replica is not None
    for _ in range(2):  # a retried CREATE whose reply was lost finds its stage
        create_stage_table(admin, database, "_ctx_stage_x", (database, "events"), if_not_exists=True)
    stage_replica = _replica(admin, database, "_ctx_stage_x")
    assert stage_replica == {
        **target_replica,
        "zookeeper_path": f"{target_replica['zookeeper_path']}{STAGE_PATH_SUFFIX}/_ctx_stage_x",
    }
    shown = {
        name: admin.query_json(
            "SELECT partition_key, sorting_key, engine FROM system.tables "
            "WHERE database = {d:String} AND name = {t:String}",
            params={"d": database, "t": name},
        )
        for name in ("events", "_ctx_stage_x")
    }
    assert shown["events"] == shown["_ctx_stage_x"]  # what MOVE PARTITION compares
    # Dropped with its Keeper data: the same stage can be made again at the same path.
    admin.command(f"DROP TABLE {q.qualified(database, '_ctx_stage_x')} SYNC")
    create_stage_table(admin, database, "_ctx_stage_x", (database, "events"), if_not_exists=False)
    assert _replica(admin, database, "_ctx_stage_x") == stage_replica


def test_a_replicated_table_without_arguments_takes_the_stacks_default_path_and_macros(
    admin: ClickHouseHTTP, database: str
) -> None:
    _replicated_table(admin, database, "no arguments")
    table_uuid = admin.command(
        "SELECT uuid FROM system.tables WHERE database = {d:String} AND name = 'events'", params={"d": database}
    ).strip()
    assert _replica(admin, database, "events") == {
        "zookeeper_path": f"/clickhouse/tables/{table_uuid}/0",
        "replica_name": "r0",
        "is_readonly": 1,
    }


@pytest.mark.parametrize(
    "ddl, code",
    [
        ("(id UInt64, s String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{run}', 'r1') ORDER BY id", 242),
        ("(id UInt64, s String, CONSTRAINT small CHECK id < 10) ENGINE = MergeTree ORDER BY id", 469),
    ],
    ids=["read-only replica", "violated constraint"],
)
def test_the_embedded_server_answers_a_streamed_insert_its_table_refuses_with_the_tables_error(
    admin: ClickHouseHTTP, database: str, ddl: str, code: int
) -> None:
    admin.command(f"CREATE TABLE {q.qualified(database, 'r')} {ddl.format(run=database)}")
    with pytest.raises(ServerError) as err:
        admin.insert_arrow_stream(q.qualified(database, "r"), rows(100).schema, batches(rows(100)), NO_KEEPER_RETRIES)
    assert err.value.code == code
    assert admin.query_json(f"SELECT count() AS c FROM {q.qualified(database, 'r')}") == [{"c": 0}]


def test_the_embedded_server_answers_a_native_insert_into_a_read_only_replica_with_its_error(
    admin: ClickHouseHTTP, database: str, ch_client: object
) -> None:
    _replicated_table(admin, database, "literal path")
    with pytest.raises(Exception, match="TABLE_IS_READ_ONLY"):
        ch_client.insert("events", [[1, "a"]], column_names=["id", "s"], settings=NO_KEEPER_RETRIES)  # type: ignore[attr-defined]
    assert _replica(admin, database, "events") is not None
    assert admin.query_json("SELECT count() AS c FROM events") == [{"c": 0}]


def test_an_insert_body_cut_off_between_two_record_batches_writes_nothing(
    admin: ClickHouseHTTP, database: str, clickhouse_url: str
) -> None:
    # A cut at a message boundary leaves a shorter valid Arrow stream: only the server
    # knowing that the body broke off keeps it from being inserted as if complete.
    admin.command(f"CREATE TABLE {q.qualified(database, 'cut')} (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, rows(1).schema)
    writer.write_batch(rows(500).to_batches()[0])
    head = sink.getvalue().to_pybytes()  # the schema and one batch, no end-of-stream marker
    host, port = clickhouse_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    conn.putrequest("POST", f"/?database={database}&query=INSERT+INTO+cut+FORMAT+ArrowStream")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"%x\r\n%b\r\n" % (len(head), head))
    time.sleep(0.5)  # the server reads the first batch; then the client dies
    conn.sock.close()
    deadline = time.monotonic() + 10
    running = "SELECT count() AS c FROM system.processes WHERE query LIKE '%INTO cut%' AND query NOT LIKE '%processes%'"
    while time.monotonic() < deadline and admin.query_json(running) != [{"c": 0}]:
        time.sleep(0.1)
    assert admin.query_json("SELECT count() AS c FROM cut") == [{"c": 0}]


def _prepare_one(target: Target, mode: str, tmp_path: Path) -> Callable[[], object]:
    co = build_coordinator(target, mode, f"ro-{uuid.uuid4().hex[:8]}", str(tmp_path))
    return lambda: co.prepare(WriteContext(co.txn_id, 0, 0, 0), batches(rows(1000)))


@pytest.mark.parametrize("mode", ["none", "dedup", "staging"])
@pytest.mark.parametrize("form", ["literal path", "macro path"])
def test_every_mode_refuses_a_read_only_replica_on_the_driver_naming_table_is_read_only(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str, form: str
) -> None:
    target = _replicated_table(admin, database, form)
    started = time.monotonic()
    with pytest.raises(ServerBusyError, match="read-only replica") as err:
        build_coordinator(target, mode, "q", str(tmp_path)).validate(rows(1).schema)
    assert (err.value.code, err.value.name) == (TABLE_IS_READ_ONLY, "TABLE_IS_READ_ONLY")
    assert time.monotonic() - started < 10
    assert _count(admin, target) == 0


@pytest.mark.parametrize("mode", ["none", "dedup", "staging"])
def test_a_task_writing_into_a_read_only_replica_fails_with_its_error_and_claims_no_row(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, mode: str
) -> None:
    # The executor's side, as when the replica turns read-only after the driver's check.
    target = _replicated_table(admin, database, "macro path")
    at_once = dataclasses.replace(target, settings={**target.settings, **NO_KEEPER_RETRIES})
    with pytest.raises(ClickHouseTxError) as err:
        _prepare_one(at_once, mode, tmp_path)()
    assert err.value.code == TABLE_IS_READ_ONLY, err.value
    assert _count(admin, target) == 0
    leftovers = admin.query_json(
        "SELECT name FROM system.tables WHERE database = {d:String} AND startsWith(name, '_ctx_')",
        params={"d": database},
    )
    assert leftovers == []  # the stage that could not be filled is dropped with the attempt
