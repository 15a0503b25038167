"""The pipeline's throughput figures from its PROGRESS lines."""

from __future__ import annotations

from spark_datasource.testing.pipeline_report import batch_figures


def test_the_steady_rate_leaves_out_the_first_micro_batch_and_the_first_is_reported_alone() -> None:
    batches = [
        {"rows": 50_000, "trigger_ms": 10_000},
        {"rows": 50_000, "trigger_ms": 1_000},
        {"rows": 50_000, "trigger_ms": 1_500},
    ]
    f = batch_figures(batches, 150_000, 20.0)
    assert f["processing_rps"] == round(150_000 / 12.5, 1)
    assert f["steady_rps"] == round(100_000 / 2.5, 1)
    assert f["first_batch_ms"] == 10_000 and f["batches"] == 3


def test_one_micro_batch_has_no_steady_rate() -> None:
    f = batch_figures([{"rows": 10, "trigger_ms": 100}], 10, 1.0)
    assert f["steady_rps"] is None and f["first_batch_ms"] == 100
    assert batch_figures([], 0, 1.0)["first_batch_ms"] is None
