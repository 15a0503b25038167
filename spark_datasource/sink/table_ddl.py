"""``CREATE TABLE`` text for the ``create_table`` option, with quoted identifiers.

Pure string building; runs on the driver once per query/job, before any task writes.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import types as T

from clickhouse_tx.client.sql import quote_option_identifier
from clickhouse_tx.errors import ConfigurationError
from spark_datasource.sink.type_mapping import arrow_to_clickhouse, spark_to_clickhouse

__all__ = ["create_table_sql", "quote_identifier"]


# Names come from options: an empty or NUL name is a ConfigurationError.
quote_identifier = quote_option_identifier


def create_table_sql(
    database: str,
    table: str,
    spark_schema: T.StructType | pa.Schema,
    order_by: str | None = None,
    partition_by: str | None = None,
    engine: str = "MergeTree",
    *,
    if_not_exists: bool = True,
) -> str:
    """``CREATE TABLE [IF NOT EXISTS] `db`.`t` (...) ENGINE = ... ORDER BY ...``.

    Parameters
    ----------
    database, table
        Quoted with :func:`quote_identifier` (never pasted raw).
    spark_schema
        Spark ``StructType`` (or an Arrow schema): column types from
        :mod:`spark_datasource.sink.type_mapping`.
    order_by, partition_by, engine
        SQL expressions from the options (user-trusted, validated against ';' by
        :class:`~spark_datasource.options.writer_options.WriterOptions`). ``order_by``
        defaults to ``tuple()``; note MergeTree refuses a Nullable sorting key
        unless ``allow_nullable_key`` is set on the table.

    Raises
    ------
    ConfigurationError
        For an empty schema, duplicate column names, or a column type with no
        ClickHouse equivalent (naming the column).
    """
    if isinstance(spark_schema, T.StructType):
        cols = [(f.name, spark_to_clickhouse(f.dataType, f.nullable, column=f.name)) for f in spark_schema.fields]
    else:
        cols = [(f.name, arrow_to_clickhouse(f.type, f.nullable, column=f.name)) for f in spark_schema]
    if not cols:
        raise ConfigurationError(f"cannot create {database}.{table}: the schema has no columns")
    names = [n for n, _ in cols]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ConfigurationError(f"cannot create {database}.{table}: duplicate columns {dups}")
    body = ",\n".join(f"    {quote_identifier(n)} {t}" for n, t in cols)
    lines = [
        f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}"
        f"{quote_identifier(database)}.{quote_identifier(table)}",
        "(",
        body,
        ")",
        f"ENGINE = {engine.strip() or 'MergeTree'}",
    ]
    if partition_by:
        lines.append(f"PARTITION BY {partition_by}")
    lines.append(f"ORDER BY {order_by or 'tuple()'}")
    return "\n".join(lines)
