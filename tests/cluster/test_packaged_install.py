"""clickhouse-tx installed as a user installs it, and shipped to executors as a user ships it.

One wheel, built from the package's sources, is installed without extras into a fresh
virtualenv (the base install: pyarrow, numpy, requests). Jobs run by ``spark-submit``
(``tests/helpers/packaged_job.py``, copied out of the checkout) write one batch and
one streaming query (four micro-batches) into the embedded stack, which this
development environment started; every row must be there once.

- On ``local[2]`` with that virtualenv's interpreter: nothing of the development stack
  (chdb, pandas, clickhouse-connect, lz4, zstandard, kafka-python) is installed in it,
  and neither they nor the wheel's ``server_patches`` are imported by the driver or
  the workers.
- On a standalone cluster whose executors run a bare interpreter, without the package
  and without this checkout on their path: the package reaches them only as the
  virtualenv packed with ``venv-pack`` and given as ``spark.archives``.
- On the same cluster, driver and executors on a virtualenv with the base dependencies
  but not the package: it reaches the executors only as the wheel (renamed ``.zip``)
  in ``--py-files``, and the driver as that file on its ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers import packaged, spark_cluster
from tests.helpers.spark_writes import create_events_table, expected_totals, read_committed

pytestmark = [pytest.mark.spark, pytest.mark.slow]

BATCH_ROWS = 5000
FILES, PER_FILE = 4, 500  # the stream: one micro-batch per file


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the interpreter of a fresh virtualenv with the wheel and no extras)."""
    work = tmp_path_factory.mktemp("packaged")
    wheel = packaged.build_wheel(work)
    return wheel, packaged.base_venv(wheel, work / "venv")


@pytest.fixture(scope="module")
def bare_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[spark_cluster.StandaloneCluster]:
    """One Worker (1 core) whose executors run the bare interpreter, without this checkout on their path."""
    cluster = spark_cluster.start_cluster(
        tmp_path_factory.mktemp("bare_cluster"),
        workers=1,
        worker_env={"PYTHONPATH": "", "PYSPARK_PYTHON": sys._base_executable},  # type: ignore[attr-defined]
    )
    try:
        yield cluster
    finally:
        spark_cluster.stop_cluster(cluster)


