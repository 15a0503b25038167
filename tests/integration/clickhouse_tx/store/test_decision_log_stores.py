"""The decision log on an object store (S3, served by a moto process) arbitrated by the registry."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from clickhouse_tx.errors import DecisionConflictError
from clickhouse_tx.factory import build_decision_log
from clickhouse_tx.interfaces import Decision, Mode, Prepared, Target
from clickhouse_tx.store.decision_arbiter import RegistryArbiter
from clickhouse_tx.store.decision_log import FileDecisionLog
from clickhouse_tx.store.registry import KeeperMapRegistry
from spark_datasource.testing.credentials import target_fields
from tests.helpers import s3
from tests.helpers.decision_log import race, race_processes

BUCKET = s3.BUCKET


def _s3(endpoint: str) -> pafs.S3FileSystem:
    return s3.filesystem(endpoint)


@pytest.fixture
def target(clickhouse_url: str, database: str) -> Target:
    return Target(url=clickhouse_url, database=database, table="events", **target_fields())


def _log(endpoint: str, target: Target, prefix: str) -> FileDecisionLog:
    arbiter = RegistryArbiter(KeeperMapRegistry(target, table=RegistryArbiter.TABLE))
    return FileDecisionLog("unused", "q", arbiter=arbiter, filesystem=(_s3(endpoint), f"{BUCKET}/{prefix}"))


def decision(xid: str, batch: int = 3, version: int = 1) -> Decision:  # one chosen xid
    p = Prepared(
        xid=xid,
        txn_id="q",
        batch=batch,
        partition=0,
        attempt=0,
        mode=Mode.DEDUP,
        server="http://h",
        table="db.t",
        rows=1,
        checksum=1,
    )
    return Decision(txn_id="q", batch=batch, version=version, chosen=(p,))


def test_concurrent_writers_of_one_batch_on_an_object_store_produce_exactly_one_decision(
    s3_endpoint: str, target: Target, database: str
) -> None:
    prefix = f"race-{database}"
    _log(s3_endpoint, target, prefix).arbiter.registry.ensure_table()
    winners = race(lambda: _log(s3_endpoint, target, prefix), writers=6)
    log = _log(s3_endpoint, target, prefix)
    assert log.semantics == "registry-cas"
    assert len(winners) == 1
    assert [p.xid for p in log.read(3).chosen] == winners
    with _s3(s3_endpoint).open_input_stream(f"{BUCKET}/{prefix}/clickhouse_tx/q/3.v1.json") as f:
        assert Decision.from_bytes(f.read()).chosen[0].xid == winners[0]


def test_a_claimed_decision_whose_writer_died_before_its_put_is_written_by_the_next_reader(
    s3_endpoint: str, target: Target, database: str
) -> None:
    log = _log(s3_endpoint, target, f"repair-{database}")
    body = decision("winner").to_bytes()
    assert log.arbiter.claim("decision:q:3:v1", body) == body  # the winner dies here, before its PUT
    with pytest.raises(DecisionConflictError):
        log.write(decision("late"))
    assert [p.xid for p in log.read(3).chosen] == ["winner"]
    assert list(log.batches()) == [3]  # the file now exists


def test_compacting_an_object_store_log_drops_the_claims_of_the_dropped_batches(
    s3_endpoint: str, target: Target, database: str
) -> None:
    log = _log(s3_endpoint, target, f"compact-{database}")
    log.retain_batches, log.compact_every = 2, 1000
    for b in range(5):
        log.write(decision(f"x{b}", batch=b))
        log.mark_done(b)
    assert log.compact() == [0, 1, 2]
    assert list(log.batches()) == [3, 4]
    assert [log.arbiter.get(f"decision:q:{b}:v1") is None for b in range(5)] == [True] * 3 + [False] * 2
    assert log.read(1).done and log.read(1).chosen == ()


def test_the_factory_arbitrates_an_s3_checkpoint_through_the_registry_and_a_local_one_by_links(
    s3_endpoint: str, target: Target, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    uri = f"s3://{BUCKET}/factory?endpoint_override={s3_endpoint}&scheme=http&region=us-east-1"
    log = build_decision_log(target, "q", uri, retain_batches=7)
    assert log.semantics == "registry-cas" and isinstance(log.arbiter, RegistryArbiter)
    assert log.retain_batches == 7
    log.write(decision("a"))
    assert [p.xid for p in log.read(3).chosen] == ["a"]
    local = build_decision_log(target, "q", str(tmp_path))
    assert local.semantics == "posix-link" and local.arbiter is None


def test_drivers_in_separate_processes_racing_to_decide_one_batch_on_s3_leave_exactly_one_decision(
    s3_endpoint: str, target: Target, database: str, clickhouse_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in s3.s3_env().items():
        monkeypatch.setenv(k, v)  # inherited by the racing processes
    uri = s3.uri(s3_endpoint, f"procs-{database}")
    build_decision_log(target, "q", uri).arbiter.registry.ensure_table()
    winners = race_processes(clickhouse_url, database, uri, writers=3)
    assert len(winners) == 1, f"winners: {winners}"
    assert [p.xid for p in build_decision_log(target, "q", uri).read(3).chosen] == winners
