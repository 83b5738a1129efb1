"""Accounts: the sandbox tells its callers apart by API key alone, as Stripe does.

Every key is its own account, and any non-empty key is a valid one: a key the sandbox
has never seen is simply an account with nothing in it. Payment intents and orders
carry the account that owns them; a refund belongs to its payment intent's account.
Another account's object is answered exactly like one that does not exist.
"""

from __future__ import annotations

import hashlib


def account_for(api_key: str) -> str:
    """The account id of ``api_key``: ``acct_`` and 16 hex digits of its SHA-256."""
    return "acct_" + hashlib.sha256(api_key.encode()).hexdigest()[:16]
