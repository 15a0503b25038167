"""Cyclic garbage collection in reused Python workers (executors).

pyspark's worker daemon runs a full ``gc.collect()`` after every task of a reused
Python worker (``pyspark/daemon.py``), and Spark hands the worker its next task only
after it. A worker that has imported pyarrow, kafka-python, pyspark and this package
tracks so many objects that this collection can cost more than a small task's own
work (a range read of a few records), and so most of a small micro-batch's
``addBatch``; ``docs/performance.md`` gives the measurement.

:func:`before_task` freezes (:func:`gc.freeze`) what is alive when a task starts:
imported modules, pooled consumers and clients. The daemon's collection then walks
only what the task itself allocated. A frozen object is still freed by reference
counting; only a frozen *cycle* that later becomes garbage (a pooled consumer closed
after idling) waits, for the next full collection, which :func:`before_task` runs
once every :data:`FULL_COLLECT_EVERY_S` seconds (unfreeze, collect, freeze again).
"""

from __future__ import annotations

import gc
import time

#: Seconds between the full collections :func:`before_task` runs in a worker.
FULL_COLLECT_EVERY_S = 60.0

_last_full: float | None = None


def before_task() -> None:
    """Executor, at the start of every read or write task in a Python worker.

    Freezes the objects alive now, so pyspark's collection after the task is short;
    once every :data:`FULL_COLLECT_EVERY_S` seconds it first collects everything.
    Costs microseconds, except the full collection (a few hundred ms, once a minute
    per worker). Call it only inside a Spark task: it changes the whole process's
    collector.
    """
    global _last_full
    now = time.monotonic()
    if _last_full is None:
        _last_full = now
    elif now - _last_full >= FULL_COLLECT_EVERY_S:
        gc.unfreeze()
        gc.collect()
        _last_full = now
    gc.freeze()
