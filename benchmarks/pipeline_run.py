"""One end-to-end pipeline run: Kafka -> Spark -> ClickHouse, SIGKILLs, restarts, verification.

The library shared by the demo (:mod:`benchmarks.pipeline`, what ``make demo`` runs),
the torture tests (``tests/torture/test_pipeline_crashes.py``) and the checkpoint
sweep (:mod:`benchmarks.checkpoint_sweep`). :func:`run_pipeline`:

1. uses the given servers or starts the embedded stack (ZooKeeper, ClickHouse on
   chdb, the dev Kafka broker) in the work directory;
2. creates a topic of ``partitions`` partitions and the target MergeTree table;
3. produces ``events`` small JSON events (or, with ``rate``, produces them at that
   rate while the job runs);
4. runs :mod:`benchmarks.streaming_job` as a child process in its own session and,
   ``crashes`` times, SIGKILLs its whole process group (driver JVM, Python workers)
   either at a protocol step (the writer's test-only ``fault.step``, fired once
   through a once-file; the job runs with ``CLICKHOUSE_TX_TEST_FAULTS=1`` for it) or
   after a random delay, restarting it on the same checkpoint;
5. verifies exactly-once: the (topic, partition, offset) set in ClickHouse, read
   committed (``implicit_transaction=1``), against Kafka's offsets 0..end of every
   partition, and the event ids against what was produced, and returns the figures.

Everything it starts (stack, jobs) is stopped on return, errors included. All of
this runs in the calling process; Spark runs only in the child job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, cast

import requests

from benchmarks.streaming_job import DEFAULT_DECODE, TABLE_COLUMNS
from clickhouse_tx.faults import TEST_FAULTS_ENV
from clickhouse_tx.interfaces import Mode
from clickhouse_tx.sql import qualified, quote_identifier, split_table
from clickhouse_tx.verify import ClickHouseReader, verify

ROOT = Path(__file__).resolve().parent.parent
MODES = tuple(m.value for m in Mode)
#: Protocol steps a crash can be injected at (see clickhouse_tx.faults).
FAULT_STEPS = ("after_prepare", "before_decision", "after_decision", "after_commit:1", "before_mark_done")


def event_json(event_id: int, ts_ms: int) -> bytes:
    """One event, ~60 bytes: small, because the dev broker keeps ~5 MiB per partition."""
    return (
        f'{{"event_id":{event_id},"user_id":{event_id * 7919 % 100000},'
        f'"amount":{event_id % 10000 / 100:.2f},"ts":{ts_ms}}}'
    ).encode()


# ------------------------------------------------------------------------------ Kafka


def create_topic(bootstrap: str, control: str | None, topic: str, partitions: int) -> None:
    """Create ``topic`` through the dev broker's control endpoint, else the Kafka admin API."""
    if control:
        from server_patches.kafka_broker import create_topic as mock_create

        mock_create(control, topic, partitions)
        return
    from confluent_kafka.admin import AdminClient, NewTopic

    fut = AdminClient({"bootstrap.servers": bootstrap}).create_topics([NewTopic(topic, partitions, 1)])
    fut[topic].result(30)


def produce(
    bootstrap: str,
    topic: str,
    n: int,
    partitions: int,
    *,
    first_id: int = 0,
    rate: float | None = None,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Produce events ``first_id .. first_id+n-1``, event i to partition i % partitions.

    ``rate`` paces production (events/s) so a running job sees a steady stream.
    Returns how many were acknowledged; raises if any delivery failed.
    """
    from confluent_kafka import Producer

    prod = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": "none",
            "enable.idempotence": False,
            "acks": 1,
        }
    )
    errors: list[str] = []
    acked = [0]

    def cb(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked[0] += 1

    t0 = time.monotonic()
    step = 1000 if rate is None else max(1, int(rate / 20))
    for start in range(first_id, first_id + n, step):
        if stop is not None and stop.is_set():
            break
        now_ms = int(time.time() * 1000)
        for i in range(start, min(start + step, first_id + n)):
            while True:
                try:
                    prod.produce(topic, event_json(i, now_ms), partition=i % partitions, on_delivery=cb)
                    break
                except BufferError:
                    prod.poll(0.05)
        prod.poll(0)
        if rate is not None:
            due = t0 + (start + step - first_id) / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        if on_progress:
            on_progress(acked[0])
    prod.flush(60)
    if errors:
        raise RuntimeError(f"{len(errors)} events were not delivered to {topic}; first: {errors[0]}")
    return acked[0]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, dict[str, list[int]]]:
    """``{topic: {partition: [low, high]}}`` watermarks, from Kafka."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "clickhouse-tx-pipeline-verify", "enable.auto.commit": False}
    )
    try:
        out = {}
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            out[str(p)] = [int(lo), int(hi)]
        return {topic: out}
    finally:
        c.close()


