"""Driver-side checks before any task writes: server reachable, credentials, table, schema.

Runs in ``writer``/``streamWriter`` on the driver: once per batch job, and before every
streaming commit (Spark rebuilds the writer there), so it costs a few small queries.
It returns the :class:`~clickhouse_tx.conversion.convert.ConversionPlan` (the table's column
types) that travels with the writer to the executors, so no task queries the table.
"""

from __future__ import annotations

import dataclasses

from pyspark.sql.types import StructType

from clickhouse_tx.client.http import ClickHouseHTTP, reuse_or_open
from clickhouse_tx.client.tls import check_tls
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.conversion.dead_letters import DEAD_LETTER_COLUMNS, dead_letter_ddl
from clickhouse_tx.conversion.schema import TableInfo, check_schema, conversion_columns, describe_table
from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError, ServerError
from clickhouse_tx.interfaces import Mode, Target
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.sink.table_ddl import create_table_sql
from spark_datasource.sink.type_mapping import spark_schema_to_arrow

_AUTH_ERRORS = {"AUTHENTICATION_FAILED", "REQUIRED_PASSWORD", "WRONG_PASSWORD", "UNKNOWN_USER"}


def prepare_target(opts: WriterOptions, schema: StructType, client: ClickHouseHTTP | None = None) -> ConversionPlan:
    """Check (and with ``create_table`` create) the target; raise ConfigurationError.

    Parameters
    ----------
    opts
        The parsed writer options.
    schema
        The Spark schema of the rows to write.
    client
        An open session-less client of ``opts.target()`` that the caller's other driver
        steps share (a batch job's: one per job), built after the caller's
        :func:`~clickhouse_tx.client.tls.check_tls`; left open. None: TLS is checked here,
        and a client of its own is closed at the end (sharded writes: one per server).

    Returns
    -------
    ConversionPlan
        The column types every executor converts the data to (for routing: the
        types all routed tables share; for shards: the types every server's table shares).
    """
    if client is None:
        check_tls(opts.target())  # files readable and parsed, each error naming its option
    with reuse_or_open(opts.target(), client) as c:
        return check_target(c, opts, schema)[0]


def check_target(
    client: ClickHouseHTTP, opts: WriterOptions, schema: StructType
) -> tuple[ConversionPlan, TableInfo | None]:
    """:func:`prepare_target`'s checks on the caller's ``client`` (TLS checked already).

    Returns the conversion plan and the target's description, which a batch job's plan
    reuses instead of reading it again (None for routing and shards: several tables).
    """
    if opts.shards:
        return _prepare_shards(opts, schema), None
    _check_reachable(client, opts)
    if not opts.table_column:
        return _check_table(client, opts, opts.target(), schema)
    # Routing: every listed table is checked before any task writes (the `table`
    # option's table only anchors the registry and markers and need not exist).
    _check_routing_column(opts, schema)
    return _one_plan(opts, [_check_table(client, opts, r, schema)[0] for r in opts.route_targets()]), None


def _check_reachable(client: ClickHouseHTTP, opts: WriterOptions) -> None:
    """``SELECT 1``: the server answers and takes the credentials (errors name the option)."""
    where = f"ClickHouse at {opts.url} as user {opts.user!r}"
    try:
        client.command("SELECT 1", idempotent=True)
    except ServerError as exc:
        if exc.name in _AUTH_ERRORS:
            raise ConfigurationError(
                f"authentication failed for {where}: check the user and password options", code=exc.code, name=exc.name
            ) from None
        raise ConfigurationError(
            f"{where} refused a trivial query: {exc.message}", code=exc.code, name=exc.name
        ) from None
    except ConfigurationError:
        raise  # a certificate refused: the error names ca_cert/verify or client_cert
    except ClickHouseTxError as exc:
        raise ConfigurationError(f"cannot reach {where} (option url): {exc.message}") from None


def _check_routing_column(opts: WriterOptions, schema: StructType) -> None:
    """``table_column`` names a string column of the data."""
    if opts.table_column not in schema.fieldNames():
        raise ConfigurationError(
            f"option table_column={opts.table_column!r}: the data has no such column "
            f"(columns: {', '.join(schema.fieldNames())})"
        )
    routing_type = schema[opts.table_column].dataType.simpleString()
    if routing_type != "string":
        raise ConfigurationError(
            f"option table_column={opts.table_column!r}: the column must be a string "
            f"(db.table or table), not {routing_type}"
        )


def _check_table(
    client: ClickHouseHTTP, opts: WriterOptions, target: Target, schema: StructType
) -> tuple[ConversionPlan, TableInfo]:
    """One table: exists (or is created), can take ``schema`` minus the routing column; its description."""
    from clickhouse_tx.factory import build_mode_io

    data = _without(schema, opts.table_column)
    arrow = spark_schema_to_arrow(data)
    info = _describe_or_create(client, opts, target, data)
    check_schema(info, arrow, source_types={f.name: f"Spark type {f.dataType.simpleString()}" for f in data.fields})
    build_mode_io(opts.mode, visibility=opts.commit_visibility()).validate(target, arrow, info)
    if opts.dead_letter_table:
        _prepare_dead_letter_table(client, opts.mode, *opts.dead_letter_table)
    plan = ConversionPlan(
        info.display,
        conversion_columns(info, arrow),
        allow_nullable_into_non_nullable=opts.allow_nullable_into_non_nullable,
        strict_precision=opts.strict_precision,
        batch_rows=opts.batch_size,
        batch_bytes=opts.batch_bytes,
        dead_letter_table=opts.dead_letter_table,
    )
    return plan, info


