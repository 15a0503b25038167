"""The chaos run's totals count injected faults by kind and every problem of every schedule."""

from __future__ import annotations

from benchmarks.chaos.__main__ import replay_command, summarize, table
from spark_datasource.testing.chaos.schedule import KINDS


def _rec(seed: int, injected: list[str], ok: bool = True, **counts: int) -> dict:
    return {
        "seed": seed,
        "planned": injected + ["kill_worker"],
        "injected": [{"kind": k} for k in injected],
        "restarts": 1,
        "recovers": 0,
        "ok": ok,
        **counts,
    }


def test_the_summary_counts_injected_faults_by_kind_and_names_the_failed_seeds() -> None:
    records = [
        _rec(1, ["kill_driver", "ch_stall"], duplicates=0, lost=0),
        _rec(2, ["ch_stall"], ok=False, duplicates=2, lost=1, stage_tables=1, registry_entries=3),
    ]
    s = summarize(records, 100.0)
    assert s["faults_by_kind"]["ch_stall"] == 2 and s["faults_by_kind"]["kill_driver"] == 1
    assert set(s["faults_by_kind"]) == set(KINDS)
    assert s["faults_planned"] == 5 and s["faults_injected"] == 3
    assert (s["duplicates"], s["lost"], s["leftovers"], s["job_restarts"]) == (2, 1, 4, 2)
    assert s["failed"] == [2] and s["mean_schedule_s"] == 50.0
    text = table(s)
    assert "failed schedules   1" in text and "  ch_stall         2" in text


def test_the_replay_command_runs_exactly_one_schedule_of_the_seed() -> None:
    assert replay_command(42) == "make chaos CHAOS_SEED=42 CHAOS_SCHEDULES=1"


def test_lanes_take_each_seed_once_and_take_none_after_the_run_is_stopped() -> None:
    import threading

    from benchmarks.chaos.__main__ import _Progress

    records: list[dict] = []
    out = _Progress(20, records)
    seeds = list(range(1, 21))
    taken: list[int] = []

    def lane() -> None:
        while (s := out.next_seed(seeds)) is not None:
            taken.append(s)

    lanes = [threading.Thread(target=lane) for _ in range(3)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    assert sorted(taken) == list(range(1, 21))
    more = [21, 22]
    out.stop.set()
    assert out.next_seed(more) is None and more == [21, 22]
