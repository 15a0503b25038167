"""Driver-side checks before any task writes: server reachable, credentials, table, schema.

Runs in ``writer``/``streamWriter`` on the driver: once per batch job, and before every
streaming commit (Spark rebuilds the writer there), so it costs a few small queries.
"""

from __future__ import annotations

from pyspark.sql.types import StructType

from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError, ServerError
from clickhouse_tx.http_client import ClickHouseHTTP
from clickhouse_tx.interfaces import Target

from .table_ddl import create_table_sql
from .type_mapping import check_compatible, spark_schema_to_arrow
from .writer_options import WriterOptions

_AUTH_ERRORS = {"AUTHENTICATION_FAILED", "REQUIRED_PASSWORD", "WRONG_PASSWORD", "UNKNOWN_USER"}

_COLUMNS_SQL = (
    "SELECT name, type, default_kind FROM system.columns "
    "WHERE database = {db:String} AND table = {t:String} ORDER BY position"
)


def prepare_target(opts: WriterOptions, schema: StructType) -> None:
    """Check (and with ``create_table`` create) the target; raise ConfigurationError.

    Parameters
    ----------
    opts
        The parsed writer options.
    schema
        The Spark schema of the rows to write.
    """
    target = opts.target()
    client = ClickHouseHTTP(target)
    where = f"ClickHouse at {opts.url} as user {opts.user!r}"
    try:
        client.command("SELECT 1")
    except ServerError as exc:
        if exc.name in _AUTH_ERRORS:
            raise ConfigurationError(f"authentication failed for {where}: check the user and password options",
                                     code=exc.code, name=exc.name) from None
        raise ConfigurationError(f"{where} refused a trivial query: {exc.message}", code=exc.code,
                                 name=exc.name) from None
    except ClickHouseTxError as exc:
        raise ConfigurationError(f"cannot reach {where} (option url): {exc.message}") from None

    if opts.table_column:
        # Routing: every listed table is checked before any task writes (the `table`
        # option's table only anchors the registry and markers and need not exist).
        if opts.table_column not in schema.fieldNames():
            raise ConfigurationError(
                f"option table_column={opts.table_column!r}: the data has no such column "
                f"(columns: {', '.join(schema.fieldNames())})")
        routing_type = schema[opts.table_column].dataType.simpleString()
        if routing_type != "string":
            raise ConfigurationError(
                f"option table_column={opts.table_column!r}: the column must be a string "
                f"(db.table or table), not {routing_type}")
        for routed in opts.route_targets():
            _check_table(client, opts, routed, schema)
        return
    _check_table(client, opts, target, schema)


def _check_table(client: ClickHouseHTTP, opts: WriterOptions, target: Target,
                 schema: StructType) -> None:
    """One table: exists (or is created), accepts ``schema`` minus the routing column."""
    from clickhouse_tx.factory import build_mode_io

    display = f"{target.database}.{target.table}"
    params = {"db": target.database, "t": target.table}
    cols = client.query_json(_COLUMNS_SQL, params=params)
    if not cols:
        if not opts.create_table:
            raise ConfigurationError(
                f"table {display} does not exist: create it, or set the option "
                "create_table=true (with order_by / partition_by) to create it from the data's schema")
        data_schema = _without(schema, opts.table_column)
        client.command(create_table_sql(target.database, target.table, data_schema, opts.order_by,
                                        opts.partition_by, opts.engine))
        cols = client.query_json(_COLUMNS_SQL, params=params)
    check_compatible(
        schema,
        [(c["name"], c["type"], c["default_kind"]) for c in cols],
        table=display,
        exclude=[opts.table_column] if opts.table_column else (),
        allow_nullable_into_non_nullable=opts.allow_nullable_into_non_nullable,
    )
    build_mode_io(opts.mode).validate(target, spark_schema_to_arrow(_without(schema, opts.table_column)))


def _without(schema: StructType, column: str | None) -> StructType:
    if not column:
        return schema
    return StructType([f for f in schema.fields if f.name != column])
