"""A provider for any server that speaks OpenAI chat completions, via the official SDK.

The SDK's own retries are off (``max_retries=0``): the engine owns retries so that every
attempt is recorded. Every failure leaves here as one of the ``ModelError`` classes.

The SDK does not validate response bodies (``_strict_response_validation`` is off by
default), so a 200 can come back as a plain ``str`` (non-JSON body without a JSON
content type), a ``list``/``None`` (JSON that is not an object) or a ``ChatCompletion``
whose fields hold whatever the JSON held, ``None`` included. The reply is therefore
checked field by field here rather than trusted.
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import openai
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agentruns.llm.base import (
    MalformedModelResponse,
    ModelRateLimited,
    ModelReply,
    ModelRequest,
    ModelRequestRejected,
    ModelUnavailable,
    RawToolCall,
)

# Only used when a call does not pass its own timeout; ``complete`` always does.
_CLIENT_DEFAULT_TIMEOUT = 60.0
# How much of an unexpected body to quote in an error message.
_SNIPPET_CHARS = 200
# Status codes below 500 that are about the moment, not the request (the SDK retries them too).
_TRANSIENT_4XX = frozenset({408, 409})


class OpenAICompatibleProvider:
    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str | None = None,
        client: Any = None,
    ):
        if client is None:
            if not api_key:
                # The SDK would raise a generic "Missing credentials" error, or silently
                # pick up OPENAI_API_KEY from the environment when given None.
                raise ValueError(
                    "OpenAICompatibleProvider needs an api_key (any non-empty value for "
                    "servers that ignore it)"
                )
            client = openai.OpenAI(
                base_url=base_url,
                api_key=api_key,
                max_retries=0,
                timeout=_CLIENT_DEFAULT_TIMEOUT,
            )
        self.base_url = base_url
        self.model = model
        self._client = client

    @classmethod
    def from_settings(cls) -> OpenAICompatibleProvider:
        base_url = getattr(settings, "OPENAI_BASE_URL", "")
        api_key = getattr(settings, "OPENAI_API_KEY", "")
        if not base_url:
            raise ImproperlyConfigured("OPENAI_BASE_URL is not set")
        if not api_key:
            raise ImproperlyConfigured(
                "OPENAI_API_KEY is not set (use any non-empty value for servers that ignore it)"
            )
        return cls(
            base_url=base_url,
            api_key=api_key,
            model=getattr(settings, "OPENAI_MODEL", None) or None,
        )

    def complete(self, request: ModelRequest, *, timeout: float) -> ModelReply:
        model = request.model or self.model
        if not model:
            raise ModelRequestRejected(
                f"{self.name}: no model given in the request and no default model configured",
                error_class="invalid_request",
            )
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": request.messages,
            "timeout": timeout,
        }
        if request.tools:
            kwargs["tools"] = request.tools
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature

        try:
            response = self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise ModelUnavailable(
                f"{self.name}: no response from {self.base_url} within {timeout:g}s"
            ) from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            raise ModelUnavailable(
                f"{self.name}: could not reach {self.base_url}: {cause}"
            ) from exc
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except openai.APIResponseValidationError as exc:
            raise MalformedModelResponse(
                f"{self.name}: HTTP {exc.status_code} body does not fit the chat-completions "
                f"shape: {exc.message}"
            ) from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # The SDK calls response.json() unguarded when the content type says JSON.
            raise MalformedModelResponse(
                f"{self.name}: the response claims to be JSON but is not ({exc})"
            ) from exc

        return self._reply(response, requested_model=model)

    def _status_error(self, exc: openai.APIStatusError) -> Exception:
        status = exc.status_code
        what = f"{self.name}: HTTP {status}: {_provider_message(exc)}"
        if exc.request_id:
            what += f" (request id {exc.request_id})"
        if isinstance(exc, openai.RateLimitError) or status == 429:
            return ModelRateLimited(what, retry_after=parse_retry_after(exc.response.headers))
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return ModelRequestRejected(what, error_class="authentication")
        if status >= 500 or status in _TRANSIENT_4XX:
            return ModelUnavailable(what)
        return ModelRequestRejected(what, error_class="invalid_request")

    def _reply(self, response: Any, *, requested_model: str) -> ModelReply:
        malformed = f"{self.name}: malformed chat-completions response"
        if not hasattr(response, "choices"):
            raise MalformedModelResponse(
                f"{malformed}: expected a chat.completion object, got "
                f"{type(response).__name__} {_snippet(response)}"
            )
        choices = response.choices
        if not isinstance(choices, list) or not choices:
            raise MalformedModelResponse(f"{malformed}: no choices (got {_snippet(choices)})")
        message = getattr(choices[0], "message", None)
        if message is None or not hasattr(message, "content"):
            raise MalformedModelResponse(f"{malformed}: the first choice has no message")

        content = message.content
        if content is not None and not isinstance(content, str):
            raise MalformedModelResponse(
                f"{malformed}: message content is {type(content).__name__}, not text"
            )
        finish_reason = getattr(choices[0], "finish_reason", None)
        if finish_reason is not None and not isinstance(finish_reason, str):
            finish_reason = str(finish_reason)

        reported_model = getattr(response, "model", None)
        usage = getattr(response, "usage", None)
        return ModelReply(
            content=content,
            tool_calls=self._tool_calls(getattr(message, "tool_calls", None), malformed),
            finish_reason=finish_reason,
            input_tokens=_token_count(getattr(usage, "prompt_tokens", None)),
            output_tokens=_token_count(getattr(usage, "completion_tokens", None)),
            # Some compatible servers leave the model out; the one asked for is the best guess.
            model=reported_model if isinstance(reported_model, str) else requested_model,
        )

    @staticmethod
    def _tool_calls(raw_calls: Any, malformed: str) -> list[RawToolCall]:
        if raw_calls is None:
            return []
        if not isinstance(raw_calls, list):
            raise MalformedModelResponse(f"{malformed}: tool_calls is not a list")
        calls = []
        for index, call in enumerate(raw_calls):
            where = f"{malformed}: tool call {index}"
            call_type = getattr(call, "type", None)
            if call_type not in (None, "function"):
                raise MalformedModelResponse(f"{where} has unsupported type {call_type!r}")
            call_id = getattr(call, "id", None)
            if not isinstance(call_id, str) or not call_id:
                raise MalformedModelResponse(f"{where} has no id")
            function = getattr(call, "function", None)
            name = getattr(function, "name", None)
            if not isinstance(name, str) or not name:
                raise MalformedModelResponse(f"{where} ({call_id}) has no function name")
            arguments = getattr(function, "arguments", None)
            if not isinstance(arguments, str):
                # Arguments are JSON *text* in this format; an object here means the server
                # is not speaking it, and re-serialising would hide what the model produced.
                raise MalformedModelResponse(
                    f"{where} ({call_id}) has arguments of type {type(arguments).__name__}, "
                    "not a string"
                )
            calls.append(RawToolCall(id=call_id, name=name, arguments=arguments))
        return calls


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date).

    None when absent or unreadable; a date in the past gives 0.
    """
    millis = _finite_float(headers.get("retry-after-ms"))
    if millis is not None:
        return max(millis / 1000, 0.0)
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _finite_float(value)
    if seconds is not None:
        return max(seconds, 0.0)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # "-0000" parses to a naive datetime; HTTP dates are always UTC.
        when = when.replace(tzinfo=datetime.UTC)
    return max(when.timestamp() - time.time(), 0.0)


def _finite_float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _token_count(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return 0


def _provider_message(exc: openai.APIStatusError) -> str:
    # The SDK has already unwrapped {"error": {...}} into body when the body was JSON.
    body = exc.body
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body.strip():
        return _snippet(body)
    return "(no message from the provider)"


def _snippet(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    if len(text) > _SNIPPET_CHARS:
        text = text[:_SNIPPET_CHARS] + "..."
    return repr(text) if isinstance(value, str) else text
