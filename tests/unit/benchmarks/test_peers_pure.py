"""The pure pieces of benchmarks.peers: rates, the latency plan, the guarantee as measured,
the summary and its table, the Kafka engine's statements.

The runs themselves are exercised by tests/torture/test_peers_bench.py (slow).
"""

from __future__ import annotations

from typing import Any

from benchmarks.peers_engine import engine_ddl
from benchmarks.peers_figures import (
    MAX_RATE_EVENTS_PER_PARTITION,
    base_peer,
    guarantee,
    known_peer,
    latency_plan,
    markdown_table,
    peer_client,
    ratios,
    round_ratios,
    rows_per_s,
    summarise,
    sustained_rate,
)


def _doc() -> dict[str, Any]:
    tput = []
    for rnd, scale in ((0, 1.0), (1, 1.2)):
        for peer, base in (("transaction", 50_000), ("foreach_batch", 40_000), ("kafka_engine", 30_000)):
            for size in (50_000, 200_000):
                rate = base * scale * (1.5 if size == 200_000 else 1.0)
                r = {"peer": peer, "batch": size, "round": rnd, "rows_per_s": rate, "ok": True}
                if peer != "kafka_engine":  # a Spark job: its rate after the first micro-batch, and that batch
                    r.update(steady_rps=rate * (2 if peer == "transaction" else 1.5), first_batch_ms=9000 + rnd * 1000)
                tput.append(r)
    tput.append({"peer": "kafka_engine", "batch": 50_000, "round": 2, "ok": False, "error": "x"})
    return {
        "config": {"batch_sizes": [50_000, 200_000], "peers": ["transaction", "foreach_batch", "kafka_engine"]},
        "throughput": tput,
        "latency": {"transaction": {"rate": 30_000, "p50_ms": 900.0, "p99_ms": 1800.0, "records": 10, "ok": True}},
        "faults": {
            "runs": {
                "transaction": {"duplicates": 0, "lost": 0, "clickhouse_kills": [{}, {}], "crashes": 1},
                "foreach_batch": {"duplicates": 5000, "lost": 0, "clickhouse_kills": [{}, {}], "crashes": 1},
                "kafka_engine": {"duplicates": 0, "lost": 0, "clickhouse_kills": [{}]},
            }
        },
    }


def test_a_rate_is_rows_over_seconds_and_none_without_a_time() -> None:
    assert rows_per_s(100_000, 2.0) == 50_000.0
    assert rows_per_s(100_000, 0.0) is None
    assert rows_per_s(100_000, None) is None


def test_a_latency_run_offers_half_the_sustained_rate_and_stays_within_what_the_broker_keeps() -> None:
    assert latency_plan(20_000.0, 30.0, 10.0, 8) == (10_000.0, 8 * MAX_RATE_EVENTS_PER_PARTITION)
    assert latency_plan(2_000.0, 30.0, 10.0, 8) == (1_000.0, 40_000)
    assert latency_plan(1_000.0, 30.0, 10.0, 1) == (500.0, 20_000)
    rate, events = latency_plan(None, 10.0, 0.0, 8)
    assert rate == 1_000.0 and events == 10_000


def test_the_guarantee_is_named_after_the_duplicates_and_losses_counted() -> None:
    assert guarantee(0, 0).startswith("exactly once")
    assert guarantee(3, 0).startswith("at least once")
    assert guarantee(0, 3).startswith("at most once")
    assert guarantee(3, 3).startswith("neither")
    assert guarantee(None, 0) == "not measured"


def test_the_sustained_rate_is_a_peers_best_successful_run() -> None:
    doc = _doc()
    assert sustained_rate(doc["throughput"], "transaction") == 50_000 * 1.2 * 1.5
    assert sustained_rate(doc["throughput"], "kafka_engine_keeper") is None


def test_the_summary_gives_best_median_and_steady_rates_per_batch_size_and_counts_failed_rounds() -> None:
    s = summarise(_doc())
    assert list(s) == ["transaction", "foreach_batch", "kafka_engine"]
    engine = s["kafka_engine"]["throughput"]["50000"]
    assert engine == {
        "best_rows_per_s": 36_000.0,
        "median_rows_per_s": 33_000.0,
        "best_steady_rows_per_s": 36_000.0,  # no micro-batches: every row counts
        "median_first_batch_ms": None,
        "rounds": 3,
        "failed": 1,
    }
    spark = s["transaction"]["throughput"]["200000"]
    assert spark["best_steady_rows_per_s"] == 50_000 * 1.2 * 1.5 * 2 and spark["median_first_batch_ms"] == 9500
    assert s["transaction"]["latency"]["p99_ms"] == 1800.0
    assert s["foreach_batch"]["faults"]["guarantee"].startswith("at least once")
    assert s["transaction"]["faults"]["clickhouse_kills"] == 2 and s["transaction"]["faults"]["driver_kills"] == 1
    assert s["kafka_engine"]["faults"]["driver_kills"] == 0


