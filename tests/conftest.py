"""Shared fixtures: the embedded stack (ZooKeeper + ClickHouse HTTP on chdb + dev Kafka).

The session-scoped ``stack`` starts once per test run, in a temporary directory, and
is stopped at the end even when tests fail. Tests that need to crash or restart a
server start their own with ``stack_factory`` so they never disturb the shared one.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import pytest

from server_patches import stack as stack_mod
from server_patches import stack_files, stack_kafka
from server_patches.stack_files import StackInfo
from spark_datasource.testing import credentials
from tests.helpers import external

# Spark's Python workers must run this interpreter (the venv with pyarrow), not
# whatever `python3` is on PATH. Set before any test module creates a SparkSession.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# The writer's fault.* hooks (clickhouse_tx.testing.faults) are refused without this; set here,
# before any SparkSession or subprocess starts, so the JVM, its Python workers and the
# jobs the torture tests launch inherit it. Production environments never set it.
os.environ["CLICKHOUSE_TX_TEST_FAULTS"] = "1"

from clickhouse_tx.client.sql import quote_identifier as quote_ident  # noqa: E402,F401 - for the tests

if TYPE_CHECKING:
    from tests.helpers.https import HttpsFront

#: Why the shared stack has no Kafka, for the ``kafka_bootstrap`` fixture to report.
_kafka_missing_reason: list[str] = []

#: ``--part I/N`` (make test-slow PART=I).
pytest_plugins = ["tests.helpers.parts"]

#: The user's servers when ``CLICKHOUSE_TX_EXTERNAL_URL`` is set (``make test-external``), else None.
EXTERNAL = external.External.from_env()
if EXTERNAL is not None:
    # Every database and topic of the run starts with this, so a leftover is recognisable.
    os.environ["CLICKHOUSE_TX_RUN_PREFIX"] = EXTERNAL.prefix

    def _no_stack_in_external_mode(*args: object, **kwargs: object) -> StackInfo:
        raise AssertionError("external mode: the suite starts no stack of its own (tests/helpers/external.py)")

    # The suite reaches the user's servers only through the given addresses: a test that
    # would start an embedded stack anyway fails here instead of certifying it.
    stack_mod.start_stack = _no_stack_in_external_mode  # type: ignore[assignment]


#: The environment variable that gives ``--compatibility`` (``make test-compat`` sets the option).
COMPATIBILITY_ENV = "CLICKHOUSE_TX_COMPATIBILITY"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--compatibility",
        default=None,
        metavar="X.Y",
        help="start the embedded stacks (stack, sharded_stack, stack_factory) with ClickHouse's "
        f"compatibility setting X.Y in the engine's default profile, e.g. 25.8 (also ${COMPATIBILITY_ENV}; "
        "docs/server.md)",
    )


def compatibility_of(config: pytest.Config) -> str | None:
    """The run's ``--compatibility`` (else ``$CLICKHOUSE_TX_COMPATIBILITY``), checked; None: the engine's own."""
    value = config.getoption("--compatibility") or os.environ.get(COMPATIBILITY_ENV) or None
    try:
        return stack_files.check_compatibility(value)
    except stack_files.StackError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_configure(config: pytest.Config) -> None:
    """A wrong ``--compatibility`` stops the run before any stack starts."""
    compatibility_of(config)


def pytest_report_header(config: pytest.Config) -> str:
    """Which settings defaults the embedded stacks run with (one line at the top of the run)."""
    value = compatibility_of(config)
    return f"clickhouse compatibility: {value or 'none (the engine defaults)'}"


@pytest.fixture(scope="session")
def clickhouse_compatibility(pytestconfig: pytest.Config) -> str | None:
    """The ``compatibility`` the run's embedded stacks start with (``--compatibility``), or None."""
    return compatibility_of(pytestconfig)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, clickhouse_compatibility: str | None) -> Iterator[StackInfo]:
    """The shared local stack, with the dev Kafka broker when it can start.

    Kafka is started in a second step so that a missing or broken broker fails only
    the tests that need Kafka (through ``kafka_bootstrap``), not every test.
    """
    if EXTERNAL is not None:
        yield EXTERNAL.stack_info()
        # The dev broker (a control address given) has no admin API; its topics live in
        # memory and end with it.
        if EXTERNAL.kafka and not EXTERNAL.kafka_control:
            _EXTERNAL_REPORT.append(f"topics deleted: {len(external.delete_topics(EXTERNAL.kafka, EXTERNAL.prefix))}")
        return
    d = tmp_path_factory.mktemp("stack")
    try:
        info = stack_mod.start_stack(d, compatibility=clickhouse_compatibility)
        if not stack_kafka.kafka_available():
            _kafka_missing_reason.append("server_patches/kafka_broker.py is not in this checkout")
        else:
            try:
                info = stack_mod.start_stack(d, kafka=True)
            except stack_files.StackError as e:
                _kafka_missing_reason.append(f"the dev Kafka broker did not start: {e}")
        yield info
    finally:
        stack_mod.stop_stack(d)


