"""The summary of ``benchmarks.checkpoint_fs``: medians over rounds, ratios to Spark's defaults."""

from __future__ import annotations

from benchmarks.checkpoint_fs import summarize


def _run(wal: float, commit: float, trigger: float, crc: int) -> dict:
    return {
        "mean_ms": {"walCommit": wal, "commitOffsets": commit, "addBatch": 30.0, "triggerExecution": trigger},
        "checksum_files": crc,
    }


def test_each_variants_batch_time_is_its_median_over_the_rounds_against_the_defaults() -> None:
    rounds = [
        {"default": _run(30, 35, 200, 48), "raw_local_fs": _run(16, 18, 90, 0)},
        {"default": _run(32, 36, 120, 50), "raw_local_fs": _run(17, 19, 80, 0)},
        {"default": _run(31, 34, 100, 49), "raw_local_fs": _run(15, 20, 70, 0)},
    ]
    out = summarize(rounds)
    assert out["default"]["median_ms"] == {
        "walCommit": 31,
        "commitOffsets": 35,
        "addBatch": 30,
        "triggerExecution": 120,
    }
    assert out["raw_local_fs"]["median_ms"]["triggerExecution"] == 80
    assert out["raw_local_fs"]["batch_time_over_default"] == round(80 / 120, 3)
    assert out["default"]["batch_time_over_default"] == 1.0


def test_the_checksum_files_of_a_variant_are_the_most_any_of_its_checkpoints_held() -> None:
    rounds = [{"default": _run(30, 35, 100, 48)}, {"default": _run(30, 35, 100, 52)}]
    assert summarize(rounds)["default"]["checksum_files"] == 52
