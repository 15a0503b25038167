"""Fail when a function outside tests/ is longer than the project's limit (run by ``make lint``).

The limit and the functions that were longer when the check came in are in pyproject.toml,
``[tool.clickhouse-tx.function-length]``: a listed function may stay long until its owner
splits it; any other long function fails the check; a listed one now within the limit is
reported so the list shrinks.
Usage: ``python .ci/function_length.py`` from the repository root.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path


def long_functions(paths: list[str], limit: int) -> dict[str, int]:
    """``{"path:name": lines}`` of every function (nested ones too) longer than ``limit`` lines."""
    found: dict[str, int] = {}
    for path in paths:
        for node in ast.walk(ast.parse(Path(path).read_text(), path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found[f"{path}:{node.name}"] = max(lines, found.get(f"{path}:{node.name}", 0))
    return found


def main() -> int:
    conf = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["clickhouse-tx"]["function-length"]
    limit, known = int(conf["max"]), set(conf.get("known", []))
    files = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True, check=True).stdout.split()
    found = long_functions([f for f in files if not f.startswith("tests/") and Path(f).exists()], limit)
    for name in sorted(known - set(found)):
        print(f"function-length: {name} is within {limit} lines now: remove it from pyproject.toml")
    bad = sorted(set(found) - known)
    for name in bad:
        print(f"function-length: {name} has {found[name]} lines (limit {limit}): split it")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
