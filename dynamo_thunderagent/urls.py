"""The URLs operators type for ``top`` and ``doctor``: a bare ``host:port`` is accepted."""

from __future__ import annotations

import urllib.parse


def http_url(value: str, *, what: str) -> str:
    """``value`` with ``http://`` added when it names no scheme; ValueError (naming
    ``what``, the flag) when it is not an http(s) URL with a host and, if given, a port."""
    url = value.strip()
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise ValueError(f"{what} {value!r} is not a URL: it holds spaces or control "
                         "characters")
    url = url if "://" in url else f"http://{url}"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is no number in range)
    except ValueError as error:
        raise ValueError(f"{what} {value!r} is not a URL: {error}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} {value!r} is not a URL: it needs http(s)://HOST[:PORT]")
    return url


def state_url(value: str, *, what: str = "--state") -> str:
    """The router's state URL: ``http://`` and ``/state`` added when missing."""
    parts = urllib.parse.urlsplit(http_url(value, what=what))
    if parts.path in ("", "/"):
        parts = parts._replace(path="/state")
    return urllib.parse.urlunsplit(parts)
