"""The operator's side: recovery over the registry (``recovery``) and the command line of
``python -m clickhouse_tx`` (``cli_args``).
"""
