"""A tenant's settings as a person edits them, checked against the agents deployed.

``Tenant.agent_config`` overrides, key by key, the configuration each agent declares, and
is pinned into every new run. Written as raw JSON it took any key and any value: a typo
("auto_aprove_up_to") silently changed nothing, and a bare amount said nothing of its
currency. Here the settings every approving agent shares are fields of their own (does a
risky call wait for an approver; up to which amount, per currency, it does not), and the
rest is JSON that may name only agents that are registered and keys they declare, with
values of the type they declare.

It lives in the composition root because it reads the deployment's agents, which the
accounts app, below the runtime, may not import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from accounts.models import Tenant
from agentruns.money import format_amount, parse_amount
from agentruns.runtime import Agent, Registry, merged_config

APPROVALS = "approvals"
ENABLED = "enabled"
LIMITS = "auto_approve_up_to"

_LIMIT_LINE = re.compile(
    r"^\s*(?:(?P<c1>[A-Za-z]{3})\s+(?P<a1>[\d.,]+)|(?P<a2>[\d.,]+)\s+(?P<c2>[A-Za-z]{3}))\s*$"
)


def approving_agents(registry: Registry) -> list[Agent]:
    """The newest version of each agent whose configuration has approval settings."""
    agents = [registry.latest(name) for name in registry.names()]
    return [a for a in agents if isinstance(a.config.get(APPROVALS), Mapping)]


def limits_text(limits: Mapping[str, int | None] | None) -> str:
    """{"eur": 5000, "jpy": None} → "50.00 EUR": one line per currency with an amount."""
    return "\n".join(
        format_amount(amount, currency)
        for currency, amount in sorted((limits or {}).items())
        if amount is not None
    )


def parse_limits(text: str) -> dict[str, int]:
    """What an operator typed, one "50.00 EUR" per line, as {"eur": 5000}.

    Raises ValidationError naming every line that is not an amount and its currency.
    """
    limits: dict[str, int] = {}
    problems = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        match = _LIMIT_LINE.match(line)
        if match is None:
            problems.append(f"line {number}: write an amount and its currency, e.g. 50.00 EUR")
            continue
        currency = (match["c1"] or match["c2"]).lower()
        try:
            amount = parse_amount(match["a1"] or match["a2"], currency)
        except ValueError as exc:
            problems.append(f"line {number}: {exc}")
            continue
        if currency in limits:
            problems.append(f"line {number}: {currency.upper()} is given twice")
            continue
        limits[currency] = amount
    if problems:
        raise ValidationError(problems)
    return limits


def settings_problems(config: Any, registry: Registry) -> list[str]:
    """Why ``config`` (agent name → overrides) is not something the agents declare."""
    if not isinstance(config, dict):
        return ["the settings must be a JSON object of agent names"]
    problems = []
    known = registry.names()
    for name, overrides in config.items():
        if name not in known:
            problems.append(f"no agent named {name!r} is deployed (known: {', '.join(known)})")
        elif not isinstance(overrides, dict):
            problems.append(f"{name}: its settings must be a JSON object")
        else:
            problems.extend(_declared(name, overrides, registry.latest(name).config))
    return problems


def _declared(path: str, overrides: Mapping[str, Any], declared: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, value in overrides.items():
        where = f"{path}.{key}"
        if key not in declared:
            names = ", ".join(sorted(declared)) or "none"
            problems.append(f"{where}: the agent declares no such setting (it has: {names})")
            continue
        default = declared[key]
        if isinstance(default, Mapping):
            if not isinstance(value, dict):
                problems.append(f"{where}: must be a JSON object")
            elif path.endswith(APPROVALS) and key == LIMITS:
                continue  # per currency, checked with the approval fields
            else:
                problems.extend(_declared(where, value, default))
        elif default is not None and value is not None and not _same_type(value, default):
            problems.append(f"{where}: must be {_type_name(default)}, as the agent declares")
    return problems


def _same_type(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float)
    return isinstance(value, type(default))


def _type_name(default: Any) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int | float):
        return "a number"
    if isinstance(default, str):
        return "a text"
    if isinstance(default, list):
        return "a list"
    return type(default).__name__


def effective_approvals(agent: Agent, stored: Mapping[str, Any]) -> dict[str, Any]:
    """The approval settings a new run of ``agent`` pins for this tenant."""
    overrides = (stored.get(agent.name) or {}).get(APPROVALS) or {}
    effective = merged_config(agent.config[APPROVALS], overrides)
    limits = effective.get(LIMITS)
    if isinstance(limits, int) and not isinstance(limits, bool):
        # A bare amount from before amounts named their currency: it was meant in EUR
        # (see the accounts migration make_auto_approval_per_currency).
        effective[LIMITS] = {"eur": limits}
    return effective


def _approval_overrides(agent: Agent, enabled: bool, limits: dict[str, int]) -> dict[str, Any]:
    """What the tenant must store so a new run pins ``enabled`` and exactly ``limits``:
    only what differs from the agent's own; a default currency left out is set to null
    (the merge is key by key, so leaving it out would keep the agent's amount)."""
    declared = agent.config[APPROVALS]
    overrides: dict[str, Any] = {}
    if enabled != declared.get(ENABLED, True):
        overrides[ENABLED] = enabled
    default_limits = declared.get(LIMITS) or {}
    if limits != {c: a for c, a in default_limits.items() if a is not None}:
        overrides[LIMITS] = {**{currency: None for currency in default_limits}, **limits}
    return overrides


def enabled_field(agent: Agent) -> str:
    return f"{agent.name}__approvals_enabled"


def limits_field(agent: Agent) -> str:
    return f"{agent.name}__auto_approve"


class TenantSettingsFormBase(forms.ModelForm):
    """Slug, name, retention, each approving agent's approval settings, and other agent
    settings."""

    other_settings = forms.JSONField(
        required=False,
        label="Other agent settings",
        help_text=(
            'JSON: agent name → settings the agent declares, e.g. {"refund_support": {…}}. '
            "Checked against the deployed agents; pinned into each new run, never into "
            "a started one."
        ),
    )

    registry: Registry
    agents: list[Agent]

    class Meta:
        model = Tenant
        fields = ["slug", "name", "retention_days", "personal_data_days"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.instance.agent_config or {}
        for agent in self.agents:
            approvals = effective_approvals(agent, stored)
            self.fields[enabled_field(agent)].initial = bool(approvals.get(ENABLED, True))
            self.fields[limits_field(agent)].initial = limits_text(approvals.get(LIMITS))
        self.fields["other_settings"].initial = _without_approval_settings(stored, self.agents)

    def clean(self):
        cleaned = super().clean()
        other = cleaned.get("other_settings") or {}
        problems = settings_problems(other, self.registry)
        for agent in self.agents:
            overrides = (other.get(agent.name) or {}) if isinstance(other, dict) else {}
            if isinstance(overrides, dict) and APPROVALS in overrides:
                problems.append(
                    f"{agent.name}.{APPROVALS}: set with the approval fields above, not here"
                )
        if problems:
            self.add_error("other_settings", problems)
            return cleaned
        config = {name: dict(values) for name, values in other.items()}
        for agent in self.agents:
            field = limits_field(agent)
            if field in self.errors:
                continue
            overrides = _approval_overrides(
                agent, cleaned.get(enabled_field(agent), False), cleaned.get(field) or {}
            )
            if overrides:
                config.setdefault(agent.name, {})[APPROVALS] = overrides
        self.instance.agent_config = {name: values for name, values in config.items() if values}
        return cleaned


class LimitsField(forms.CharField):
    widget = forms.Textarea(attrs={"rows": 3, "cols": 24})

    def to_python(self, value):
        return parse_limits(super().to_python(value))


def _without_approval_settings(stored: Mapping[str, Any], agents: list[Agent]) -> dict:
    approving = {agent.name for agent in agents}
    other = {}
    for name, values in stored.items():
        if name in approving and isinstance(values, Mapping):
            values = {k: v for k, v in values.items() if k != APPROVALS}
        if values:
            other[name] = values
    return other


def tenant_settings_form(registry: Registry) -> type[TenantSettingsFormBase]:
    """The form for this deployment's agents: two approval fields per approving agent."""
    agents = approving_agents(registry)
    fields: dict[str, forms.Field] = {}
    for agent in agents:
        fields[enabled_field(agent)] = forms.BooleanField(
            required=False,
            label=f"{agent.name}: risky calls wait for an approver",
            help_text="Unticked, the agent's calls that need approval by its policy go ahead.",
        )
        fields[limits_field(agent)] = LimitsField(
            required=False,
            label=f"{agent.name}: no approval needed up to",
            help_text=(
                "One amount and its currency per line, e.g. 50.00 EUR. In a currency not "
                "listed, every such call waits for an approver."
            ),
        )
    attrs = {**fields, "registry": registry, "agents": agents, "__module__": __name__}
    return type("TenantSettingsForm", (TenantSettingsFormBase,), attrs)


def approval_field_names(registry: Registry) -> list[str]:
    names = []
    for agent in approving_agents(registry):
        names += [enabled_field(agent), limits_field(agent)]
    return names
