"""Test suites written by others, run against a ClickHouse HTTP endpoint (docs/server.md)."""
