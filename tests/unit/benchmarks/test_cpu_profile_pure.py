"""The pure pieces of benchmarks.cpu_profile and benchmarks.cpu_sampler: reading /proc
lines, naming a process's component, totals between readings, the windows and the split
of the Python workers by difference; and the source options of a ``PEER@CLIENT`` peer.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.cpu_profile import _parse, derived, per_million, split_subject, summary, window
from benchmarks.cpu_sampler import (
    CLOCK_TICKS,
    CpuSampler,
    PythonProcess,
    Totals,
    component_of,
    descendants,
    jvm_thread_group,
    parse_stat,
    python_kind,
    started_between,
)
from benchmarks.peers_spark import source_options


def test_a_stat_line_gives_ppid_cpu_seconds_and_start_even_with_spaces_in_the_name() -> None:
    fields = ["S", "7"] + ["0"] * 9 + [str(3 * CLOCK_TICKS), str(CLOCK_TICKS)] + ["5", "5"] + ["0"] * 4 + ["12345"]
    assert parse_stat("42 (python3 (x) y) " + " ".join(fields)) == (7, 4.0, 12345)


@pytest.mark.parametrize(
    ("argv", "component"),
    [
        (["/usr/lib/jvm/java-17/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit"], "spark_jvm"),
        (["/v/bin/python", "-m", "pyspark.daemon", "pyspark.worker"], "python_workers"),
        (["/v/bin/python", "-m", "pyspark.daemon"], "python_workers"),
        (["/v/bin/python", "-m", "pyspark.worker"], "python_workers"),
        (
            ["/v/bin/python", "-m", "pyspark.daemon", "pyspark.sql.worker.write_into_data_source"],
            "python_datasource_runners",
        ),
        (["/v/bin/python", "-m", "pyspark.sql.streaming.python_streaming_source_runner"], "python_datasource_runners"),
        (["/v/bin/python", "-m", "spark_datasource.testing.streaming_job", "--topic", "t"], "driver_python"),
        ([], "driver_python"),
    ],
)
def test_a_job_process_is_named_by_its_command_line(argv: list[str], component: str) -> None:
    assert component_of(argv) == component


DAEMON = ["/v/bin/python", "-m", "pyspark.daemon", "pyspark.sql.worker.write_into_data_source"]


@pytest.mark.parametrize(
    ("argv", "parent", "kind"),
    [
        (DAEMON, ["/usr/bin/java", "-cp", "x"], "write_into_data_source daemon"),
        (DAEMON, DAEMON, "write_into_data_source"),
        (["/v/bin/python", "-m", "pyspark.daemon"], ["/v/bin/python", "-m", "pyspark.daemon"], "worker"),
        (
            ["/v/bin/python", "-m", "pyspark.sql.streaming.python_streaming_source_runner"],
            [],
            "python_streaming_source_runner",
        ),
        (["/v/bin/python", "-m", "spark_datasource.testing.streaming_job"], [], None),
        (["/usr/bin/java", "-cp", "x"], [], None),
    ],
)
def test_a_python_worker_is_named_by_its_module_and_a_fork_by_its_daemons_command_line(
    argv: list[str], parent: list[str], kind: str | None
) -> None:
    assert python_kind(argv, parent) == kind


def test_the_workers_started_in_a_window_are_counted_per_kind_with_their_cpu() -> None:
    procs = [
        PythonProcess("worker", 1.0, 2.0),
        PythonProcess("worker", 5.0, 0.9),
        PythonProcess("worker", 6.0, 1.1),
        PythonProcess("python_streaming_sink_runner", 6.5, 0.6),
        PythonProcess("worker", 9.0, 1.0),
    ]
    assert started_between(procs, 5.0, 8.0) == {
        "python_streaming_sink_runner": {"started": 1, "cpu_s": 0.6},
        "worker": {"started": 2, "cpu_s": 2.0},
    }
    assert started_between(procs, 10.0, 20.0) == {}


def test_descendants_are_every_pid_below_the_roots() -> None:
    parents = {2: 1, 3: 2, 4: 3, 5: 1, 6: 99}
    assert descendants(parents, [2]) == {3, 4}
    assert descendants(parents, [1]) == {2, 3, 4, 5}
    assert descendants(parents, [6]) == set()


def test_totals_between_two_times_interpolate_and_clamp() -> None:
    t = Totals()
    t.add(10.0, {"jvm": 1.0})
    t.add(12.0, {"jvm": 3.0, "clickhouse": 2.0})
    assert t.between(11.0, 12.0) == {"clickhouse": 1.0, "jvm": 1.0}
    assert t.between(0.0, 100.0) == {"clickhouse": 2.0, "jvm": 2.0}
    assert Totals().between(0.0, 1.0) == {}


def test_a_window_is_cpu_per_million_events_with_its_extra_and_busy_cores() -> None:
    t = Totals()
    t.add(0.0, {"spark_jvm": 0.0, "clickhouse": 0.0})
    t.add(4.0, {"spark_jvm": 2.0, "clickhouse": 1.0})
    w = window(t, 0.0, 4.0, 500_000, {"job_unsampled": 0.5})
    assert w["cpu_s_per_million"] == {"spark_jvm": 4.0, "clickhouse": 2.0, "job_unsampled": 1.0, "total": 7.0}
    assert (w["rows_per_s"], w["cores_busy"]) == (125_000.0, 0.88)
    assert per_million({"x": 1.0}, 0) == {}


def test_the_workers_are_split_by_difference_on_one_client_and_between_clients() -> None:
    def run(subject: str, workers: float) -> dict:
        return {"subject": subject, "whole": {"cpu_s_per_million": {"python_workers": workers}}}

    runs = [
        run("transaction@kafka-python", 30.0),
        run("transaction@librdkafka", 12.0),
        run("foreach_batch@kafka-python", 22.0),
        run("foreach_batch@librdkafka", 5.0),
        {"subject": "kafka_engine", "whole": {"cpu_s_per_million": {"clickhouse": 9.0}}},
    ]
    d = derived(runs)
    assert d["sink_workers transaction@kafka-python whole"] == 8.0
    assert d["sink_workers transaction@librdkafka whole"] == 7.0
    assert d["decode_saved transaction whole"] == 18.0
    assert d["decode_saved foreach_batch whole"] == 17.0
    assert not any("steady" in k for k in d)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("C2 CompilerThre", "jit"),
        ("C1 CompilerThre", "jit"),
        ("GC Thread#0", "gc"),
        ("G1 Conc#0", "gc"),
        ("VM Thread", "gc"),
        ("Executor task l", "tasks"),
        ("stream executio", "stream_execution"),
        ("dag-scheduler-e", "other"),
    ],
)
def test_a_jvm_thread_is_grouped_by_its_name(name: str, group: str) -> None:
    assert jvm_thread_group(name) == group


def test_a_window_splits_the_jvm_by_thread_group_per_million_events() -> None:
    t, threads = Totals(), Totals()
    t.add(0.0, {"spark_jvm": 0.0})
    t.add(2.0, {"spark_jvm": 3.0})
    threads.add(0.0, {"jit": 1.0, "tasks": 0.0})
    threads.add(2.0, {"jit": 2.0, "tasks": 1.5})
    w = window(t, 0.0, 2.0, 500_000, jvm_threads=threads)
    assert w["spark_jvm_threads_per_million"] == {
        "jit": 2.0,
        "gc": 0.0,
        "tasks": 3.0,
        "stream_execution": 0.0,
        "other": 0.0,
    }
    assert "spark_jvm_threads_per_million" not in window(t, 0.0, 2.0, 500_000)


def test_a_subject_names_its_client_and_variant_and_a_variant_its_spark_settings() -> None:
    assert split_subject("transaction@librdkafka+gc") == ("transaction", "librdkafka", "gc")
    assert split_subject("kafka_engine") == ("kafka_engine", "", "")
    a = _parse(
        [
            "--subjects=transaction@librdkafka,transaction@librdkafka+gc",
            "--variant=gc:spark.driver.extraJavaOptions=-XX:+UseParallelGC -Da=b",
            "--variant=gc:spark.buffer.size=65536",
            "--spark-conf=spark.sql.shuffle.partitions=2",
        ]
    )
    assert a.variants == {
        "gc": {"spark.driver.extraJavaOptions": "-XX:+UseParallelGC -Da=b", "spark.buffer.size": "65536"}
    }
    assert a.spark_conf == {"spark.sql.shuffle.partitions": "2"}
    for bad in (["--subjects=transaction+nope"], ["--subjects=kafka_engine+gc", "--variant=gc:a=b"]):
        with pytest.raises(SystemExit):
            _parse(bad)


def test_the_summary_is_each_subjects_median_over_its_rounds() -> None:
    def run(subject: str, jvm: float, jit: float) -> dict:
        pm = {"spark_jvm": jvm, "total": jvm + 1.0}
        return {"subject": subject, "steady": {"cpu_s_per_million": pm, "spark_jvm_threads_per_million": {"jit": jit}}}

    runs = [run("t", 10.0, 5.0), run("t+gc", 8.0, 5.0), run("t", 14.0, 7.0), run("t", 12.0, 6.0)]
    s = summary(runs)
    assert s["t"]["steady"]["median"] == {"spark_jvm": 12.0, "total": 13.0}
    assert s["t"]["steady"]["totals"] == [11.0, 15.0, 13.0]
    assert s["t"]["steady"]["spark_jvm_threads_median"]["jit"] == 6.0
    assert s["t+gc"]["steady"]["runs"] == 1 and "whole" not in s["t"]


def test_a_peer_at_a_client_replaces_the_runs_client_and_keeps_its_other_options() -> None:
    shared = ("maxPartitions=2", "kafka.client=librdkafka")
    assert source_options(shared, "transaction") == shared
    assert source_options(shared, "transaction@kafka-python") == ("maxPartitions=2", "kafka.client=kafka-python")


def test_the_sampler_files_a_child_under_the_job_and_keeps_its_cpu_once_it_is_gone() -> None:
    pid = os.fork()
    if pid == 0:  # a child that burns a little CPU and exits
        end = os.times().elapsed + 0.3
        while os.times().elapsed < end:
            pass
        os._exit(0)
    with CpuSampler({}, 0.05) as s:
        os.waitpid(pid, 0)
    assert s.job_seen
    assert s.totals.rows[-1].get("driver_python", 0.0) > 0.0
