"""docs/compatibility.md cannot rot silently: every test it cites exists, every row cites something.

The page backs each row of its tables with pytest node ids
(``tests/integration/test_x.py::test_y``) or with ClickHouse's documentation or source
(an ``https://`` URL). A test renamed or deleted without the page being updated fails
here. Node ids are checked with :mod:`ast`: the file must exist and define a function of
that name (at module level or in a class); nothing is imported or run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
DOC = ROOT / "docs" / "compatibility.md"
NODE_ID = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def _table_rows(text: str, heading: str) -> list[str]:
    """The body rows of the first Markdown table under ``heading`` (header and rule left out)."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return rows[2:]


def _defined_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def _missing_node_ids(text: str, root: Path) -> list[str]:
    """Node ids in ``text`` whose file is absent or defines no function of that name."""
    missing = []
    for file, name in NODE_ID.findall(text):
        path = root / file
        if not path.is_file() or name not in _defined_functions(path):
            missing.append(f"{file}::{name}")
    return missing


def test_every_test_the_compatibility_page_cites_exists_and_defines_that_function() -> None:
    text = DOC.read_text(encoding="utf-8")
    cited = NODE_ID.findall(text)
    assert len(cited) >= 20, "the page should cite the tests behind its rows"
    assert _missing_node_ids(text, ROOT) == []


def test_a_renamed_test_is_reported_as_missing(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_present():\n    pass\n", encoding="utf-8")
    text = "`tests/test_a.py::test_present`, `tests/test_a.py::test_renamed`, `tests/test_gone.py::test_x`"
    assert _missing_node_ids(text, tmp_path) == ["tests/test_a.py::test_renamed", "tests/test_gone.py::test_x"]


def test_every_feature_row_of_the_compatibility_page_cites_a_test_or_a_clickhouse_source() -> None:
    rows = _table_rows(DOC.read_text(encoding="utf-8"), "## Per feature")
    assert len(rows) == 12
    for row in rows:
        assert NODE_ID.search(row) or "https://" in row, row