def test_ratios_are_each_peer_over_foreach_batch_per_batch_size() -> None:
    r = ratios(summarise(_doc()), [50_000, 200_000])
    assert r["transaction/foreach_batch at 50000"] == 1.25
    assert r["transaction/foreach_batch at 50000 steady"] == round(1.25 * 2 / 1.5, 3)
    assert r["kafka_engine/foreach_batch at 200000"] == 0.75
    assert "foreach_batch/foreach_batch at 50000" not in r


def test_ratios_are_also_each_peer_over_the_kafka_engine() -> None:
    r = ratios(summarise(_doc()), [50_000, 200_000])
    assert r["transaction/kafka_engine at 50000"] == round(60_000 / 36_000, 3)
    assert r["foreach_batch/kafka_engine at 200000"] == round(72_000 / 54_000, 3)
    assert "kafka_engine/kafka_engine at 50000" not in r


def test_round_ratios_divide_runs_of_one_round_and_take_their_median() -> None:
    r = round_ratios(_doc())
    assert r["transaction/foreach_batch at 50000"] == {"rounds": [1.25, 1.25], "median": 1.25}
    # the engine's failed third round has no partner and no ratio
    assert r["transaction/kafka_engine at 50000"] == {"rounds": [1.667, 1.667], "median": 1.667}
    assert "kafka_engine/kafka_engine at 50000" not in r


def test_a_spark_peer_at_a_client_is_its_own_row_after_the_plain_peers_order() -> None:
    assert (base_peer("transaction@kafka-python"), peer_client("transaction@kafka-python")) == (
        "transaction",
        "kafka-python",
    )
    assert (base_peer("kafka_engine"), peer_client("kafka_engine")) == ("kafka_engine", None)
    assert known_peer("foreach_batch@librdkafka") and known_peer("transaction")
    assert not known_peer("kafka_engine@librdkafka") and not known_peer("transaction@java")
    doc = _doc()
    doc["config"]["peers"] = ["transaction", "transaction@kafka-python", "foreach_batch", "kafka_engine"]
    doc["throughput"].append({"peer": "transaction@kafka-python", "batch": 50_000, "rows_per_s": 30_000.0, "ok": True})
    s = summarise(doc)
    assert list(s) == doc["config"]["peers"]
    assert s["transaction@kafka-python"]["what"].endswith("kafka.client=kafka-python")
    assert s["transaction@kafka-python"]["throughput"]["50000"]["best_rows_per_s"] == 30_000.0
    assert ratios(s, [50_000])["transaction@kafka-python/foreach_batch at 50000"] == 0.625


def test_the_table_has_a_row_per_peer_with_its_faults() -> None:
    md = markdown_table(summarise(_doc()), [50_000, 200_000]).splitlines()
    assert len(md) == 2 + 3
    assert md[2].startswith(
        "| (a) transaction | 60,000 (120,000) | 90,000 (180,000) | 9.5 | 9.5 "
        "| 30,000 | 900 | 1,800 | 0 / 0 | exactly once"
    )
    assert "| 5000 / 0 | at least once" in md[3]


def test_the_engine_statements_quote_names_and_store_offsets_in_keeper_only_when_asked() -> None:
    plain = engine_ddl("peers.t`x", "127.0.0.1:9092", "top'ic", False, {"kafka_max_block_size": 50_000})
    assert plain["queue"].startswith("CREATE TABLE `peers`.`t\\`x_queue` (")
    assert "kafka_topic_list = 'top\\'ic'" in plain["queue"] and "kafka_max_block_size = 50000" in plain["queue"]
    assert "kafka_keeper_path" not in plain["queue"]
    assert "TO `peers`.`t\\`x` AS SELECT" in plain["view"] and "FROM `peers`.`t\\`x_queue`" in plain["view"]
    keeper = engine_ddl("peers.t", "b:1", "topic", True, {})
    assert "kafka_keeper_path = '/clickhouse/peers/peers/t', kafka_replica_name = 'r1'" in keeper["queue"]
    assert keeper["drop"] == "DROP TABLE IF EXISTS `peers`.`t_view`; DROP TABLE IF EXISTS `peers`.`t_queue`"
