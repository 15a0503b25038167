"""The overwrite writer runs no DDL when it is built: its stage comes from ``overwrite.create_stage``."""

from __future__ import annotations

import dataclasses
import pickle

from pyspark.sql.types import LongType, StructField, StructType

from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.sink.job_writers import OverwriteWriter
from spark_datasource.sink.overwrite import OverwriteStage


def test_building_the_overwrite_writer_runs_no_ddl_and_it_pickles_with_its_stage() -> None:
    # Port 9 (discard) has no ClickHouse: any query from the constructor would fail.
    opts = WriterOptions.parse({"url": "http://127.0.0.1:9", "table": "db.t"}, streaming=False)
    stage_opts = dataclasses.replace(opts, table="_ctx_ow_job_abc")
    stage = OverwriteStage(
        options=stage_opts, txn_id=opts.txn_id(), name="_ctx_ow_job_abc", swap="exchange", conversion=None
    )  # type: ignore[arg-type]
    w = OverwriteWriter(opts, StructType([StructField("id", LongType())]), stage)
    back = pickle.loads(pickle.dumps(w))
    assert (back.stage, back.swap, back.txn_id) == ("_ctx_ow_job_abc", "exchange", opts.txn_id())
    assert back.opts.table == "_ctx_ow_job_abc" and back.display_table == "db.t"
