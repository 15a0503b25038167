"""A batch job's plan on the embedded server, its requests counted (``batch_append.plan_job``).

The plan runs on the driver once per batch job, before any task writes: whether the
target can take a transaction, its materialized views, the job table, the stage made
``AS`` the target (and the dead-letter stage), the mode validated on the stage, the
stages dropped again if that fails. It runs on one client of the target and describes
the target once: the stage is made from that description, not from a second read of
``system.tables``. The mode's validate builds clients of the stage (the mode's own),
which are not the plan's. No SparkSession: the plan needs only the schema.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import types as T

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.conversion.convert import ConversionPlan
from clickhouse_tx.errors import ConfigurationError
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.sink.job_append import plan_job
from spark_datasource.sink.setup import prepare_target
from tests.helpers.spark_writes import create_events_table, table_names, writer_options
from tests.helpers.views import add_rollup_views

SCHEMA = T.StructType(
    [T.StructField("id", T.LongType()), T.StructField("k", T.IntegerType()), T.StructField("s", T.StringType())]
)


@dataclasses.dataclass
class Traced:
    """Every client built and every request sent while the fixture is active."""

    clients: list[ClickHouseHTTP] = dataclasses.field(default_factory=list)
    #: (index of the client in ``clients``, the SQL, its ``{name:Type}`` parameters)
    requests: list[tuple[int, str, dict[str, str]]] = dataclasses.field(default_factory=list)

    def clear(self) -> None:
        self.clients.clear()
        self.requests.clear()

    def clients_of(self, table: str) -> list[int]:
        """Indexes of the clients built for a target named ``table``."""
        return [i for i, c in enumerate(self.clients) if c.target.table == table]

    def descriptions_of(self, database: str, table: str) -> list[str]:
        """The reads of ``database.table``'s engine or DDL from ``system.tables``."""
        return [
            sql
            for _, sql, p in self.requests
            if "FROM system.tables" in sql
            and ("engine_full" in sql or "create_table_query" in sql)
            and (p.get("d"), p.get("t")) == (database, table)
        ]


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Traced:
    """Wrap ``ClickHouseHTTP``'s constructor and its one POST (the clients are kept, so no id is reused)."""
    out = Traced()
    init, post = ClickHouseHTTP.__init__, ClickHouseHTTP._post

    def built(self: ClickHouseHTTP, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        out.clients.append(self)

    def sent(self: ClickHouseHTTP, *, url_params: dict[str, str], data: Any, what: str, **kw: Any) -> Any:
        sql = url_params.get("query") or (data.decode("utf-8", "replace") if isinstance(data, bytes) else "")
        params = {k.removeprefix("param_"): v for k, v in url_params.items() if k.startswith("param_")}
        out.requests.append((next(i for i, c in enumerate(out.clients) if c is self), sql, params))
        return post(self, url_params=url_params, data=data, what=what, **kw)

    monkeypatch.setattr(ClickHouseHTTP, "__init__", built)
    monkeypatch.setattr(ClickHouseHTTP, "_post", sent)
    return out


def _checked(url: str, database: str, mode: str, **extra: str) -> tuple[WriterOptions, ConversionPlan]:
    """The job's options and conversion plan, as the data source has them when it calls plan_job."""
    opts = WriterOptions.parse(writer_options(url, database, "events", mode, **extra), streaming=False)
    return opts, prepare_target(opts, SCHEMA)


@pytest.mark.parametrize(
    "mode, extra, views",
    [
        ("transaction", {}, False),
        ("staging", {}, False),
        ("dedup", {}, False),
        ("transaction", {"bad_rows": "dead_letter", "dead_letter_table": "events_dl"}, False),
        ("transaction", {}, True),
    ],
    ids=["transaction", "staging", "dedup", "dead_letters", "views"],
)
def test_a_batch_jobs_plan_runs_on_one_client_of_the_target_and_describes_it_once(
    clickhouse_url: str, database: str, traced: Traced, mode: str, extra: dict[str, str], views: bool
) -> None:
    create_events_table(clickhouse_url, database, "events", mode)
    if views:
        add_rollup_views(clickhouse_url, database, "k")
    opts, plan = _checked(clickhouse_url, database, mode, **extra)
    traced.clear()  # the target's checks (prepare_target) are not the plan's

    job = plan_job(opts, SCHEMA, opts.txn_id(), plan)

    assert job is not None and set(job.job.stages()) <= set(table_names(clickhouse_url, database))
    assert job.job.views == ((f"{database}.events_by_key_mv", f"{database}.events_total_mv") if views else ())
    (client,) = traced.clients_of("events")
    assert len(traced.descriptions_of(database, "events")) == 1
    plans = {i for i, _, _ in traced.requests if i not in traced.clients_of(job.job.stage)}
    assert plans == {client}, "every request but the mode's validate of the stage runs on the plan's client"


def test_a_plan_that_fails_on_the_stage_drops_it_through_the_same_client(
    clickhouse_url: str, database: str, traced: Traced, monkeypatch: pytest.MonkeyPatch
) -> None:
    import clickhouse_tx.factory

    create_events_table(clickhouse_url, database, "events", "transaction")
    opts, plan = _checked(clickhouse_url, database, "transaction")

    class Refusing:
        def validate(self, *args: object) -> None:
            raise ConfigurationError("refused on the stage")

    monkeypatch.setattr(clickhouse_tx.factory, "build_mode_io", lambda *a, **kw: Refusing())
    traced.clear()
    with pytest.raises(ConfigurationError, match="refused on the stage"):
        plan_job(opts, SCHEMA, opts.txn_id(), plan)

    assert not [t for t in table_names(clickhouse_url, database) if t.startswith("_ctx_ow_")]
    (client,) = traced.clients_of("events")
    assert {i for i, _, _ in traced.requests} == {client}
    assert [sql for _, sql, _ in traced.requests if sql.startswith("DROP TABLE")]


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup"])
def test_a_batch_jobs_whole_driver_set_up_runs_on_one_client_and_describes_the_target_once(
    clickhouse_url: str, database: str, traced: Traced, mode: str
) -> None:
    # writer(): the server and table checks, the idempotence_key's read, the plan. The
    # mode's validate of the target and of the stage builds clients of its own.
    from spark_datasource import ClickHouseTxDataSource

    create_events_table(clickhouse_url, database, "events", mode)
    options = writer_options(clickhouse_url, database, "events", mode, idempotence_key="load-1")
    writer = ClickHouseTxDataSource(options).writer(SCHEMA, False)

    first = traced.clients_of("events")[0]  # the job's: built before any check runs
    on_first = [sql for i, sql, _ in traced.requests if i == first]
    assert on_first[0] == "SELECT 1"
    assert {i for i, sql, _ in traced.requests if "clickhouse_tx_jobs" in sql} == {first}, "the key's DDL and read"
    stage = q.qualified(database, writer.job.stage)
    assert [sql for sql in on_first if sql.startswith(f"CREATE TABLE {stage} ")], "the stage"
    engines = [sql for sql in on_first if "FROM system.tables" in sql and "engine_full" in sql]
    assert len(engines) == 1, "the plan reuses the checks' description of the target"


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup", "none"])
def test_a_streaming_querys_checks_describe_the_target_once_and_the_mode_reads_that_description(
    clickhouse_url: str, database: str, traced: Traced, mode: str, tmp_path: Path
) -> None:
    # streamWriter(): the sink's checks describe the target and check the schema; the mode's
    # validate takes that description instead of reading system.tables again.
    from spark_datasource import ClickHouseTxDataSource

    create_events_table(clickhouse_url, database, "events", mode)
    (tmp_path / "metadata").write_text('{"id":"7d1c2a3e-0000-4000-8000-000000000001"}\n')  # as Spark writes it
    options = writer_options(clickhouse_url, database, "events", mode, checkpointLocation=str(tmp_path))
    ClickHouseTxDataSource(options).streamWriter(SCHEMA, False)

    assert len(traced.descriptions_of(database, "events")) == 1
    columns = [sql for _, sql, p in traced.requests if "FROM system.columns" in sql and p.get("t") == "events"]
    assert len(columns) == 1
