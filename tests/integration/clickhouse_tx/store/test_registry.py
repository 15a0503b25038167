"""The KeeperMap registry: durable entries, fencing, and a compare-and-set that one writer wins."""

from __future__ import annotations

import pickle
import threading

import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import AlreadyRegisteredError
from clickhouse_tx.interfaces import Mode, RegistryEntry, RegistryIO, Target
from clickhouse_tx.protocol.state import TxState
from clickhouse_tx.store.registry import KeeperMapRegistry
from spark_datasource.testing.credentials import target_fields

INIT, COMMITTING, COMMITTED = TxState.INITIALIZED.value, TxState.COMMITTING.value, TxState.COMMITTED.value
ABORTING, ABORTED = TxState.ABORTING.value, TxState.ABORTED.value


@pytest.fixture
def target(clickhouse_url: str, database: str) -> Target:
    return Target(url=clickhouse_url, database=database, table="events", **target_fields())


@pytest.fixture
def registry(target: Target) -> KeeperMapRegistry:
    return KeeperMapRegistry(target)


def entry(xid: str, *, batch: int = 0, partition: int = 0, state: str = INIT, txn: str = "q") -> RegistryEntry:
    return RegistryEntry(
        xid=xid,
        txn_id=txn,
        batch=batch,
        partition=partition,
        attempt=0,
        mode=Mode.TRANSACTION,
        server="http://h",
        table="db.events",
        state=state,
        created_ms=1,
        updated_ms=1,
    )


def test_the_registry_creates_its_keeper_map_table_when_missing(registry: KeeperMapRegistry, target: Target) -> None:
    assert isinstance(registry, RegistryIO)
    assert registry.get("nobody") is None
    c = ClickHouseHTTP(target)
    rows = c.query_json(
        "SELECT engine FROM system.tables WHERE database = {d:String} AND name = {t:String}",
        params={"d": target.database, "t": "clickhouse_tx_registry"},
    )
    assert rows == [{"engine": "KeeperMap"}]


def test_a_registered_entry_reads_back_with_every_field(registry: KeeperMapRegistry) -> None:
    e = RegistryEntry(
        xid="x-1",
        txn_id="q'uoted\tq",
        batch=7,
        partition=3,
        attempt=2,
        mode=Mode.STAGING,
        server="http://h:1",
        table="d.t",
        state=INIT,
        payload={"k": [1, "v"]},
        created_ms=11,
        updated_ms=12,
    )
    registry.register(e)
    assert registry.get("x-1") == e


def test_registering_an_existing_xid_fails_whatever_its_state(registry: KeeperMapRegistry) -> None:
    registry.register(entry("x-1"))
    with pytest.raises(AlreadyRegisteredError):
        registry.register(entry("x-1"))


def test_an_aborted_tombstone_fences_a_late_registration(registry: KeeperMapRegistry) -> None:
    registry.register(entry("late", state=ABORTED))
    with pytest.raises(AlreadyRegisteredError, match="aborted"):
        registry.register(entry("late"))
    assert registry.get("late").state == ABORTED


def test_transition_moves_only_from_an_expected_state(registry: KeeperMapRegistry) -> None:
    registry.register(entry("x"))
    assert registry.transition("x", [INIT], COMMITTING, {"decision": 1}) is True
    assert registry.get("x").state == COMMITTING and registry.get("x").payload == {"decision": 1}
    assert registry.transition("x", [INIT], ABORTING) is False
    assert registry.get("x").state == COMMITTING
    assert registry.transition("x", [COMMITTING], COMMITTED) is True
    assert registry.get("x").payload == {"decision": 1}  # kept when no payload is given


def test_transition_of_an_unknown_xid_is_false_and_creates_nothing(registry: KeeperMapRegistry) -> None:
    assert registry.transition("ghost", [INIT], COMMITTING) is False
    assert registry.get("ghost") is None


@pytest.mark.parametrize("round_", range(3))
def test_of_threads_racing_the_same_transition_exactly_one_wins(target: Target, round_: int) -> None:
    setup = KeeperMapRegistry(target)
    xid = f"race-{round_}"
    setup.register(entry(xid))
    n = 6
    barrier = threading.Barrier(n)
    results: list[bool | BaseException] = [False] * n

    def racer(i: int) -> None:
        reg = KeeperMapRegistry(target)  # each its own client, as separate drivers would be
        reg.ensure_table()
        barrier.wait()
        try:
            results[i] = reg.transition(xid, [INIT], COMMITTING, {"winner": i})
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert results.count(True) == 1, results
    winner = results.index(True)
    assert setup.get(xid).payload == {"winner": winner}