@pytest.fixture
def stack_factory(
    tmp_path_factory: pytest.TempPathFactory, clickhouse_compatibility: str | None
) -> Iterator[Callable[..., StackInfo]]:
    """Start private stacks (``stack_factory(kafka=False) -> StackInfo``); all stopped after the test.

    For tests that kill, restart or stop servers: the shared ``stack`` stays untouched.
    They run with the run's ``--compatibility`` unless the test gives its own.
    """
    dirs: list[Path] = []

    def make(**kwargs: object) -> StackInfo:
        d = tmp_path_factory.mktemp("own_stack")
        dirs.append(d)
        kwargs.setdefault("compatibility", clickhouse_compatibility)
        return stack_mod.start_stack(d, **kwargs)  # type: ignore[arg-type]

    try:
        yield make
    finally:
        for d in dirs:
            stack_mod.stop_stack(d)


@pytest.fixture(scope="session")
def sharded_stack(
    tmp_path_factory: pytest.TempPathFactory, clickhouse_compatibility: str | None
) -> Iterator[StackInfo]:
    """A stack of 2 ClickHouse shards (one server each) on one ZooKeeper, shared by the
    tests of a run that need shards and do not crash servers (``stack_factory(shards=2)``
    for those that do); ``.shards_option`` is the writer's ``shards`` option."""
    d = tmp_path_factory.mktemp("sharded_stack")
    try:
        yield stack_mod.start_stack(d, shards=2, compatibility=clickhouse_compatibility)
    finally:
        stack_mod.stop_stack(d)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``127.0.0.1:<port>`` of a moto S3 server process with the bucket ``chk`` (once per run)."""
    from tests.helpers.s3 import moto_server

    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def clickhouse_url(stack: StackInfo) -> str:
    """``http://127.0.0.1:<port>`` of the shared stack's ClickHouse HTTP interface."""
    return stack.clickhouse_url


@pytest.fixture(scope="session")
def kafka_bootstrap(stack: StackInfo) -> str:
    """``host:port`` of the shared stack's dev Kafka broker."""
    if not stack.kafka_bootstrap:
        pytest.fail(
            "this test needs the dev Kafka broker, but the shared stack runs without "
            "it: " + ("; ".join(_kafka_missing_reason) or "unknown reason")
        )
    return stack.kafka_bootstrap


def _http(url: str, sql: str) -> None:
    import requests

    if EXTERNAL is not None:
        EXTERNAL.run(sql)
        return
    r = requests.post(url, data=sql.encode(), timeout=60)
    if r.status_code != 200:
        raise RuntimeError(f"{sql!r} failed with HTTP {r.status_code}: {r.text.strip()}")


