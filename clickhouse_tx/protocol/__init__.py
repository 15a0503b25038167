"""The two-phase commit itself, pure where it can be: the state machine, the commit plan,
the executor's prepare, the driver's batch commit and abort over one commit context, the
idempotent steps of one xid, ids and fault hooks. Never imports ``modes``, ``store``, ``sharding``, ``verify``
or ``admin``: it reaches them through the contracts of :mod:`clickhouse_tx.interfaces`.
"""