def test_racing_commit_against_abort_leaves_one_consistent_outcome(target: Target) -> None:
    KeeperMapRegistry(target).register(entry("duel"))
    out: dict[str, bool] = {}
    barrier = threading.Barrier(2)

    def move(name: str, new: str) -> None:
        reg = KeeperMapRegistry(target)
        reg.ensure_table()
        barrier.wait()
        out[name] = reg.transition("duel", [INIT], new)

    ts = [
        threading.Thread(target=move, args=("commit", COMMITTING)),
        threading.Thread(target=move, args=("abort", ABORTING)),
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(out.values()) == [False, True]
    winner_state = COMMITTING if out["commit"] else ABORTING
    assert KeeperMapRegistry(target).get("duel").state == winner_state


def test_list_batch_and_list_open_filter_entries(registry: KeeperMapRegistry) -> None:
    registry.register(entry("b1p0", batch=1, partition=0))
    registry.register(entry("b1p1", batch=1, partition=1))
    registry.register(entry("b2p0", batch=2))
    registry.register(entry("other", batch=1, txn="other"))
    registry.transition("b1p1", [INIT], ABORTED)
    assert [e.xid for e in registry.list_batch("q", 1)] == ["b1p0", "b1p1"]
    assert {e.xid for e in registry.list_open()} == {"b1p0", "b2p0", "other"}
    fresh = RegistryEntry(
        xid="fresh",
        txn_id="q",
        batch=3,
        partition=0,
        attempt=0,
        mode=Mode.TRANSACTION,
        server="h",
        table="d.t",
        state=INIT,
    )  # timestamps 0: stamped now
    registry.register(fresh)
    assert registry.get("fresh").updated_ms > 1
    # the others were stamped at 1 ms after the epoch: stale
    assert {e.xid for e in registry.list_open(older_than_s=3600)} == {"b1p0", "b2p0", "other"}


def test_the_registry_pickles_without_its_connection(registry: KeeperMapRegistry) -> None:
    registry.register(entry("p"))
    clone = pickle.loads(pickle.dumps(registry))
    assert clone.get("p").state == INIT


def test_a_hostile_registry_table_name_is_quoted(target: Target) -> None:
    reg = KeeperMapRegistry(target, table="reg`istry; DROP")
    reg.register(entry("h"))
    assert reg.get("h").xid == "h"
    c = ClickHouseHTTP(target)
    assert c.query_json(f"SELECT count() AS c FROM {q.qualified(target.database, 'reg`istry; DROP')}") == [{"c": 1}]


def test_a_bulk_transition_moves_only_the_xids_in_an_expected_state_and_says_which(
    clickhouse_url: str, database: str
) -> None:
    from clickhouse_tx.interfaces import Mode, RegistryEntry, Target
    from clickhouse_tx.store.registry import KeeperMapRegistry

    reg = KeeperMapRegistry(Target(url=clickhouse_url, database=database, table="events", **target_fields()))
    for i, state in enumerate(["initialized", "initialized", "committed"]):
        reg.register(
            RegistryEntry(
                xid=f"x{i}",
                txn_id="t",
                batch=1,
                partition=i,
                attempt=0,
                mode=Mode.TRANSACTION,
                server=clickhouse_url,
                table=f"{database}.events",
                state=state,
            )
        )
    moved = reg.transition_many(["x0", "x1", "x2", "missing"], ["initialized"], "committing", {"v": 2})
    assert sorted(moved) == ["x0", "x1"]
    assert [reg.get(x).state for x in ("x0", "x1", "x2")] == ["committing", "committing", "committed"]
    assert reg.get("x0").payload == {"v": 2} and reg.get("missing") is None
    assert reg.transition_many(["x0", "x1"], ["initialized"], "committing") == []  # none expected any more


def test_forget_drops_finished_entries_and_only_the_committing_ones_named_committed(
    registry: KeeperMapRegistry,
) -> None:
    states = {"done": COMMITTED, "gone": ABORTED, "said": COMMITTING, "busy": COMMITTING, "open": INIT}
    for xid, state in states.items():
        registry.register(entry(xid, state=INIT if state != ABORTED else ABORTED))
        if state in (COMMITTING, COMMITTED):
            assert registry.transition(xid, [INIT], COMMITTING)
        if state == COMMITTED:
            assert registry.transition(xid, [COMMITTING], COMMITTED)

    registry.forget(list(states), committed=["said", "open"])

    assert {e.xid: e.state for e in registry.list_batch("q", 0)} == {"busy": COMMITTING, "open": INIT}
