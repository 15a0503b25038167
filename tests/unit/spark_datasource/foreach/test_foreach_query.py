"""What the foreachBatch helper remembers of a run: pure state, no Spark."""

from __future__ import annotations

from spark_datasource.foreach import query as foreach_query
from spark_datasource.foreach.query import MAX_RUNS, RunMemory


def test_a_batch_follows_only_the_batch_a_run_last_wrote_or_skipped() -> None:
    run = RunMemory()
    assert not run.follows(0)  # a run's first batch may be a replay: checked in full
    run.done(4)
    assert run.follows(5) and not run.follows(4) and not run.follows(6)


def test_after_a_batch_that_raised_the_next_call_is_checked_in_full() -> None:
    run = RunMemory()
    run.done(4)
    run.failed()
    assert not run.follows(5)


def test_each_run_app_and_database_has_its_own_memory_and_the_oldest_runs_are_forgotten(monkeypatch) -> None:
    monkeypatch.setattr(foreach_query, "_RUNS", type(foreach_query._RUNS)())
    runs = iter(f"run-{i}" for i in range(MAX_RUNS + 1))
    monkeypatch.setattr(foreach_query, "running_run_id", lambda spark, query_id: next(runs))
    first = foreach_query.run_memory(None, "q", "a", "http://h", "db")
    assert first is not None
    first.done(1)
    for _ in range(MAX_RUNS):
        assert foreach_query.run_memory(None, "q", "a", "http://h", "db") is not first
    assert len(foreach_query._RUNS) == MAX_RUNS and ("run-0", "a", "http://h", "db") not in foreach_query._RUNS


def test_outside_a_running_query_nothing_is_remembered(monkeypatch) -> None:
    monkeypatch.setattr(foreach_query, "running_run_id", lambda spark, query_id: None)
    assert foreach_query.run_memory(None, "q", "a", "http://h", "db") is None