# ------------------------------------------------------------------------- ClickHouse


def _ddl(url: str, sql: str) -> None:
    r = requests.post(url.rstrip("/") + "/", data=sql.encode(), timeout=120)
    if r.status_code != 200:
        raise RuntimeError(f"ClickHouse refused {sql.split('(')[0].strip()!r}: {r.text.strip()}")


def create_target(url: str, table: str, mode: str) -> None:
    """The events table: a MergeTree; with a dedup window only for the ``dedup`` mode.

    A dedup window must not be set for the other modes: ClickHouse remembers the block
    hash of an insert made in a transaction that is later rolled back, so the replay of
    the same rows after a crash is silently dropped as a duplicate (seen: a whole
    batch lost while its markers committed).
    """
    db, t = split_table(table)
    _ddl(url, f"CREATE DATABASE IF NOT EXISTS {quote_identifier(db)}")
    cols = ",\n  ".join(f"{quote_identifier(n)} {ty}" for n, ty in TABLE_COLUMNS)
    _ddl(
        url,
        f"CREATE TABLE IF NOT EXISTS {qualified(db, t)} (\n  {cols}\n) "
        "ENGINE = MergeTree ORDER BY (`topic`, `partition`, `offset`)"
        + (" SETTINGS non_replicated_deduplication_window = 10000" if mode == "dedup" else ""),
    )


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
    """Starts :mod:`benchmarks.streaming_job` in its own session; parses its stdout."""

    def __init__(
        self,
        argv: Sequence[str],
        work: Path,
        on_line: Callable[[JobRun, str, dict], None] | None = None,
        module: str = "benchmarks.streaming_job",
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


# ------------------------------------------------------------------------- visibility


class VisibilityPoller:
    """Polls, read-committed, the highest visible offset per partition (for latency).

    Runs in a thread of the calling process every ``interval_s``; the latency of a
    record is the first poll at which its offset was visible minus its Kafka timestamp,
    so it carries up to one ``interval_s`` of measurement error (reported).
    """

    def __init__(self, url: str, table: str, interval_s: float = 0.1) -> None:
        self.src = qualified(*split_table(table))
        self.reader = ClickHouseReader(url)
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

    ch = ClickHouseReader(url)
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
    if not xs:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(xs), q))


# ---------------------------------------------------------------------------- running


@dataclasses.dataclass
class PipelineConfig:
    """Everything one pipeline run needs (see the command-line options)."""

    events: int = 200_000
    partitions: int = 8
    mode: str = "transaction"
    trigger: float = 2.0
    crashes: int = 2
    crash_points: str = "mixed"  # random | steps | mixed | comma-separated fault steps
    max_offsets_per_trigger: int | None = None
    rate: float | None = None  # produce at this rate while the job runs (else all up front)
    seed: int | None = None
    url: str | None = None
    bootstrap: str | None = None
    kafka_control: str | None = None
    table: str | None = None
    work_dir: str | None = None
    keep: bool = False
    measure_latency: bool = False
    latency_poll_s: float = 0.1
    #: Seconds after the producer starts that latency and the steady batch figures leave
    #: out: the first micro-batches with data start the Python workers and their clients.
    warmup_s: float = 0.0
    job_timeout_s: float = 900.0
    quiet: bool = False
    writer_options: tuple[str, ...] = ()
    sink: str = "clickhouse_tx"  # or foreach_insert: a diagnostic sink without the writer
    decode: str = DEFAULT_DECODE  # where the job decodes the events' JSON (streaming_job.DECODE_OPTIONS)


