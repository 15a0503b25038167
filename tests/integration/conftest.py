"""Fixtures of the integration tests (the shared stack's fixtures are in ``tests/conftest.py``)."""

from __future__ import annotations

from typing import Iterator

import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import target_fields


@pytest.fixture
def admin(clickhouse_url: str, database: str) -> Iterator[ClickHouseHTTP]:
    """A client of the test's database on the shared stack (default table ``events``), closed after the test."""
    c = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="events", **target_fields()))
    yield c
    c.close()
