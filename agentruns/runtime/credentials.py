"""As whom a tool acts: the run's tenant's own account at each provider.

A tool asks its ``CallInfo`` for the account it needs (``call.credentials("payments")``)
when it makes the call, and the engine answers from the ``CredentialSource`` it was
built with. The runtime never reads a secret itself and keeps none: the source
resolves the tenant's reference at call time (``accounts.provider_accounts`` is the
deployment's source). A tenant with no usable account for that provider is a
definite refusal: nothing is sent, and the step says why.
"""

from __future__ import annotations

from typing import Protocol


class Credentials(Protocol):
    """One tenant's account at one provider, as a tool uses it."""

    provider: str
    # The tenant it belongs to (a slug): for messages, never for deciding.
    tenant: str
    # Where the provider's API is, when the provider has one (``https://api.stripe.com``).
    endpoint: str
    # The API key or token; never logged, stored or shown.
    secret: str
    # The address mail is sent from, for a mail account.
    sender: str


class CredentialSource(Protocol):
    def credentials(self, tenant_id: int, provider: str) -> Credentials:
        """The tenant's account at ``provider``; raises ``LookupError`` with a sentence
        an operator can act on when the tenant has none that can be used now."""


class NoCredentials:
    """An engine built without provider accounts: a tool that needs one is refused."""

    def credentials(self, tenant_id: int, provider: str) -> Credentials:
        raise LookupError(f"this engine has no provider accounts; it cannot act on {provider}")
