"""Pydantic AI agents as Holdfast agents: durable steps, recovery, approvals.

An existing ``pydantic_ai.Agent`` becomes a registered Holdfast agent with a
recovery declaration on each tool and one call::

    support = Agent("openai:gpt-5.2", instructions="Be concise.")

    @support.tool_plain
    @durable(recovery=READ_ONLY, provider="shop")
    def lookup_order(order_id: str) -> dict: ...

    AGENTS = [holdfast_agent(support, name="support", version=1)]

What each part of a Pydantic AI run becomes:

- every model request is a Holdfast model step (``RunContext.model_exchange``):
  the conversation, the tools offered and the settings are its identity, the
  provider, model, tokens and cost (from Pydantic AI's price data, where it knows
  the model) its evidence; on replay the recorded response is handed back and
  the model is not called;
- every tool call is a Holdfast tool step (``RunContext.tool``), with the
  recovery declared by ``@durable`` next to the tool; the tool reads its effect
  key and the rest of its ``CallInfo`` with ``current_call()``; a recorded result
  is handed back on replay, and a definite refusal reaches the model as the
  tool's failure (Pydantic AI's ``ToolFailed``);
- a tool with ``requires_approval=True`` (or an ``approval=`` policy) waits at
  Holdfast's approval gate, bound to its exact arguments, never as a deferred
  result its caller could edit; a rejection reaches the model as the tool's
  failure with the approver's note;
- Pydantic AI validates the output; its refusals of an answer are recorded in
  the evidence of the model step that carries them back to the model, and a run
  whose output never validates fails saying so.

The threads: Pydantic AI is async, while a run's context records on the run's
own thread through Django's database connection (which refuses to be used from a
thread running an event loop). So the Pydantic AI loop runs on an event loop in
a helper thread, and the model and toolset wrapped around the agent's own hand
each step to the run's thread (``_Bridge``), which records it through the
ordinary run context and hands the answer back. The call itself (the model's
request, the tool's function) runs on the helper's loop while the run's thread
waits for it, holding its heartbeat. Tool calls run one at a time
(``parallel_tool_call_execution_mode("sequential")``), so a step's position never
depends on timing.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.exceptions import (
    ApprovalRequired,
    CallDeferred,
    ModelAPIError,
    ModelAuthenticationError,
    ModelRateLimitError,
    ModelRequestRejectedError,
    ModelRetry,
    ToolFailed,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryFeedbackPart,
    RetryPromptPart,
    ToolReturnPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
from pydantic_core import to_jsonable_python

from agentruns.llm.base import (
    ModelError,
    ModelRateLimited,
    ModelRequestRejected,
    ModelUnavailable,
)
from agentruns.runtime import (
    Agent,
    ApprovalPolicy,
    Budget,
    CallInfo,
    LookupResult,
    ModelAnswer,
    ModelSpec,
    Recovery,
    RetryPolicy,
    RunContext,
    Tool,
    ToolRefused,
    ToolResult,
    Undo,
    always,
    canonical_json,
)

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_DECLARATION = "__holdfast_durable__"
# Allowance over a tool's own timeout for handing its call to the loop and back.
_HANDOVER_SECONDS = 1.0


class PydanticAIAgentError(ValueError):
    """A Pydantic AI agent cannot be run as declared (a tool without a recovery declaration)."""


class OutputNotValid(Exception):
    """The model's answers never passed Pydantic AI's output validation."""


# --- declaring tools ----------------------------------------------------------------


@dataclass(frozen=True)
class Durable:
    """What Holdfast needs to know of a Pydantic AI tool: its recovery, and its approval."""

    recovery: Recovery
    lookup: Callable[[dict[str, Any], CallInfo], LookupResult] | None = None
    undo: Undo | None = None
    retry: RetryPolicy | None = None
    timeout: float = 10.0
    approval: ApprovalPolicy | None = None
    provider: str = ""
    personal_data: bool = False


def durable(
    *,
    recovery: Recovery,
    lookup: Callable[[dict[str, Any], CallInfo], LookupResult] | None = None,
    undo: Undo | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = 10.0,
    approval: ApprovalPolicy | None = None,
    provider: str = "",
    personal_data: bool = False,
) -> Callable[[F], F]:
    """Declare, next to a Pydantic AI tool, how Holdfast recovers it.

    ``recovery`` is ``READ_ONLY``, ``idempotent(window, lookup=…)``, ``lookup()`` or
    ``MANUAL``; ``lookup(args, call)`` finds what an interrupted call did by its
    effect key; ``undo`` names a Holdfast tool that compensates it (given to
    ``holdfast_agent(tools=…)``: a compensation runs after the agent's loop, not
    inside it); ``approval`` an ``ApprovalPolicy``; ``personal_data`` that its
    arguments or answers name a person (as ``@tool`` declares it). The decorated
    function is returned unchanged, so it goes under ``@agent.tool`` /
    ``@agent.tool_plain``.
    """
    declaration = Durable(recovery, lookup, undo, retry, timeout, approval, provider, personal_data)

    def mark(function: F) -> F:
        setattr(function, _DECLARATION, declaration)
        return function

    return mark


_CALL: contextvars.ContextVar[CallInfo] = contextvars.ContextVar("holdfast_pydantic_ai_call")


def current_call() -> CallInfo:
    """The Holdfast call a tool function is running as: its effect key, attempt,
    timeout, the run's pinned configuration and its tenant's credentials."""
    try:
        return _CALL.get()
    except LookupError:
        raise RuntimeError(
            "current_call() is only known inside a tool call that Holdfast runs"
        ) from None


# --- the agent ------------------------------------------------------------------------


def holdfast_agent(
    agent: PydanticAgent[Any, Any],
    *,
    name: str,
    version: int,
    model: Model | None = None,
    prompt: Callable[[dict[str, Any]], str] | None = None,
    deps: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
    outcome: Callable[[Any, list[ModelMessage]], tuple[str, str] | None] | None = None,
    input_model: type[BaseModel] | None = None,
    tools: Sequence[Tool] = (),
    budget: Budget | None = None,
    config: dict[str, Any] | None = None,
    pricing: tuple[Decimal, Decimal] = (Decimal(0), Decimal(0)),
    model_timeout: float = 60.0,
) -> Agent:
    """A Holdfast agent that runs ``agent`` durably.

    - ``model``: the model to call instead of the agent's own (a deployment's choice);
    - ``prompt(input)``: the user prompt from the run's input (default: ``input["prompt"]``);
    - ``deps(input, config)``: the run's Pydantic AI dependencies, from its input and
      pinned configuration;
    - ``outcome(output, messages)``: what the run's end means, ``(code, detail)``,
      recorded as ``ctx.outcome``;
    - ``tools``: Holdfast tools the agent's tools name as their undo;
    - ``pricing``: USD per million (input, output) tokens for a model Pydantic AI's
      price data does not know (none: cost 0).

    The run's output is the agent's output as JSON.
    """
    model = model or agent.model
    if not isinstance(model, Model):
        raise PydanticAIAgentError(
            f"agent {name!r}: the Pydantic AI agent names no model; give it one, or give "
            "holdfast_agent(model=…)"
        )
    declared = _declared_tools(agent, name)
    holdfast_tools = [_holdfast_tool(tool, declaration) for tool, declaration in declared]
    run = _Runner(agent, model, prompt, deps, outcome)
    return Agent(
        name=name,
        version=version,
        fn=run,
        tools=(*holdfast_tools, *tools),
        input_model=input_model,
        budget=budget or Budget(),
        model=ModelSpec(
            provider=model.system,
            model=model.model_name,
            prompt_version=f"pydantic-ai:{name}:{version}",
            pricing=pricing,
            timeout=model_timeout,
        ),
        config=dict(config or {}),
    )


def _declared_tools(agent: PydanticAgent[Any, Any], name: str):
    found = []
    for toolset in agent.toolsets:
        if not isinstance(toolset, FunctionToolset):
            raise PydanticAIAgentError(
                f"agent {name!r}: toolset {toolset.label} is not a function toolset; Holdfast "
                "runs tools it can declare at registration (functions with @durable)"
            )
        for tool in toolset.tools.values():
            declaration = getattr(tool.function, _DECLARATION, None)
            if declaration is None:
                raise PydanticAIAgentError(
                    f"agent {name!r}: tool {tool.name!r} has no recovery declaration; "
                    "add @durable(recovery=…) under its @agent.tool"
                )
            found.append((tool, declaration))
    return found


def _holdfast_tool(tool, declaration: Durable) -> Tool:
    approval = declaration.approval
    if approval is None and tool.requires_approval:
        approval = _ask_every_time(tool.name)
    return Tool(
        name=tool.name,
        description=tool.description or "",
        args_model=_arguments_model(tool.name, tool.tool_def.parameters_json_schema),
        recovery=declaration.recovery,
        call=_bridged(tool.name),
        find=declaration.lookup,
        undo=declaration.undo,
        retry=declaration.retry or RetryPolicy(),
        timeout=declaration.timeout,
        approval=approval,
        provider=declaration.provider,
        personal_data=declaration.personal_data,
    )


def _ask_every_time(tool_name: str) -> ApprovalPolicy:
    """The approval of a tool Pydantic AI says always needs one: bound to its exact arguments."""
    return ApprovalPolicy(
        required=always,
        resource=lambda args: f"tool:{tool_name}",
        resource_state=lambda args, call: {},
        preview=lambda args: f"{tool_name}({canonical_json(args)})",
    )


def _arguments_model(tool_name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """The arguments as Holdfast stores them: Pydantic AI has validated them already,
    so this model keeps them as they are and shows the tool's own JSON schema."""

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow")

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return schema

    Arguments.__name__ = Arguments.__qualname__ = f"{tool_name}_arguments"
    return Arguments


