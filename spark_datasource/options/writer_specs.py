"""The ``clickhouse_tx`` writer's options, each declared once.

Each :class:`~spark_datasource.options.spec.OptionSpec` holds one option's name,
default, parser and the line of ``docs/options.md`` that documents it (the table
there is generated from :data:`WRITER_OPTIONS`). The defaults a ``Target`` or a
``RetryPolicy`` already holds are read from them, so each default is written once.
:mod:`spark_datasource.options.writer_options` parses the options with these declarations
(on the driver, before any task writes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clickhouse_tx.interfaces import Mode, Target
from clickhouse_tx.retry import RetryPolicy
from spark_datasource.options.https_specs import HTTPS_OPTIONS
from spark_datasource.options.spec import (
    BOOL,
    HTTP_URL,
    POSITIVE_INT,
    POSITIVE_SECONDS,
    SQL_EXPRESSION,
    TEXT,
    OptionFamily,
    OptionSpec,
    Parser,
    matching,
    one_of,
)

__all__ = ["WRITER_OPTIONS", "MIN_SESSION_TIMEOUT_S"]

#: Defaults the protocol's own values hold (their one place).
_TARGET = {f.name: f.default for f in dataclasses.fields(Target)}
_RETRY = {f.name: f.default for f in dataclasses.fields(RetryPolicy)}

#: The shortest ``session_timeout`` (seconds) the writer accepts. The executors' keep-alive
#: (``clickhouse_tx.modes.session_keepalive.SessionKeepAlive``) touches a prepared session every
#: ``session_timeout / 4`` seconds, each touch given at most ``max(1, session_timeout / 2)``,
#: and only while its Python worker lives. Below this floor one slow touch (a worker starved
#: of CPU, a busy server) or the start of the driver's commit outlasts the session.
MIN_SESSION_TIMEOUT_S = 10


def _session_timeout(text: str) -> int:
    n = int(text.strip())
    if n < MIN_SESSION_TIMEOUT_S:
        raise ValueError()
    return n


def _idempotence_key(text: str) -> str:
    key = text.strip()
    if not key or len(key) > 256 or not key.isprintable():
        raise ValueError()
    return key


AS_GIVEN = Parser("text", lambda text: text)
#: Stripped text; blank means not given.
OPTIONAL_TEXT: Parser[str | None] = Parser("text", lambda text: text.strip() or None)
MODE = Parser("one of " + ", ".join(m.value for m in Mode), lambda text: Mode(text.strip().lower()))
TXN_ID = matching(r"[A-Za-z0-9_.\-]{1,128}", "1-128 characters of A-Z a-z 0-9 _ . -")
IDEMPOTENCE_KEY = Parser("1-256 printable characters (e.g. a scheduler's run id)", _idempotence_key)
SESSION_TIMEOUT = Parser(
    f"at least {MIN_SESSION_TIMEOUT_S} seconds: prepared sessions wait for the driver's commit "
    "and are kept alive only by touches every session_timeout/4 s from the executors, so a "
    "shorter timeout may expire them before the commit (docs/options.md)",
    _session_timeout,
)

_VISIBILITY_DEFAULT = (
    "streaming: `partition`; batch jobs: `auto` (`partition` in mode `none`, with `table_column`, "
    "`shards`, or a resumable job)"
)
_DECISION_LOG_DEFAULT = (
    "streaming: `<checkpointLocation>/clickhouse_tx` (the location spelled one way: absolute, "
    "normalised); batch: `<tmpdir>/clickhouse_tx_batch/clickhouse_tx/<transactional_id>`"
)


#: Every writer option, in the order of the docs' tables.
_SPECS: tuple[OptionSpec[Any], ...] = (
    OptionSpec(
        "url",
        None,
        HTTP_URL,
        "`http://host:port` or `https://...` of the ClickHouse HTTP interface. Credentials in the URL are refused "
        "(they would leak into logs): use `user`/`password`. No query string (use `setting.*`).",
        shown_default="required",
    ),
    OptionSpec("user", _TARGET["user"], AS_GIVEN, "ClickHouse user.", field="user", blank_is_default=True),
    OptionSpec(
        "password",
        _TARGET["password"],
        AS_GIVEN,
        "Never shown in `repr`, `str` or errors.",
        field="password",
        secret=True,
        shown_default="empty",
    ),
    *HTTPS_OPTIONS,
    OptionSpec(
        "table",
        None,
        TEXT,
        '`table` or `database.table` (split at the first dot unless `database` is given). `save("db.t")` is the same '
        "as `table=db.t`; giving both with different values is an error.",
        shown_default="required",
    ),
    OptionSpec(
        "path",
        None,
        AS_GIVEN,
        'Set by Spark from `save(path)`: the table when `table` is not given (`save("db.t")`).',
        shown_default="—",
    ),
    OptionSpec(
        "database",
        "default",
        Parser("a non-empty database name", TEXT.convert),
        "When set, `table` is taken literally (so table names may contain dots).",
        shown_default="from `table`, else `default`",
    ),
    OptionSpec(
        "mode",
        Mode.TRANSACTION,
        MODE,
        "`transaction` \\| `staging` \\| `dedup` \\| `none` (case-insensitive), see [design.md](design.md) §4.",
        field="mode",
    ),
    OptionSpec(
        "visibility",
        "partition",
        one_of("partition", "batch", "auto"),
        "What a read-committed reader (`implicit_transaction=1`) sees while a batch or a job commits. `partition`: "
        "each Spark partition appears on its own, so a read can see part of a batch. Streaming `batch` (mode "
        "`staging` only; others are refused on the driver): the driver moves every stage of the micro-batch and "
        "writes every marker in one ClickHouse transaction, so a read sees the whole batch or none of it "
        '([modes.md](modes.md), "Whole batches at once"). Batch jobs, `batch` and `auto` (modes `transaction`, '
        "`staging`, `dedup`): the job is written into a stage table of its own and published in one ClickHouse "
        "transaction at its very end, so a job stopped anywhere before that step leaves nothing, and running it again"
        ' as it is writes each row once ([modes.md](modes.md), "Batch jobs"). Both need a non-replicated `*MergeTree`'
        " target and a server with `allow_experimental_transactions` and Keeper, checked on the driver: `batch` is "
        "refused without them, `auto` then publishes partition by partition and logs a WARNING saying so.",
        shown_default=_VISIBILITY_DEFAULT,
    ),
    OptionSpec(
        "idempotence_key",
        "",
        IDEMPOTENCE_KEY,
        "Batch jobs: a key of the job's own, such as a scheduler's run id (Airflow `{{ run_id }}`). Recorded with the"
        " job in `<database>.clickhouse_tx_jobs` inside the transaction that publishes it; a job whose key is already"
        " recorded for the table writes nothing and logs a WARNING naming the job that recorded it. Closes the one "
        "window a plain re-run cannot tell from a new job: stopped after the publishing COMMIT, before Spark's "
        "`commit` returned. 1–256 printable characters; refused in streaming writes (their checkpoint makes them "
        "idempotent).",
        shown_default="none",
    ),
    OptionSpec(
        "transactional_id",
        "",
        TXN_ID,
        "Identity of the writing query in markers, registry and xids: 1–128 of `A-Z a-z 0-9 _ . -`. Streaming "
        'default: `q_<Spark\'s query id>`, read from the checkpoint (see "The transactional id" below); an explicit '
        "one is stored in the checkpoint on first use and must not change afterwards. Batch: `batch-<uuid4>`, or "
        "`<transactional_id>.job-<12 hex>` when given: fresh per job either way; with both `transactional_id` and "
        "`decision_log` given, the job is *resumable*: it keeps that id, running it again rolls an unfinished "
        "decision forward (how a job that failed mid-commit is finished), and running it once it is done is refused "
        "on the driver.",
        shown_default="derived",
    ),
    OptionSpec(
        "checkpointLocation",
        None,
        OPTIONAL_TEXT,
        'Set by the user on the `DataStreamWriter` (`.option("checkpointLocation", ...)`); Spark forwards it (see '
        "below).",
        blank_is_default=True,
        shown_default="—",
    ),
    OptionSpec(
        "queryName",
        None,
        OPTIONAL_TEXT,
        "Set with `.queryName(...)`; Spark forwards it. Accepted, not used: the transactional id does not depend "
        "on it.",
        blank_is_default=True,
        shown_default="—",
    ),
    OptionSpec(
        "decision_log",
        "",
        Parser("a path or URI", TEXT.convert),
        "Where the coordinator's decisions are written (a local path or a `pyarrow.fs` URI such as `s3://`, "
        "`hdfs://`). Streaming writes without `checkpointLocation` must give it (and `transactional_id`).",
        shown_default=_DECISION_LOG_DEFAULT,
    ),
    OptionSpec(
        "batch_size",
        65536,
        POSITIVE_INT,
        "Upper bound on the rows of each Arrow record batch sent to ClickHouse (one ArrowStream message; larger "
        "batches from Spark are cut into zero-copy slices on the executor, after conversion). Positive integer.",
        field="batch_size",
    ),
    OptionSpec(
        "batch_bytes",
        64 * 1024 * 1024,
        POSITIVE_INT,
        "Upper bound on the bytes of each sent record batch, from the batch's average row size (one row larger than "
        "the bound goes alone). Positive integer.",
        field="batch_bytes",
        shown_default="`67108864` (64 MiB)",
    ),
    OptionSpec(
        "connect_timeout",
        _TARGET["connect_timeout_s"],
        POSITIVE_SECONDS,
        "Seconds (positive number) to connect.",
        field="connect_timeout_s",
    ),
    OptionSpec(
        "request_timeout",
        _TARGET["request_timeout_s"],
        POSITIVE_SECONDS,
        "Seconds (positive number) per HTTP request.",
        field="request_timeout_s",
    ),
    OptionSpec(
        "session_timeout",
        _TARGET["session_timeout_s"],
        SESSION_TIMEOUT,
        "Seconds (integer, at least 10) a ClickHouse HTTP session (and so an open transaction) survives without "
        "requests. A prepared partition waits in its session for the driver's commit; the executors' keep-alive "
        "touches it every `session_timeout / 4` s while their Python worker lives, so a value below 10 is refused on "
        "the driver (one slow touch or the start of the commit outlasted a 3-second session). Spark ends a Python "
        "worker it does not reuse (`spark.python.use.daemon=false`, `spark.python.worker.reuse=false`) with its task,"
        " and the keep-alive with it: then the timeout alone must outlast the wait from each task's end to the commit"
        " (the default does). See `docs/modes.md`.",
        field="session_timeout_s",
    ),
    OptionSpec("create_table", False, BOOL, "Create the table when missing, with the DDL below.", field="create_table"),
    OptionSpec(
        "order_by",
        None,
        SQL_EXPRESSION,
        "`ORDER BY` expression for `create_table`. MergeTree refuses Nullable key columns unless the table sets "
        "`allow_nullable_key`.",
        field="order_by",
        shown_default="`tuple()`",
    ),
    OptionSpec(
        "partition_by", None, SQL_EXPRESSION, "`PARTITION BY` expression for `create_table`.", field="partition_by"
    ),
    OptionSpec(
        "engine",
        "MergeTree",
        SQL_EXPRESSION,
        "`ENGINE =` clause for `create_table` (e.g. `ReplacingMergeTree(ver)`).",
        field="engine",
    ),
    OptionSpec(
        "table_column",
        None,
        Parser("a column name", TEXT.convert),
        "Multi-table routing (values are converted before rows are split, so the routed tables must have the same "
        "column types; the driver refuses them otherwise): each row goes to the table named in this string column "
        "(`db.table`, or `table` in `database`); the column itself is not stored. Needs `tables`; mode `transaction` "
        'only (other modes and `.mode("overwrite")` are refused on the driver). All tables of a partition are written'
        " in its one transaction; the partition is held in executor memory. See `docs/writer.md`.",
        field="table_column",
    ),
    OptionSpec(
        "tables",
        None,
        AS_GIVEN,
        "With `table_column` (and only with it): comma-separated tables rows may be routed to (`db.table` or `table` "
        "in `database`). The driver checks every one (exists or `create_table`, schema of the data minus "
        "`table_column`, transaction mode) before any task writes; a row naming another table fails its task and the "
        "job commits nothing. `table` stays required: its database holds the registry and markers.",
    ),
    OptionSpec(
        "allow_nullable_into_non_nullable",
        False,
        BOOL,
        "A null sent to a non-`Nullable` scalar column is stored as the column's default (0 or '') instead of failing"
        " the task. Without it, a nullable Spark column goes into a non-`Nullable` column as long as its values hold "
        "no null.",
        field="allow_nullable_into_non_nullable",
    ),
    OptionSpec(
        "bad_rows",
        "fail",
        one_of("fail", "dead_letter"),
        "`fail`: a value that does not fit its column fails the task (nothing of its partition is visible; the job "
        "aborts). `dead_letter` (modes `transaction`, `staging` and `dedup`, no `table_column`): the whole row goes "
        "to `dead_letter_table` instead — in `transaction` in the same transaction as the good rows of its partition,"
        " in `staging` into a stage of the dead-letter table beside the partition's stage and moved with it at "
        "commit, in `dedup` with a deduplication token made of the dead letters' content — so a replayed batch never "
        "duplicates or loses a dead letter (see `docs/writer.md`, *Dead letters*). Mode `none` refuses it on the "
        "driver.",
    ),
    OptionSpec(
        "dead_letter_table",
        None,
        AS_GIVEN,
        "With `bad_rows=dead_letter` (and only then): `table` or `database.table`, created on the driver when "
        "missing: `table, txn_id, batch, partition, xid, row, column, clickhouse_type, reason, row_json` (`row`: "
        "position in the partition; `column`: the path, e.g. `m.value`; `row_json`: the whole row). An existing table"
        " must have these columns; in modes `transaction` and `staging` it must be a non-replicated `*MergeTree`, in "
        "`dedup` it needs a deduplication window (the created one has `non_replicated_deduplication_window = 1000` in"
        " `dedup` only). Batch metrics count them (`dead_letters`).",
    ),
    OptionSpec(
        "strict_precision",
        False,
        BOOL,
        "Sub-second digits a `DateTime`/`DateTime64(p)` column cannot hold fail the task (naming the value) instead "
        "of being truncated toward the past, as ClickHouse itself truncates.",
        field="strict_precision",
    ),
    OptionSpec(
        "setting.<name>",
        None,
        AS_GIVEN,
        "ClickHouse setting applied to every insert (`Target.settings`), e.g. "
        "`setting.max_insert_block_size=1048576`. The name must be an identifier; it arrives lower-cased (all "
        "ClickHouse settings are).",
        shown_default="—",
    ),
    OptionSpec(
        "retry.attempts",
        _RETRY["max_attempts"],
        POSITIVE_INT,
        "Attempts of each ClickHouse/Keeper call that failed transiently, on executors and the driver: writes when "
        "they definitely did not take effect, reads (registry, markers, lookups, a mode's reads inside a prepare) and"
        " idempotent DDL (`CREATE TABLE IF NOT EXISTS`) also when the reply was lost; each retry logged at WARNING. "
        "The `RetryPolicy.max_attempts` of `clickhouse_tx.retry`. Riding through a server restart needs more than the"
        ' default (`docs/protocol.md`, "Riding through transient faults"). Positive integer.',
        field="retry_attempts",
    ),
    OptionSpec(
        "retry.max_seconds",
        _RETRY["max_total_s"],
        POSITIVE_SECONDS,
        "Upper bound on the time spent retrying one such call (`RetryPolicy.max_total_s`).",
        field="retry_max_seconds",
    ),
    OptionSpec(
        "fault.*",
        None,
        AS_GIVEN,
        "Test-only fault hooks (`clickhouse_tx/testing/faults.py`; [design.md](design.md) §8). Refused on the "
        "driver unless the environment has `CLICKHOUSE_TX_TEST_FAULTS=1`, which only the test suite and the "
        "demo's job set; an unknown `fault.step` is refused there too.",
        shown_default="—",
    ),
    OptionSpec(
        "shards",
        None,
        AS_GIVEN,
        "Instead of `url` (both together are refused): every server of a sharded table, `,` between shards and `|` "
        "between the replicas of one shard, e.g. `http://a:8123|http://b:8123,http://c:8123`. One xid per (partition,"
        " shard), one decision per batch; each xid commits on the replica that prepared it. See "
        '[deployment.md](deployment.md). Not with `table_column` or `.mode("overwrite")`.',
        section="sharded",
    ),
    OptionSpec(
        "sharding_key",
        None,
        Parser("a column name", TEXT.convert),
        "With `shards` only: the column whose value's hash picks each row's shard (integer, boolean, date, timestamp,"
        " string or binary; the hash is documented in [deployment.md](deployment.md)). Without it each Spark "
        "partition goes whole to one shard. With it the partition is held in executor memory while it is split.",
        section="sharded",
    ),
    OptionSpec(
        "shard_weights",
        None,
        AS_GIVEN,
        "With `shards` only: one positive integer per shard, its share of the hash range (and of the partitions).",
        section="sharded",
        shown_default="`1` per shard",
    ),
)
WRITER_OPTIONS = OptionFamily("clickhouse_tx", "docs/options.md", _SPECS)
