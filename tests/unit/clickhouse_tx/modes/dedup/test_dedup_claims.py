"""The pure checks of dedup layouts (the I/O is in tests/integration/clickhouse_tx/modes/dedup/test_dedup_claims.py)."""

from __future__ import annotations

import pytest

from clickhouse_tx.errors import DedupLayoutError
from clickhouse_tx.interfaces import Mode, Prepared
from clickhouse_tx.modes.dedup.claims import END, barrier, check_chunk, check_messages, check_partition, layout_of
from clickhouse_tx.modes.dedup.records import keys_of

SEALED = {
    0: {"first": "10:a", "rows": 10, "checksum": 1},
    1: {"first": "10:b", "rows": 10, "checksum": 2},
    2: {"first": "", "rows": 0, "checksum": 0},
}


def msg(partition: int, first: str, rows: int, checksum: int, attempt: int = 0, **details: object) -> Prepared:
    return Prepared(
        xid=f"x{partition}-{attempt}",
        txn_id="t",
        batch=4,
        partition=partition,
        attempt=attempt,
        mode=Mode.DEDUP,
        server="s",
        table="d.t",
        rows=rows,
        checksum=checksum,
        details={"first_chunk": first, **details},
    )


def test_a_partition_with_the_sealed_first_chunk_or_its_own_claim_passes() -> None:
    check_partition("t", 4, 0, "10:a", SEALED, None)
    check_partition("t", 4, 7, "10:z", None, "10:z")
    check_partition("t", 4, 7, "10:z", None, None)


@pytest.mark.parametrize(
    "partition, first, held",
    [(0, "10:x", "began with other rows"), (2, "10:c", "was empty"), (3, "10:c", "does not exist")],
)
def test_a_partition_the_seal_does_not_hold_is_refused_naming_both_layouts(
    partition: int, first: str, held: str
) -> None:
    with pytest.raises(DedupLayoutError) as info:
        check_partition("t", 4, partition, first, SEALED, None)
    text = str(info.value)
    assert f"batch 4 of t, partition {partition}" in text and held in text
    assert "3 partitions (0: 10 rows, 1: 10 rows, 2: empty)" in text and "original partitioning" in text


def test_a_claim_with_another_first_chunk_is_refused() -> None:
    with pytest.raises(DedupLayoutError, match="earlier attempt of it inserted rows beginning with 10:a"):
        check_partition("t", 4, 0, "10:b", None, "10:a")


def test_a_later_chunk_passes_when_unrecorded_or_equal_to_the_recorded_one_whatever_the_seal() -> None:
    check_chunk("t", 4, 0, 1, "10:q", None)  # the seal holds first chunks only: not an input
    check_chunk("t", 4, 0, 3, "10:q", "10:q")
    check_chunk("t", 4, 0, 2, END, END)


@pytest.mark.parametrize(
    "mine, recorded, says",
    [
        ("10:x", "10:y", "holds 10:x as chunk 2, while an earlier attempt of it inserted chunk 2 as 10:y"),
        (
            "10:x",
            END,
            "holds 10:x as chunk 2, while an earlier attempt of it inserted this partition whole and it "
            "ended after 2 chunks",
        ),
        (END, "10:y", "ends after 2 chunks, while an earlier attempt of it inserted chunk 2 as 10:y"),
    ],
)
def test_a_later_chunk_other_than_the_recorded_one_is_refused_naming_the_chunk_and_both_fingerprints(
    mine: str, recorded: str, says: str
) -> None:
    with pytest.raises(DedupLayoutError) as info:
        check_chunk("t", 4, 0, 2, mine, recorded)
    text = str(info.value)
    assert "batch 4 of t, partition 0, chunk 2: " in text and says in text and "original partitioning" in text


