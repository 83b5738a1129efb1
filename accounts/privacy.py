"""One rule for personal data and secrets, wherever a value leaves the database.

Pages, live fragments, the API, audit entries and the admin all show values through
``mask`` (structures) or ``mask_text`` (a sentence, an error message): the same
rule everywhere, so an address a provider quoted in an error is hidden exactly like
the address in a step's arguments.

- a field whose *name* says it is sensitive (password, secret, an access or API
  token, API key, authorization, card, IBAN, email, phone, SSN, CVC) is replaced
  whole; a reference to a secret (``secret_ref``) is not a secret;
- in any text: email addresses keep only their domain (enough to debug a bounce),
  card numbers (digit runs that pass the Luhn check) keep their last four digits,
  API tokens and keys (``hft_…``, ``sk_live_…``, ``Bearer …``) are replaced whole.

Records keep the real values (a provider may need them; an operator settling a case
reads the provider's own records); only what is shown is masked.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

MASK = "••••"

SENSITIVE_KEY = re.compile(
    r"(pass(word)?|secret|(access|refresh|id|auth|api|bearer|session)[_-]?token|api[_-]?key"
    r"|authorization|card|iban|email|phone|ssn|cvc|cvv)",
    re.I,
)
# A reference to where a secret is (``secret_ref: env:HOLDFAST_SECRET_…``) is not one.
REFERENCE_KEY = re.compile(r"(_ref|reference)$", re.I)
EMAIL = re.compile(r"[^@\s\"'<>(),;:\[\]]+@([^@\s\"'<>(),;:\[\]]+\.[^@\s\"'<>(),;:\[\]]+)")
# Not inside a word: a hash or an id ("pi_…", a hex digest) holds digit runs that may
# pass the Luhn check by chance.
CARD = re.compile(r"(?<![\w])(?:\d[ -]?){12,18}\d(?![\w])")
SECRET = re.compile(
    r"\b(?:hft_[A-Za-z0-9_-]{20,}|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9_]{4,}|whsec_[A-Za-z0-9]{6,})"
)
BEARER = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]+", re.I)


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"[ -]", "", match.group(0))
    if not 13 <= len(digits) <= 19 or not _luhn(digits):
        return match.group(0)
    return f"{MASK} {digits[-4:]}"


def mask_text(text: str) -> str:
    """A sentence with every address, card number and secret in it masked."""
    if not text:
        return text
    text = SECRET.sub(MASK, text)
    text = BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = EMAIL.sub(lambda m: f"{MASK}@{m.group(1)}", text)
    return CARD.sub(_card, text)


def _sensitive(key: str) -> bool:
    return bool(SENSITIVE_KEY.search(key)) and not REFERENCE_KEY.search(key)


def _has_value(item: Any) -> bool:
    # A flag says nothing to hide ("email_customer": false); an empty field neither.
    return item not in (None, "") and not isinstance(item, bool)


def mask(value: Any) -> Any:
    """A JSON-like value with sensitive fields replaced and every string masked."""
    if isinstance(value, dict):
        return {
            key: MASK if _sensitive(str(key)) and _has_value(item) else mask(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask(item) for item in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


# --- Errors a provider wrote. Its text can name internal hosts, accounts and request
# details: people who act on providers (the ``view_provider_errors`` permission) read
# it, masked like any text; everyone else reads what kind of failure it was and a
# reference, which is the same on every page and in the log for the same error, so a
# viewer can quote it to someone who may read the detail.

# Error classes whose text Holdfast itself wrote (a refusal before sending, a
# rejected approval, a model's invalid arguments): it explains the run and is
# shown to everyone who may see the run.
OWN_ERROR_CLASSES = frozenset(
    {
        "approval_rejected",
        "cancelled",
        "currency_mismatch",
        "did_not_happen",
        "invalid_arguments",
        "no_provider_account",
        "policy_rejection",
        "refused_before_send",
        "validation",
    }
)

PROVIDER_ERROR_CATEGORIES = {
    "unreachable": "the provider could not be reached",
    "slow": "the provider did not answer in time",
    "timeout": "the provider did not answer in time",
    "rate_limited": "the provider asked to slow down",
    "idempotency_key_in_use": "the provider was still working on an earlier attempt",
    "authentication": "the provider refused the account's credentials",
    "not_found": "the provider has no such record",
    "invalid_request": "the provider refused the request",
    "refused": "the provider refused the request",
    "server_error": "the provider failed",
}
UNCATEGORISED = "the call failed"


def error_reference(text: str) -> str:
    """A short, stable name for one error text: "E-1a2b3c4d"."""
    return "E-" + hashlib.sha256(text.encode()).hexdigest()[:8]


def shown_error(error_class: str, text: str, *, detail: bool) -> str:
    """An error as one reader may read it.

    ``detail``: the reader may read providers' own words (``view_provider_errors``).
    Holdfast's own explanations are shown to everyone; a provider's text only to
    readers with ``detail``, everyone else reads its category and reference.
    """
    if not text:
        return ""
    if error_class in OWN_ERROR_CLASSES:
        return mask_text(text)
    if detail:
        return f"{mask_text(text)} (reference {error_reference(text)})"
    category = PROVIDER_ERROR_CATEGORIES.get(error_class, UNCATEGORISED)
    return f"{category} (reference {error_reference(text)})"
