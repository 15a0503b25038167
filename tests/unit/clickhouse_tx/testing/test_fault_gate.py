"""The writer's ``fault.*`` hooks are test-only: refused unless CLICKHOUSE_TX_TEST_FAULTS=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.testing.faults import TEST_FAULTS_ENV, FaultPlan
from spark_datasource.options.writer_options import WriterOptions

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
BASE = {"url": "http://127.0.0.1:8123", "table": "db.events"}
KILL = {"fault.step": "after_decision", "fault.action": "kill"}


def test_the_test_suite_runs_with_the_fault_hooks_enabled() -> None:
    # tests/conftest.py sets it before any Spark or subprocess starts; every other
    # test in this file depends on it being set exactly to "1".
    assert os.environ.get(TEST_FAULTS_ENV) == "1"


def test_a_fault_step_option_is_refused_on_the_driver_without_the_test_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TEST_FAULTS_ENV)
    with pytest.raises(ConfigurationError) as e:
        WriterOptions.parse({**BASE, **KILL}, streaming=False)
    msg = str(e.value)
    assert "fault.action, fault.step" in msg and f"{TEST_FAULTS_ENV}=1" in msg and "test-only" in msg


@pytest.mark.parametrize("value", ["0", "", "true", "yes"])
def test_only_the_value_1_enables_the_fault_hooks(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(TEST_FAULTS_ENV, value)
    with pytest.raises(ConfigurationError, match="test-only"):
        WriterOptions.parse({**BASE, "fault.once_file": "/tmp/x"}, streaming=False)


def test_a_fault_step_option_is_accepted_with_the_test_environment_variable() -> None:
    o = WriterOptions.parse({**BASE, **KILL, "fault.batch": "2"}, streaming=False)
    assert o.faults == {**KILL, "fault.batch": "2"}
    assert FaultPlan.parse(o.faults) == FaultPlan(step="after_decision", action="kill", batch=2)


def test_options_without_fault_hooks_need_no_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEST_FAULTS_ENV)
    assert WriterOptions.parse(BASE, streaming=False).faults == {}


def test_a_fault_plan_built_on_an_executor_without_the_variable_is_refused_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Options are pickled to executors: a plan parsed there is checked again.
    monkeypatch.delenv(TEST_FAULTS_ENV)
    with pytest.raises(ConfigurationError, match=TEST_FAULTS_ENV):
        FaultPlan.parse(KILL)


def test_an_unknown_fault_step_fails_on_the_driver_naming_the_option() -> None:
    with pytest.raises(ConfigurationError, match="fault.step must be one of"):
        WriterOptions.parse({**BASE, "fault.step": "after_everything"}, streaming=False)


def test_a_process_started_without_the_variable_refuses_a_writer_with_fault_options() -> None:
    # What a production driver sees: a fresh interpreter whose environment lacks it.
    env = {k: v for k, v in os.environ.items() if k != TEST_FAULTS_ENV}
    env["PYTHONPATH"] = str(ROOT)
    code = (
        "import json, sys\n"
        "from spark_datasource.options.writer_options import WriterOptions\n"
        "try:\n"
        "    WriterOptions.parse(json.loads(sys.argv[1]), streaming=False)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
        "else:\n"
        "    print('accepted')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps({**BASE, **KILL})],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.startswith("ConfigurationError") and TEST_FAULTS_ENV in out, out


def test_a_coordinator_with_faults_keeps_everything_it_was_built_with_but_the_two_it_wraps() -> None:
    from clickhouse_tx.conversion.convert import ConversionPlan
    from clickhouse_tx.testing.faults import FaultyDecisionLog, FaultyModeIO, with_faults
    from tests.unit.fakes import World

    world = World()
    conversion = ConversionPlan("db.events", [])
    plain = world.coordinator(conversion=conversion, parallelism=3)
    faulty = with_faults(plain, FaultPlan(step="after_decision"))
    assert isinstance(faulty.mode_io, FaultyModeIO) and faulty.mode_io.inner is world.ch
    assert isinstance(faulty.log, FaultyDecisionLog)
    assert faulty.conversion is conversion and faulty.xid_factory == world.next_xid
    kept = ("txn_id", "target", "registry", "retry", "clock", "sleep", "parallelism")
    assert all(getattr(faulty.context, f) is getattr(plain.context, f) for f in kept)
    assert plain.mode_io is world.ch  # the original is left as it was
