"""The private transport: the one ClickHouse HTTP client and the one error mapping.

Import the names below from here (``from clickhouse_tx._transport import ClickHouseHTTP``);
the modules inside are an implementation detail. The layout follows
clickhouse-connect's ``driver/``: a client (:mod:`.http`) and the classification of
what the server or the connection answered (:mod:`.errors`).
"""

# Every name of the error mapping's __all__ (codes, classification, the ReplyLostError
# and RequestNotSentError it raises) is the package's too: listed once, in errors.py.
from clickhouse_tx._transport.errors import *  # noqa: F403
from clickhouse_tx._transport.errors import __all__ as _error_names
from clickhouse_tx._transport.http import ClickHouseHTTP, safe_url

__all__ = [*_error_names, "ClickHouseHTTP", "safe_url"]