def _job_args(url: str, database: str, tmp_path: Path) -> dict[str, object]:
    """Target tables created, the stream's input files written; the job's arguments."""
    for table in ("batch_events", "stream_events"):
        create_events_table(url, database, table, "transaction")
    source = tmp_path / "input"
    source.mkdir()
    for f in range(FILES):
        rows = ({"id": i, "k": i % 1000, "s": f"r{i}"} for i in range(f * PER_FILE, (f + 1) * PER_FILE))
        (source / f"part-{f}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"url": url, "database": database, "rows": BATCH_ROWS, "input": str(source), "chk": str(tmp_path / "chk")}


def _assert_every_row_once(url: str, database: str) -> None:
    totals = "count(), sum(id), sum(k), sum(length(s)), uniqExact(id)"
    for table, n in (("batch_events", BATCH_ROWS), ("stream_events", FILES * PER_FILE)):
        got = [int(x) for x in read_committed(url, f"SELECT {totals} FROM `{database}`.`{table}`")[0]]
        assert got == [*expected_totals(n), n], table


@pytest.mark.timeout(900)
def test_a_wheel_installed_without_extras_writes_a_batch_and_a_stream_once_and_loads_nothing_of_the_dev_stack(
    installed: tuple[Path, Path], stack, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    _, python = installed
    conf = {"spark.master": "local[2]", "spark.driver.memory": "768m", "spark.ui.enabled": "false"}
    report = packaged.submit(
        _job_args(clickhouse_url, database, tmp_path),
        conf,
        packaged.user_env(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python)),
        tmp_path,
    )
    site = python.parent.parent / "lib"
    for where in [report["driver"], *report["executors"]]:
        assert where["python"] == str(python)
        assert where["clickhouse_tx"].startswith(str(site))  # the installed wheel, not this checkout
        assert where["installed"] == [] and where["loaded"] == []
    _assert_every_row_once(clickhouse_url, database)


@pytest.mark.timeout(900)
def test_executors_without_the_package_get_it_from_a_packed_virtualenv_in_spark_archives_and_write_once(
    installed: tuple[Path, Path],
    bare_cluster: spark_cluster.StandaloneCluster,
    stack,
    clickhouse_url: str,
    database: str,
    tmp_path: Path,
) -> None:
    _, python = installed
    archive = packaged.pack(python.parent.parent, tmp_path / "environment.tar.gz")
    # Spark runs a Python data source's planning and commit in Python workers of the
    # driver, with spark.pyspark.python too: ./environment must resolve where the
    # driver runs (here: a link to the virtualenv the archive was packed from).
    (tmp_path / "environment").symlink_to(python.parent.parent)
    conf = {
        **spark_cluster.app_conf(bare_cluster),
        "spark.archives": f"{archive}#environment",
        "spark.pyspark.python": "./environment/bin/python",
        "spark.pyspark.driver.python": str(python),
        "spark.executorEnv.PYSPARK_PYTHON": "./environment/bin/python",
    }
    del conf["spark.executorEnv.PYTHONPATH"]
    report = packaged.submit(
        _job_args(clickhouse_url, database, tmp_path),
        conf,
        packaged.user_env(PYSPARK_PYTHON="./environment/bin/python", PYSPARK_DRIVER_PYTHON=str(python)),
        tmp_path,
    )
    work = str(bare_cluster.log_dir)
    for where in report["executors"]:
        # the executor's working directory, where Spark unpacked the archive
        assert where["python"].startswith(work) and "/environment/bin/python" in where["python"]
        assert where["clickhouse_tx"].startswith(work) and "/environment/lib/" in where["clickhouse_tx"]
        assert where["loaded"] == []
    _assert_every_row_once(clickhouse_url, database)


@pytest.mark.timeout(900)
def test_a_python_with_only_the_base_dependencies_gets_the_package_from_the_wheel_in_py_files_and_writes_once(
    installed: tuple[Path, Path],
    bare_cluster: spark_cluster.StandaloneCluster,
    stack,
    clickhouse_url: str,
    database: str,
    tmp_path: Path,
) -> None:
    wheel, _ = installed
    python = packaged.deps_venv(wheel, tmp_path / "deps")
    # pyspark puts a --py-files entry on the executors' path only if it ends in .zip,
    # .egg or .jar (SparkContext.PACKAGE_EXTENSIONS): the wheel, a zip, renamed
    wheel = Path(shutil.copy(wheel, tmp_path / "clickhouse_tx.zip"))
    conf = {
        **spark_cluster.app_conf(bare_cluster),
        "spark.submit.pyFiles": str(wheel),  # what --py-files sets
        "spark.pyspark.python": str(python),
        "spark.executorEnv.PYSPARK_PYTHON": str(python),
    }
    del conf["spark.executorEnv.PYTHONPATH"]
    # --py-files reaches the executors and the driver's own Python process, but not the
    # Python workers Spark starts on the driver to plan and commit a data source: the
    # wheel goes on the driver's PYTHONPATH too, which those workers inherit.
    env = packaged.user_env(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python), PYTHONPATH=str(wheel))
    report = packaged.submit(_job_args(clickhouse_url, database, tmp_path), conf, env, tmp_path)
    # the driver's Python process imports Spark's copy of the file (SparkContext puts it first)
    assert report["driver"]["clickhouse_tx"].endswith(f"{wheel.name}/clickhouse_tx/__init__.py")
    work = str(bare_cluster.log_dir)
    for where in report["executors"]:
        assert where["python"] == str(python)
        # the executor's copy of the wheel, fetched by Spark into its working directory
        assert where["clickhouse_tx"].startswith(work)
        assert where["clickhouse_tx"].endswith(f"{wheel.name}/clickhouse_tx/__init__.py")
        assert where["loaded"] == []
    _assert_every_row_once(clickhouse_url, database)
