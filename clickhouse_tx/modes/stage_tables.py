"""Stage tables: their names, the plan kept in their COMMENT, the sessions that publish them.

A stage table holds rows prepared for the target until a commit MOVEs (or
``INSERT ... SELECT``s) them in: per xid in mode ``staging``
(:mod:`clickhouse_tx.modes.staging`), per job for batch jobs published at once and
overwrites (:mod:`clickhouse_tx.job_publish`, ``spark_datasource.overwrite``). Their
names say whose they are, so ``gc`` finds what a dead writer left
(:mod:`clickhouse_tx.recovery`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from clickhouse_tx import sql as q
from clickhouse_tx.errors import ClickHouseTxError, OutcomeUnknownError
from clickhouse_tx.http_client import ClickHouseHTTP
from clickhouse_tx.http_errors import INVALID_TRANSACTION, SESSION_IS_LOCKED, SESSION_NOT_FOUND, ReplyLostError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import Target

#: Stage tables of mode staging, one per xid.
STAGE_PREFIX = "_ctx_stage_"
#: Stage tables of dead letters (beside the stage of the same xid; not a STAGE_PREFIX name,
#: so ``gc`` reaches them through the rollback of their xid's stage).
DEAD_LETTER_STAGE_PREFIX = "_ctx_dlstage_"
#: Stage tables of batch overwrite jobs (``spark_datasource.overwrite``).
OVERWRITE_STAGE_PREFIX = "_ctx_ow_"
#: Idle seconds after which the server rolls back a batch transaction whose driver died
#: holding it (its MOVEs lock the stages' parts until then).
BATCH_SESSION_TIMEOUT_S = 60
#: How long a replay waits for a batch COMMIT still running in the session (SESSION_IS_LOCKED).
SETTLE_WAIT_S = 30.0


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
    session still busy (SESSION_IS_LOCKED: a COMMIT running) is waited for.
    """
    deadline = time.monotonic() + SETTLE_WAIT_S
    while True:
        try:
            c.command("ROLLBACK", session_check=True)
            return True
        except ClickHouseTxError as exc:
            if exc.code in (SESSION_NOT_FOUND, INVALID_TRANSACTION):
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
