"""The exactly-once verifier: the run (``verifier``), its read-only access to ClickHouse,
the audit of the commit evidence, the offset checks, the shards and the report.
"""