def test_the_layout_of_messages_takes_the_lowest_attempt_and_marks_committed_partitions() -> None:
    layout = layout_of(
        [
            msg(1, "10:b", 10, 2, attempt=1, chunks=3),
            msg(1, "10:b", 10, 2, attempt=0, chunks=2),
            msg(0, "", 0, 0, committed_by="x"),
        ]
    )
    assert layout == {0: {"committed": "x"}, 1: {"first": "10:b", "rows": 10, "checksum": 2, "chunks": 2}}


def test_a_seal_names_every_claim_and_chunk_record_of_its_batch_up_to_the_one_past_the_last_chunk() -> None:
    seal = layout_of([msg(0, "10:a", 10, 1, chunks=2), msg(1, "", 0, 0, chunks=0)])
    assert keys_of("t", 4, seal) == ["t/4/all", "t/4/first_run", "t/4/0", "t/4/0/1", "t/4/0/2", "t/4/1"]


def test_a_seal_without_chunk_counts_or_with_a_committed_partition_names_no_keys() -> None:
    assert keys_of("t", 4, {0: {"first": "10:a", "rows": 10, "checksum": 1}}) is None  # written before the counts
    assert keys_of("t", 4, layout_of([msg(0, "", 0, 0, committed_by="x")])) is None


def test_messages_matching_the_seal_pass_and_any_difference_is_refused() -> None:
    same = layout_of([msg(0, "10:a", 10, 1), msg(1, "10:b", 10, 2), msg(2, "", 0, 0)])
    check_messages("t", 4, same, SEALED, {})
    check_messages("t", 4, {**same, 0: {"committed": "x"}}, SEALED, {})
    for now in (
        {**same, 1: {"first": "10:b", "rows": 11, "checksum": 2}},  # a longer tail
        {0: same[0], 2: same[2]},  # partition 1 missing
        {**same, 3: {"first": "1:q", "rows": 1, "checksum": 5}},
    ):  # a new partition
        with pytest.raises(DedupLayoutError, match="the batch is not committed|The batch is not committed"):
            check_messages("t", 4, now, SEALED, {})


def claim(first: str, run: str = "r1", inserted: bool = True, **extra: str) -> dict[str, object]:
    return {"first": first, "run": run, "inserted": inserted, **extra}


def test_without_a_seal_every_inserted_claim_must_be_a_partition_of_the_messages_with_its_first_chunk() -> None:
    now = layout_of([msg(0, "10:a", 10, 1), msg(1, "10:b", 10, 2)])
    check_messages("t", 4, now, None, {0: claim("10:a"), 1: claim("10:b"), 3: claim("9:z", inserted=False)})
    with pytest.raises(DedupLayoutError, match=r"inserted partitions \[2\]"):
        check_messages("t", 4, now, None, {0: claim("10:a"), 2: claim("10:c")})


def test_unbound_rows_wait_until_every_inserted_claim_is_caught_up_by_this_run() -> None:
    claims = {
        0: claim("10:a", run="r1", caught_up="r1"),
        1: claim("10:b", run="r2", caught_up="r2"),
        2: claim("10:c", run="r1", inserted=False),
    }
    assert barrier("t", 4, 3, "r2", claims) == [0]  # 1 is caught up by this run, 2 never inserted
    # re-checked first chunk only (the claim is this run's): its later chunks are still to check
    assert barrier("t", 4, 3, "r2", {**claims, 0: claim("10:a", run="r2", caught_up="r1")}) == [0]
    assert barrier("t", 4, 3, "r2", {**claims, 0: claim("10:a", run="r2", caught_up="r2")}) == []


def test_a_partition_no_earlier_run_claimed_is_refused_once_this_run_refused_an_earlier_runs_partition() -> None:
    claims = {0: claim("10:a", run="r1", refused_by="r2"), 1: claim("10:b", run="r1")}
    with pytest.raises(DedupLayoutError, match=r"inserted partitions \[0, 1\].*partitions \[0\] hold other rows"):
        barrier("t", 4, 5, "r2", claims)
    assert barrier("t", 4, 5, "r3", claims) == [0, 1]  # another run's refusal is not this run's
