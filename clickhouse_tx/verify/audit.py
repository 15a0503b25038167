"""The verifier's audit of the commit evidence: the markers and the decision logs.

Beside the offsets (:mod:`clickhouse_tx.verify.offsets`), a table written by
clickhouse-tx has its commit markers (``clickhouse_tx_commits`` in its database, read
through :class:`~clickhouse_tx.store.markers.CommitMarkers`), its published batch jobs
(``clickhouse_tx_jobs``) and, given the query's checkpoint, its decision logs. The
audit reports ``double_commit`` (one (txn_id, batch, partition) committed under two
xids), ``marker_count_mismatch`` (markers and published jobs do not add up to the
table's rows) and ``decided_not_committed`` (a decision names an xid without a
marker). Runs in the calling process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clickhouse_tx.client.sql import quote_option_identifier as quote_ident
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.store.markers import MARKERS_TABLE, CommitMarkers
from clickhouse_tx.verify.report import Anomaly

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.verify.reader import ClickHouseReader


def audit(
    ch: ClickHouseReader,
    markers: CommitMarkers,
    total: int,
    *,
    txn_id: str | None,
    checkpoint: str | None,
    required: bool | None,
    checks: list[str],
    anomalies: list[Anomaly],
) -> dict[str, object] | None:
    """The markers table and the decision logs, when present or ``required``.

    ``markers`` is the target's (its ``target`` names the table audited); ``total`` the
    table's row count. Appends to ``checks`` and ``anomalies``; returns the markers'
    totals (None: not checked).
    """
    db = markers.target.database
    columns = markers.columns()
    if required and not columns:
        raise ConfigurationError(f"the markers table {db}.{MARKERS_TABLE} does not exist")
    if not columns or required is False:
        if checkpoint:
            raise ConfigurationError(
                f"checking the decision logs of {checkpoint} needs the markers "
                f"table {db}.{MARKERS_TABLE}, which does not exist"
            )
        return None
    checks.append("markers")
    # markers name the target as "db.table" or as the bare table; older ones not at all
    t = markers.target.table
    names = (f"{db}.{t}", t) if "table" in columns else ()
    info, found = _check_markers(ch, markers, names, total, txn_id)
    anomalies.extend(found)
    if checkpoint:
        checks.append("decision logs")
        anomalies.extend(_check_decisions(markers, checkpoint, txn_id))
    return info


def _check_markers(
    ch: ClickHouseReader, markers: CommitMarkers, names: tuple[str, ...], table_rows: int, txn_id: str | None
) -> tuple[dict[str, object], list[Anomaly]]:
    """The markers' totals, their double commits, and whether they account for the table's rows."""
    agg = markers.totals(names, txn_id)
    jobs, job_rows = _published_jobs(ch, markers.target.database, markers.target.table, txn_id)
    info: dict[str, object] = {**agg, "published_jobs": jobs, "published_job_rows": job_rows}
    out: list[Anomaly] = []
    for r in markers.double_commits(names, txn_id):
        detail = (
            f"txn {r['txn_id']} batch {r['batch']} spark partition {r['p']} committed "
            f"by {len(r['xids'])} xids: {', '.join(r['xids'])}"
        )
        out.append(Anomaly.of_table("double_commit", len(r["xids"]) - 1, detail))
    # Only a table filled by this one query can be compared with its markers' row counts.
    # A batch job published at once has markers for its stage and one row for the target.
    accounted = agg["rows"] + job_rows
    one_query = txn_id is None or agg["txn_ids"] + jobs == 1
    if (agg["markers"] or jobs) and accounted != table_rows and one_query:
        detail = f"markers and published jobs account for {accounted} rows, the table holds {table_rows}"
        out.append(Anomaly.of_table("marker_count_mismatch", abs(accounted - table_rows), detail))
    return info, out


def _published_jobs(ch: ClickHouseReader, db: str, t: str, txn_id: str | None) -> tuple[int, int]:
    """(jobs, rows) of the batch jobs published into ``db.t`` at once (``clickhouse_tx_jobs``)."""
    from clickhouse_tx.jobs.publish import JOBS_TABLE

    if not ch.columns(db, JOBS_TABLE):
        return 0, 0
    where = "`table` = {jt:String}" + (" AND txn_id = {jx:String}" if txn_id else "")
    row = ch.rows(
        f"SELECT count() AS jobs, sum(`rows`) AS rows FROM {quote_ident(db)}.{quote_ident(JOBS_TABLE)} WHERE {where}",
        {"jt": f"{db}.{t}", "jx": txn_id or ""},
    )[0]
    return int(row["jobs"]), int(row["rows"] or 0)


def _check_decisions(markers: CommitMarkers, checkpoint: str, txn_id: str | None) -> list[Anomaly]:
    """Every xid a decision log names must have a visible marker (every mode but none)."""
    from clickhouse_tx.store.decision_log import FileDecisionLog, txn_ids_with_decisions

    txns = [txn_id] if txn_id else txn_ids_with_decisions(checkpoint)
    out: list[Anomaly] = []
    for txn in txns:
        lg = FileDecisionLog(checkpoint, txn)
        seen = markers.committed_xids(txn)
        for b in sorted(lg.batches()):
            d = lg.read(b)
            if d is None:
                continue
            missing = [p for p in d.chosen if p.xid not in seen and p.mode.value != "none"]
            if missing:
                state = "marked done" if d.done else "not marked done (a replay would roll it forward)"
                detail = f"txn {txn} batch {b} (decision v{d.version}, {state}): no marker for " + ", ".join(
                    f"partition {p.partition} xid {p.xid}" for p in missing
                )
                out.append(Anomaly.of_table("decided_not_committed", len(missing), detail))
    return out
