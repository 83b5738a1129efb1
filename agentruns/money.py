"""Amounts in minor units, as operators read and type them.

Providers (Stripe among them) count money in the currency's smallest unit: 700
EUR cents, but 700 JPY yen. The pages show and accept amounts in major units,
with as many decimals as the currency has.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

# Currencies without a minor unit, as Stripe lists them.
ZERO_DECIMAL = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga"}
    | {"pyg", "rwf", "ugx", "vnd", "vuv", "xaf", "xof", "xpf"}
)


def decimals(currency: str) -> int:
    return 0 if (currency or "").lower() in ZERO_DECIMAL else 2


def format_amount(amount: int | None, currency: str = "") -> str:
    """700, "eur" → "7.00 EUR"; 700, "jpy" → "700 JPY"; None → "—"."""
    if amount is None:
        return "—"
    places = decimals(currency)
    value = Decimal(amount).scaleb(-places)
    return f"{value:,.{places}f} {currency.upper()}".strip()


def state_changes(before: dict, after: dict) -> list[str]:
    """What differs between two states of a resource, one line per field, sorted:
    "amount_refunded: 0.00 EUR → 5.00 EUR". An ``amount``/``amount_…`` in minor units
    beside a ``currency`` is shown as money in it."""
    lines = []
    for name in sorted(set(before) | set(after)):
        then, now = before.get(name), after.get(name)
        if then != now:
            lines.append(f"{name}: {_shown(name, then, before)} → {_shown(name, now, after)}")
    return lines


def _shown(name: str, value, state: dict) -> str:
    currency = state.get("currency")
    money = name == "amount" or name.startswith("amount_")
    if money and type(value) is int and isinstance(currency, str) and currency:
        return format_amount(value, currency)
    return str(value)


def parse_amount(text: str, currency: str = "") -> int | None:
    """What an operator typed ("7.00", "1,250.5") in minor units; "" → None.

    Raises ValueError with a sentence for the operator when it is not an amount.
    """
    raw = (text or "").strip().replace(",", "")
    if not raw:
        return None
    places = decimals(currency)
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise ValueError(f"the amount {raw!r} is not a number (write 7.00)") from None
    if not value.is_finite() or value < 0 or value.as_tuple().exponent < -places:
        raise ValueError(
            f"the amount must be positive with at most {places} decimal"
            f"{'s' if places != 1 else ''} for {currency.upper() or 'this currency'}"
        )
    return int(value.scaleb(places))
