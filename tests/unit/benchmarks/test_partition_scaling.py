"""The pure parts of ``benchmarks.partition_scaling``: the summary of a mode's batches and the fitted line."""

from __future__ import annotations

from benchmarks.partition_scaling import fit_line, report, summarize


def _batch(add_ms: float, commit_s: float, prepare_s: float, steps: dict[str, float]) -> dict:
    return {
        "progress": {"durationMs": {"addBatch": add_ms}},
        "metrics": {"commit_seconds": commit_s, "prepare_seconds_p50": prepare_s, "durations": steps},
    }


def test_a_line_through_exact_points_gives_back_its_fixed_cost_and_slope() -> None:
    assert fit_line([(8, 116.0), (32, 260.0), (128, 836.0)]) == {"fixed_ms": 68.0, "per_partition_ms": 6.0}


def test_the_executor_time_of_a_batch_is_its_add_batch_minus_the_drivers_commit() -> None:
    s = summarize(
        [_batch(1000, 0.2, 0.05, {"commit": 0.1}), _batch(1200, 0.4, 0.07, {"commit": 0.3}), _batch(900, 0.3, 0.06, {})]
    )
    assert s["add_batch_ms"] == 1000 and s["commit_ms"] == 300 and s["executor_ms"] == 800
    assert s["prepare_p50_ms"] == 60 and s["commit_steps_ms"] == {"commit": 200}


def test_the_report_puts_each_mode_over_none_at_the_same_partition_count_and_checks_the_targets() -> None:
    one = {"add_batch_ms": 100.0, "commit_ms": 50.0}
    doc = report(
        {
            "none": {8: dict(one), 128: dict(one)},
            "staging": {8: {**one, "add_batch_ms": 150.0}, 128: {"add_batch_ms": 120.0, "commit_ms": 250.0}},
        },
        rows=64_000,
    )
    assert doc["results"]["staging"]["8"]["ratio_to_none"] == 1.5
    assert doc["targets_met"]["staging_ratio_at_128"] is True
    assert doc["targets_met"]["staging_commit_128_ms"] is False
