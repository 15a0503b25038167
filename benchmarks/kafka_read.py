"""``kafka_py``'s executor read, ``read_range``, with each client: kafka-python vs librdkafka.

Starts a private dev broker (:mod:`server_patches.kafka_broker`), produces ``--records``
records of ``--value-bytes`` bytes (JSON objects, as the pipeline's events) into each of
``--partitions`` partitions, then runs ``--rounds`` rounds; each round reads every
partition's whole range once with each client, the clients' order alternating between
rounds, in this process, as one executor task does
(:func:`spark_datasource.kafka.fetch.read_range` into Arrow record batches):

- ``cold``: through a new consumer pool (the consumer connects, as a Python worker's
  first task does);
- ``warm``: the same ranges again through the pool the cold read filled (the reused
  consumer of the next micro-batch).

Each read is timed on the wall clock and in CPU seconds of the whole process
(librdkafka fetches and parses in its own threads, which count). Reported: the median
records/s and CPU µs per record of each client over the rounds, and librdkafka /
kafka-python, the issue's goal being >= 3x. With ``--spark``, then: a Spark batch read
of the whole topic (``spark.read.format("kafka_py")``, ``local[2]``) into the no-op
sink with each client, ``--rounds`` interleaved rounds after one warm-up read each.

    python -m benchmarks.kafka_read --partitions 4 --spark --json benchmarks/results/kafka_read.json
    python -m benchmarks.kafka_read --records 20000 --rounds 2        # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.results_file import machine, write_result

CLIENTS = ("kafka-python", "librdkafka")


def produce(bootstrap: str, topic: str, partitions: int, records: int, value_bytes: int) -> None:
    """``records`` JSON values of about ``value_bytes`` bytes into each partition (librdkafka's producer)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 2000})
    pad = "x" * max(0, value_bytes - 40)
    for part in range(partitions):
        for i in range(records):
            p.produce(topic, b'{"id": %d, "user": %d, "pad": "%s"}' % (i, i % 97, pad.encode()), partition=part)
            if i % 10_000 == 0:
                p.poll(0)
    p.flush(60)


def read_once(opts: Any, ranges: list[Any], pool: Any) -> dict[str, float]:
    """Read every range once through ``pool``: rows, wall seconds, CPU seconds."""
    from spark_datasource.kafka.fetch import read_range

    rows = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for rng in ranges:
        rows += sum(b.num_rows for b in read_range(opts, rng, pool))
    return {"rows": rows, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def one_round(bootstrap: str, topic: str, ranges: list[Any], order: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Cold and warm reads of ``ranges`` with each client of ``order``, in that order."""
    from spark_datasource.kafka.consumers import ConsumerPool
    from spark_datasource.kafka.options import parse_kafka_options

    out: dict[str, dict[str, Any]] = {}
    for client in order:
        opts = parse_kafka_options({"bootstrap.servers": bootstrap, "subscribe": topic, "kafka.client": client})
        pool = ConsumerPool()
        try:
            out[client] = {"cold": read_once(opts, ranges, pool), "warm": read_once(opts, ranges, pool)}
        finally:
            pool.close_all()
    return out


def summarize(rounds: list[dict[str, dict[str, Any]]], expected_rows: int) -> dict[str, Any]:
    """Median records/s and CPU µs per record of each client and kind of read, and the ratios."""
    out: dict[str, Any] = {}
    for client in CLIENTS:
        for kind in ("cold", "warm"):
            runs = [r[client][kind] for r in rounds]
            wrong = [run["rows"] for run in runs if run["rows"] != expected_rows]
            if wrong:
                raise RuntimeError(f"{client} {kind}: read {wrong} rows, expected {expected_rows}")
            out[f"{client}_{kind}_records_per_s"] = round(statistics.median(expected_rows / x["wall_s"] for x in runs))
            out[f"{client}_{kind}_cpu_us_per_record"] = round(
                statistics.median(x["cpu_s"] * 1e6 / expected_rows for x in runs), 3
            )
    for kind in ("cold", "warm"):
        out[f"speedup_{kind}"] = round(
            out[f"librdkafka_{kind}_records_per_s"] / out[f"kafka-python_{kind}_records_per_s"], 2
        )
        out[f"cpu_ratio_{kind}"] = round(
            out[f"kafka-python_{kind}_cpu_us_per_record"] / out[f"librdkafka_{kind}_cpu_us_per_record"], 2
        )
    return out


def spark_rounds(bootstrap: str, topic: str, rounds: int, expected_rows: int) -> dict[str, Any]:
    """``spark.read.format("kafka_py")`` of the whole topic into the no-op sink, each client
    per round (order alternating), in a ``local[2]`` session: median records/s and the ratio."""
    import spark_datasource
    from spark_datasource.testing.session import local_session

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers with this interpreter's packages
    spark = local_session("kafka-read-bench", {"spark.executorEnv.PYSPARK_PYTHON": sys.executable})
    spark_datasource.register(spark)

    def once(client: str) -> float:
        df = (
            spark.read.format("kafka_py")
            .option("bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("kafka.client", client)
            .load()
        )
        started = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        return expected_rows / (time.perf_counter() - started)

    try:
        for client in CLIENTS:
            once(client)  # warm-up: the JVM, the Python workers, their imports and pools
        per: dict[str, list[float]] = {c: [] for c in CLIENTS}
        for i in range(rounds):
            for client in CLIENTS if i % 2 == 0 else CLIENTS[::-1]:
                per[client].append(once(client))
            print(f"spark round {i + 1}/{rounds}: " + json.dumps({c: round(v[-1]) for c, v in per.items()}), flush=True)
    finally:
        spark.stop()
    out: dict[str, Any] = {f"{c}_records_per_s": round(statistics.median(v)) for c, v in per.items()}
    out["speedup"] = round(out["librdkafka_records_per_s"] / out["kafka-python_records_per_s"], 2)
    out["rounds"] = {c: [round(x) for x in v] for c, v in per.items()}
    return out


def run(records: int, partitions: int, value_bytes: int, rounds: int, spark: bool = False) -> dict[str, Any]:
    """The whole benchmark on a private dev broker; the result document."""
    from server_patches.kafka_broker import start_broker, stop_broker
    from spark_datasource.kafka.offsets import KafkaOffsetRange

    topic = "bench"
    proc, bootstrap, _ = start_broker(topics=[(topic, partitions)])
    try:
        started = time.perf_counter()
        produce(bootstrap, topic, partitions, records, value_bytes)
        produce_s = time.perf_counter() - started
        ranges = [KafkaOffsetRange(topic, p, 0, records) for p in range(partitions)]
        one_round(bootstrap, topic, ranges, CLIENTS)  # warm-up: imports, first connections, caches
        done = []
        for i in range(rounds):
            order = CLIENTS if i % 2 == 0 else CLIENTS[::-1]
            done.append(one_round(bootstrap, topic, ranges, order))
            print(f"round {i + 1}/{rounds}: " + json.dumps(done[-1]), flush=True)
        on_spark = spark_rounds(bootstrap, topic, rounds, records * partitions) if spark else None
    finally:
        stop_broker(proc)
    return {
        "benchmark": "kafka_read",
        "command": (
            f"python -m benchmarks.kafka_read --records {records} --partitions {partitions} "
            f"--value-bytes {value_bytes} --rounds {rounds}" + (" --spark" if spark else "")
        ),
        "records_per_partition": records,
        "partitions": partitions,
        "value_bytes": value_bytes,
        "produce_s": round(produce_s, 2),
        "summary": summarize(done, records * partitions),
        "spark_noop": on_spark,
        "rounds": done,
        "machine": machine(**_versions()),
    }


def _versions() -> dict[str, Any]:
    import confluent_kafka
    import kafka

    try:
        import crc32c  # noqa: F401

        has_crc32c = True
    except ImportError:
        has_crc32c = False
    return {
        "kafka_python": kafka.__version__,
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "crc32c": has_crc32c,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=50_000, help="records per partition (the mock keeps <= 5 MiB)")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--value-bytes", type=int, default=60, help="size of each JSON value")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--spark", action="store_true", help="also spark.read of the topic into noop, local[2]")
    parser.add_argument("--json", help="write the result here (benchmarks/results/kafka_read.json)")
    args = parser.parse_args(argv)
    result = run(args.records, args.partitions, args.value_bytes, args.rounds, args.spark)
    print(json.dumps({"read_range": result["summary"], "spark_noop": result["spark_noop"]}, indent=2))
    if args.json:
        write_result(args.json, result)
    return result


if __name__ == "__main__":
    main()
