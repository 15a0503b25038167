"""The pure pieces of ``benchmarks.streaming_speed`` (its figures and its batch side): split, ratios, ramp."""

from __future__ import annotations

from benchmarks.streaming_speed_batch import paced_batch
from benchmarks.streaming_speed_figures import batch_split, kept_up, ramp, ratios


def _progress(rows: int, trigger_ms: float, add_ms: float) -> dict:
    return {"numInputRows": rows, "durationMs": {"triggerExecution": trigger_ms, "addBatch": add_ms}}


def test_the_batch_split_leaves_out_the_first_batch_and_batches_without_rows() -> None:
    prog = [_progress(100, 5000, 4000), _progress(100, 1000, 800), _progress(0, 50, 0), _progress(300, 1000, 600)]
    s = batch_split(prog)
    assert s["batches"] == 2 and s["rows"] == 400
    assert s["rows_per_s"] == 200.0  # 400 rows over 2 s of triggerExecution
    assert s["mean_ms"]["addBatch"] == 700.0 and s["mean_ms"]["walCommit"] == 0.0
    assert batch_split(prog, skip_first=False)["rows"] == 500
    assert batch_split([])["rows_per_s"] is None


def test_ratios_compare_within_one_run_and_leave_out_what_was_not_measured() -> None:
    doc = {
        "batch_noop": {"rows_per_s": 1000.0},
        "available_now": [
            {"sink": "noop", "rows_per_s": 850.0},
            {"sink": "none", "rows_per_s": 700.0},
            {"sink": "transaction", "rows_per_s": 665.0},
        ],
        "triggers": [
            {"mode": "none", "trigger_s": 1.0, "processing_rps": 500.0},
            {"mode": "transaction", "trigger_s": 1.0, "processing_rps": 400.0},
        ],
    }
    r = ratios(doc)
    assert r["stream_noop/batch_noop"] == 0.85
    assert r["stream_transaction/batch_noop"] == 0.665
    assert r["available_now transaction/none"] == 0.95
    assert r["available_now dedup/none"] is None
    assert r["trigger 1s transaction/none"] == 0.8
    assert r["stream_noop one batch/batch_noop"] is None
    assert r["available_now noop paced/bulk"] is None


def test_paced_and_one_batch_runs_are_compared_with_the_bulk_runs_of_the_same_sink() -> None:
    doc = {
        "batch_noop": {"rows_per_s": 1000.0},
        "available_now": [{"sink": "noop", "rows_per_s": 800.0}, {"sink": "transaction", "rows_per_s": 500.0}],
        "available_now_one_batch": [{"sink": "noop", "rows_per_s": 900.0}],
        "available_now_paced": {"by_sink": [{"sink": "noop", "rows_per_s": 400.0}, {"sink": "transaction"}]},
    }
    r = ratios(doc)
    assert r["stream_noop one batch/batch_noop"] == 0.9
    assert r["available_now noop paced/bulk"] == 0.5
    assert r["available_now transaction paced/bulk"] is None  # the paced run failed


def test_the_noop_rounds_medians_give_the_streaming_over_batch_ratios_and_one_per_variant() -> None:
    doc = {
        "batch_noop": {"rows_per_s": 2000.0},  # one warm run: the medians of the rounds win
        "available_now": [{"sink": "noop", "rows_per_s": 300.0}, {"sink": "transaction", "rows_per_s": 500.0}],
        "noop_rounds": {
            "median": {
                "batch": 1000.0,
                "default": 850.0,
                "minRecordsPerPartition=1": 600.0,
                "minRecordsPerPartition=2000": None,
            }
        },
    }
    r = ratios(doc)
    assert r["stream_noop/batch_noop"] == 0.85
    assert r["stream_transaction/batch_noop"] == 0.5
    assert r["stream_noop minRecordsPerPartition=1/batch_noop"] == 0.6
    assert r["stream_noop minRecordsPerPartition=2000/batch_noop"] is None  # every run of it failed


def test_a_paced_batch_holds_five_seconds_of_the_offered_rate_per_partition() -> None:
    assert paced_batch(2000.0, 8) == 1250
    assert paced_batch(1.0, 8) == 4


def test_the_ramp_doubles_until_a_run_falls_behind_and_keeps_the_last_rate_that_kept_up() -> None:
    seen = []

    def measure(rate: float) -> dict:
        seen.append(rate)
        return {"rate": rate, "ok": True, "mean_batch_ms": rate / 4}  # falls behind past 4000/s

    best, runs = ramp(measure, 1000, 10, 1.0)
    assert seen == [1000, 2000, 4000, 8000]
    assert best == 4000 and [r["kept_up"] for r in runs] == [True, True, True, False]
    assert ramp(measure, 8000, 3, 1.0)[0] is None


def test_a_run_that_lost_records_never_counts_as_keeping_up() -> None:
    assert kept_up({"ok": True, "mean_batch_ms": 900}, 1.0)
    assert not kept_up({"ok": False, "mean_batch_ms": 100}, 1.0)
    assert not kept_up({"ok": True, "mean_batch_ms": None}, 1.0)


