"""The OpenAI-compatible provider against a real HTTP server on 127.0.0.1 that speaks the
chat-completions wire format, so the SDK's own parsing and error mapping are exercised."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentruns.llm.base import (
    MalformedModelResponse,
    ModelRateLimited,
    ModelRequest,
    ModelRequestRejected,
    ModelUnavailable,
    RawToolCall,
)
from agentruns.llm.openai_compat import OpenAICompatibleProvider, parse_retry_after

API_KEY = "sk-test-123"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Refund order 42."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": "Refund an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "integer"}, "amount": {"type": "number"}},
                "required": ["order_id"],
            },
        },
    }
]


@dataclass
class Reply:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    # Accept the request, then say nothing until the test ends.
    hang: bool = False


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class ChatServer:
    def __init__(self) -> None:
        self.reply = Reply(body=b"{}")
        self.received: list[Received] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.received.append(
                    Received(
                        method="POST",
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=json.loads(raw) if raw else None,
                    )
                )
                reply = server.reply
                if reply.hang:
                    server.release.wait(5)
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def respond_json(self, payload: Any, *, status: int = 200, **headers: str) -> None:
        self.reply = Reply(
            status=status,
            body=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json", **headers},
        )

    def respond_raw(self, body: bytes, *, status: int = 200, content_type: str) -> None:
        self.reply = Reply(status=status, body=body, headers={"Content-Type": content_type})

    def hang(self) -> None:
        self.reply = Reply(hang=True)


@pytest.fixture
def server() -> Iterator[ChatServer]:
    chat_server = ChatServer()
    chat_server.start()
    yield chat_server
    chat_server.stop()


@pytest.fixture
def provider(server: ChatServer) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(
        base_url=server.base_url, api_key=API_KEY, model="default-model"
    )


def completion(message: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    finish_reason = "tool_calls" if message.get("tool_calls") else "stop"
    payload = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "gpt-test-2024",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40},
    }
    payload.update(overrides)
    return payload


def tool_call(call_id: str, name: str | None, arguments: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    return {"id": call_id, "type": "function", "function": function}


def ask(provider: OpenAICompatibleProvider, *, timeout: float = 5.0, **request: Any):
    fields: dict[str, Any] = {"model": "gpt-test", "messages": MESSAGES, **request}
    return provider.complete(ModelRequest(**fields), timeout=timeout)


def error_body(message: str, error_type: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": None}}


# --- successful replies ---------------------------------------------------------------------


def test_it_returns_the_text_reply_with_usage_and_reported_model(server, provider):
    server.respond_json(completion({"content": "Refunded."}))

    reply = ask(provider)

    assert reply.content == "Refunded."
    assert reply.tool_calls == []
    assert reply.finish_reason == "stop"
    assert reply.input_tokens == 31
    assert reply.output_tokens == 9
    assert reply.model == "gpt-test-2024"


def test_it_sends_a_chat_completions_request_with_bearer_auth(server, provider):
    server.respond_json(completion({"content": "ok"}))

    ask(provider, tools=TOOLS, temperature=0.2)

    [received] = server.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {API_KEY}"
    assert received.body["model"] == "gpt-test"
    assert received.body["messages"] == MESSAGES
    assert received.body["tools"] == TOOLS
    assert received.body["temperature"] == 0.2


def test_it_omits_tools_and_temperature_when_not_given(server, provider):
    server.respond_json(completion({"content": "ok"}))

    ask(provider)

    body = server.received[0].body
    assert "tools" not in body
    assert "temperature" not in body


def test_it_uses_the_configured_model_when_the_request_names_none(server, provider):
    server.respond_json(completion({"content": "ok"}))

    ask(provider, model="")

    assert server.received[0].body["model"] == "default-model"


def test_it_returns_tool_calls_with_ids_names_and_raw_arguments_unchanged(server, provider):
    arguments = ['{"order_id": 42, "amount": 12.5}', '{"amount": 12', "", "  {\n}  "]
    server.respond_json(
        completion(
            {
                "content": None,
                "tool_calls": [
                    tool_call(f"call_{i}", "issue_refund", args) for i, args in enumerate(arguments)
                ],
            }
        )
    )

    reply = ask(provider, tools=TOOLS)

    assert reply.content is None
    assert reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [
        RawToolCall(id=f"call_{i}", name="issue_refund", arguments=args)
        for i, args in enumerate(arguments)
    ]


def test_it_counts_zero_tokens_when_the_server_reports_no_usage(server, provider):
    payload = completion({"content": "ok"})
    del payload["usage"]
    server.respond_json(payload)

    reply = ask(provider)

    assert (reply.input_tokens, reply.output_tokens) == (0, 0)


# --- HTTP errors ----------------------------------------------------------------------------


def test_it_maps_a_429_to_rate_limited_with_retry_after(server, provider):
    server.respond_json(
        error_body("Slow down", "rate_limit_error"), status=429, **{"Retry-After": "7"}
    )

    with pytest.raises(ModelRateLimited) as caught:
        ask(provider)

    assert caught.value.retry_after == 7.0
    assert "429" in str(caught.value)
    assert "Slow down" in str(caught.value)


def test_it_prefers_retry_after_ms_on_a_429(server, provider):
    server.respond_json(
        error_body("Slow down"), status=429, **{"Retry-After": "7", "retry-after-ms": "1500"}
    )

    with pytest.raises(ModelRateLimited) as caught:
        ask(provider)

    assert caught.value.retry_after == 1.5


def test_it_leaves_retry_after_unset_when_a_429_gives_none(server, provider):
    server.respond_json(error_body("Slow down"), status=429)

    with pytest.raises(ModelRateLimited) as caught:
        ask(provider)

    assert caught.value.retry_after is None


def test_it_reads_retry_after_as_an_http_date():
    when = datetime.now(UTC) + timedelta(seconds=30)

    seconds = parse_retry_after({"retry-after": format_datetime(when, usegmt=True)})

    assert seconds is not None
    assert 28 <= seconds <= 30


def test_it_reads_a_past_or_unreadable_retry_after_as_zero_or_none():
    past = format_datetime(datetime.now(UTC) - timedelta(minutes=5), usegmt=True)

    assert parse_retry_after({"retry-after": past}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "inf"}) is None
    assert parse_retry_after({}) is None


def test_it_maps_a_500_to_unavailable(server, provider):
    server.respond_json(error_body("The server had an error", "server_error"), status=500)

    with pytest.raises(ModelUnavailable) as caught:
        ask(provider)

    assert "500" in str(caught.value)
    assert "The server had an error" in str(caught.value)


def test_it_maps_a_503_with_an_html_body_to_unavailable_quoting_the_body(server, provider):
    server.respond_raw(b"<h1>Bad gateway</h1>", status=503, content_type="text/html")

    with pytest.raises(ModelUnavailable) as caught:
        ask(provider)

    assert "503" in str(caught.value)
    assert "Bad gateway" in str(caught.value)


@pytest.mark.parametrize("status", [401, 403])
def test_it_maps_401_and_403_to_a_rejected_request_of_class_authentication(
    server, provider, status
):
    server.respond_json(error_body("Incorrect API key provided"), status=status)

    with pytest.raises(ModelRequestRejected) as caught:
        ask(provider)

    assert caught.value.error_class == "authentication"
    assert caught.value.retryable is False
    assert str(status) in str(caught.value)
    assert "Incorrect API key provided" in str(caught.value)


@pytest.mark.parametrize("status", [400, 404, 422])
def test_it_maps_400_404_and_422_to_a_rejected_request_of_class_invalid_request(
    server, provider, status
):
    server.respond_json(error_body("Unknown parameter: 'tool'."), status=status)

    with pytest.raises(ModelRequestRejected) as caught:
        ask(provider)

    assert caught.value.error_class == "invalid_request"
    assert str(status) in str(caught.value)
    assert "Unknown parameter" in str(caught.value)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_the_sdk_does_not_retry_on_its_own(server, provider, status):
    server.respond_json(error_body("nope"), status=status, **{"Retry-After": "0"})

    with pytest.raises((ModelRateLimited, ModelUnavailable)):
        ask(provider)

    assert len(server.received) == 1


# --- malformed 200s -------------------------------------------------------------------------


def test_it_maps_a_200_with_a_non_json_body_to_malformed(server, provider):
    server.respond_raw(b"<html>proxy login</html>", content_type="text/html")

    with pytest.raises(MalformedModelResponse) as caught:
        ask(provider)

    assert "proxy login" in str(caught.value)
    assert len(server.received) == 1


def test_it_maps_a_200_claiming_json_but_not_json_to_malformed(server, provider):
    server.respond_raw(b"{not json", content_type="application/json")

    with pytest.raises(MalformedModelResponse):
        ask(provider)


def test_it_maps_a_200_json_without_choices_to_malformed(server, provider):
    server.respond_json({"id": "chatcmpl-1", "object": "chat.completion", "model": "m"})

    with pytest.raises(MalformedModelResponse, match="no choices"):
        ask(provider)


def test_it_maps_a_200_json_with_empty_choices_to_malformed(server, provider):
    server.respond_json(completion({"content": "x"}, choices=[]))

    with pytest.raises(MalformedModelResponse, match="no choices"):
        ask(provider)


def test_it_maps_a_200_json_that_is_not_an_object_to_malformed(server, provider):
    server.respond_json([{"choices": []}])

    with pytest.raises(MalformedModelResponse, match=r"chat\.completion object"):
        ask(provider)


def test_it_maps_a_tool_call_without_a_function_name_to_malformed(server, provider):
    server.respond_json(completion({"tool_calls": [tool_call("call_1", None, "{}")]}))

    with pytest.raises(MalformedModelResponse, match="no function name"):
        ask(provider)


def test_it_maps_tool_call_arguments_that_are_not_a_string_to_malformed(server, provider):
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    server.respond_json(completion({"tool_calls": [call]}))

    with pytest.raises(MalformedModelResponse, match="not a string"):
        ask(provider)


# --- transport failures ---------------------------------------------------------------------


def test_it_maps_a_server_that_does_not_answer_in_time_to_unavailable(server, provider):
    server.hang()

    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match=r"within 0\.5s"):
        ask(provider, timeout=0.5)

    assert time.monotonic() - started < 2
    assert len(server.received) == 1


def test_it_maps_a_refused_connection_to_unavailable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = OpenAICompatibleProvider(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY)

    with pytest.raises(ModelUnavailable, match="could not reach"):
        ask(provider, timeout=1)


def test_it_refuses_to_build_a_client_without_an_api_key():
    with pytest.raises(ValueError, match="api_key"):
        OpenAICompatibleProvider(base_url="http://127.0.0.1:1/v1", api_key="")


def test_it_builds_from_django_settings(server, settings):
    settings.OPENAI_BASE_URL = server.base_url
    settings.OPENAI_API_KEY = "sk-from-settings"
    settings.OPENAI_MODEL = "settings-model"
    server.respond_json(completion({"content": "ok"}))

    ask(OpenAICompatibleProvider.from_settings(), model="")

    [received] = server.received
    assert received.headers["authorization"] == "Bearer sk-from-settings"
    assert received.body["model"] == "settings-model"
