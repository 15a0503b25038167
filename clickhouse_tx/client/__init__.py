"""The one ClickHouse HTTP client (:mod:`.http`), the codes its callers branch on, TLS, SQL
quoting, and its private wire (``_transport``). Imports nothing of the project above
``errors``, ``interfaces`` and ``retry``.
"""