def test_a_run_keeps_up_when_its_batches_after_the_warm_up_fit_in_the_trigger_even_if_the_first_did_not() -> None:
    run = {"ok": True, "mean_batch_ms": 4000, "steady": {"mean_batch_ms": 700}}
    assert kept_up(run, 1.0)
    assert not kept_up({**run, "steady": {"mean_batch_ms": 1200}}, 1.0)


def test_the_rounds_split_gives_each_stage_over_the_batch_job_and_heads_with_the_source_decoded_transaction() -> None:
    doc = {
        "available_now": [{"sink": "transaction", "rows_per_s": 100.0}, {"sink": "none", "rows_per_s": 80.0}],
        "noop_rounds": {
            "median": {"batch": 1000.0, "default": 700.0},
            "split_median": {
                "noop": {"rows_per_s": 700.0, "add_batch_ms": 250.0},
                "parsed_noop": {"rows_per_s": 500.0, "add_batch_ms": 400.0},
                "parsed_noop_python": {"rows_per_s": 450.0, "add_batch_ms": 450.0},
                "none": {"rows_per_s": 400.0, "add_batch_ms": 550.0},
                "transaction": {"rows_per_s": 380.0, "add_batch_ms": 570.0},
                "decoded_noop": {"rows_per_s": 650.0, "add_batch_ms": 270.0},
                "decoded_none": {"rows_per_s": 560.0, "add_batch_ms": 400.0},
                "decoded_transaction": {"rows_per_s": 540.0, "add_batch_ms": 410.0},
            },
        },
    }
    r = ratios(doc)
    assert r["stream_transaction/batch_noop"] == 0.54  # the rounds' median, not the one run
    assert r["stream transaction/batch_noop"] == 0.38  # the same job parsing with from_json
    assert r["stream decoded_noop/batch_noop"] == 0.65
    assert r["split decoded_transaction/decoded_none"] == 0.964
    assert r["stream parsed_noop/batch_noop"] == 0.5
    assert r["stream parsed_noop_python/batch_noop"] == 0.45
    assert r["stream none/batch_noop"] == 0.4
    assert r["split transaction/none"] == 0.95
    assert r["available_now transaction/none"] == 1.25


def test_each_decoded_streaming_run_is_also_compared_with_the_batch_job_into_its_own_sink() -> None:
    doc = {
        "noop_rounds": {
            "median": {"batch": 1000.0, "default": 700.0},
            "batch_sink_median": {
                "none": 760.0,
                "transaction": 720.0,
                "transaction, maxPartitions=cores": 760.0,
            },
            "split_median": {
                "decoded_none": {"rows_per_s": 380.0},
                "decoded_transaction": {"rows_per_s": 360.0},
                "decoded_transaction, 4x maxOffsetsPerTrigger, maxPartitions=cores": {"rows_per_s": 684.0},
                "transaction": {"rows_per_s": 300.0},  # from_json: not the batch job's parse
            },
        },
    }
    r = ratios(doc)
    assert r["batch transaction/batch_noop"] == 0.72
    assert r["batch none/batch_noop"] == 0.76
    assert r["stream decoded_transaction/batch transaction"] == 0.5
    assert r["batch transaction, maxPartitions=cores/batch_noop"] == 0.76
    # a streaming run is compared with the batch job of the same cut only
    cut = "decoded_transaction, 4x maxOffsetsPerTrigger, maxPartitions=cores"
    assert r[f"stream {cut}/batch transaction, maxPartitions=cores"] == 0.9
    assert f"stream {cut}/batch transaction" not in r
    assert "stream decoded_transaction/batch transaction, maxPartitions=cores" not in r
    assert r["stream decoded_none/batch none"] == 0.5
    assert "stream transaction/batch transaction" not in r
    # the batch jobs are not read as streaming variants of the noop query
    assert not any(k.startswith("stream_noop batch") for k in r)


def test_a_run_without_batch_jobs_into_the_sink_has_no_ratios_over_them() -> None:
    r = ratios(
        {
            "noop_rounds": {
                "median": {"batch": 1000.0},
                "batch_sink_median": {"transaction": None},
                "split_median": {"decoded_transaction": {"rows_per_s": 400.0}},
            }
        }
    )
    assert not [k for k in r if "batch transaction" in k]


def test_the_fixed_cost_of_a_noop_query_is_compared_with_sparks_floor_measured_in_the_same_run() -> None:
    doc = {
        "fixed_cost": {"by_sink": [{"sink": "noop", "mean_ms": {"triggerExecution": 102.0}}, {"sink": "none"}]},
        "spark_floor": {"records_per_batch": 32, "mean_ms": {"triggerExecution": 120.0}},
    }
    assert ratios(doc)["fixed_cost noop/spark_floor"] == 0.85
    assert ratios({"fixed_cost": doc["fixed_cost"]})["fixed_cost noop/spark_floor"] is None  # floor not measured
