"""Who sent a request: ClickHouse's three ways of passing credentials over HTTP.

Checked once per request, before any SQL runs. Precedence as in ClickHouse's
``HTTPHandler::authenticateUser``: the ``user``/``password`` URL (or form)
parameters, then ``X-ClickHouse-User``/``X-ClickHouse-Key``, then Basic auth.
The password never appears in an error.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Mapping

from server_patches.errors import AUTHENTICATION_FAILED, HTTPError


def authenticate(headers: Mapping[str, str], params: Mapping[str, str], users: Mapping[str, str]) -> str:
    """The name of the user the request authenticates as; :class:`HTTPError` (516) if none."""
    user, password = _credentials(headers, params)
    expected = users.get(user)
    if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
        raise HTTPError(
            AUTHENTICATION_FAILED,
            f"{user}: Authentication failed: password is incorrect, or there is no user with such name",
        )
    return user


def _credentials(headers: Mapping[str, str], params: Mapping[str, str]) -> tuple[str, str]:
    user: str | None = None
    password: str | None = None
    auth = headers.get("Authorization")
    if auth and auth.lower().startswith("basic "):
        try:
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise HTTPError(AUTHENTICATION_FAILED, "Malformed Authorization header") from None
    if headers.get("X-ClickHouse-User"):
        user = headers["X-ClickHouse-User"]
        password = headers.get("X-ClickHouse-Key", "")
    if "user" in params:
        user, password = params["user"], params.get("password", "")
    return user or "default", password or ""
