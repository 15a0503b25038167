"""An exactly-once verifier for any ClickHouse table fed from Kafka (eBay's "runtime verifier").

It reads the target table (and, when present, the commit markers and the decision
logs) and reports, per topic-partition:

- ``duplicate``: an offset stored more than once (runs of consecutive duplicated
  offsets are reported as one range: a replayed batch committed twice looks like that);
- ``gap``: offsets missing inside what was stored, or, against ``expected`` end
  offsets, at its head or tail, or whole partitions missing;
- ``unexpected``: offsets or partitions beyond the expected ones;
- with ``segment_col`` (a column constant per insert, e.g. ``ingested_at
  DateTime64(3) DEFAULT now64(3)``, or a batch id): the offset range of each
  committed insert, in order, checked like eBay's verifier: the next range must start
  right after the previous one (``gap`` if later, ``overlap`` if it starts inside the
  previous range, ``backward`` if it lies wholly before it);
- with the markers table ``clickhouse_tx_commits`` in the target database:
  ``double_commit`` (one (txn_id, batch, partition) committed under two xids) and
  ``marker_count_mismatch`` (marker rows' ``rows`` do not add up to the table's row count);
- with a checkpoint location (the decision logs): ``decided_not_committed``, a batch
  whose decision names an xid whose marker is not visible.

The table's materialized views (:func:`clickhouse_tx.modes.views.dependent_views`, down
chains) are listed in the report as not checked, each with why: a view's table holds
what its ``SELECT`` made of each inserted block (a rollup, a filter), which the
verifier cannot recompute from the offsets; ``docs/modes.md`` says what each mode
keeps of them. The verdict (``clean``) is the table's.

Every read of user tables uses ``implicit_transaction=1``: ClickHouse shows the rows of
running (uncommitted) transactions to queries outside a transaction (``docs/design.md`` §4), so a
plain ``SELECT`` would count rows that may still be rolled back. ``system.*`` tables do
not support transactions and are read without it.

This module reads (:class:`ClickHouseReader`) and runs the checks in order: the
offsets (:mod:`clickhouse_tx.verify.offsets`), then the markers and the decision
logs (:mod:`clickhouse_tx.verify.audit`); the findings are the values of
:mod:`clickhouse_tx.verify.report`. Everything runs in the calling process (a CLI, a
benchmark, a test); no Spark.
"""

from __future__ import annotations

from typing import Mapping

from clickhouse_tx.client.http import safe_url
from clickhouse_tx.client.sql import quote_option_identifier as quote_ident  # names come from the CLI
from clickhouse_tx.client.sql import split_table
from clickhouse_tx.errors import ClickHouseTxError, ConfigurationError
from clickhouse_tx.interfaces import DEFAULT_TLS, Target, TlsSettings
from clickhouse_tx.store.markers import CommitMarkers
from clickhouse_tx.verify.audit import audit
from clickhouse_tx.verify.offsets import Columns, Scan, offset_checks, summaries, tp_order
from clickhouse_tx.verify.reader import ClickHouseReader
from clickhouse_tx.verify.report import TP, VerifyReport

#: The verifier's API: ``verify`` takes the reader it runs with.
__all__ = ["ClickHouseReader", "DEFAULT_SAMPLE_LIMIT", "verify", "views_not_checked"]

#: At most this many rows of a kind are fetched to describe anomalies (counts stay exact).
DEFAULT_SAMPLE_LIMIT = 100_000


