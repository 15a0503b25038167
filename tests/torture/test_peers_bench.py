"""``python -m benchmarks.peers --quick --faults`` end to end: the four peers into the same
table, then each under ClickHouse kills (and, for the Spark peers, two driver kills: one
after a batch's rows are written and before Spark's commit log records it, one at random).

The benchmark starts its own embedded stack and Spark jobs and stops them; this test
runs it as a child process (as a user would) and reads its JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.peers_figures import PEERS
from spark_datasource.testing.job_launcher import ROOT


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_quick_peers_run_under_faults_counts_every_peers_duplicates_and_losses_and_the_sink_has_none(
    tmp_path: Path,
) -> None:
    out = tmp_path / "peers.json"
    proc = subprocess.run(
        # --fault-duration as the full run's: with the quick run's 20 s, a loaded machine's
        # slow start put the second ClickHouse kill after the job had drained, or during
        # the run's final check
        [sys.executable, "-m", "benchmarks.peers", "--quick", "--faults", "--fault-duration", "60", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    runs = doc["faults"]["runs"]
    assert set(runs) == set(PEERS)
    for peer, r in runs.items():
        assert "error" not in r, (peer, r["error"])
        assert isinstance(r["duplicates"], int) and isinstance(r["lost"], int), (peer, r)
        assert doc["summary"][peer]["faults"]["guarantee"] != "not measured"
        assert len(r["clickhouse_kills"]) == 2, (peer, r["clickhouse_kills"])
    tx = runs["transaction"]
    assert tx["crashes"] == 2, tx["crash_log"]  # the driver was SIGKILLed and restarted
    assert tx["duplicates"] == 0 and tx["lost"] == 0 and tx["lost_event_ids"] == 0, tx["anomalies"]
    assert tx["rows_in_clickhouse"] == doc["faults"]["events"]
    fb = runs["foreach_batch"]
    assert fb["crashes"] == 2, fb["crash_log"]
    # the batch written before the kill is written again by its replay: at least once
    assert fb["duplicates"] > 0 and fb["lost"] == 0, fb["anomalies"]
