"""Reports how many random protocol schedules the unit run explored."""

from __future__ import annotations

import sys


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    mod = sys.modules.get("tests.unit.clickhouse_tx.protocol.test_protocol_state_machine")
    if mod is None or not mod.SCHEDULES["started"]:
        return
    s = mod.SCHEDULES
    terminalreporter.write_line(
        f"clickhouse_tx protocol state machine: {s['finished']} schedules completed "
        f"({s['started']} started), {s['steps']} rule steps, {s['commits_ok']} successful commits, "
        f"{s['crashes']} driver crashes"
    )
