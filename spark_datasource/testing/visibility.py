"""When committed rows become visible to a read-committed reader, and percentiles of it.

Calling process of a pipeline run (a poller thread next to the job).
"""

from __future__ import annotations

import threading
import time
from typing import Mapping, Sequence

from clickhouse_tx.client.sql import qualified, split_table
from clickhouse_tx.verify.verifier import ClickHouseReader
from spark_datasource.testing.credentials import target_fields


class VisibilityPoller:
    """Polls, read-committed, the highest visible offset per partition (for latency).

    Runs in a thread of the calling process every ``interval_s``; the latency of a
    record is the first poll at which its offset was visible minus its Kafka timestamp,
    so it carries up to one ``interval_s`` of measurement error (reported).
    """

    def __init__(self, url: str, table: str, interval_s: float = 0.1) -> None:
        self.src = qualified(*split_table(table))
        self.reader = ClickHouseReader(url, **target_fields())
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "VisibilityPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.reader.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                rows = self.reader.rows(f"SELECT `partition` AS p, max(`offset`) AS o FROM {self.src} GROUP BY p")
                self.samples.append((t, {int(r["p"]): int(r["o"]) for r in rows}))
            except Exception:  # a poll lost to a busy server is just a missed sample
                pass
            self._stop.wait(self.interval_s)


def latencies_ms(
    url: str, table: str, samples: Sequence[tuple[float, Mapping[int, int]]], since_s: float | None = None
) -> list[float]:
    """Per record: first poll time showing its offset visible − its Kafka timestamp, in ms.

    Only records whose Kafka timestamp is at or after ``since_s`` (epoch seconds) count.
    """
    import numpy as np

    ch = ClickHouseReader(url, **target_fields())
    try:
        rows = ch.rows(
            f"SELECT `partition` AS p, groupArray(`offset`) AS o, "
            f"groupArray(toUnixTimestamp64Milli(kafka_ts)) AS ts FROM "
            f"(SELECT `partition`, `offset`, kafka_ts FROM {qualified(*split_table(table))} "
            f"ORDER BY `partition`, `offset`) GROUP BY p"
        )
    finally:
        ch.close()
    out: list[np.ndarray] = []
    times = np.array([s[0] for s in samples], dtype=float)
    for r in rows:
        p = int(r["p"])
        offs = np.asarray(r["o"], dtype=np.int64)
        ts = np.asarray(r["ts"], dtype=float) / 1000.0
        vis = np.array([s[1].get(p, -1) for s in samples], dtype=np.int64)
        vis = np.maximum.accumulate(vis) if len(vis) else vis
        idx = np.searchsorted(vis, offs, side="left")  # first poll with max offset >= o
        ok = idx < len(vis)
        if since_s is not None:
            ok &= ts >= since_s
        out.append((times[idx[ok]] - ts[ok]) * 1000.0)
    return [float(x) for x in np.concatenate(out)] if out else []


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (``q`` in 0..100, linear interpolation) of ``xs``; None if empty.

    The one percentile of the harness and the benchmarks, so their figures compare.
    """
    if not xs:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(xs), q))
