"""An agent on the OpenAI-compatible provider, through the engine, against a local server
that speaks the chat-completions wire format: 429, a malformed body, invalid tool
arguments, a tool call, a final answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentruns.models import Step
from agentruns.runtime import ModelSpec, Registry, agent
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


class ScriptedServer:
    """Answers each POST with the next scripted (status, headers, body)."""

    def __init__(self, answers: list[tuple[int, dict[str, str], bytes]]):
        self.answers = list(answers)
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                outer.requests.append(json.loads(self.rfile.read(length)))
                status, headers, body = outer.answers.pop(0)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


def _completion(message: dict, usage=(30, 7)) -> tuple[int, dict[str, str], bytes]:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-test-1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }
    return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def chat_server(settings) -> Iterator[ScriptedServer]:
    server = ScriptedServer(
        [
            (
                429,
                {"Content-Type": "application/json", "Retry-After": "1"},
                b'{"error": {"message": "Rate limit reached", "type": "requests"}}',
            ),
            (200, {"Content-Type": "text/plain"}, b"upstream proxy error"),
            _completion(
                {"content": None, "tool_calls": [_call("c1", "lookup_order", '{"order_id": ')]}
            ),
            _completion(
                {
                    "content": None,
                    "tool_calls": [_call("c2", "lookup_order", '{"order_id": "o-7"}')],
                }
            ),
            _completion({"content": "Order o-7 is 12.00 EUR."}),
        ]
    )
    server.thread.start()
    settings.OPENAI_BASE_URL = server.base_url
    settings.OPENAI_API_KEY = "sk-local"
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@agent(
    name="remote",
    version=1,
    tools=agents.TOOLS,
    model=ModelSpec(provider="openai", model="gpt-test", prompt_version="remote-1"),
)
def remote(ctx, input):
    return agents.support.fn(ctx, input)


def test_an_openai_compatible_model_drives_a_run_through_its_failures(
    harness, chat_server, provider
):
    harness.registry = Registry([remote])
    harness.engine = harness.build()
    run = harness.start("remote", {"message": "how much was o-7?"})

    assert harness.advance(run) == "suspended:waiting_for_retry"  # 429
    step = Step.objects.get(run=run, kind="model")
    assert (step.status, step.last_error_class, step.provider_retry_after) == (
        "planned",
        "rate_limited",
        1.0,
    )
    harness.make_due(run)
    assert harness.advance(run) == "suspended:waiting_for_retry"  # malformed body
    step.refresh_from_db()
    assert step.last_error_class == "malformed_response" and step.attempts == 2
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"

    run.refresh_from_db()
    assert run.output["reply"] == "Order o-7 is 12.00 EUR."
    models = list(Step.objects.filter(run=run, kind="model").order_by("seq"))
    assert models[0].attempts == 3
    assert models[0].model_id == "gpt-test-1"
    assert models[0].validation[0]["valid"] is False
    assert models[1].validation[0]["valid"] is True
    assert provider.calls["lookup_order"] == 1
    # The model saw its malformed call rejected, as a tool message, on its next turn.
    tool_messages = [m for m in chat_server.requests[3]["messages"] if m["role"] == "tool"]
    assert json.loads(tool_messages[0]["content"])["error_class"] == "invalid_arguments"
    assert chat_server.requests[0]["model"] == "gpt-test"
    offered = [t["function"]["name"] for t in chat_server.requests[0]["tools"]]
    assert offered == sorted(t.name for t in agents.TOOLS)
    assert run.tokens_used == 3 * 37
