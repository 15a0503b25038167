"""A driver SIGKILLed in the middle of an INSERT body, then restarted: every record once, no session timeout.

The other kill tests kill at protocol steps, between requests. Here the kill comes from
outside, by the server's progress (:class:`tests.helpers.insert_kill.InsertKill`): once
the server's ``system.processes`` shows an INSERT into the target (or its stage) that
has read ``KILL_AT`` rows, the child's whole process group (driver Python, JVM, Python
workers) is SIGKILLed, so the INSERT's body breaks off and the server ends that INSERT
(and, inside a transaction, fails the transaction: only a ROLLBACK may follow in its
session). Then the query is restarted once on the same checkpoint (the batch job run
again as it is), and must succeed at once and leave every record exactly once. The
killed run's bodies are slowed (:data:`PACE_S`) and sent in small record batches, so the
server's ``read_rows`` grows while the body is still coming and the kill lands inside
it; each test checks that the interrupted INSERT never read its whole body.

Every writer runs with ``session_timeout=3600`` (the default) and every test with an
overall timeout of minutes: nothing may wait for a session to expire. What the killed
attempt left is checked, not timed: no transaction open at the kill is open after the
restart, plain reads (which see open transactions' rows) count every record once, no
registry entry is left open, and the helper's restart says it rolled back the killed
attempt's transaction in the key's session.

Cases: the ``foreachBatch`` helper in mode ``transaction`` into one table, and its
``clickhouse_tx_transaction`` context into two (killed in the second table's INSERT);
the sink in modes ``transaction``, ``staging`` and ``dedup`` (the INSERT a Python worker
runs); a batch job in mode ``transaction`` (killed in its job stage's INSERT).

Mode ``dedup`` sends each chunk from memory, with a ``Content-Length``, once it holds it
all: pacing the source does not slow its body, which one Arrow message carries (the
server's ``read_rows`` goes from 0 to the chunk's rows at its end). So its killed run
writes through a :class:`~spark_datasource.testing.chaos.proxy.FaultProxy` whose
``slow`` fault (both directions, the request's included) moves a chunk's body in 2 to
:data:`SLOW_BODY_S` seconds, and the kill fires once an INSERT of micro-batch 1 has run
:data:`KILL_AFTER_S` (its ``read_rows`` still 0: the embedded server reads a body under
1 MiB whole before its query parses it). The body does not all sit in the driver's
process: the kernel holds what it wrote of it (megabytes on loopback) and still
delivers it after the SIGKILL, so the proxy resets its connections right after the
kill (a driver whose host died): the server never gets the rest of the body. The case
checks that the kill came early in the body, that the INSERT had read fewer rows than
the chunk's and never finished (no ``QueryFinish`` in its query log, nothing written).
The restart goes through the proxy with no fault.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pyarrow as pa
import pytest

from spark_datasource.testing.chaos.proxy import FaultProxy
from tests.helpers.batch_torture import run_batch_child
from tests.helpers.cli import run_cli
from tests.helpers.foreach_torture import APP_ID, JOB, SPLIT
from tests.helpers.insert_kill import InsertKill, open_transactions, query_log_types
from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    expected_totals,
    open_registry_entries,
    read_committed,
    run_sql,
    table_names,
)
from tests.helpers.torture import PARTITIONS, job_args, run_child

#: Records per Kafka partition, and per micro-batch: two micro-batches of 75,000.
PER_PARTITION, MAX_OFFSETS = 50_000, 75_000
#: The rows the server has read of an INSERT when the kill is sent.
KILL_AT = 10_000
#: The session timeout of every writer: the default, an hour. No restart may wait for it.
SESSION_TIMEOUT = "3600"
#: The killed run's INSERT bodies are slowed (a slow driver or source): each record batch
#: (the helper) or each slice of SLICE_ROWS source rows (the sink) comes PACE_S s after the
#: one before, so that the kill lands in the middle of a body, not after it.
PACE_S, SLICE_ROWS = 0.2, 2_000
#: Each test's own bound (seconds): a few minutes, far below the session timeout.
TEST_TIMEOUT_S = 360
#: Mode dedup's killed run: the seconds its proxy's slow fault takes to move a chunk's body
#: (a connection idle for a second sends its first third at once: at least 2 s), and how
#: long an INSERT has run when the kill is sent.
SLOW_BODY_S, KILL_AFTER_S = 3, 1.0


def _committed(url: str, database: str, table: str, tables: int) -> str:
    """The SELECT of 1 once ``table`` holds micro-batch 0 (its rows committed, read committed)."""
    rows = MAX_OFFSETS // tables
    return f"SELECT count() >= {rows} FROM `{database}`.`{table}` SETTINGS implicit_transaction = 1"


def _assert_mid_body(url: str, kill: InsertKill, insert_rows: int) -> None:
    """The kill fired, the server never read the whole body of the INSERT it interrupted,
    and that INSERT never finished (its query log has no ``QueryFinish``)."""
    assert kill.fired is not None, f"no INSERT reached {kill.rows} rows read; INSERTs seen, rows read: {kill.progress}"
    print(kill.fired.summary())
    assert kill.fired.read_rows < insert_rows and kill.fired.final_read_rows < insert_rows, (
        f"the INSERT read all {insert_rows} rows: the kill came after its body, not in it ({kill.fired.summary()})"
    )
    ended = query_log_types(url, kill.fired.query_id)
    print(f"the killed INSERT's query log: {ended}")
    assert ended and "QueryFinish" not in ended, (
        f"the killed INSERT of {insert_rows} rows finished, or left no log: {ended} ({kill.fired.summary()})"
    )


def _assert_nothing_left_open(url: str, database: str, kill: InsertKill, tables: dict[str, int]) -> None:
    """No transaction open at the kill is still open, and plain reads (which see open
    transactions' rows) count each table's rows: the restart ended what the killed attempt left."""
    assert kill.fired is not None
    still = kill.fired.open_tids & open_transactions(url)
    assert not still, f"transactions open at the kill are still open after the restart: {sorted(still)}"
    for table, rows in tables.items():
        seen = int(run_sql(url, f"SELECT count() FROM `{database}`.`{table}` FORMAT TSV"))
        assert seen == rows, f"plain reads of {table} see {seen} rows, {rows} committed"


def _stream_killed_then_restarted(args: dict, kill: InsertKill, module: str, paced: dict) -> list[int]:
    """The job (with ``paced``, its arguments that slow its INSERTs' bodies) killed by ``kill``,
    then restarted once on the same checkpoint as it is: both exit codes."""
    codes = [run_child({**args, **paced}, timeout_s=TEST_TIMEOUT_S, module=module, watch=kill.watch)]
    assert kill.fired is not None, f"the kill never fired (exit {codes[0]}); INSERTs seen, rows read: {kill.progress}"
    codes.append(run_child(args, timeout_s=TEST_TIMEOUT_S, module=module, check=False))
    print(f"exit codes {codes}")
    assert codes == [-signal.SIGKILL, 0], f"exit codes {codes} (killed run, restart)"
    return codes


def _helper_case(stack, bootstrap: str, url: str, database: str, tmp_path: Path, tables: list[str]) -> None:
    """The helper's job killed mid-INSERT of micro-batch 1 (its last table), restarted once."""
    topic, expected = make_topic(stack, bootstrap, PARTITIONS, PER_PARTITION)
    for table in tables:
        create_target(url, database, table)
    log = tmp_path / "foreach_batch.log"
    more = {"tables": tables, "log": str(log), "max_offsets": MAX_OFFSETS}
    args = job_args(bootstrap, topic, url, database, tmp_path / "chk", **more)
    args["helper_options"] = {"session_timeout": SESSION_TIMEOUT}
    # Micro-batch 1's INSERT into the last table: once micro-batch 0 committed.
    kill = InsertKill(url, database, tables[-1], KILL_AT, armed=_committed(url, database, tables[-1], len(tables)))
    _stream_killed_then_restarted(args, kill, JOB, {"paced_s": PACE_S})
    _assert_mid_body(url, kill, MAX_OFFSETS // len(tables))
    lines = log.read_text().splitlines()
    rolled_back = [line for line in lines if "rolled back the transaction an earlier attempt left open" in line]
    assert len(rolled_back) == 1 and "batch_id=1)" in rolled_back[0], lines
    assert not [line for line in lines if "skipped" in line], lines
    keys = read_committed(
        url,
        f"SELECT batch_id, count(), sum(rows) FROM `{database}`.clickhouse_tx_batches "
        f"WHERE app_id = '{APP_ID}' GROUP BY batch_id ORDER BY batch_id",
    )
    assert keys == [["0", "1", str(MAX_OFFSETS)], ["1", "1", str(MAX_OFFSETS)]], keys
    if tables == ["events"]:
        assert_exactly(url, database, expected)
        _assert_nothing_left_open(url, database, kill, {"events": len(expected)})
        return
    per_table = {t: {r for r in expected if r[1] % 2 == parity} for t, parity in SPLIT.items()}
    for table, rows in per_table.items():
        assert_exactly(url, database, rows, table)
    _assert_nothing_left_open(url, database, kill, {t: len(rows) for t, rows in per_table.items()})


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_helper_driver_killed_in_the_middle_of_its_insert_restarts_at_once_and_writes_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    _helper_case(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, ["events"])


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_two_table_context_killed_in_the_middle_of_its_second_insert_restarts_at_once_and_each_table_is_exact(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    _helper_case(stack, kafka_bootstrap, clickhouse_url, database, tmp_path, list(SPLIT))


#: The table each mode's executors INSERT into: the target, or the xid's stage (``-`` in xids).
SINK_INSERTS = {"transaction": "events", "staging": r"_ctx_stage_[^\s(]+", "dedup": "events"}


def _chunk_body_bytes(rows: list[tuple[int, int, str]]) -> int:
    """About the bytes of the ArrowStream body of a dedup chunk of ``rows``: the schema, one
    message of the rows (their ``(p, o, v)`` columns) and the end-of-stream marker."""
    p, o, v = zip(*rows)
    batch = pa.record_batch([pa.array(p, pa.int32()), pa.array(o, pa.int64()), pa.array(v)], names=["p", "o", "v"])
    return batch.schema.serialize().size + batch.serialize().size + 8


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("mode", list(SINK_INSERTS))
def test_a_sink_driver_killed_in_the_middle_of_a_workers_insert_restarts_at_once_and_writes_every_record_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, mode: str
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database, dedup_window=mode == "dedup")
    # Record batches of SLICE_ROWS rows: the server's read_rows of an INSERT grows by them.
    options = {"mode": mode, "session_timeout": SESSION_TIMEOUT, "batch_size": str(SLICE_ROWS)}
    more = {"options": options, "max_offsets": MAX_OFFSETS, "name": f"insert_kill_{mode}"}
    # One INSERT per Kafka partition and micro-batch: one of micro-batch 1's, once 0 committed.
    armed = _committed(clickhouse_url, database, "events", 1)
    chunk_rows = MAX_OFFSETS // PARTITIONS
    if mode != "dedup":
        args = job_args(kafka_bootstrap, topic, clickhouse_url, database, tmp_path / "chk", **more)
        kill = InsertKill(clickhouse_url, database, SINK_INSERTS[mode], KILL_AT, armed=armed)
        paced = {"delay_s": PACE_S, "delay_rows": SLICE_ROWS}  # the source's rows, in slices
        _stream_killed_then_restarted(args, kill, "tests.helpers.torture", paced)
        _assert_mid_body(clickhouse_url, kill, chunk_rows)
    else:
        # A chunk is one Arrow message sent from memory: the proxy slows its body, and the
        # kill fires once an INSERT of micro-batch 1 has run KILL_AFTER_S (read_rows still
        # 0: the message is not all there), then the proxy resets what the dead driver
        # left in its socket buffers.
        body = _chunk_body_bytes(sorted(r for r in expected if r[0] == 0 and r[1] >= chunk_rows)[:chunk_rows])
        with FaultProxy(("127.0.0.1", stack.clickhouse_port)) as proxy:
            url = f"http://127.0.0.1:{proxy.port}"
            args = job_args(kafka_bootstrap, topic, url, database, tmp_path / "chk", **more)
            proxy.inject("slow", 2 * TEST_TIMEOUT_S, rate=body // SLOW_BODY_S)
            print(f"dedup: a chunk of {chunk_rows} rows, a body of about {body} bytes at {body // SLOW_BODY_S} B/s")

            def reset() -> None:  # the dead driver's bytes still on their way never arrive
                proxy.inject("reset", TEST_TIMEOUT_S)

            kill = InsertKill(
                clickhouse_url, database, SINK_INSERTS[mode], 0, armed=armed, on_kill=reset, elapsed_s=KILL_AFTER_S
            )
            codes = [run_child(args, timeout_s=TEST_TIMEOUT_S, watch=kill.watch)]
            assert kill.fired is not None, f"the kill never fired (exit {codes[0]}); INSERTs seen: {kill.progress}"
            _assert_mid_body(clickhouse_url, kill, chunk_rows)
            assert KILL_AFTER_S <= kill.fired.elapsed_s < SLOW_BODY_S - 1, (
                f"the kill came too late into a body of about {SLOW_BODY_S} s: {kill.fired.summary()}"
            )
            # Every INSERT of micro-batch 1 takes 2 s or more: none ended before the kill,
            # and the killed one wrote nothing (mode dedup's rows are seen at once).
            seen = int(run_sql(clickhouse_url, f"SELECT count() FROM `{database}`.events FORMAT TSV"))
            assert seen == MAX_OFFSETS, f"after the kill the target holds {seen} rows, not micro-batch 0's"
            proxy.clear()
            codes.append(run_child(args, timeout_s=TEST_TIMEOUT_S, check=False))
        print(f"exit codes {codes}")
        assert codes == [-signal.SIGKILL, 0], f"exit codes {codes} (killed run, restart)"
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_")]
    _assert_nothing_left_open(clickhouse_url, database, kill, {"events": len(expected)})


#: The batch job's rows and partitions: one INSERT of 50,000 rows per partition.
JOB_ROWS, JOB_PARTITIONS = 150_000, 3


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_batch_job_killed_in_the_middle_of_an_insert_and_run_again_as_it_is_writes_each_row_once(
    stack, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    job = {
        "url": clickhouse_url,
        "database": database,
        "mode": "transaction",
        "n": JOB_ROWS,
        "partitions": JOB_PARTITIONS,
        "options": {"session_timeout": SESSION_TIMEOUT, "batch_size": str(SLICE_ROWS)},
    }
    # The job writes into a job stage of its own (_ctx_ow_<txn>_<hex>), published at its end.
    kill = InsertKill(clickhouse_url, database, r"_ctx_ow_\w+", KILL_AT)
    paced = {"delay_s": PACE_S, "delay_rows": SLICE_ROWS}
    first, _ = run_batch_child({**job, **paced}, timeout_s=TEST_TIMEOUT_S, watch=kill.watch)
    assert kill.fired is not None, f"the kill never fired (exit {first}); INSERTs seen, rows read: {kill.progress}"
    second, err = run_batch_child(job, timeout_s=TEST_TIMEOUT_S)
    print(f"exit codes {[first, second]}")
    assert first == -signal.SIGKILL and second == 0, f"exit codes {[first, second]}: {err[-3000:]}"
    _assert_mid_body(clickhouse_url, kill, JOB_ROWS // JOB_PARTITIONS)
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(JOB_ROWS)
    # The killed job is a job of its own: its stage and prepared xids (the transaction of a
    # partition whose INSERT had ended stays open) are left for the documented clean-up,
    # gc of its transactional id (docs/modes.md).
    stages = [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_ow_")]
    txns = run_sql(
        clickhouse_url,
        f"SELECT DISTINCT txn_id FROM `{database}`.clickhouse_tx_registry "
        f"WHERE lower(state) NOT IN ('committed', 'aborted') FORMAT TSV",
    ).split()
    print(f"left by the killed job: stages {stages}, transactional ids {txns}")
    assert len(txns) == 1 and len(stages) == 1, (stages, txns)
    done = run_cli(
        "gc", "--url", clickhouse_url, "--table", f"{database}.events", "--mode", "transaction",
        "--txn-id", txns[0], "--not-running", "--older-than", "0",
    )  # fmt: skip
    assert done.returncode == 0, f"gc: {done.stdout}{done.stderr}"
    assert open_registry_entries(clickhouse_url, database) == 0
    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_")]
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(JOB_ROWS)
    _assert_nothing_left_open(clickhouse_url, database, kill, {"events": JOB_ROWS})
