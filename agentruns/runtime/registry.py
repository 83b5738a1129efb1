"""Agents by name and version, and what a run pins when it starts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from agentruns.runtime.effects import content_hash
from agentruns.runtime.tools import Tool

if TYPE_CHECKING:
    from agentruns.llm.scripted import Scenario
    from agentruns.runtime.context import RunContext


@dataclass(frozen=True)
class Budget:
    """Limits on a run's forward progress; recovery and compensation are never limited."""

    max_steps: int = 200
    max_model_calls: int = 50
    max_tokens: int = 200_000
    max_cost: Decimal = Decimal("5.00")  # in the pricing currency (USD)

    def as_json(self) -> dict[str, Any]:
        return {
            "max_steps": self.max_steps,
            "max_model_calls": self.max_model_calls,
            "max_tokens": self.max_tokens,
            "max_cost_micros": int(self.max_cost * 1_000_000),
        }


@dataclass(frozen=True)
class ModelSpec:
    """Which model an agent talks to; pinned into the run at start."""

    provider: str = "scripted"  # "scripted" or "openai"
    model: str = "scripted-1"
    prompt_version: str = "1"
    # USD per million tokens: (input, output).
    pricing: tuple[Decimal, Decimal] = (Decimal("0.15"), Decimal("0.60"))
    timeout: float = 20.0

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "prompt_version": self.prompt_version,
            "pricing_per_million": [str(self.pricing[0]), str(self.pricing[1])],
            "timeout": self.timeout,
        }


AgentFunction = Callable[["RunContext", dict[str, Any]], Any]


@dataclass
class Agent:
    name: str
    version: int
    fn: AgentFunction
    tools: Sequence[Tool] = ()
    input_model: type[BaseModel] | None = None
    budget: Budget = field(default_factory=Budget)
    model: ModelSpec = field(default_factory=ModelSpec)
    # Configuration pinned into each run; agent code reads it as ctx.config.
    config: Mapping[str, Any] = field(default_factory=dict)
    # Scripted-model scenarios by name; a run picks one with input["scenario"]
    # or config["scenario"].
    scenarios: Mapping[str, Scenario] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"agent {self.name!r} declares tools twice: {sorted(duplicates)}")
        by_name = {t.name: t for t in self.tools}
        for t in self.tools:
            if t.undo is not None and t.undo.tool not in by_name:
                raise ValueError(f"tool {t.name!r} names undo tool {t.undo.tool!r}, not declared")

    def tool(self, name: str) -> Tool | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def snapshot(self) -> dict[str, Any]:
        tools = {t.name: t.snapshot() for t in self.tools}
        return {
            "tools": tools,
            "tool_schema_version": content_hash({n: s["schema_hash"] for n, s in tools.items()}),
            "budget": self.budget.as_json(),
            "model": self.model.as_json(),
            "config": dict(self.config),
        }


def agent(
    *,
    name: str,
    version: int,
    tools: Sequence[Tool] = (),
    input_model: type[BaseModel] | None = None,
    budget: Budget | None = None,
    model: ModelSpec | None = None,
    config: Mapping[str, Any] | None = None,
    scenarios: Mapping[str, Scenario] | None = None,
) -> Callable[[AgentFunction], Agent]:
    """Declare an agent from its orchestration function ``fn(ctx, input)``."""

    def decorate(fn: AgentFunction) -> Agent:
        return Agent(
            name=name,
            version=version,
            fn=fn,
            tools=tuple(tools),
            input_model=input_model,
            budget=budget or Budget(),
            model=model or ModelSpec(),
            config=dict(config or {}),
            scenarios=dict(scenarios or {}),
        )

    return decorate


class UnknownAgent(LookupError):
    pass


class Registry:
    """The agents a process can run, by name and version."""

    def __init__(self, agents: Sequence[Agent] = ()):
        self._agents: dict[tuple[str, int], Agent] = {}
        for a in agents:
            self.register(a)

    def register(self, agent: Agent) -> Agent:
        key = (agent.name, agent.version)
        existing = self._agents.get(key)
        if existing is not None and existing is not agent:
            raise ValueError(f"agent {agent.name!r} version {agent.version} is registered twice")
        self._agents[key] = agent
        return agent

    def get(self, name: str, version: int) -> Agent | None:
        return self._agents.get((name, version))

    def tool_of(self, run: Any, name: str) -> Tool | None:
        """The tool ``name`` of the agent version ``run`` (a Run) is pinned to, if deployed."""
        agent = self.get(run.agent_name, run.agent_version)
        return agent.tool(name) if agent is not None else None

    def latest(self, name: str) -> Agent:
        versions = [a for (n, _), a in self._agents.items() if n == name]
        if not versions:
            known = ", ".join(sorted({n for n, _ in self._agents})) or "none"
            raise UnknownAgent(f"no agent named {name!r} is registered (known: {known})")
        return max(versions, key=lambda a: a.version)

    def names(self) -> list[str]:
        return sorted({n for n, _ in self._agents})
