"""One chaos schedule end to end: job, faults, restarts until done, then every check.

:func:`run_schedule` runs in the chaos runner's process, once per schedule, on the
shared :class:`~spark_datasource.testing.chaos.inject.ChaosStack` (a fresh database, topic and
checkpoint each time). The job is a child driver process per run
(:class:`~spark_datasource.testing.job_launcher.JobLauncher`); after the faults it is restarted on
the same checkpoint (or ``transactional_id``) until it finishes. Then: every record is
checked (Kafka offsets and event ids against what a read-committed reader sees),
``python -m clickhouse_tx verify`` must pass, ``python -m clickhouse_tx gc`` runs,
and no stage table, running transaction or registry entry may be left.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

from clickhouse_tx.client.sql import quote_identifier
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX
from clickhouse_tx.verify.verifier import ClickHouseReader
from spark_datasource.testing.chaos.batch_job import BATCH_TOPIC
from spark_datasource.testing.chaos.inject import ChaosStack, Injector
from spark_datasource.testing.chaos.schedule import Schedule
from spark_datasource.testing.credentials import http_auth, target_fields
from spark_datasource.testing.job_launcher import ROOT, JobLauncher, JobRun, group_members
from spark_datasource.testing.source_and_target import create_target, create_topic, produce

MAX_RUNS = 12
JOB_TIMEOUT_S = 300.0
#: Short client timeouts, so stalls are felt, and retries that ride through outages.
WRITER_OPTIONS = ("request_timeout=6", "connect_timeout=2", "retry.attempts=40", "retry.max_seconds=60")


@dataclasses.dataclass
class _Sched:
    """What one schedule needs while it runs (runner process)."""

    sch: Schedule
    stack: ChaosStack
    work: Path
    database: str
    launcher: JobLauncher | None = None
    restarts: int = 0
    recovers: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def table(self) -> str:
        return f"{self.database}.events"

    @property
    def topic(self) -> str:
        return BATCH_TOPIC if self.sch.job == "batch" else f"chaos_{self.database}"

    @property
    def checkpoint(self) -> Path:
        return self.work / "checkpoint"

    @property
    def shard_urls(self) -> list[str]:
        """Direct URLs of the ClickHouse servers the job writes to (one unless sharded)."""
        return self.stack.shard_urls[: self.sch.shards]

    def target_args(self) -> list[str]:
        """``--url`` of the one server, or ``--shards`` of every shard (the CLI's target)."""
        return ["--shards", ",".join(self.shard_urls)] if self.sch.shards > 1 else ["--url", self.stack.url]


def _job_argv(s: _Sched) -> tuple[str, list[str]]:
    """(module, argv) of the schedule's driver program; the writer goes through the proxy."""
    sch = s.sch
    options = list(WRITER_OPTIONS)
    if sch.shards > 1:
        options.append(f"shards={s.stack.writer_shards(sch.shards)}")
        if sch.sharding_key:
            options.append(f"sharding_key={sch.sharding_key}")
    opts = [a for kv in options for a in ("--writer-option", kv)]
    common = ["--url", s.stack.proxy_url, "--table", s.table, "--mode", sch.mode, "--master", sch.master, *opts]
    if sch.job == "batch":
        extra = ["--events", str(sch.events), "--partitions", str(sch.partitions), "--txn-id", f"chaos-{s.database}"]
        return "spark_datasource.testing.chaos.batch_job", [*common, *extra, "--decision-log", str(s.checkpoint)]
    ends = {s.topic: {str(p): len(range(p, sch.events, sch.partitions)) for p in range(sch.partitions)}}
    trigger = "0" if sch.job == "stream_available_now" else "0.5"
    return "spark_datasource.testing.streaming_job", [
        *common,
        "--bootstrap",
        str(s.stack.info.kafka_bootstrap),
        "--topic",
        s.topic,
        "--checkpoint",
        str(s.checkpoint),
        "--trigger",
        trigger,
        "--max-offsets-per-trigger",
        str(max(100, sch.events // 5)),
        "--end-offsets",
        json.dumps(ends),
        "--timeout",
        str(JOB_TIMEOUT_S),
    ]


def _prepare(s: _Sched) -> None:
    """The database, target table and (streaming) the topic with every event."""
    for url in s.shard_urls:
        create_target(url, s.table, s.sch.mode)
    if s.sch.job != "batch":
        info = s.stack.info
        create_topic(str(info.kafka_bootstrap), info.kafka_control, s.topic, s.sch.partitions)
        produce(str(info.kafka_bootstrap), s.topic, s.sch.events, s.sch.partitions)


def _step_args(s: _Sched, index: int) -> list[str]:
    """The first run carries the schedule's protocol-step kill, if it has one."""
    step = next((f.step for f in s.sch.faults if f.step), None)
    if index != 0 or step is None:
        return []
    return ["--fault-step", step, "--fault-action", "kill", "--fault-once-file", str(s.work / "step.once")]


def _maybe_recover(s: _Sched, run: JobRun) -> None:
    """A batch job that died mid-commit names ``recover``: run it, as an operator would."""
    text = (s.work / f"job-{run.index}.stderr").read_text(errors="replace")
    if "python -m clickhouse_tx recover" not in text:
        return
    s.recovers += 1
    cli(s, "recover", "--mode", s.sch.mode, "--checkpoint", str(s.checkpoint))


#: The launchers of the jobs running now, over every lane: an interrupted run stops them all.
_LIVE: set[JobLauncher] = set()
_LIVE_LOCK = threading.Lock()


def stop_all_jobs() -> None:
    """SIGKILL every job run of every schedule still running (on SIGTERM or Ctrl-C of the run)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for launcher in live:
        launcher.stop_all()


def _run_job(s: _Sched, rng: random.Random) -> Injector:
    """Run the job through its faults, restarting it until it finishes; the injector's log."""
    module, argv = _job_argv(s)
    s.launcher = launcher = JobLauncher(argv, s.work, module=module)
    with _LIVE_LOCK:
        _LIVE.add(launcher)
    timed = [f for f in s.sch.faults if not f.step]
    current: list[JobRun] = []
    inj = Injector(s.stack, timed, lambda: current[-1] if current else None, launcher.kill, rng)
    try:
        for index in range(MAX_RUNS):
            run = launcher.start(_step_args(s, index), "step" if _step_args(s, index) else None)
            current.append(run)
            if index == 0:
                _wait_alive(run)
                inj.start(time.monotonic())
            rc = launcher.wait(run, JOB_TIMEOUT_S + 60)
            if rc == 0 and run.done is not None:
                return inj
            if rc is None:  # hung: keep the JVM's threads for the post-mortem, then kill
                _dump_jvm_threads(s, run)
                launcher.kill(run)
            s.restarts += 1
            s.notes.append(f"run {index}: exit {rc}{' (killed)' if run.killed_by_us else ''}")
            _maybe_recover(s, run)
        raise RuntimeError(f"the job did not finish in {MAX_RUNS} runs; last stderr:\n{launcher.stderr_tail(run)}")
    finally:
        inj.finish()
        launcher.stop_all()
        with _LIVE_LOCK:
            _LIVE.discard(launcher)


def _dump_jvm_threads(s: _Sched, run: JobRun) -> None:
    """``jstack`` of the job's JVM into ``job-<n>.jstack`` (where ``jstack`` exists)."""
    jstack = shutil.which("jstack")
    if jstack is None:
        return
    for pid in group_members(run.pgid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"java" in cmd.split(b"\0")[0]:
            with open(s.work / f"job-{run.index}.jstack", "ab") as out:
                subprocess.run([jstack, str(pid)], stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False)
    s.notes.append(f"run {run.index} hung: thread dump in job-{run.index}.jstack")


def _wait_alive(run: JobRun, timeout_s: float = 180.0) -> None:
    """Until the job reported READY (or ended): faults are timed from there."""
    deadline = time.monotonic() + timeout_s
    while not run.ready and run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def cli(s: _Sched, *args: str) -> subprocess.CompletedProcess:
    """``python -m clickhouse_tx <command> --url|--shards <ClickHouse> --table <target> ...`` (direct urls)."""
    cmd, *rest = args
    argv = [sys.executable, "-m", "clickhouse_tx", cmd, *s.target_args(), "--table", s.table, *rest]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _expected(s: _Sched) -> dict[str, dict[str, list[int]]]:
    n, p = s.sch.events, s.sch.partitions
    return {s.topic: {str(i): [0, len(range(i, n, p))] for i in range(p)}}


def _counts(s: _Sched) -> dict[str, int]:
    """Rows, duplicates and losses over every shard, read committed, against the events produced."""
    rows: list[dict] = []
    for url in s.shard_urls:
        ch = ClickHouseReader(url, **target_fields())
        try:
            rows += ch.rows(
                f"SELECT `topic`, `partition`, `offset`, event_id FROM {quote_identifier(s.database)}.events"
            )
        finally:
            ch.close()
    offsets = {(r["topic"], int(r["partition"]), int(r["offset"])) for r in rows}
    ids = {int(r["event_id"]) for r in rows}
    alien = sum(1 for i in ids if not 0 <= i < s.sch.events)
    return {
        "rows": len(rows),
        "duplicates": len(rows) - len(offsets),
        "lost": s.sch.events - (len(ids) - alien),
        "alien": alien,
    }


def _plain_rows(url: str, sql: str) -> list[dict]:
    """Rows of ``sql`` read plainly (system and KeeperMap tables are not transactional)."""
    r = requests.post(url.rstrip("/") + "/", data=f"{sql} FORMAT JSONEachRow".encode(), timeout=60, auth=http_auth())
    if r.status_code != 200:
        raise RuntimeError(f"ClickHouse refused {sql!r}: {r.text.strip()[:300]}")
    return [json.loads(line) for line in r.text.splitlines() if line.strip()]


def _leftovers(s: _Sched) -> dict[str, int]:
    """After gc, summed over the shards: stage tables, running transactions, registry entries."""
    out = {"stage_tables": 0, "open_transactions": 0, "registry_entries": 0}
    for url in s.shard_urls:
        for k, n in _leftovers_on(url, s.database).items():
            out[k] += n
    return out


def _leftovers_on(url: str, database: str) -> dict[str, int]:
    """After gc, on one server: stage tables of the database, running transactions, registry entries."""
    db = database.replace("'", "''")
    tables = [r["name"] for r in _plain_rows(url, f"SELECT name FROM system.tables WHERE database = '{db}'")]
    tx = _plain_rows(url, "SELECT count() AS n FROM system.transactions WHERE state = 'RUNNING'")
    reg = 0
    if "clickhouse_tx_registry" in tables:
        reg_rows = _plain_rows(url, f"SELECT count() AS n FROM {quote_identifier(database)}.clickhouse_tx_registry")
        reg = int(reg_rows[0]["n"])
    stages = sum(1 for t in tables if t.startswith(("_ctx_", STAGE_PREFIX)))
    return {"stage_tables": stages, "open_transactions": int(tx[0]["n"]), "registry_entries": reg}


def _check(s: _Sched) -> dict:
    """Every record, the verify CLI, gc, then what is left."""
    counts = _counts(s)
    v = cli(s, "verify", "--expected", json.dumps(_expected(s)), "--checkpoint", str(s.checkpoint), "--quiet")
    gc_args = ["--mode", s.sch.mode, "--checkpoint", str(s.checkpoint), "--older-than", "0", "--not-running"]
    gc = cli(s, "gc", *gc_args)
    left = _leftovers(s)
    problems = []
    if v.returncode != 0:
        problems.append(f"verify exit {v.returncode}: {(v.stdout + v.stderr).strip()[-800:]}")
    if gc.returncode != 0:
        problems.append(f"gc exit {gc.returncode}: {(gc.stdout + gc.stderr).strip()[-800:]}")
    bad = {k: n for k, n in {**counts, **left}.items() if k != "rows" and n}
    if bad:
        problems.append("; ".join(f"{k}={n}" for k, n in bad.items()))
    return {**counts, **left, "verify_exit": v.returncode, "gc_exit": gc.returncode, "problems": problems}


def run_schedule(stack: ChaosStack, sch: Schedule, work: Path) -> dict:
    """Run schedule ``sch`` and return its record (``ok`` false on any problem)."""
    t0 = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    s = _Sched(sch, stack, work, database=f"chaos_{sch.seed}_{int(time.time())}")
    stack.heal()
    _prepare(s)
    rec: dict = {"seed": sch.seed, "job": sch.job, "mode": sch.mode, "master": sch.master, "shards": sch.shards}
    rec["planned"] = [f.label() for f in sch.faults]
    try:
        inj = _run_job(s, random.Random(sch.seed))
        stack.heal()
        rec["injected"] = _injected(s, inj)
        rec.update(_check(s))
    except Exception as e:  # the schedule failed; the run goes on with the next one
        stack.heal()
        rec.setdefault("injected", [])
        rec["problems"] = [f"{type(e).__name__}: {e}"[-1500:]]
    runs = s.launcher.runs if s.launcher else []
    rec["run_s"] = [round((r.ended or time.monotonic()) - r.started, 1) for r in runs]
    rec["batches"] = sum(len(r.progress) for r in runs)
    rec.update(restarts=s.restarts, recovers=s.recovers, notes=s.notes, wall_s=round(time.monotonic() - t0, 1))
    rec["ok"] = not rec["problems"]
    return rec


def _injected(s: _Sched, inj: Injector) -> list[dict]:
    """The faults that really happened (a step kill fired; a timed fault found its target)."""
    out = [e for e in inj.log if not str(e["detail"]).startswith(("no ", "error"))]
    step = next((f for f in s.sch.faults if f.step), None)
    if step is not None and (s.work / "step.once").exists():
        out.insert(0, {"kind": "kill_driver", "at_s": None, "detail": f"at {step.step}"})
    errors = [e for e in inj.log if str(e["detail"]).startswith("error")]
    if errors:
        raise RuntimeError(f"fault injection failed: {errors}")
    return out
