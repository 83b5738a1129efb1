"""Which model client a run talks to, from the model spec pinned to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from agentruns.llm.scripted import ScriptedProvider

if TYPE_CHECKING:
    from agentruns.runtime.registry import Agent


class ModelConfigurationError(Exception):
    """The run's model spec names a provider or scenario this deployment cannot offer."""


def default_providers(spec: dict[str, Any], agent: Agent):
    provider = spec.get("provider", "scripted")
    if provider == "scripted":
        name = spec.get("scenario")
        if name is None or name not in agent.scenarios:
            known = ", ".join(sorted(agent.scenarios)) or "none"
            raise ModelConfigurationError(
                f"scripted model: agent {agent.name!r} has no scenario {name!r} (known: {known})"
            )
        return ScriptedProvider(agent.scenarios[name], model=spec.get("model", "scripted-1"))
    if provider == "openai":
        # Imported on first use, not for an import cycle: the openai package takes
        # about half a second to import, and most workers never talk to it.
        from agentruns.llm.openai_compat import OpenAICompatibleProvider

        try:
            return OpenAICompatibleProvider.from_settings()
        except ImproperlyConfigured as exc:
            raise ModelConfigurationError(str(exc)) from exc
    raise ModelConfigurationError(f"unknown model provider {provider!r}")
