"""Money as the API answers it: minor units, the currency, and as the pages show it."""

from __future__ import annotations

from typing import Any

from ninja import Field, Schema

from agentruns.money import format_amount


class MoneyOut(Schema):
    amount: int = Field(description="minor units of `currency` (cents, yen)")
    currency: str = Field(description="ISO 4217, lower case as providers write it: `eur`")
    display: str = Field(description='as the pages show it: "60.00 EUR"')


def money_out(amount: int | None, currency: str) -> dict[str, Any] | None:
    """``MoneyOut``'s data, or None when no amount is known (nothing moves)."""
    if amount is None:
        return None
    return {"amount": amount, "currency": currency, "display": format_amount(amount, currency)}
