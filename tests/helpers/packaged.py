"""clickhouse-tx as a user installs it: its wheel, a fresh virtualenv with no extras, a
packed copy of that virtualenv for ``spark.archives``, and a job run by ``spark-submit``.

The wheel is built from a copy of the package's sources (nothing is written into the
checkout). The virtualenv installs it with pip from the package index (the pip cache
here), so it holds exactly the base dependencies. ``spark-submit`` is the pyspark
package's own (the "cluster's Spark"); its driver and workers get pyspark from
``$SPARK_HOME/python/lib/pyspark.zip``, as with a Spark distribution, and never see
this checkout: no ``PYTHONPATH``, the job file copied out of ``tests/``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.spark_cluster import ROOT, spark_home

SOURCES = ("pyproject.toml", "README.md", "clickhouse_tx", "spark_datasource", "server_patches")
JOB = Path(__file__).with_name("packaged_job.py")


def _run(args: list[str], **kw: Any) -> None:
    out = subprocess.run(args, capture_output=True, text=True, **kw)
    assert out.returncode == 0, f"{args[:4]} failed ({out.returncode}): {out.stderr[-3000:]}"


def build_wheel(work: Path) -> Path:
    """The package's wheel, built by pip from a copy of its sources in ``work``."""
    src = work / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(work / "dist")])
    return next((work / "dist").glob("clickhouse_tx-*.whl"))


def base_venv(wheel: Path, where: Path) -> Path:
    """A fresh virtualenv with ``wheel`` installed without extras; its interpreter."""
    _run([sys.executable, "-m", "venv", str(where)])
    python = where / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)])
    return python


def deps_venv(wheel: Path, where: Path) -> Path:
    """A fresh virtualenv with the wheel's base dependencies but not the wheel; its interpreter."""
    _run([sys.executable, "-m", "venv", str(where)])
    python = where / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)])
    _run([str(python), "-m", "pip", "uninstall", "-q", "-y", "clickhouse-tx"])
    return python


def pack(venv: Path, out: Path) -> Path:
    """``venv-pack`` of ``venv`` into ``out`` (a .tar.gz for ``spark.archives``)."""
    _run([sys.executable, "-m", "venv_pack", "-p", str(venv), "-o", str(out)])
    return out


def submit(job_args: dict[str, Any], conf: dict[str, str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """``spark-submit`` of the job with ``conf`` from ``cwd``; the job's ``PACKAGED_JOB`` report.

    ``env`` is the whole environment of ``spark-submit`` (the caller leaves this
    checkout off ``PYTHONPATH``); the job's output goes to ``cwd/driver.log``.
    """
    job = shutil.copy(JOB, cwd / "job.py")
    args = [str(spark_home() / "bin" / "spark-submit")]
    for k, v in conf.items():
        args += ["--conf", f"{k}={v}"]
    log = cwd / "driver.log"
    with log.open("wb") as out:
        proc = subprocess.run(
            [*args, str(job), json.dumps(job_args)], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=900
        )
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"the job failed ({proc.returncode}): {text[-4000:]}"
    line = next((ln for ln in text.splitlines() if ln.startswith("PACKAGED_JOB ")), None)
    assert line is not None, text[-4000:]
    return dict(json.loads(line[len("PACKAGED_JOB ") :]))


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's ``spark-submit``: this process's, without ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1", SPARK_CONNECT_MODE="0", SPARK_DAEMON_MEMORY="384m"
    )
    env.update(extra)
    return env