class _Runner:
    """The Holdfast agent function: one Pydantic AI run per claim, replayed from its steps."""

    def __init__(self, agent, model, prompt, deps, outcome):
        self.agent = agent
        self.model = model
        self.prompt = prompt or (lambda input: input["prompt"])
        self.deps = deps
        self.outcome = outcome

    def __call__(self, ctx: RunContext, input: dict[str, Any]) -> Any:
        bridge = _Bridge(ctx)
        model = _HoldfastModel(self.model, bridge)
        toolsets = [_HoldfastToolset(toolset, bridge) for toolset in self.agent.toolsets]
        deps = self.deps(input, ctx.config) if self.deps is not None else None
        prompt = self.prompt(input)

        async def main():
            with (
                self.agent.override(model=model, tools=[], toolsets=toolsets),
                PydanticAgent.parallel_tool_call_execution_mode("sequential"),
            ):
                return await self.agent.run(prompt, deps=deps)

        try:
            result = bridge.run(main)
        except UnexpectedModelBehavior as exc:
            if "output retries" in exc.message:
                raise OutputNotValid(f"the output never passed validation: {exc.message}") from exc
            raise
        output = to_jsonable_python(result.output)
        if self.outcome is not None:
            declared = self.outcome(result.output, result.all_messages())
            if declared is not None:
                ctx.outcome(*declared)
        return output


