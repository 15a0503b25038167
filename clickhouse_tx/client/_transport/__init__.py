"""Private wire details of the HTTP client (:mod:`clickhouse_tx.client.http`).

:mod:`.wire` frames request bodies and reads JSON values; :mod:`.reply_mapping` is the
one mapping of a reply or a connection failure to the errors of
:mod:`clickhouse_tx.errors` and :mod:`clickhouse_tx.client.codes`. Used by the client
only; every other module imports the client and the codes from those public modules.
"""