def plan_crashes(cfg: PipelineConfig, rng: random.Random) -> list[str]:
    """One entry per crash: a fault step, or ``random`` (a SIGKILL from outside)."""
    if cfg.crashes <= 0:
        return []
    if cfg.crash_points == "random":
        return ["random"] * cfg.crashes
    if cfg.crash_points in ("steps", "mixed"):
        steps = list(FAULT_STEPS)
        rng.shuffle(steps)
        out = []
        for i in range(cfg.crashes):
            if cfg.crash_points == "mixed" and i % 2 == 1:
                out.append("random")
            else:
                out.append(steps[i % len(steps)])
        return out
    given = [s.strip() for s in cfg.crash_points.split(",") if s.strip()]
    for s in given:
        if s != "random" and s.split(":")[0] not in {f.split(":")[0] for f in FAULT_STEPS}:
            raise ValueError(f"--crash-points: unknown step {s!r} (one of {', '.join(FAULT_STEPS)}, random)")
    return [given[i % len(given)] for i in range(cfg.crashes)]


@contextlib.contextmanager
def _servers(cfg: PipelineConfig, work: Path, say: Callable[[str], None]) -> Iterator[tuple[str, str, str | None]]:
    """(clickhouse url, kafka bootstrap, kafka control): given ones, else a fresh stack."""
    if cfg.url and cfg.bootstrap:
        yield cfg.url, cfg.bootstrap, cfg.kafka_control
        return
    from server_patches import stack as stack_mod

    d = work / "stack"
    say(f"starting the embedded stack in {d} ...")
    try:
        info = stack_mod.start_stack(d, kafka=True)
        say(f"  ClickHouse {info.clickhouse_url}, ZooKeeper {info.zookeeper}, Kafka {info.kafka_bootstrap}")
        yield info.clickhouse_url, str(info.kafka_bootstrap), info.kafka_control
    finally:
        stack_mod.stop_stack(d)


@dataclasses.dataclass
class _Run:
    """The state of one :func:`run_pipeline` call, shared by its steps (calling process)."""

    cfg: PipelineConfig
    rng: random.Random
    say: Callable[[str], None]
    work: Path
    topic: str
    table: str
    checkpoint: Path
    crashes: list[str]
    t_start: float
    url: str = ""
    bootstrap: str = ""
    launcher: JobLauncher | None = None
    committed: int = 0  # events the job has committed, from its last PROGRESS line
    produced: int = 0
    producer: threading.Thread | None = None
    stop_producing: threading.Event = dataclasses.field(default_factory=threading.Event)
    crashes_done: list[dict] = dataclasses.field(default_factory=list)
    latency_since: float | None = None


def run_pipeline(cfg: PipelineConfig) -> dict:
    """Run the whole pipeline once and return its figures (what the demo's ``--json`` writes).

    Calling process, once per demo, torture test or sweep point; blocks until the job
    drained the topic through every planned crash, or raises (the job failed or timed
    out), stopping whatever it started either way.
    """
    r = _new_run(cfg)
    try:
        with _servers(cfg, r.work, r.say) as (url, bootstrap, control):
            r.url, r.bootstrap = url, bootstrap
            _prepare_topic_and_table(r, control)
            r.launcher = JobLauncher(_job_argv(r), r.work, _progress_printer(r))
            poller = VisibilityPoller(url, r.table, cfg.latency_poll_s) if cfg.measure_latency else None
            with poller if poller else contextlib.nullcontext():
                _run_through_crashes(r, r.launcher)
                r.stop_producing.set()
                if r.producer is not None:
                    r.producer.join(60)
            return _figures(r, r.launcher, poller)
    finally:
        if r.launcher is not None:
            r.launcher.stop_all()
        if cfg.work_dir is None and not cfg.keep:
            shutil.rmtree(r.work, ignore_errors=True)


