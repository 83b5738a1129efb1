"""What needs attention, for the navigation every page an operator sees shows.

``accounts`` is the lowest app: it cannot count runs, approvals or cases itself.
Each app offers a counter in its ``selectors.py`` and the composition root
(``config/wiring.py``) installs them here; the context processor and the live
pages' websocket both ask ``attention_for``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.core.exceptions import ImproperlyConfigured

from accounts.models import Tenant

# One tenant's counts under the keys templates/accounts/_attention.html reads.
AttentionCounter = Callable[[Tenant], dict[str, int]]

_counters: tuple[AttentionCounter, ...] = ()


def install_attention(counters: Iterable[AttentionCounter]) -> None:
    """The composition root gives the navigation its counters (config/wiring.py)."""
    global _counters
    _counters = tuple(counters)


def attention_for(tenant: Tenant) -> dict[str, int]:
    """Every installed counter's counts for ``tenant``, in one dict."""
    # Never badges that read 0 by accident: they exist to say something waits.
    if not _counters:
        raise ImproperlyConfigured(
            "the navigation has no attention counters: add config.apps.HoldfastConfig "
            "to INSTALLED_APPS (it runs config.wiring.install())"
        )
    counts: dict[str, int] = {}
    for counter in _counters:
        counts.update(counter(tenant))
    return counts
