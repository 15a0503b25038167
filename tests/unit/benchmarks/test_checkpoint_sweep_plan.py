"""The checkpoint sweep's command line: what it runs and where it writes (no run started)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.checkpoint_sweep import INTERVALS, QUICK_INTERVALS, RESULTS, overheads, sweep_plan


def test_the_default_sweep_runs_every_interval_and_mode_at_4000_events_a_second() -> None:
    plan = sweep_plan([])
    assert plan.intervals == list(INTERVALS) and plan.modes == ["none", "transaction", "staging", "dedup"]
    assert (plan.rate, plan.base_s, plan.partitions) == (4000.0, 40.0, 8)
    assert plan.json_path == RESULTS / "checkpoint_sweep.json"
    assert plan.png_path == RESULTS / "checkpoint_sweep.png"


def test_a_quick_sweep_runs_fewer_intervals_shorter_and_writes_its_own_files() -> None:
    plan = sweep_plan(["--quick"])
    assert plan.intervals == list(QUICK_INTERVALS) and (plan.rate, plan.base_s) == (2000.0, 20.0)
    assert plan.json_path.name == "checkpoint_sweep_quick.json"


def test_the_baseline_mode_runs_first_at_each_interval_whatever_order_it_was_given_in(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    plan = sweep_plan(["--modes", "dedup, none,staging", "--intervals", "2,7", "--json", str(out), "--rate", "10"])
    assert plan.modes == ["none", "dedup", "staging"] and plan.intervals == [2.0, 7.0] and plan.rate == 10.0
    assert (plan.json_path, plan.png_path) == (out, tmp_path / "sweep.png")


def test_overheads_compare_each_mode_with_none_at_the_same_interval() -> None:
    runs = [
        {"mode": "none", "trigger_s": 1.0, "processing_rps": 1000.0, "latency_ms": {"p50": 100.0, "p99": 300.0}},
        {"mode": "staging", "trigger_s": 1.0, "processing_rps": 900.0, "latency_ms": {"p50": 150.0, "p99": None}},
        {"mode": "staging", "trigger_s": 5.0, "processing_rps": 900.0, "latency_ms": {"p50": 150.0}},
    ]
    assert overheads(runs) == [
        {
            "trigger_s": 1.0,
            "mode": "staging",
            "throughput_overhead_pct": 10.0,
            "p50_latency_overhead_ms": 50.0,
            "p99_latency_overhead_ms": None,
        }
    ]