def _new_run(cfg: PipelineConfig) -> _Run:
    """Names (topic, table, checkpoint) and the crash plan of a fresh run."""
    if cfg.mode not in MODES:
        raise ValueError(f"--mode must be one of {', '.join(MODES)} (got {cfg.mode!r})")
    rng = random.Random(cfg.seed)
    say: Callable[[str], None] = (lambda s: None) if cfg.quiet else (lambda s: print(s, flush=True))
    work = Path(cfg.work_dir or tempfile.mkdtemp(prefix="chtx-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    suffix = f"{int(time.time())}_{rng.randrange(1 << 30):x}"
    return _Run(
        cfg=cfg,
        rng=rng,
        say=say,
        work=work,
        topic=f"events_{suffix}",
        table=cfg.table or f"pipeline.events_{cfg.mode}_{suffix}",
        checkpoint=work / f"checkpoint_{suffix}",
        crashes=plan_crashes(cfg, rng),
        t_start=time.monotonic(),
    )


def _prepare_topic_and_table(r: _Run, control: str | None) -> None:
    """Create the topic and the target; produce every event now unless producing at a rate."""
    cfg = r.cfg
    create_topic(r.bootstrap, control, r.topic, cfg.partitions)
    create_target(r.url, r.table, cfg.mode)
    r.say(
        f"topic {r.topic} ({cfg.partitions} partitions) -> {r.table} [{cfg.mode}], "
        f"trigger {cfg.trigger:g} s, {len(r.crashes)} crashes planned: {', '.join(r.crashes) or '-'}"
    )
    if cfg.rate is None:
        t_prod = time.monotonic()
        r.produced = produce(r.bootstrap, r.topic, cfg.events, cfg.partitions)
        r.say(f"produced {r.produced} events in {time.monotonic() - t_prod:.1f} s")


def _job_argv(r: _Run) -> list[str]:
    """The streaming job's command line (the same for every restart)."""
    cfg = r.cfg
    ends = {r.topic: {str(p): (cfg.events - p + cfg.partitions - 1) // cfg.partitions for p in range(cfg.partitions)}}
    mopt = cfg.max_offsets_per_trigger
    if mopt is None and cfg.rate is None:
        # several batches, so that crashes land mid-stream
        mopt = max(1000, cfg.events // 10)
    argv = [
        "--bootstrap",
        r.bootstrap,
        "--topic",
        r.topic,
        "--url",
        r.url,
        "--table",
        r.table,
        "--mode",
        cfg.mode,
        "--checkpoint",
        str(r.checkpoint),
        "--trigger",
        str(cfg.trigger),
        "--end-offsets",
        json.dumps(ends),
        "--timeout",
        str(cfg.job_timeout_s),
    ]
    if mopt:
        argv += ["--max-offsets-per-trigger", str(mopt)]
    for kv in cfg.writer_options:
        argv += ["--writer-option", kv]
    if cfg.sink != "clickhouse_tx":
        argv += ["--sink", cfg.sink]
    return argv + ["--decode", cfg.decode]


def _progress_printer(r: _Run) -> Callable[[JobRun, str, dict], None]:
    """The launcher's line callback: track committed events, print one line per batch."""
    total = r.cfg.events

    def on_line(run: JobRun, kind: str, doc: dict) -> None:
        if kind != "PROGRESS":
            return
        end = (doc.get("end_offset") or {}).get(r.topic, {})
        r.committed = sum(int(v) for v in end.values())
        rps = doc.get("processed_rps") or 0
        r.say(
            f"  [run {run.index}] batch {doc.get('batch')}: {doc.get('rows') or 0:>7} rows, "
            f"{rps:>9,.0f} rows/s, write+commit {doc.get('add_batch_ms') or 0:>6} ms | "
            f"committed {r.committed:>8}/{total} ({100 * r.committed / max(1, total):.0f}%)"
        )

    return on_line


def _run_through_crashes(r: _Run, launcher: JobLauncher) -> None:
    """Start the job, crash it as planned, restart it on the checkpoint, until it drains."""
    pending = list(r.crashes)
    while True:
        point = pending[0] if pending else None
        run, fault, kill_at = _start_job(r, launcher, point)
        rc = _wait_job(r, launcher, run, kill_at)
        fired = fault is not None and (r.work / f"fault-{run.index}.once").exists()
        if run.killed_by_us or fired:
            r.crashes_done.append(
                {
                    "run": run.index,
                    "point": fault or "random",
                    "after_s": round((run.ended or time.monotonic()) - run.started, 2),
                    "committed_before": r.committed,
                }
            )
            r.say(
                f"  ** crash {len(r.crashes_done)}: SIGKILL {f'at {fault}' if fired else 'from outside'}"
                f" after {r.crashes_done[-1]['after_s']} s (exit {rc}); restarting on the same checkpoint"
            )
            pending.pop(0)
            continue
        if rc == 0 and run.done is not None:
            if pending:
                # finished before the planned fault could fire (e.g. no more batches)
                r.say(f"  job finished before crash point {pending[0]} fired; {len(pending)} crash(es) not done")
            return
        raise RuntimeError(
            f"the streaming job exited with {rc} (run {run.index}); stderr tail:\n{launcher.stderr_tail(run)}"
        )


def _start_job(r: _Run, launcher: JobLauncher, point: str | None) -> tuple[JobRun, str | None, float | None]:
    """One start of the job, armed for crash ``point``: (run, fault step, time of a kill from outside)."""
    extra: list[str] = []
    fault = None
    if point and point != "random":
        fault = point
        extra = [
            "--fault-step",
            point,
            "--fault-action",
            "kill",
            "--fault-once-file",
            str(r.work / f"fault-{len(launcher.runs)}.once"),
        ]
    run = launcher.start(extra, fault)
    if r.cfg.rate is not None and r.producer is None:
        # start the steady stream once the first job is up, so start-up time does not
        # count as latency
        _wait_first_progress(run, 180)
        r.latency_since = time.time() + max(r.cfg.trigger, 1.0, r.cfg.warmup_s)
        r.producer = threading.Thread(target=_produce_at_rate, args=(r,), daemon=True)
        r.producer.start()
    kill_at = None
    if point == "random":
        # somewhere in the stream: after the first committed batch, before the end
        _wait_first_progress(run, 180)
        kill_at = time.monotonic() + r.rng.uniform(0.2, 2.5 * max(r.cfg.trigger, 1.0))
    return run, fault, kill_at


def _produce_at_rate(r: _Run) -> None:
    r.produced = produce(r.bootstrap, r.topic, r.cfg.events, r.cfg.partitions, rate=r.cfg.rate, stop=r.stop_producing)


def _wait_job(r: _Run, launcher: JobLauncher, run: JobRun, kill_at: float | None) -> int | None:
    """The job's exit code once it ended or was killed at ``kill_at``; raises on timeout."""
    rc = None
    deadline = time.monotonic() + r.cfg.job_timeout_s + 60
    while rc is None and time.monotonic() < deadline:
        if kill_at is not None and time.monotonic() >= kill_at and run.done is None:
            launcher.kill(run)
            break
        rc = launcher.wait(run, 0.2)
    if rc is None and run.proc.poll() is None:
        launcher.kill(run)
        raise RuntimeError(
            f"the job did not finish within {r.cfg.job_timeout_s:.0f} s; stderr:\n{launcher.stderr_tail(run)}"
        )
    return run.proc.returncode


def _figures(r: _Run, launcher: JobLauncher, poller: VisibilityPoller | None) -> dict:
    """Verify the table against Kafka and the produced ids; the run's figures, ``ok`` last."""
    cfg = r.cfg
    wall = time.monotonic() - r.t_start
    job_wall = sum(((j.ended or time.monotonic()) - j.started) for j in launcher.runs)
    kafka_offsets = end_offsets(r.bootstrap, r.topic, cfg.partitions)
    expected = {r.topic: {p: [0, hi] for p, (lo, hi) in kafka_offsets[r.topic].items()}}
    report = verify(
        r.url,
        r.table,
        expected={(r.topic, int(p)): (0, hi) for p, (lo, hi) in kafka_offsets[r.topic].items()},
        markers=False,
    )
    ch = ClickHouseReader(r.url)
    try:
        ev = ch.rows(
            f"SELECT count() AS n, uniqExact(event_id) AS u, min(event_id) AS lo, "
            f"max(event_id) AS hi FROM {qualified(*split_table(r.table))}"
        )[0]
    finally:
        ch.close()
    batches = [p for j in launcher.runs for p in j.progress if p.get("rows")]
    lat = latencies_ms(r.url, r.table, poller.samples, r.latency_since) if poller else []
    result = {
        "mode": cfg.mode,
        "trigger_s": cfg.trigger,
        "events": cfg.events,
        "partitions": cfg.partitions,
        "produced": r.produced,
        "kafka_end_offsets": expected,
        "rows_in_clickhouse": report.rows,
        "distinct_offsets": report.distinct,
        "distinct_event_ids": int(ev["u"]),
        "duplicates": report.duplicates,
        "lost": report.missing,
        "lost_event_ids": cfg.events - int(ev["u"]) if report.rows else cfg.events,
        "anomalies": [a.to_json() for a in report.anomalies[:50]],
        "crashes_planned": len(r.crashes),
        "crashes": len(r.crashes_done),
        "crash_log": r.crashes_done,
        "restarts": len(launcher.runs) - 1,
        "job_runs": len(launcher.runs),
        **_batch_figures(batches, cfg.events, job_wall),
        "steady": _batch_figures([p for p in batches if (p.get("wall") or 0) >= (r.latency_since or 0)], 0, 0)
        if cfg.warmup_s
        else None,
        "warmup_s": cfg.warmup_s,
        "wall_s": round(wall, 2),
        "rate": cfg.rate,
        "latency_ms": {
            "p50": percentile(lat, 50),
            "p99": percentile(lat, 99),
            "max": max(lat) if lat else None,
            "records": len(lat),
            "poll_interval_ms": cfg.latency_poll_s * 1000,
        }
        if poller
        else None,
        "table": r.table,
        "topic": r.topic,
    }
    result["ok"] = (
        result["lost"] == 0 and result["lost_event_ids"] == 0 and (cfg.mode == "none" or result["duplicates"] == 0)
    )
    return result


def _batch_figures(batches: Sequence[dict], events: int, job_wall: float) -> dict:
    """Throughput and per-batch means from the job's PROGRESS lines (replays included)."""
    proc_s = sum((p.get("trigger_ms") or 0) for p in batches) / 1000.0
    rows_all = sum(int(p.get("rows") or 0) for p in batches)
    return {
        "batches": len(batches),
        "rows_processed_incl_replays": rows_all,
        "job_wall_s": round(job_wall, 2),
        "throughput_rps": round(events / job_wall, 1) if job_wall else None,
        "processing_rps": round(rows_all / proc_s, 1) if proc_s else None,
        "mean_batch_ms": round(1000 * proc_s / len(batches), 1) if batches else None,
        "mean_write_commit_ms": round(sum((p.get("add_batch_ms") or 0) for p in batches) / len(batches), 1)
        if batches
        else None,
    }


def _wait_first_progress(run: JobRun, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not run.ready and run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def summary_table(r: Mapping[str, object]) -> str:
    """The human summary of one run."""
    rows = [
        ("mode", r["mode"]),
        ("trigger", f"{r['trigger_s']} s"),
        ("events produced", r["produced"]),
        ("rows in ClickHouse", r["rows_in_clickhouse"]),
        ("distinct offsets", r["distinct_offsets"]),
        ("duplicates", r["duplicates"]),
        ("lost", r["lost"]),
        ("lost event ids", r["lost_event_ids"]),
        ("crashes (SIGKILL)", f"{r['crashes']} of {r['crashes_planned']} planned"),
        ("restarts", r["restarts"]),
        ("micro-batches", r["batches"]),
        ("wall time", f"{r['wall_s']} s (job {r['job_wall_s']} s)"),
        ("throughput", f"{r['throughput_rps']:,} events/s end to end" if r["throughput_rps"] else "-"),
        ("processing rate", f"{r['processing_rps']:,} rows/s in batches" if r["processing_rps"] else "-"),
        ("mean write+commit", f"{r['mean_write_commit_ms']} ms per batch"),
    ]
    if r.get("latency_ms"):
        lat = cast("dict[str, Any]", r["latency_ms"])
        rows.append(("latency p50/p99", f"{lat['p50']:.0f} / {lat['p99']:.0f} ms" if lat["p50"] is not None else "-"))
    w = max(len(k) for k, _ in rows)
    line = "+" + "-" * (w + 2) + "+" + "-" * 40 + "+"
    body = [line] + [f"| {k:<{w}} | {str(v):<38} |" for k, v in rows] + [line]
    verdict = (
        "EXACTLY ONCE: duplicates=0 lost=0"
        if r["duplicates"] == 0 and r["lost"] == 0
        else (
            f"duplicates={r['duplicates']} lost={r['lost']}" + (" (at-least-once mode)" if r["mode"] == "none" else "")
        )
    )
    return "\n".join(body + [verdict])
