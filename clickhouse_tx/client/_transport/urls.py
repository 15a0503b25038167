"""The one form of a server URL that may be shown: without credentials, query or fragment."""

from __future__ import annotations

import urllib.parse


def safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part, query or fragment: the one form of a
    URL that is logged, put in messages or recorded (registry ``server``, CLI hints).

    A URL too broken to split (bad port, bad IPv6 literal) yields ``<unparseable url>``:
    its text may hold anything, a password included."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable url>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets
    if port:
        host = f"{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


__all__ = ["safe_url"]
