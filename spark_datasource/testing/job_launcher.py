"""The streaming job as a child process group: start, read its stdout, SIGKILL the group.

Calling process; the job itself (:mod:`spark_datasource.testing.streaming_job`) runs Spark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from clickhouse_tx.testing.faults import TEST_FAULTS_ENV

#: The checkout the job runs from (its cwd and PYTHONPATH).
ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- the job


@dataclasses.dataclass
class JobRun:
    """One start of the streaming job, until it exits or is killed."""

    index: int
    fault: str | None
    proc: subprocess.Popen
    started: float
    progress: list[dict] = dataclasses.field(default_factory=list)
    done: dict | None = None
    ready: bool = False
    killed_by_us: bool = False
    ended: float | None = None

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the job leads its own group


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of group ``pgid``, from /proc."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                raw = fh.read()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        # fields[0] is the state, fields[2] the process group
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(name))
    return out


def group_alive(pgid: int) -> bool:
    """True while any live process of group ``pgid`` exists (zombies do not count)."""
    return bool(group_members(pgid))


def kill_group(pgid: int, timeout_s: float = 30.0) -> None:
    """SIGKILL every process of the job's group and wait until none is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


class JobLauncher:
    """Starts :mod:`spark_datasource.testing.streaming_job` in its own session; parses its stdout."""

    def __init__(
        self,
        argv: Sequence[str],
        work: Path,
        on_line: Callable[[JobRun, str, dict], None] | None = None,
        module: str = "spark_datasource.testing.streaming_job",
    ) -> None:
        self.module = module  # another driver program speaking the same stdout protocol (chaos)
        self.argv = list(argv)
        self.work = work
        self.on_line = on_line
        self.runs: list[JobRun] = []

    def start(self, extra: Sequence[str] = (), fault: str | None = None) -> JobRun:
        env = dict(os.environ)
        env["PYSPARK_PYTHON"] = sys.executable
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if fault is not None:  # the planned crash is a test-only fault hook of the writer
            env[TEST_FAULTS_ENV] = "1"
        idx = len(self.runs)
        with open(self.work / f"job-{idx}.stderr", "wb") as err:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.argv, *extra],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                text=True,
                bufsize=1,
            )
        run = JobRun(idx, fault, proc, time.monotonic())
        self.runs.append(run)
        threading.Thread(target=self._read, args=(run,), daemon=True).start()
        return run

    def _read(self, run: JobRun) -> None:
        assert run.proc.stdout is not None
        for line in run.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            if kind not in ("PROGRESS", "DONE", "READY"):
                continue
            try:
                doc = json.loads(rest)
            except ValueError:
                continue
            if kind == "PROGRESS":
                run.progress.append(doc)
            elif kind == "DONE":
                run.done = doc
            elif kind == "READY":
                run.ready = True
            if self.on_line:
                self.on_line(run, kind, doc)

    def wait(self, run: JobRun, timeout_s: float) -> int | None:
        """Wait for the job's exit; returns its code (None on timeout). Reaps its group."""
        try:
            rc = run.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        run.ended = time.monotonic()
        kill_group(run.pgid, 10)  # a worker the driver left behind must not outlive it
        return rc

    def kill(self, run: JobRun) -> None:
        run.killed_by_us = True
        kill_group(run.pgid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.proc.wait(10)
        run.ended = time.monotonic()

    def stop_all(self) -> None:
        for r in self.runs:
            if r.proc.poll() is None or group_alive(r.pgid):
                kill_group(r.pgid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    r.proc.wait(10)

    def stderr_tail(self, run: JobRun, lines: int = 30) -> str:
        p = self.work / f"job-{run.index}.stderr"
        try:
            return "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""
