"""spark_datasource.worker_gc: what a reused Python worker does to its collector per task.

Each scenario runs in a child interpreter: freezing and full collections act on the
whole process, and a full collection in the test process would finalize whatever
earlier tests left behind.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(body: str) -> str:
    code = textwrap.dedent(
        """
        import gc, weakref
        from spark_datasource import worker_gc

        clock = [1000.0]
        worker_gc.time.monotonic = lambda: clock[0]

        class Node:
            other = None

        def cycle():
            a, b = Node(), Node()
            a.other, b.other = b, a  # only the cyclic collector frees it
            return weakref.ref(a)
        """
    ) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_what_is_alive_at_a_task_start_is_left_out_of_the_collection_after_the_task() -> None:
    out = _run(
        """
        alive = cycle()
        worker_gc.before_task()
        gc.collect()  # what pyspark's daemon runs after the task
        print("frozen kept" if alive() is not None else "collected")
        gc.unfreeze()
        gc.collect()
        print("unfrozen collected" if alive() is None else "kept")
        """
    )
    assert out.splitlines() == ["frozen kept", "unfrozen collected"]


def test_a_task_starting_a_minute_after_the_last_full_collection_frees_cyclic_garbage_among_frozen_objects() -> None:
    out = _run(
        """
        alive = cycle()
        worker_gc.before_task()  # the worker's first task: the cycle is frozen
        clock[0] += worker_gc.FULL_COLLECT_EVERY_S - 1
        worker_gc.before_task()
        print("kept" if alive() is not None else "collected")
        clock[0] += 2
        worker_gc.before_task()  # a minute on: unfreeze, collect, freeze again
        print("kept" if alive() is not None else "collected")
        """
    )
    assert out.splitlines() == ["kept", "collected"]
