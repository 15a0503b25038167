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
runs); a batch job in mode ``transaction`` (killed in its job stage's INSERT). In mode
``dedup`` the worker sends each chunk from memory at once, so the kill lands while the
server runs the INSERT but not reliably inside its body (the case prints which).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers.batch_torture import run_batch_child
from tests.helpers.cli import run_cli
from tests.helpers.foreach_torture import APP_ID, JOB, SPLIT
from tests.helpers.insert_kill import InsertKill, open_transactions
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


def _committed(url: str, database: str, table: str, tables: int) -> str:
    """The SELECT of 1 once ``table`` holds micro-batch 0 (its rows committed, read committed)."""
    rows = MAX_OFFSETS // tables
    return f"SELECT count() >= {rows} FROM `{database}`.`{table}` SETTINGS implicit_transaction = 1"


def _assert_mid_body(kill: InsertKill, insert_rows: int) -> None:
    """The kill fired, and the server never read the whole body of the INSERT it interrupted."""
    assert kill.fired is not None, f"no INSERT reached {kill.rows} rows read; INSERTs seen, rows read: {kill.progress}"
    print(kill.fired.summary())
    assert kill.fired.final_read_rows < insert_rows, (
        f"the INSERT read all {insert_rows} rows: the kill came after its body, not in it ({kill.fired.summary()})"
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
    _assert_mid_body(kill, MAX_OFFSETS // len(tables))
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
    args = job_args(kafka_bootstrap, topic, clickhouse_url, database, tmp_path / "chk", **more)
    # One INSERT per Kafka partition and micro-batch: one of micro-batch 1's, once 0 committed.
    armed = _committed(clickhouse_url, database, "events", 1)
    # Mode dedup sends a chunk only once it holds it all (its token is the chunk's hash):
    # the source's pace does not slow its body, which the server reads in tens of ms (seen:
    # read_rows 0, then the whole chunk). There the kill fires as soon as the INSERT shows,
    # and the case is skipped when every INSERT ended between two polls.
    kill = InsertKill(clickhouse_url, database, SINK_INSERTS[mode], 0 if mode == "dedup" else KILL_AT, armed=armed)
    paced = {"delay_s": PACE_S, "delay_rows": SLICE_ROWS}  # the source's rows, in slices
    if mode == "dedup":
        # Its INSERTs can end between two polls of the process list: then nothing was killed.
        code = run_child({**args, **paced}, timeout_s=TEST_TIMEOUT_S, watch=kill.watch)
        if kill.fired is None:
            pytest.skip(f"every dedup INSERT ended between two polls (exit {code}): nothing killed, {kill.progress}")
        codes = [code, run_child(args, timeout_s=TEST_TIMEOUT_S, check=False)]
        assert codes == [-signal.SIGKILL, 0], f"exit codes {codes} (killed run, restart)"
    else:
        _stream_killed_then_restarted(args, kill, "tests.helpers.torture", paced)
    if mode == "dedup":
        assert kill.fired is not None
        print(kill.fired.summary())  # whether its body was cut is the machine's timing
    else:
        _assert_mid_body(kill, MAX_OFFSETS // PARTITIONS)
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
    _assert_mid_body(kill, JOB_ROWS // JOB_PARTITIONS)
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
