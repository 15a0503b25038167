"""A write over several ClickHouse shards: where rows go (``placement``) and the prepare
and commit per (partition, shard) (``io``).
"""
