"""The pure pieces of benchmarks.worker_imports: a Spark worker's path and the chains it imports."""

from __future__ import annotations

import importlib.util
import os

from benchmarks.worker_imports import CHAINS, ROOT, spark_env


def test_the_worker_path_puts_pyspark_zip_first_and_this_checkout_last() -> None:
    path = spark_env(None)["PYTHONPATH"].split(os.pathsep)
    assert path[0].endswith("pyspark.zip")
    assert path[-1] == str(ROOT)


def test_cached_bytecode_goes_to_its_own_directory_and_is_written() -> None:
    env = spark_env("/tmp/pyc")
    assert env["PYTHONPYCACHEPREFIX"] == "/tmp/pyc"
    assert "PYTHONDONTWRITEBYTECODE" not in env


def test_every_module_of_every_chain_exists() -> None:
    missing = [m for chain in CHAINS.values() for _, mods in chain for m in mods if importlib.util.find_spec(m) is None]
    assert missing == []
