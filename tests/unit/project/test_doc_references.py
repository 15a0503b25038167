"""Every dotted name of the project in a docstring, comment or doc page names something that exists.

A module moved or a function renamed leaves ``clickhouse_tx.modes.staging.mode.leftover_stages``
behind in prose that nothing imports; this test resolves each such name (the longest
importable module prefix, then attributes) so the rename fails here, naming the file and line.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
#: A dotted name of the project: ``clickhouse_tx.a.b``, ``spark_datasource.x``.
NAME = re.compile(r"(?<![\w./-])(?:clickhouse_tx|spark_datasource|server_patches)(?:\.[A-Za-z_]\w*)+")
SOURCES = ("clickhouse_tx", "spark_datasource", "server_patches", "benchmarks", "tests")
PAGES = ("docs", "README.md")


def _files() -> list[Path]:
    out = [p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py"))]
    for page in PAGES:
        path = ROOT / page
        out += sorted(path.rglob("*.md")) if path.is_dir() else [path]
    return out


def references(text: str) -> list[tuple[int, str]]:
    """``(line, name)`` of each dotted project name in ``text``."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1) for m in NAME.finditer(line)]


#: Names that are not Python objects: files a page tells to make, logger names (``getLogger("...")``).
FILE_SUFFIXES = (".zip", ".whl", ".py", ".json", ".jsonl", ".md")
LOGGER = re.compile(r"getLogger\(\s*[\"']([\w.]+)[\"']\s*\)")
#: Files whose names are made up on purpose (the layering test's examples of bad imports).
INVENTED = ("test_import_structure.py", "test_doc_references.py")


@cache
def resolves(name: str) -> bool:
    """A prefix of ``name`` imports as a module and the rest are its attributes (dataclass fields count)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        if _attributes(obj, parts[cut:]):
            return True
    return False


def _attributes(obj: object, names: list[str]) -> bool:
    for attr in names:
        fields = getattr(obj, "__dataclass_fields__", {}) or getattr(obj, "__annotations__", {})
        if not hasattr(obj, attr):
            return attr in fields
        obj = getattr(obj, attr)
    return True


def logger_names() -> set[str]:
    return {m.group(1) for d in SOURCES for p in (ROOT / d).rglob("*.py") for m in LOGGER.finditer(p.read_text())}


def test_the_reference_finder_sees_names_in_prose_and_skips_table_names_and_paths() -> None:
    text = (
        "see :func:`clickhouse_tx.client.http.reuse_or_open`. The clickhouse_tx_commits table, clickhouse_tx/state.py"
    )
    assert references(text) == [(1, "clickhouse_tx.client.http.reuse_or_open")]


def test_a_dangling_name_does_not_resolve_and_a_real_one_does() -> None:
    assert resolves("clickhouse_tx.client.http.ClickHouseHTTP.command")
    assert not resolves("clickhouse_tx.modes.staging.mode.leftover_stages")
    assert not resolves("spark_datasource.sink.writer.OverwriteWriter")


def test_every_dotted_project_name_in_the_code_and_docs_resolves() -> None:
    pytest.importorskip("pyspark")
    loggers = logger_names()
    dangling = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _files()
        if path.name not in INVENTED
        for line, name in references(path.read_text(encoding="utf-8"))
        if not (name in loggers or name.endswith(FILE_SUFFIXES) or resolves(name))
    ]
    assert dangling == [], "names that no longer exist:\n" + "\n".join(dangling)
