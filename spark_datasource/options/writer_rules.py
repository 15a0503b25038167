"""The writer options that are read together: each rule checks a few options against each other.

:meth:`spark_datasource.options.writer_options.WriterOptions.parse` runs these on the driver,
each on the lower-cased options dict, after the unknown keys are refused. Each value
is parsed by its declaration (:mod:`spark_datasource.options.writer_specs`); a rule
adds what one value alone cannot say (``url`` or ``shards``, ``bad_rows`` and its
table, ``visibility`` by kind of write and mode).
"""

from __future__ import annotations

from typing import Any, Mapping

from clickhouse_tx.client.contract import refuse_pinned
from clickhouse_tx.client.sql import split_table
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import Mode
from spark_datasource.options.spec import bad_value
from spark_datasource.options.writer_specs import WRITER_OPTIONS

__all__ = [
    "field_values",
    "required_url",
    "target_table",
    "route_tables",
    "dead_letter_table",
    "visibility",
    "idempotence_key",
    "prefixed",
    "sharding",
]


def field_values(opts: Mapping[str, str]) -> dict[str, object]:
    """The options that fill a field on their own, by field: parsed, or their declared default."""
    return {s.field: s.read(opts) for s in WRITER_OPTIONS.specs if s.field}


def required_url(opts: Mapping[str, str]) -> str:
    """``url``, or the first replica of the first shard with ``shards`` (not both)."""
    if "shards" in opts:
        if opts.get("url", "").strip():
            raise ConfigurationError(
                "options url and shards are given together: give url for one server, or shards "
                "(',' between shards, '|' between replicas) for a cluster, not both"
            )
        return str(sharding(opts)["shards"][0][0])
    if not opts.get("url", "").strip():
        raise ConfigurationError("option url is required (e.g. http://127.0.0.1:8123)")
    return str(WRITER_OPTIONS["url"].read(opts))


def target_table(opts: Mapping[str, str]) -> tuple[str, str]:
    """``(database, table)`` from ``table`` (or ``save(path)``) and ``database``."""
    table_raw = opts.get("table", "").strip()
    path = opts.get("path", "").strip()
    if not table_raw and path:
        table_raw = path  # df.write.format("clickhouse_tx").save("db.events")
    elif table_raw and path and path != table_raw:
        raise ConfigurationError(f"option table={table_raw!r} and save(path={path!r}) disagree; give one")
    if not table_raw:
        raise ConfigurationError("option table is required (table or database.table)")
    if "database" not in opts:
        return _table_name("table", table_raw, table_raw, "default", "table or database.table")
    # With an explicit database, dots belong to the table name.
    return str(WRITER_OPTIONS["database"].read(opts)), table_raw


def _table_name(option: str, raw: str, name: str, database: str, expected: str) -> tuple[str, str]:
    """``name`` (part of option ``raw``) as ``(database, table)``, refused as the option's value."""
    try:
        return split_table(name, database)
    except ConfigurationError:
        raise bad_value(option, raw, expected) from None


def route_tables(opts: Mapping[str, str], database: str) -> tuple[tuple[str, str], ...]:
    """``tables``: comma-separated ``db.table`` or ``table`` (in ``database``), deduplicated."""
    raw = opts.get("tables")
    if raw is None:
        return ()
    out: list[tuple[str, str]] = []
    for item in raw.split(","):
        name = item.strip()
        if not name:
            raise bad_value("tables", raw, "a comma-separated list of db.table or table names (no empty entries)")
        db, t = _table_name("tables", raw, name, database, f"db.table or table names ({name!r} is neither)")
        if (db, t) not in out:
            out.append((db, t))
    return tuple(out)


def dead_letter_table(opts: Mapping[str, str], database: str, mode: Mode) -> tuple[str, str] | None:
    """``bad_rows`` / ``dead_letter_table``: the dead-letter table, or None (``bad_rows=fail``)."""
    bad_rows = WRITER_OPTIONS["bad_rows"].read(opts)
    raw = opts.get("dead_letter_table", "").strip()
    if bad_rows == "fail":
        if raw:
            raise ConfigurationError(f"option dead_letter_table={raw!r} needs bad_rows=dead_letter")
        return None
    if not raw:
        raise ConfigurationError(
            "option bad_rows=dead_letter needs the option dead_letter_table "
            "(table or database.table; created when missing)"
        )
    if mode not in (Mode.TRANSACTION, Mode.DEDUP, Mode.STAGING):
        raise ConfigurationError(
            f"option bad_rows=dead_letter with mode={mode.value!r}: dead letters are written "
            "exactly once in modes 'transaction' (in the partition's transaction), 'dedup' "
            "(with the partition's deduplication token) and 'staging' (in a stage moved with "
            "the partition's) only"
        )
    if opts.get("table_column", "").strip():
        raise ConfigurationError("option bad_rows=dead_letter cannot be combined with table_column")
    return _table_name("dead_letter_table", raw, raw, database, "table or database.table")