def verify(
    url: str,
    table: str,
    *,
    topic_col: str | None = "topic",
    partition_col: str = "partition",
    offset_col: str = "offset",
    expected: Mapping[TP, tuple[int, int]] | None = None,
    segment_col: str | None = None,
    txn_id: str | None = None,
    checkpoint: str | None = None,
    markers: bool | None = None,
    user: str = "default",
    password: str = "",
    sample_limit: int = DEFAULT_SAMPLE_LIMIT,
    tls: TlsSettings = DEFAULT_TLS,
) -> VerifyReport:
    """Check ``table`` for exactly-once anomalies (see the module docstring).

    Parameters
    ----------
    url, table:
        The ClickHouse HTTP endpoint and ``db.table`` to check.
    topic_col, partition_col, offset_col:
        Where the Kafka coordinates are stored; ``topic_col=None`` for tables without one.
    expected:
        From :func:`~clickhouse_tx.verify.offsets.parse_expected`: the offsets that must be present, exactly once.
    segment_col:
        A column constant within one committed insert (see the module docstring).
    txn_id:
        Restrict marker and decision checks to this query's transactional id.
    checkpoint:
        The query's ``checkpointLocation``: check its decision logs against the markers.
    markers:
        Check the markers table: None = when it exists, True = it must exist.
    tls:
        How an ``https://`` server is trusted (:class:`~clickhouse_tx.interfaces.TlsSettings`).

    Raises
    ------
    ConfigurationError
        The table or a named column does not exist.
    ServerError
        ClickHouse refused a query or could not be reached.
    """
    db, t = split_table(table)
    ch = ClickHouseReader(url, user=user, password=password, tls=tls)
    try:
        scan = _open_scan(
            ch, db, t, url, (topic_col, partition_col, offset_col), segment_col=segment_col, sample_limit=sample_limit
        )
        if expected and not scan.cols.topic:
            # a table without a topic column is checked by partition alone
            expected = {(None, p): v for (_, p), v in expected.items()}
        found = summaries(scan, expected or {})
        total = sum(s.rows for s in found.values())
        checks, anomalies = offset_checks(scan, found, expected, segment_col)
        target = Target(url=url, database=db, table=t, user=user, password=password, tls=tls)
        marker_info = audit(
            ch,
            CommitMarkers(target, ch.client),
            total,
            txn_id=txn_id,
            checkpoint=checkpoint,
            required=markers,
            checks=checks,
            anomalies=anomalies,
        )
        return VerifyReport(
            table=table,
            rows=total,
            distinct=sum(s.distinct for s in found.values()),
            partitions=tuple(found[k] for k in sorted(found, key=tp_order)),
            anomalies=tuple(anomalies),
            checks=tuple(checks),
            markers=marker_info,
            views_not_checked=views_not_checked(target),
        )
    finally:
        ch.close()


#: Why a materialized view's table is not checked (see the module docstring).
VIEW_NOT_CHECKED = (
    "its table holds what the view's SELECT made of each inserted block, which the offsets "
    "cannot recompute; compare it with that SELECT over the table"
)


def views_not_checked(target: Target) -> tuple[dict[str, str], ...]:
    """The target's materialized views, each with why it is not checked; one entry if listing them failed."""
    from clickhouse_tx.modes.views import dependent_views

    try:
        views = dependent_views(target)
    except ClickHouseTxError as exc:
        return ({"view": "*", "table": "*", "why": f"the views could not be listed: {exc}"},)
    return tuple(
        {
            "view": f"{v.view[0]}.{v.view[1]}",
            "table": f"{v.target[0]}.{v.target[1]}" if v.target else "?",
            "why": VIEW_NOT_CHECKED if v.target else "the server does not say which table it writes into",
        }
        for v in views
    )


def _open_scan(
    ch: ClickHouseReader,
    db: str,
    t: str,
    url: str,
    coordinates: tuple[str | None, str, str],
    *,
    segment_col: str | None,
    sample_limit: int,
) -> Scan:
    """The scan of ``db.t`` once the table and every named column are found to exist.

    ``coordinates``: the (topic, partition, offset) columns; topic None or "" for none.
    """
    topic_col, partition_col, offset_col = coordinates
    _check_columns(
        ch,
        db,
        t,
        url,
        topic_col=topic_col,
        partition_col=partition_col,
        offset_col=offset_col,
        segment_col=segment_col,
    )
    return Scan(
        ch,
        Columns(topic_col or None, partition_col, offset_col),
        f"{quote_ident(db)}.{quote_ident(t)}",
        int(sample_limit),
    )


def _check_columns(ch: ClickHouseReader, db: str, t: str, url: str, **named: str | None) -> None:
    """The table and every named column exist (``named``: option -> column or None)."""
    types = ch.columns(db, t)
    if not types:
        raise ConfigurationError(f"table {db}.{t} does not exist on {safe_url(url)}")
    for opt, c in named.items():
        if c and c not in types:
            raise ConfigurationError(
                f"{opt.replace('_col', ' column')} {c!r} is not a column of {db}.{t} (columns: {', '.join(types)})"
            )
