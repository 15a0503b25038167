"""The operator command line (``python -m clickhouse_tx``) run as a child process."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m clickhouse_tx *args`` (2 min at most); its exit code and output, text."""
    return subprocess.run([sys.executable, "-m", "clickhouse_tx", *args], capture_output=True, text=True, timeout=120)
