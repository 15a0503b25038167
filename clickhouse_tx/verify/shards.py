"""The exactly-once verifier over the shards of a sharded table.

A sharded write spreads each Kafka partition's offsets over the shards, so one shard
alone has gaps by design; :func:`verify_shards` reads the (topic, partition, offset)
of every shard, read-committed, and checks their union: an offset stored twice, on
one shard or on two (a ``duplicate`` naming the shards), an offset missing between
the lowest and highest stored (a ``gap``), and, with ``expected`` end offsets, the
head and tail (:func:`clickhouse_tx.verify.offsets.check_expected`).

It holds every stored offset in memory (about 100 bytes per row): meant for the
test and benchmark tables and for spot checks of a bounded range, not for a table of
billions of rows. The markers and decision-log checks of :func:`~clickhouse_tx.verify.verifier.verify`
run per shard there (``python -m clickhouse_tx verify --url`` on each shard).
Runs in the calling process (the CLI, a test); no Spark.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from clickhouse_tx.client.http import safe_url
from clickhouse_tx.client.sql import quote_option_identifier as quote_ident
from clickhouse_tx.client.sql import split_table
from clickhouse_tx.interfaces import DEFAULT_TLS, TlsSettings
from clickhouse_tx.verify.offsets import check_expected, runs
from clickhouse_tx.verify.reader import ClickHouseReader
from clickhouse_tx.verify.report import TP, Anomaly, PartitionSummary, VerifyReport


def _read_shard(
    url: str, table: str, cols: tuple[str | None, str, str], user: str, password: str, tls: TlsSettings
) -> list[tuple[TP, int]]:
    db, t = split_table(table)
    topic, partition, offset = cols
    topic_sql = quote_ident(topic) if topic else "''"
    key = f"{topic_sql} AS topic, {quote_ident(partition)} AS p, {quote_ident(offset)} AS o"
    reader = ClickHouseReader(url, user=user, password=password, tls=tls)
    try:
        rows = reader.rows(f"SELECT {key} FROM {quote_ident(db)}.{quote_ident(t)}")
    finally:
        reader.close()
    return [((r["topic"] if topic else None, int(r["p"])), int(r["o"])) for r in rows]


def _tp_anomalies(tp: TP, holders: Mapping[int, list[int]], urls: Sequence[str]) -> list[Anomaly]:
    """Duplicates (within or across shards) and inner gaps of one topic-partition."""
    out: list[Anomaly] = []
    for first, last in runs(sorted(o for o, shards in holders.items() if len(shards) > 1)):
        where = sorted({safe_url(urls[s]) for o in range(first, last + 1) for s in holders[o]})
        extra = sum(len(holders[o]) - 1 for o in range(first, last + 1))
        out.append(
            Anomaly.over("duplicate", tp, first, last, f"stored more than once, on {', '.join(where)}", count=extra)
        )
    stored = sorted(holders)
    for prev, o in zip(stored, stored[1:]):
        if o > prev + 1:
            out.append(Anomaly.over("gap", tp, prev + 1, o - 1, "offsets missing on every shard"))
    return out


def verify_shards(
    urls: Sequence[str],
    table: str,
    *,
    topic_col: str | None = "topic",
    partition_col: str = "partition",
    offset_col: str = "offset",
    expected: Mapping[TP, tuple[int, int]] | None = None,
    user: str = "default",
    password: str = "",
    tls: TlsSettings = DEFAULT_TLS,
) -> VerifyReport:
    """Check ``table`` across the shards at ``urls`` (one server per shard) for duplicates and gaps."""
    holders: dict[TP, dict[int, list[int]]] = {}
    for shard, url in enumerate(urls):
        for tp, o in _read_shard(url, table, (topic_col, partition_col, offset_col), user, password, tls):
            holders.setdefault(tp, {}).setdefault(o, []).append(shard)
    anomalies: list[Anomaly] = []
    summaries: dict[TP, PartitionSummary] = {}
    for tp in sorted(holders, key=lambda k: (str(k[0]), k[1])):
        h = holders[tp]
        summaries[tp] = PartitionSummary(tp[0], tp[1], sum(len(s) for s in h.values()), len(h), min(h), max(h))
        anomalies += _tp_anomalies(tp, h, urls)
    if expected:
        anomalies += check_expected(summaries, expected)
    return VerifyReport(
        table=f"{table} on {len(urls)} shards",
        rows=sum(s.rows for s in summaries.values()),
        distinct=sum(s.distinct for s in summaries.values()),
        partitions=tuple(summaries.values()),
        anomalies=tuple(anomalies),
        checks=("duplicates across shards", "gaps across shards") + (("expected",) if expected else ()),
    )
