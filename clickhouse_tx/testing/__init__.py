"""Test-only fault hooks (:mod:`.faults`): a ``fault.*`` option is refused unless the process runs
with ``CLICKHOUSE_TX_TEST_FAULTS=1``, which only the test suite and the demo's jobs set."""
