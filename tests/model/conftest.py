"""Prints the model checker's counts at the end of the pytest run (also under ``-q``)."""

from __future__ import annotations

import sys

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    explorer = sys.modules.get("tests.model.explorer")
    for line in getattr(explorer, "REPORTS", ()):
        terminalreporter.write_line(line)