# --- the bridge between the Pydantic AI loop and the run's thread ----------------------


class _Halted(BaseException):
    """The run stopped on its own thread (a suspension, a divergence, a lost lease):
    the Pydantic AI loop is unwound without recording anything."""


@dataclass
class _Ask:
    perform: Callable[[RunContext], Any]
    future: asyncio.Future[Any]


@dataclass
class _Ended:
    output: Any = None
    error: BaseException | None = None


class _Bridge:
    """Hands each step the Pydantic AI loop (helper thread) asks for to the run's thread."""

    def __init__(self, ctx: RunContext):
        self.ctx = ctx
        self._asks: queue.SimpleQueue[_Ask | _Ended] = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None

    # On the helper's loop.

    async def ask(self, perform: Callable[[RunContext], T]) -> T:
        """Have ``perform(ctx)`` run on the run's thread; its answer, or its halt."""
        future = asyncio.get_running_loop().create_future()
        self._asks.put(_Ask(perform, future))
        return await future

    # On the run's thread.

    def run(self, main: Callable[[], Awaitable[T]]) -> T:
        """Run ``main()`` on a helper thread's loop, serving its asks here until it ends."""
        helper = threading.Thread(
            target=self._helper, args=(main,), name=f"pydantic-ai {self.ctx.run_id}", daemon=True
        )
        helper.start()
        while True:
            item = self._asks.get()
            if isinstance(item, _Ended):
                helper.join()
                if item.error is not None:
                    raise item.error
                return item.output
            try:
                answer = item.perform(self.ctx)
            except BaseException:
                # A suspension, a finish, a divergence or a lost lease travels on from
                # here; the loop is unwound first so no thread outlives the claim.
                self._halt(item, helper)
                raise
            self.loop.call_soon_threadsafe(_settle, item.future, answer)

    def on_loop(self, coroutine: Awaitable[T], timeout: float) -> T:
        """Run ``coroutine`` on the helper's loop (waiting for this thread's answer) and wait."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def _halt(self, item: _Ask, helper: threading.Thread) -> None:
        self.loop.call_soon_threadsafe(_fail, item.future, _Halted())
        while not isinstance(ended := self._asks.get(), _Ended):
            self.loop.call_soon_threadsafe(_fail, ended.future, _Halted())
        helper.join()

    def _helper(self, main: Callable[[], Awaitable[T]]) -> None:
        async def on_loop() -> T:
            self.loop = asyncio.get_running_loop()
            return await main()

        try:
            output = asyncio.run(on_loop())
        except BaseException as exc:  # carried to the run's thread, raised there
            self._asks.put(_Ended(error=exc))
        else:
            self._asks.put(_Ended(output=output))


def _settle(future: asyncio.Future[Any], answer: Any) -> None:
    if not future.done():
        future.set_result(answer)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


# --- model requests -----------------------------------------------------------------------


class _HoldfastModel(WrapperModel):
    """The agent's model, each request recorded as a Holdfast model step."""

    def __init__(self, wrapped: Model, bridge: _Bridge):
        super().__init__(wrapped)
        self._bridge = bridge

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        identity = _request_identity(messages, model_settings, model_request_parameters)
        refusals = _refusals(messages)

        def call(timeout: float) -> ModelAnswer:
            coroutine = self.wrapped.request(messages, model_settings, model_request_parameters)
            try:
                response = self._bridge.on_loop(coroutine, timeout)
            except ModelAPIError as exc:
                raise _model_error(exc) from exc
            except TimeoutError as exc:
                raise ModelUnavailable(f"no answer within {timeout:g}s") from exc
            return ModelAnswer(
                result=ModelMessagesTypeAdapter.dump_python([response], mode="json")[0],
                model=response.model_name or self.wrapped.model_name,
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
                cost_micros=_cost_micros(response),
                validation=refusals,
            )

        recorded = await self._bridge.ask(lambda ctx: ctx.model_exchange(identity, call))
        (response,) = ModelMessagesTypeAdapter.validate_python([recorded])
        return response

    @asynccontextmanager
    async def request_stream(self, *args: Any, **kwargs: Any):
        raise NotImplementedError(
            "a Pydantic AI agent on Holdfast is run with agent.run: a streamed response is "
            "not recorded as one step"
        )
        # A context manager, as Model.request_stream is: entering it raises the refusal
        # above, not a TypeError about its shape.
        yield


