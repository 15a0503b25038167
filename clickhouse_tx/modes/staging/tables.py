"""Stage tables: their names, the plan kept in their COMMENT, the sessions that publish them.

A stage table holds rows prepared for the target until a commit MOVEs (or
``INSERT ... SELECT``s) them in: per xid in mode ``staging``
(:mod:`clickhouse_tx.modes.staging.mode`), per job for batch jobs published at once and
overwrites (:mod:`clickhouse_tx.jobs.publish`, ``spark_datasource.sink.overwrite``). Their
names say whose they are, so ``gc`` finds what a dead writer left
(:mod:`clickhouse_tx.admin.recovery`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import SESSION_IS_LOCKED, SESSION_NOT_FOUND, no_current_transaction
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.errors import ClickHouseTxError, OutcomeUnknownError, ReplyLostError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import Target

#: Stage tables of mode staging, one per xid.
STAGE_PREFIX = "_ctx_stage_"
#: Stage tables of dead letters (beside the stage of the same xid; not a STAGE_PREFIX name,
#: so ``gc`` reaches them through the rollback of their xid's stage).
DEAD_LETTER_STAGE_PREFIX = "_ctx_dlstage_"
#: Stage tables of batch overwrite jobs (``spark_datasource.sink.overwrite``).
OVERWRITE_STAGE_PREFIX = "_ctx_ow_"
#: Idle seconds after which the server rolls back a batch transaction whose driver died
#: holding it (its MOVEs lock the stages' parts until then).
BATCH_SESSION_TIMEOUT_S = 60
#: How long a replay waits for a batch COMMIT still running in the session (SESSION_IS_LOCKED).
SETTLE_WAIT_S = 30.0
#: Appended to a Replicated table's Keeper path to make the parent of its stages' paths: a
#: sibling of the table's own node, so nothing of a stage is written into the table's tree.
STAGE_PATH_SUFFIX = "_clickhouse_tx_stages"

#: ``Replicated*MergeTree('<path>'`` / ``Shared*MergeTree('<path>'`` at the start of ``engine_full``.
_KEEPER_PATH_ARG = re.compile(r"((?:Replicated|Shared)\w*MergeTree)\s*\(\s*'((?:[^'\\]|\\.)*)'")
_REPLICATED_ENGINE = re.compile(r"(?:Replicated|Shared)\w*MergeTree\b")
#: How long a process reuses what it read of a non-replicated table for the stages it
#: creates (a reused Python worker creates one per task; the read cost a request each).
#: Such a stage is ``AS <table>``: were the table re-created as a replicated one
#: meanwhile, the stage's DDL or MOVE fails, never silently.
ENGINE_CACHE_S = 60.0
_engines: dict[tuple[str, str, str], tuple[float, str, str]] = {}


def stage_name(xid: str) -> str:
    """Name of the stage table of ``xid`` (in the target's database)."""
    return STAGE_PREFIX + xid


def dead_letter_stage_name(xid: str) -> str:
    """Name of the dead-letter stage table of ``xid`` (in the target's database)."""
    return DEAD_LETTER_STAGE_PREFIX + xid


def overwrite_stage_name(txn_id: str) -> str:
    """A fresh name for the stage table of an overwrite job: ``_ctx_ow_<txn>_<32 hex>``.

    The job's (sanitised) txn id in the name lets ``gc`` tell whose a leftover is.
    """
    return f"{OVERWRITE_STAGE_PREFIX}{sanitize_txn(txn_id)}_{uuid.uuid4().hex}"


def is_overwrite_stage_of(name: str, txn_id: str) -> bool:
    """True if ``name`` was made by :func:`overwrite_stage_name` for ``txn_id``."""
    return re.fullmatch(re.escape(OVERWRITE_STAGE_PREFIX + sanitize_txn(txn_id)) + "_[0-9a-f]{32}", name) is not None


def batch_session(txn_id: str, batch: int) -> str:
    """The session of batch ``batch``'s publishing transaction.

    Named, not random, so a replay (another driver process) or ``recover`` finds and
    settles what an attempt that died left open in it. One name for every decision
    version: whoever comes next settles whatever is open, and a MOVE is idempotent.
    """
    return f"clickhouse_tx_batch_{sanitize_txn(txn_id)}_{int(batch)}"


def publish_session(xid: str) -> str:
    """The session of the transaction publishing ``xid``'s stage into a target with views.

    Named by the xid, as :func:`batch_session` is by the batch, so a replay or
    ``recover`` settles what a dead driver left open in it before it looks at the marker.
    """
    return f"clickhouse_tx_publish_{xid}"


def settle_session(c: ClickHouseHTTP) -> bool:
    """End what an earlier attempt left in ``c``'s session, so its outcome is final.

    ROLLBACK an open transaction (then True); a session that does not exist, or holds
    no transaction, has nothing open (a COMMIT there finished, or never came). A
    session still busy (SESSION_IS_LOCKED: a COMMIT running) is waited for. Any other
    refusal of the ROLLBACK, INVALID_TRANSACTION of a failed transaction among them,
    leaves a transaction open and is raised: never read as "nothing open".
    """
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        try:
            c.command("ROLLBACK", session_check=True)
            return True
        except ClickHouseTxError as exc:
            if exc.code == SESSION_NOT_FOUND or no_current_transaction(exc):
                return False
            if exc.code != SESSION_IS_LOCKED and not isinstance(exc, ReplyLostError):
                raise
            if time.monotonic() >= deadline:
                raise OutcomeUnknownError(
                    f"the batch transaction in session {c.session_id} is still running after "
                    f"{SETTLE_WAIT_S:.0f} s; a replay settles it",
                    xid=c.session_id,
                ) from exc
        time.sleep(0.5)


def tables_named(target: Target, prefix: str) -> list[tuple[str, float]]:
    """(name, age in seconds) of the tables of the target's database whose names start with ``prefix``."""
    with ClickHouseHTTP(target) as c:
        rows = c.query_json(
            "SELECT name, dateDiff('second', metadata_modification_time, now()) AS age "
            "FROM system.tables WHERE database = {d:String} AND startsWith(name, {p:String}) "
            "ORDER BY name",
            params={"d": target.database, "p": prefix},
        )
    return [(str(r["name"]), float(r["age"])) for r in rows]


def leftover_stages(target: Target) -> list[tuple[str, float]]:
    """(xid, age in seconds) of every stage table in the target's database.

    Operator side, once per ``gc`` of mode staging (``Mode.capabilities.stage_tables``):
    the candidates it matches against the registry.
    """
    return [(name[len(STAGE_PREFIX) :], age) for name, age in tables_named(target, STAGE_PREFIX)]


def stage_storage(engine_full: str, table_uuid: str, stage: str) -> tuple[str | None, bool]:
    """How a stage of a table with this ``engine_full`` is created; pure.

    Returns ``(engine, fresh_uuid)``: the ENGINE clause to give the stage instead of the
    table's (None: the table's own, ``CREATE TABLE <stage> AS <table>``), and whether
    the stage needs a UUID of its own.

    A ``Replicated*``/``Shared*MergeTree`` stage cannot take the table's Keeper path:
    the replica would already exist there. ClickHouse stores ``{database}`` and
    ``{table}`` unfolded, so the stored path is the table's own whatever macros it was
    written with. The stage's path is the table's with :data:`STAGE_PATH_SUFFIX` and
    the stage's name appended (``{uuid}`` replaced by the table's UUID; ``{shard}`` and
    ``{replica}`` kept, so the stage belongs to the server's shard as the table does),
    and the rest of the engine clause (replica name, engine arguments, keys, settings)
    is the table's, so ``MOVE PARTITION`` accepts the pair. An engine stored without
    arguments takes the server's default path, made of ``{uuid}``: a UUID of the
    stage's own makes it unique.
    """
    m = _KEEPER_PATH_ARG.match(engine_full.strip())
    if m is None:
        return None, _REPLICATED_ENGINE.match(engine_full.strip()) is not None
    path = re.sub(r"\\(.)", r"\1", m.group(2)).replace("{uuid}", table_uuid)
    stage_path = q.quote_string(f"{path.rstrip('/')}{STAGE_PATH_SUFFIX}/{stage}")
    text = engine_full.strip()
    return f"{m.group(1)}({stage_path}{text[m.end() :]}", False


def create_stage_table(
    c: ClickHouseHTTP,
    database: str,
    stage: str,
    like: tuple[str, str],
    *,
    if_not_exists: bool,
    like_info: TableInfo | None = None,
) -> None:
    """``CREATE TABLE <database>.<stage> AS <like>``, with a Keeper path of its own when ``like``
    is replicated (:func:`stage_storage`). One DDL, and one read of ``like``'s engine
    unless this process read it, non-replicated, within :data:`ENGINE_CACHE_S`.

    ``like_info``: ``like`` as the caller described it already
    (:func:`clickhouse_tx.conversion.schema.describe_table`); its ``engine_full`` and
    ``uuid`` then stand for the read.
    """
    if like_info is None:
        engine_full, table_uuid = _storage_of(c, like)
    else:
        engine_full, table_uuid = like_info.engine_full, like_info.uuid
    # An empty engine_full (no such table: the CREATE then fails naming it) keeps ``AS <like>`` alone.
    engine, fresh_uuid = stage_storage(engine_full, table_uuid, stage)
    sql = f"CREATE TABLE {'IF NOT EXISTS ' if if_not_exists else ''}{q.qualified(database, stage)}"
    if fresh_uuid:
        sql += f" UUID {q.quote_string(str(uuid.uuid4()))}"
    sql += f" AS {q.qualified(*like)}" + (f" ENGINE = {engine}" if engine else "")
    c.command(sql, idempotent=if_not_exists)


def _storage_of(c: ClickHouseHTTP, table: tuple[str, str]) -> tuple[str, str]:
    """``table``'s ``engine_full`` and UUID (empty strings when there is no such table); a
    non-replicated one's read at most every :data:`ENGINE_CACHE_S`."""
    key = (c.target.url, *table)
    cached = _engines.get(key)
    if cached is not None and time.monotonic() - cached[0] < ENGINE_CACHE_S:
        return cached[1], cached[2]
    rows = c.query_json(
        "SELECT engine_full, toString(uuid) AS uuid FROM system.tables "
        "WHERE database = {d:String} AND name = {t:String}",
        params={"d": table[0], "t": table[1]},
    )
    if not rows:
        return "", ""
    found = str(rows[0]["engine_full"]), str(rows[0]["uuid"])
    if _REPLICATED_ENGINE.match(found[0].strip()) is None:
        _engines[key] = (time.monotonic(), *found)
    return found


def record_plan(c: ClickHouseHTTP, stage: str, plan: dict[str, Any]) -> None:
    """Executor: the stage's plan into its COMMENT (durable; read by commit and rollback)."""
    c.command(f"ALTER TABLE {stage} MODIFY COMMENT {q.quote_string(json.dumps(plan))}", idempotent=True)


def plan_of(comment: str | None) -> dict[str, Any]:
    """The plan :func:`record_plan` wrote; empty if none (no table, or another comment)."""
    try:
        d = json.loads(comment or "")
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def move_sql(database: str, name: str, pid: str, into: str) -> str:
    """``ALTER TABLE <stage> MOVE PARTITION ID <pid> TO TABLE <into>``."""
    return f"ALTER TABLE {q.qualified(database, name)} MOVE PARTITION ID {q.quote_string(pid)} TO TABLE {into}"
