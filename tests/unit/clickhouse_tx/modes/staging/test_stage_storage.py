"""The stage of a table, from the table's ``engine_full``: which Keeper path, which UUID.

Each form is created against the embedded engine in
``tests/integration/clickhouse_tx/modes/test_replicated_targets.py::test_a_stage_of_a_replicated_target_takes_a_keeper_path_of_its_own_beside_the_targets``.
"""

from __future__ import annotations

import pytest

from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.modes.base import distributed_hint
from clickhouse_tx.modes.staging.tables import STAGE_PATH_SUFFIX, stage_storage

S = "_ctx_stage_x"


@pytest.mark.parametrize(
    "engine_full, stage_engine",
    [
        (
            "ReplicatedMergeTree('/clickhouse/tables/lit', 'r1') ORDER BY k SETTINGS index_granularity = 8192",
            f"ReplicatedMergeTree('/clickhouse/tables/lit{STAGE_PATH_SUFFIX}/{S}', 'r1') ORDER BY k "
            "SETTINGS index_granularity = 8192",
        ),
        (  # {database}/{table} arrive unfolded; {shard}/{replica} stay for the server
            "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/t', '{replica}', v) ORDER BY k",
            f"ReplicatedReplacingMergeTree('/clickhouse/tables/{{shard}}/db/t{STAGE_PATH_SUFFIX}/{S}', "
            "'{replica}', v) ORDER BY k",
        ),
        (  # the server's default path of an engine created without arguments
            "ReplicatedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY k",
            f"ReplicatedMergeTree('/clickhouse/tables/u-1/{{shard}}{STAGE_PATH_SUFFIX}/{S}', '{{replica}}') ORDER BY k",
        ),
        (
            "SharedMergeTree('/clickhouse/tables/{uuid}/{shard}', '{replica}') ORDER BY k",
            f"SharedMergeTree('/clickhouse/tables/u-1/{{shard}}{STAGE_PATH_SUFFIX}/{S}', '{{replica}}') ORDER BY k",
        ),
        (  # a quote in the path survives the round trip
            "ReplicatedMergeTree('/p/it\\'s/', 'r') ORDER BY k",
            f"ReplicatedMergeTree('/p/it\\'s{STAGE_PATH_SUFFIX}/{S}', 'r') ORDER BY k",
        ),
    ],
    ids=["literal", "macros", "default path", "shared", "quoted"],
)
def test_a_replicated_tables_stage_gets_the_tables_keeper_path_with_its_own_name_appended(
    engine_full: str, stage_engine: str
) -> None:
    assert stage_storage(engine_full, "u-1", S) == (stage_engine, False)


def test_a_replicated_engine_stored_without_arguments_gives_the_stage_a_uuid_of_its_own() -> None:
    assert stage_storage("SharedMergeTree ORDER BY k", "u-1", S) == (None, True)


@pytest.mark.parametrize("engine_full", ["MergeTree ORDER BY k", "ReplacingMergeTree(ver) ORDER BY k", "Memory"])
def test_a_non_replicated_tables_stage_is_created_as_the_table_itself(engine_full: str) -> None:
    assert stage_storage(engine_full, "u-1", S) == (None, False)


def _info(engine: str) -> TableInfo:
    return TableInfo("db", "t", engine, (), "", 0, 0)


def test_a_refused_distributed_target_is_told_to_write_into_its_shards_local_tables() -> None:
    assert "option shards" in distributed_hint(_info("Distributed"))
    assert distributed_hint(_info("MergeTree")) == ""