@pytest.fixture
def database(clickhouse_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A freshly created database for this test alone, dropped afterwards."""
    base = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:40].strip("_")
    name = f"{os.environ.get('CLICKHOUSE_TX_RUN_PREFIX', '')}t_{base}_{uuid.uuid4().hex[:8]}"
    _http(clickhouse_url, f"CREATE DATABASE {quote_ident(name)}")
    try:
        yield name
    finally:
        _http(clickhouse_url, f"DROP DATABASE IF EXISTS {quote_ident(name)} SYNC")


@pytest.fixture
def ch_client(stack: StackInfo, database: str) -> Iterator[object]:
    """An unmodified clickhouse-connect client (default settings) bound to ``database``."""
    from urllib.parse import urlsplit

    import clickhouse_connect

    host = urlsplit(stack.clickhouse_url).hostname or "127.0.0.1"
    client = clickhouse_connect.get_client(
        host=host,
        port=stack.clickhouse_port,
        database=database,
        interface=urlsplit(stack.clickhouse_url).scheme,
        **credentials.clickhouse_connect_login(),
    )
    try:
        yield client
    finally:
        client.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each collected test by what it needs, once per run at collection.

    ``spark``: everything under tests/spark (a SparkSession in this process) and
    tests/torture (a Spark driver in a child process). ``slow``: every kill case under
    tests/torture but the one marked ``smoke`` (make test keeps one; the rest run in
    ``make test-slow PART=I``). ``integration``: everything under
    tests/integration and any test using the embedded stack (``stack``/``stack_factory``,
    also through ``clickhouse_url``, ``database``, ...). So ``-m "not spark"`` or
    ``-m "not integration"`` select by need rather than by path.
    """
    root = Path(__file__).parent
    for item in items:
        try:
            top = item.path.relative_to(root).parts[0]
        except ValueError:
            continue
        if top in ("spark", "torture"):
            item.add_marker(pytest.mark.spark)
        if top == "torture":
            item.add_marker(pytest.mark.kill)
            if item.get_closest_marker("smoke") is None:
                item.add_marker(pytest.mark.slow)  # kill cases run in make test-slow's parts
        if top == "integration" or {"stack", "stack_factory", "sharded_stack"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    if EXTERNAL is not None:
        _select_for_external(config, items)


def _select_for_external(config: pytest.Config, items: list[pytest.Item]) -> None:
    """External mode: leave out what needs the embedded servers, skip what the server lacks.

    Each group left out is printed with its reason at the end of the run's header, so
    the summary says what was certified and what was not.
    """
    assert EXTERNAL is not None
    lacks = external.probe_server(EXTERNAL)
    kept: list[pytest.Item] = []
    left: dict[str, int] = {}
    for item in items:
        reason = external.embedded_only_reason(item, EXTERNAL.url.startswith("https:"))
        if reason is None and "kafka_bootstrap" in item.fixturenames and not EXTERNAL.kafka:
            reason = f"needs Kafka, and {external.ENV_KAFKA} is not set"
        if reason is None and "zookeeper" in item.fixturenames and not EXTERNAL.keeper:
            reason = f"reads Keeper, and {external.ENV_KEEPER} is not set"
        if reason is not None:
            left[reason] = left.get(reason, 0) + 1
            continue
        need = external.lacking_for(item, lacks)
        if need is not None:
            item.add_marker(pytest.mark.skip(reason=f"the server lacks it: {need}"))
        kept.append(item)
    kept_ids = {id(i) for i in kept}
    config.hook.pytest_deselected(items=[i for i in items if id(i) not in kept_ids])
    items[:] = kept
    _EXTERNAL_REPORT.extend(f"left out {n}: {why}" for why, n in sorted(left.items()))
    _EXTERNAL_REPORT.extend(f"server lacks {need}: {answer[:200]}" for need, answer in lacks.items())


_EXTERNAL_REPORT: list[str] = []


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """External mode: before any test runs, what is left out and what will be skipped, and why."""
    if EXTERNAL is None:
        return []
    return ["external servers: " + line for line in _EXTERNAL_REPORT or ["nothing left out"]]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """External mode: what the run left out and what the server lacks, with the reasons."""
    if EXTERNAL is None:
        return
    terminalreporter.section("external servers")
    for line in _EXTERNAL_REPORT or ["nothing left out"]:
        terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def front(clickhouse_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator["HttpsFront"]:
    """The shared server behind a TLS front with certificates made for the test module."""
    from tests.helpers.https import https_front

    with https_front(clickhouse_url, tmp_path_factory.mktemp("https")) as f:
        yield f


@pytest.fixture(scope="module")
def mtls_front(clickhouse_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator["HttpsFront"]:
    """As ``front``, and the front requires a client certificate on every connection."""
    from tests.helpers.https import https_front

    with https_front(clickhouse_url, tmp_path_factory.mktemp("mtls"), require_client_cert=True) as f:
        yield f
