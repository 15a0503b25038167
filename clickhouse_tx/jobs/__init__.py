"""Batch jobs (``df.write``) published in one step: the job's stage moved into the target in one
ClickHouse transaction, and the job table that makes a re-run of the same job a no-op (:mod:`.publish`)."""
