"""The batch job the batch-job SIGKILL tests run as a child process.

``python -m tests.helpers.batch_torture run <json args>`` writes ids ``0 .. n-1`` of
:func:`tests.helpers.spark_writes.events`, cut into ``partitions`` partitions, into
``database.events`` as one ``df.write...mode("append").save()`` job, with the writer
options of ``args["options"]`` (``fault.*`` ones included), then exits 0. A fault plan
with ``fault.action=kill`` SIGKILLs the child's whole process group (driver, JVM,
workers): it runs in a session of its own (:func:`tests.helpers.torture.start_child`).
Run again with the same arguments and no fault, it is the user's plain re-run.
``delay_s`` (with ``delay_rows``) slows the rows down as
:class:`tests.helpers.cluster_job.Throttle` does (a slow source: long INSERT bodies).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable

from tests.helpers.cluster_job import Throttle
from tests.helpers.spark_writes import events, writer_options
from tests.helpers.torture import spark_session


def batch_job(args: dict) -> None:
    """Write the job's rows (child process); the exception of a failed job ends it non-zero."""
    spark = spark_session(args)
    opts = writer_options(args["url"], args["database"], "events", args["mode"], **args.get("options", {}))
    df = events(spark, args["n"], args["partitions"])
    if args.get("delay_s"):  # slices of delay_rows rows, each after delay_s seconds (a slow source)
        df = df.mapInArrow(Throttle(float(args["delay_s"]), args.get("delay_rows")), df.schema)
    df.write.format("clickhouse_tx").options(**opts).mode("append").save()
    spark.stop()


def run_batch_child(
    args: dict, timeout_s: float = 600, watch: Callable[[subprocess.Popen], None] | None = None
) -> tuple[int, str]:
    """Run :func:`batch_job` in a child session to its end (or its SIGKILL): exit code and stderr.

    ``watch`` runs in a thread beside each run, given its process (as for
    :func:`tests.helpers.torture.run_child`).

    Again (up to 3 runs) when Spark gave up on a Python worker's start before anything
    ran: Spark waits 10 s (hard-coded) for a new worker to connect back, too short on a
    loaded machine, and that is no protocol step (as
    :func:`tests.helpers.torture.run_child_past_worker_start`).
    """
    for attempt in range(3):
        code, err = _run_once(args, timeout_s, watch)
        if code == 0 or "connect back" not in err or attempt == 2 or _fault_fired(args):
            return code, err
    raise AssertionError("unreachable")


def _fault_fired(args: dict) -> bool:
    once = args.get("options", {}).get("fault.once_file")
    return bool(once) and Path(once).exists()


def _run_once(args: dict, timeout_s: float, watch: Callable[[subprocess.Popen], None] | None) -> tuple[int, str]:
    from tests.helpers.torture import kill_session, start_child

    proc = start_child(args, module="tests.helpers.batch_torture")
    watcher = threading.Thread(target=watch, args=(proc,), daemon=True) if watch else None
    if watcher:
        watcher.start()
    try:
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        kill_session(proc)  # whatever of the session survived its leader (a JVM, a worker)
        if watcher:
            watcher.join()
    return proc.returncode, (err or b"").decode(errors="replace")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        batch_job(json.loads(sys.argv[2]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]!r}")