def _request_identity(
    messages: list[ModelMessage],
    settings: ModelSettings | None,
    parameters: ModelRequestParameters,
) -> dict[str, Any]:
    """What makes a model request this request, as JSON: the conversation without its
    timestamps and run ids (new on every replay), the tools and output offered, the settings."""
    conversation = []
    for message in ModelMessagesTypeAdapter.dump_python(messages, mode="json"):
        parts = [{k: v for k, v in part.items() if k != "timestamp"} for part in message["parts"]]
        entry = {"kind": message["kind"], "parts": parts}
        if message["kind"] == "request":
            entry["instructions"] = message.get("instructions")
        conversation.append(entry)
    return {
        "messages": conversation,
        "tools": [_tool_identity(t) for t in parameters.function_tools],
        "output_tools": [_tool_identity(t) for t in parameters.output_tools],
        "output_mode": parameters.output_mode,
        "allow_text_output": parameters.allow_text_output,
        "settings": to_jsonable_python(settings or {}),
    }


def _tool_identity(tool: ToolDefinition) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters_json_schema,
        "kind": tool.kind,
    }


def _refusals(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """What Pydantic AI refused in the model's previous answer (its output, or a tool's
    arguments, failed validation), as this request carries it back to the model."""
    if not messages or not isinstance(messages[-1], ModelRequest):
        return []
    return [
        {
            "name": f"{getattr(part, 'tool_name', None) or 'text output'} (previous answer)",
            "valid": False,
            "error": _problems(part.content),
        }
        for part in messages[-1].parts
        if isinstance(part, RetryFeedbackPart | RetryPromptPart)
        or (isinstance(part, ToolReturnPart) and part.outcome == "retried")
    ]


def _problems(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "; ".join(
        f"{'.'.join(str(p) for p in error.get('loc', ())) or '(root)'}: {error.get('msg', '')}"
        for error in content
    )


def _cost_micros(response: ModelResponse) -> int | None:
    """The response's cost in USD millionths: the cost its usage carries (what the provider
    reported, where it reports one), else Pydantic AI's price data for the model; None when
    neither knows it (the agent's pinned pricing applies)."""
    cost = response.usage.cost
    if cost is None:
        try:
            cost = response.cost().total_price
        except (LookupError, ValueError, AssertionError):
            return None
    return int(Decimal(cost) * 1_000_000)


# A request the provider refused as such: asking again will not help.
_REJECTED_STATUSES = frozenset({400, 401, 403, 404, 413, 422})


def _model_error(exc: ModelAPIError) -> ModelError:
    """Pydantic AI's model error as the engine's, which decides whether to retry (§3.5)."""
    status = getattr(exc, "status_code", None)
    if isinstance(exc, ModelRateLimitError) or status == 429:
        return ModelRateLimited(str(exc), retry_after=exc.retry_after)
    if isinstance(exc, ModelRequestRejectedError) or status in _REJECTED_STATUSES:
        authentication = isinstance(exc, ModelAuthenticationError) or status in (401, 403)
        error_class = "authentication" if authentication else "invalid_request"
        return ModelRequestRejected(str(exc), error_class=error_class)
    return ModelUnavailable(f"{type(exc).__name__}: {exc}")


# --- tool calls -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PendingCall:
    """A tool call the Pydantic AI loop is waiting on, as the run's thread performs it."""

    bridge: _Bridge
    toolset: AbstractToolset[Any]
    name: str
    run_context: Any  # pydantic_ai.RunContext
    tool: ToolsetTool[Any]

    def perform(self, request: dict[str, Any], call: CallInfo) -> Any:
        """One attempt of the tool with the stored request, on the helper's loop."""
        arguments = self.tool.args_validator.validate_python(request)

        async def attempt():
            token = _CALL.set(call)
            try:
                return await self.toolset.call_tool(
                    self.name, arguments, self.run_context, self.tool
                )
            finally:
                _CALL.reset(token)

        try:
            value = self.bridge.on_loop(attempt(), call.timeout + _HANDOVER_SECONDS)
        except ModelRetry as exc:
            raise ToolRefused(exc.message, error_class="model_retry") from exc
        except ToolFailed as exc:
            raise ToolRefused(exc.message, error_class="tool_failed") from exc
        except (ApprovalRequired, CallDeferred) as exc:
            raise ToolRefused(
                f"{self.name} deferred itself ({type(exc).__name__}); on Holdfast a call that "
                "needs a person declares an approval policy, decided before anything is sent",
                error_class="policy_rejection",
            ) from exc
        return to_jsonable_python(value)


_PENDING: contextvars.ContextVar[_PendingCall] = contextvars.ContextVar("holdfast_pending_call")


def _bridged(tool_name: str) -> Callable[[dict[str, Any], CallInfo], Any]:
    def call(request: dict[str, Any], info: CallInfo) -> Any:
        pending = _PENDING.get(None)
        if pending is None or pending.name != tool_name:
            # A compensation, say: it runs after the agent's loop, where no Pydantic AI
            # run context exists. Nothing was sent.
            raise ToolRefused(
                f"{tool_name} is a Pydantic AI tool: it runs only inside its agent's loop",
                error_class="invalid_arguments",
            )
        return pending.perform(request, info)

    return call


class _HoldfastToolset(WrapperToolset[Any]):
    """The agent's toolset, each call recorded as a Holdfast tool step."""

    def __init__(self, wrapped: AbstractToolset[Any], bridge: _Bridge):
        super().__init__(wrapped)
        self._bridge = bridge

    async def get_tools(self, ctx) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        # A tool Pydantic AI would defer for approval is called here instead: Holdfast's
        # gate holds it, bound to its exact arguments, before anything is sent.
        return {
            name: (
                dataclasses.replace(
                    tool, tool_def=dataclasses.replace(tool.tool_def, kind="function")
                )
                if tool.tool_def.kind == "unapproved"
                else tool
            )
            for name, tool in tools.items()
        }

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx, tool) -> Any:
        pending = _PendingCall(self._bridge, self.wrapped, name, ctx, tool)
        arguments = to_jsonable_python(tool_args)

        def perform(run: RunContext) -> ToolResult:
            token = _PENDING.set(pending)
            try:
                return run.tool(name, arguments)
            finally:
                _PENDING.reset(token)

        result = await self._bridge.ask(perform)
        if result.ok:
            return result.value
        if result.error_class in ("model_retry", "invalid_arguments"):
            raise ModelRetry(result.error or "invalid arguments")
        raise ToolFailed(f"{result.error_class}: {result.error}")
