"""The names users import, the version, and what each import pulls in.

The subprocess checks run a fresh interpreter: this test process has long since
imported Spark and the embedded stack, so its ``sys.modules`` says nothing.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import clickhouse_tx
import spark_datasource
from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.options import parse_kafka_options

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
DEV_ONLY = ("pyspark", "chdb", "pandas", "kafka", "clickhouse_connect", "lz4", "zstandard", "server_patches")


def _modules_after(statement: str) -> list[str]:
    """Top-level packages of ``DEV_ONLY`` a fresh interpreter holds after ``statement``."""
    probe = f"{statement}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return [m for m in json.loads(out.stdout) if m in DEV_ONLY]


def test_the_version_is_written_once_and_the_installed_metadata_carries_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert "version" not in project and project["dynamic"] == ["version"]
    assert dynamic["version"] == {"attr": "clickhouse_tx.__version__"}
    assert metadata.version("clickhouse-tx") == clickhouse_tx.__version__


def test_every_name_in_all_is_importable_from_the_package() -> None:
    for package in (clickhouse_tx, spark_datasource):
        missing = [n for n in package.__all__ if not hasattr(package, n)]
        assert missing == [], package.__name__
    assert set(spark_datasource.__all__) == {
        "register",
        "RECOMMENDED_SPARK_CONF",
        "ClickHouseTxDataSource",
        "KafkaDataSource",
        "clickhouse_tx_batch",
        "clickhouse_tx_transaction",
    }
    assert issubclass(clickhouse_tx.LostTransactionError, clickhouse_tx.ClickHouseTxError)
    assert clickhouse_tx.verify.__module__ == "clickhouse_tx.verify.verifier"


def _exception_classes(package: str) -> dict[str, str]:
    """Every exception class defined in ``package``'s source: name -> module (read with ast)."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            bases = [ast.unparse(b) for b in getattr(node, "bases", ())]
            if isinstance(node, ast.ClassDef) and any(b.endswith(("Error", "Exception")) for b in bases):
                found[node.name] = module
    return found


#: Exceptions that are not the package's API: test-only fault hooks (unreachable from
#: production options) and the option parser's internal signal, each caught where raised.
NOT_PUBLIC = {
    "InjectedFault": "clickhouse_tx.testing.faults",
    "InjectedServerError": "clickhouse_tx.testing.faults",
    "Expected": "spark_datasource.options.spec",
}


def test_every_error_of_the_protocol_lives_in_its_errors_module_and_is_exported() -> None:
    found = {n: m for n, m in _exception_classes("clickhouse_tx").items() if NOT_PUBLIC.get(n) != m}
    assert set(found.values()) == {"clickhouse_tx.errors"}, found
    assert sorted(found) == sorted(n for n in clickhouse_tx.__all__ if n.endswith("Error"))
    assert all(issubclass(getattr(clickhouse_tx, n), clickhouse_tx.ClickHouseTxError) for n in found)


def test_every_error_of_the_kafka_source_lives_in_the_kafka_package_errors_and_is_exported() -> None:
    import spark_datasource.kafka as kafka

    found = {n: m for n, m in _exception_classes("spark_datasource").items() if NOT_PUBLIC.get(n) != m}
    assert set(found.values()) == {"spark_datasource.kafka.errors"}, found
    assert sorted(found) == sorted(kafka.__all__)


def test_the_verify_module_still_serves_its_other_names_beside_the_exported_function() -> None:
    from clickhouse_tx.verify.verifier import ClickHouseReader

    reader = ClickHouseReader("http://reader:s3cret@localhost:8123")
    try:
        assert "s3cret" not in repr(reader)
    finally:
        reader.close()


def test_importing_clickhouse_tx_pulls_in_no_spark_and_nothing_of_the_development_stack() -> None:
    assert _modules_after("import clickhouse_tx, clickhouse_tx.protocol.coordinator") == []


def test_registering_the_data_sources_needs_pyspark_but_nothing_of_the_development_stack() -> None:
    assert _modules_after("import spark_datasource, spark_datasource.sink.writer, spark_datasource.kafka.reader") == [
        "pyspark"
    ]


def test_a_kafka_py_read_without_the_kafka_extra_fails_on_the_driver_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "kafka", None)  # what an install without [kafka] has
    with pytest.raises(ConfigurationError, match=r"pip install 'clickhouse-tx\[kafka\]'"):
        parse_kafka_options({"bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"})
