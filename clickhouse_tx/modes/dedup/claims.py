"""Mode ``dedup``: the layout of a batch, so a replay under another partitioning is refused.

Dedup rows are visible as soon as they are inserted, and a chunk's token is made of
its partition number and its rows. A replay of a batch that cuts it into other
partitions (another ``repartition(n)``, ``minPartitions`` or Kafka partition count)
sends other tokens for rows already in the table: ClickHouse would insert them again.
The layout records of this module refuse such a replay before it inserts:

claim (executor, once per partition attempt, before its first chunk)
    ``<txn>/<batch>/<partition>`` -> ``{"first", "run", "inserted", "caught_up"}``: the
    first chunk's fingerprint (rows and digest), the run that claimed it
    (:attr:`WriteContext.run`, one id per run of the job or query), whether it went on
    to insert, and the run whose attempt has re-checked every chunk the earlier runs
    recorded for the partition. Created if absent; marked ``inserted`` just before the
    first insert (created so marked when the batch's records, read first, leave it
    nothing to wait for at the barrier). A later attempt whose first chunk differs
    from an inserted claim is refused, and so is one whose later chunk differs (the
    claim is then marked ``refused_by`` this run).
chunk record (executor, before each chunk k > 0 and once past the last chunk)
    ``<txn>/<batch>/<partition>/<k>`` -> ``{"chunk", "run"}``: chunk k's fingerprint,
    or :data:`END` one past the partition's last chunk, created if absent just before
    the chunk's insert (the chunk number in the entry's ``attempt`` column). A later
    attempt whose chunk k differs from the recorded one is refused before inserting it.
the barrier (executor, before a chunk no earlier record binds)
    Rows no record binds (a partition without an inserted claim, or a chunk past the
    point where an earlier run stopped inside a partition) may be rows the earlier run
    inserted in another partition. They go in only once every inserted claim of the
    batch is caught up by this run (:func:`barrier`): this run's attempt of each
    partition an earlier run inserted has re-checked, with the same rows, every chunk
    recorded there. Then the earlier runs' rows are rows of this run at the same
    places, and the unbound rows, being other rows of this run, were never inserted.
first run (executor, once per partition attempt, before its claim)
    ``<txn>/<batch>/first_run`` -> ``{"run"}``, created if absent: in a batch this run
    reached first, no claim of another run binds it, and the barrier needs no scan.
seal (driver, at the start of every commit of the batch, before its decision)
    ``<txn>/<batch>/all`` -> every partition's first-chunk fingerprint, rows, checksum
    and chunk count, from the commit messages, created if absent. Before sealing, every
    inserted claim of the batch must match the messages (read only when the batch's
    first run is not this one: this run's own claims match its messages, or their
    attempts were refused and sent none). Once sealed, an executor's partition that the seal does not hold (a
    partition number beyond the sealed count, or one that was empty), or holds with
    another first chunk, is refused; so is a commit whose messages differ from the seal.

All are KeeperMap rows (``clickhouse_tx_layouts``, beside the registry;
:class:`~clickhouse_tx.modes.dedup.records.ClaimRecords`) written as finished registry
entries, the way the decision log's arbiter claims versions: an
``INSERT`` under ``keeper_map_strict_mode`` fails on an existing key, so the first
writer wins and every later one compares. The checks themselves are pure functions
(:func:`check_partition`, :func:`check_chunk`, :func:`barrier`, :func:`check_messages`).

A writer without a run id (``WriteContext.run == ""``, not the Spark writer) does not wait at
the barrier, so a replay of it under another cut is refused only where a record binds it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from clickhouse_tx.errors import DedupLayoutError
from clickhouse_tx.interfaces import Prepared

#: One partition of a layout: {"first": "<rows>:<digest>" | "", "rows": n, "checksum": c, "chunks": k}
#: (seals written before the chunk count have none: the drop then scans, see dedup_records).
Part = Mapping[str, object]
#: One partition's claim: {"first": "<rows>:<digest>", "run": run id, "inserted": bool, "caught_up":
#: run id, "refused_by": run id}; "inserted" is set just before the partition's first insert.
Claim = Mapping[str, object]
#: How long a chunk no earlier record binds waits at the barrier for the partitions an earlier
#: run inserted to be caught up by this run (then it refuses; Spark may retry the task).
WAIT_S = 120.0
#: The fingerprint recorded one past a partition's last chunk (a replay longer or
#: shorter than the earlier run's partition differs there).
END = "end"


def way_out(txn_id: str) -> str:
    """What the user does after a :class:`DedupLayoutError`."""
    return (
        f"Way out: run the batch again with the original partitioning (the same "
        "repartition(n), Kafka partitions and kafka_py options minPartitions, maxPartitions and "
        "minRecordsPerPartition): restart the streaming query on "
        f"the same checkpoint, or re-run the batch job with transactional_id '{txn_id}' and "
        "the same decision_log. It re-sends the same rows under the same tokens, which "
        "ClickHouse drops as duplicates"
    )


def describe(layout: Mapping[int, Part]) -> str:
    """``3 partitions (0: 1000 rows, 1: 1000 rows, 2: empty)`` for error messages."""

    def one(p: int) -> str:
        part = layout[p]
        if part.get("committed"):
            return f"{p}: committed"
        return f"{p}: {part.get('rows', '?')} rows" if part.get("first") else f"{p}: empty"

    return f"{len(layout)} partitions ({', '.join(one(p) for p in sorted(layout))})"


def check_partition(
    txn_id: str,
    batch: int,
    partition: int,
    first: str,
    sealed: Mapping[int, Part] | None,
    claimed: str | None,
) -> None:
    """Executor, before a partition's first chunk: raise if the batch was cut otherwise.

    ``first`` is this attempt's first-chunk fingerprint, ``sealed`` the batch's seal
    (None before its first commit), ``claimed`` the fingerprint an earlier attempt of
    this partition claimed (None if none did). Later chunks: :func:`check_chunk`.
    """
    where = f"batch {batch} of {txn_id}, partition {partition}"
    if sealed is not None:
        before = sealed.get(partition)
        if before is None or before.get("first") != first:
            held = (
                "does not exist"
                if before is None
                else ("was empty" if not before.get("first") else f"began with other rows ({before.get('first')})")
            )
            raise DedupLayoutError(
                f"{where}: this run's partition begins with {first}, but in the run whose rows are "
                f"already in the table (mode dedup: visible at prepare) the batch was cut into "
                f"{describe(sealed)} and this partition {held}. Inserting this cut would duplicate "
                f"rows; nothing of this partition was inserted. {way_out(txn_id)}"
            )
    if claimed is not None and claimed != first:
        raise DedupLayoutError(
            f"{where}: this run's partition begins with {first}, but an earlier attempt of it "
            f"inserted rows beginning with {claimed}: the batch was cut into other partitions "
            "than the run whose rows are already in the table. Inserting this cut would duplicate "
            f"rows; nothing of this partition was inserted. {way_out(txn_id)}"
        )


def check_chunk(txn_id: str, batch: int, partition: int, chunk: int, mine: str, claimed: str | None) -> None:
    """Executor, before chunk ``chunk`` > 0 of a partition: raise if it differs from the recorded one.

    ``mine`` is this attempt's fingerprint of the chunk (:data:`END` one past its last
    chunk), ``claimed`` the one an earlier attempt recorded there (None if none did).
    The seal holds first chunks only, so it plays no part here.
    """
    if claimed is None or claimed == mine:
        return
    where = f"batch {batch} of {txn_id}, partition {partition}, chunk {chunk}"
    if claimed == END:
        held = f"an earlier attempt of it inserted this partition whole and it ended after {chunk} chunks"
    else:
        held = f"an earlier attempt of it inserted chunk {chunk} as {claimed}"
    this = f"ends after {chunk} chunks" if mine == END else f"holds {mine} as chunk {chunk}"
    raise DedupLayoutError(
        f"{where}: this run's partition has the same first chunks but {this}, while {held}: the "
        "batch was cut into other partitions than the run whose rows are already in the table "
        f"(mode dedup: visible at prepare). Inserting the rest would duplicate rows; chunk {chunk} "
        f"and the later ones of this attempt were not inserted. {way_out(txn_id)}"
    )


def barrier(txn_id: str, batch: int, partition: int, run: str, claims: Mapping[int, Claim]) -> list[int]:
    """Executor, before rows no earlier record binds: the claims they must wait for.

    Before the batch's seal, the partitions an earlier run inserted are known only by
    their claims and chunk records, and an executor cannot know how many partitions
    either run has. Unbound rows (a partition no earlier run claimed, or a chunk past
    where an earlier run stopped inside this partition) go in only once every inserted
    claim of the batch is caught up by this run: its attempt of that partition has
    re-checked every chunk recorded there, with the same rows. Then the earlier runs'
    rows are this run's rows at the same places, and the unbound rows were never
    inserted. Returns the partitions still to wait for (empty: go on).

    Raises
    ------
    DedupLayoutError
        This run refused one of those partitions (other rows): the batch was cut
        otherwise, so the unbound rows may be among the earlier run's.
    """
    refused = sorted(p for p, c in claims.items() if c.get("refused_by") == run)
    if refused:
        raise DedupLayoutError(
            f"batch {batch} of {txn_id}, partition {partition}: an earlier run inserted partitions "
            f"{sorted(p for p, c in claims.items() if c.get('inserted'))} of this batch and stopped "
            "before its commit, and this run's "
            f"partitions {refused} hold other rows than that run's: the batch was cut otherwise, "
            f"so this partition's rows may already be in the table. Its rows that no earlier record "
            f"binds were not inserted. {way_out(txn_id)}"
        )
    return sorted(p for p, c in claims.items() if c.get("inserted") and c.get("caught_up") != run)


def layout_of(messages: Sequence[Prepared]) -> dict[int, Part]:
    """The layout a run's commit messages describe (the lowest attempt per partition).

    A partition whose attempt found it committed already inserted nothing: it is
    ``{"committed": xid}`` and not compared.
    """
    out: dict[int, Part] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.attempt, m.xid)):
        if m.partition in out:
            continue
        done = m.details.get("committed_by")
        out[m.partition] = (
            {"committed": str(done)}
            if done
            else {
                "first": str(m.details.get("first_chunk") or ""),
                "rows": m.rows,
                "checksum": m.checksum,
                "chunks": int(m.details.get("chunks") or 0),
            }
        )
    return out


def _differ(now: Mapping[int, Part], sealed: Mapping[int, Part]) -> list[int]:
    """Partitions with rows in either layout whose first chunk, rows or checksum differ."""
    keys = ("first", "rows", "checksum")
    out = []
    for p in sorted(set(now) | set(sealed)):
        a, b = now.get(p, {}), sealed.get(p, {})
        if a.get("committed") or not (a.get("first") or b.get("first")):
            continue
        if [a.get(k) for k in keys] != [b.get(k) for k in keys]:
            out.append(p)
    return out


def check_messages(
    txn_id: str, batch: int, now: Mapping[int, Part], sealed: Mapping[int, Part] | None, claims: Mapping[int, Claim]
) -> None:
    """Driver, at the start of a batch's commit: raise if this run cut the batch otherwise.

    Against the seal: every partition with rows, in either layout, must hold the same
    first chunk, rows and checksum in both (partitions this run found committed are
    not compared). Without a seal: every claim must be a partition of ``now`` with the
    same first chunk.
    """
    if sealed is not None:
        differ = _differ(now, sealed)
        if differ:
            raise DedupLayoutError(
                f"batch {batch} of {txn_id}: this run cut the batch into {describe(now)}, but the "
                f"run whose rows are already in the table (mode dedup: visible at prepare) cut it "
                f"into {describe(sealed)}; partitions {differ} differ. The batch is not committed. "
                f"Rows this run inserted into other partitions may be in the table twice. "
                f"{way_out(txn_id)}"
            )
        return
    differ = sorted(
        p
        for p, c in claims.items()
        if c.get("inserted") and not now.get(p, {}).get("committed") and now.get(p, {}).get("first") != c.get("first")
    )
    if differ:
        raise DedupLayoutError(
            f"batch {batch} of {txn_id}: this run cut the batch into {describe(now)}, but an "
            f"earlier run inserted partitions {differ} with other rows (it inserted partitions "
            f"{sorted(p for p, c in claims.items() if c.get('inserted'))} before it stopped). The "
            "batch is not committed. "
            f"Rows this run inserted may be in the table twice. {way_out(txn_id)}"
        )


def run_claim(first: str, run: str, *, inserted: bool) -> dict[str, Any]:
    """The claim ``run`` makes of a partition beginning with ``first``: inserted ones are caught up by it."""
    claim: dict[str, Any] = {"first": first, "run": run, "inserted": inserted}
    return {**claim, "caught_up": run} if inserted else claim
