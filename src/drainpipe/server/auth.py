"""The bearer token check, one for every transport (an HTTP ``Authorization`` header, gRPC ``authorization``
metadata): constant-time, the scheme case-insensitive, as RFC 6750 says."""

from __future__ import annotations

import hmac

__all__ = ["bearer_ok"]


def bearer_ok(authorization: str | None, token: str | None) -> bool:
    """Whether ``authorization`` (the header's value, or None) is ``Bearer <token>``; always True without a token."""
    if not token:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