def visibility(opts: Mapping[str, str], mode: Mode, streaming: bool) -> str:
    """``visibility``, checked here, on the driver.

    Streaming (default ``partition``): ``batch`` needs mode staging. Batch jobs (default
    ``auto``; ``partition`` in mode none): ``batch`` and ``auto`` publish the whole job
    at once through a job stage (:mod:`clickhouse_tx.jobs.publish`), which options
    routing rows to several tables or servers, a resumable job and mode none cannot.
    """
    from clickhouse_tx.modes import mode_io_for

    if streaming:
        value = opts.get("visibility", "partition").strip().lower()
        mode_io_for(mode, visibility=value)  # names a value it does not know, and batch outside staging
        return value
    whole_job_refused = _whole_job_refused(opts, mode)
    default = "partition" if whole_job_refused else "auto"
    value = WRITER_OPTIONS["visibility"].read(opts) if "visibility" in opts else default
    if value != "partition" and whole_job_refused:
        raise ConfigurationError(f"option visibility={value} {whole_job_refused}; use visibility=partition")
    return str(value)


def _whole_job_refused(opts: Mapping[str, str], mode: Mode) -> str | None:
    """Why a batch job with these options cannot be published at once; None when it can."""
    if mode is Mode.NONE:
        return "with mode='none': an at-least-once write has no job to publish at once"
    if opts.get("table_column", "").strip():
        return "with table_column: the job spans several tables"
    if "shards" in opts:
        return "with shards: the job spans several servers"
    if "transactional_id" in opts and "decision_log" in opts:
        return "for a resumable batch job (transactional_id with decision_log): it is finished per partition"
    return None


def idempotence_key(opts: Mapping[str, str], streaming: bool) -> str:
    """``idempotence_key``: batch jobs only, 1-256 printable characters."""
    if "idempotence_key" not in opts:
        return ""
    if streaming:
        raise ConfigurationError(
            "option idempotence_key is for batch jobs; a streaming query is made idempotent by its checkpoint"
        )
    return str(WRITER_OPTIONS["idempotence_key"].read(opts))


def prefixed(opts: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``setting.<name>`` (ClickHouse settings) and ``fault.*`` (test-only hooks)."""
    settings: dict[str, str] = {}
    faults: dict[str, str] = {}
    for k, v in opts.items():
        if k.startswith("setting."):
            name = k[len("setting.") :]
            if not name.isidentifier() or not name.isascii():
                raise ConfigurationError(f"option {k}: {name!r} is not a ClickHouse setting name")
            settings[name] = v
        elif k.startswith("fault."):
            faults[k] = v
    refuse_pinned(settings, "option setting.{name}")
    _check_faults(faults)
    return settings, faults


def _check_faults(faults: Mapping[str, str]) -> None:
    """``fault.*``: refused outside the test suite, and a bad step fails here, on the driver."""
    if not faults:
        return
    from clickhouse_tx.testing.faults import FaultPlan, check_enabled

    check_enabled(faults)
    try:
        FaultPlan.parse(faults)
    except ValueError as exc:
        raise ConfigurationError(f"option {exc}") from None


def sharding(opts: Mapping[str, str]) -> dict[str, Any]:
    """``shards`` (each URL checked like ``url``), ``sharding_key``, ``shard_weights`` as fields."""
    from clickhouse_tx.sharding.placement import parse_shard_urls, parse_weights

    if "shards" not in opts:
        for name in ("sharding_key", "shard_weights"):
            if name in opts:
                raise ConfigurationError(f"option {name} needs the option shards (the cluster's servers)")
        return {}
    if opts.get("visibility", "").strip().lower() == "batch":
        raise ConfigurationError(
            "option visibility=batch with shards: a batch spans several servers and one ClickHouse "
            "transaction cannot; use visibility=partition (the default)"
        )
    url = WRITER_OPTIONS["url"]
    shards = tuple(tuple(url.parse(u) for u in replicas) for replicas in parse_shard_urls(opts["shards"]))
    key = WRITER_OPTIONS["sharding_key"].read(opts)
    weights = parse_weights(opts["shard_weights"], len(shards)) if "shard_weights" in opts else ()
    return {"shards": shards, "sharding_key": key, "shard_weights": weights}