def _prepare_dead_letter_table(client: ClickHouseHTTP, mode: Mode, database: str, table: str) -> None:
    """Create the dead-letter table when missing; an existing one must have its columns."""
    client.command(dead_letter_ddl(database, table, dedup_window=mode is Mode.DEDUP), idempotent=True)
    info = describe_table(client, database, table)
    have = {c.name: c.type for c in info.columns}
    missing = [f"{n} {t}" for n, t in DEAD_LETTER_COLUMNS if have.get(n) != t]
    if missing:
        raise ConfigurationError(
            f"option dead_letter_table: {info.display} exists without the columns {', '.join(missing)}; "
            "drop it or name another table (it is created when missing)"
        )
    if mode in (Mode.TRANSACTION, Mode.STAGING) and (info.is_replicated or not info.is_merge_tree):
        how = (
            "in the partition's transaction"
            if mode is Mode.TRANSACTION
            else "into a stage created AS it and moved with MOVE PARTITION"
        )
        raise ConfigurationError(
            f"option dead_letter_table: {info.display} has engine {info.engine}; dead letters are "
            f"written {how}, which needs a non-replicated *MergeTree"
        )
    window = info.replicated_dedup_window if info.is_replicated else info.non_replicated_dedup_window
    if mode is Mode.DEDUP and (not info.is_merge_tree or window <= 0):
        raise ConfigurationError(
            f"option dead_letter_table: {info.display} has no deduplication window, so mode 'dedup' "
            "could write a replayed dead letter twice: drop it (it is created with one) or run "
            f"ALTER TABLE ... MODIFY SETTING non_replicated_deduplication_window = 1000"
        )


def _describe_or_create(client: ClickHouseHTTP, opts: WriterOptions, target: Target, data: StructType) -> TableInfo:
    try:
        return describe_table(client, target.database, target.table)
    except ConfigurationError:
        if not opts.create_table:
            raise ConfigurationError(
                f"table {target.database}.{target.table} does not exist: create it, or set the "
                "option create_table=true (with order_by / partition_by) to create it from the "
                "data's schema"
            ) from None
    client.command(create_table_sql(target.database, target.table, data, opts.order_by, opts.partition_by, opts.engine))
    return describe_table(client, target.database, target.table)


def _one_plan(opts: WriterOptions, plans: list[ConversionPlan]) -> ConversionPlan:
    """Routing converts each batch before it is split: every table must share the types."""
    distinct = {p.columns for p in plans}
    if len(distinct) > 1:
        shown = "; ".join(f"{p.table}: " + ", ".join(f"{n} {t}" for n, t in p.columns) for p in plans)
        raise ConfigurationError(
            f"option table_column={opts.table_column!r}: the routed tables have different column "
            f"types ({shown}); values are converted before rows are split, so route only into "
            "tables with the same columns"
        )
    first = plans[0]
    return dataclasses.replace(first, table=", ".join(p.table for p in plans))


def _without(schema: StructType, column: str | None) -> StructType:
    if not column:
        return schema
    return StructType([f for f in schema.fields if f.name != column])


def _prepare_shards(opts: WriterOptions, schema: StructType) -> ConversionPlan:
    """Every shard: the checks of one server on each replica that answers (at least one per
    shard), the same column types everywhere, and a ``sharding_key`` the hash takes."""
    from clickhouse_tx.sharding.io import answers
    from clickhouse_tx.sharding.placement import is_hashable_type

    if opts.sharding_key is not None:
        if opts.sharding_key not in schema.fieldNames():
            raise ConfigurationError(
                f"option sharding_key={opts.sharding_key!r}: the data has no such column "
                f"(columns: {', '.join(schema.fieldNames())})"
            )
        arrow_type = spark_schema_to_arrow(schema).field(opts.sharding_key).type
        if not is_hashable_type(arrow_type):
            raise ConfigurationError(
                f"option sharding_key={opts.sharding_key!r}: a column of Spark type "
                f"{schema[opts.sharding_key].dataType.simpleString()} cannot pick a shard; use an "
                "integer, boolean, date, timestamp, string or binary column"
            )
    plans = []
    for shard, replicas in enumerate(opts.shards):
        live = [u for u in replicas if len(replicas) == 1 or answers(opts.target(), u)]
        if not live:
            raise ConfigurationError(f"option shards: no replica of shard {shard} answers; nothing was written")
        plans += [prepare_target(dataclasses.replace(opts, url=u, shards=()), schema) for u in live]
    if len({p.columns for p in plans}) > 1:
        raise ConfigurationError(
            f"option shards: the table {opts.qualified_table} has different column types on different "
            "servers; create it alike on every shard"
        )
    return plans[0]
