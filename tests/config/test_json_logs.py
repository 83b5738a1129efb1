"""HOLDFAST_LOG_FORMAT=json: one JSON object a line, carrying the run, step and effect key."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from pydantic import BaseModel

from agentruns.models import Step
from agentruns.runtime import agent, idempotent, tool
from config.logging import JsonFormatter, RunContextFilter
from tests.agentruns.runtime import agents
from tests.harness import ROOT, Harness

tool_log = logging.getLogger("tests.notify")


class NoteArgs(BaseModel):
    text: str


@tool(
    name="notify",
    args=NoteArgs,
    description="Send a note.",
    recovery=idempotent(timedelta(hours=1)),
)
def notify(request: dict, call) -> dict:
    tool_log.info("sending %s", request["text"])
    return {"sent": True}


@agent(name="notifier", version=1, tools=[notify])
def notifier(ctx, input):
    return {"sent": ctx.tool("notify", {"text": "hello"}).ok}


@pytest.fixture
def json_lines():
    """What the console handler settings configure writes, captured."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RunContextFilter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    root.removeHandler(handler)
    root.setLevel(level)


@pytest.mark.django_db(transaction=True)
def test_a_line_written_during_a_step_carries_its_run_step_and_effect_key(tenant, json_lines):
    harness = Harness(tenant)
    harness.registry = agents.registry(notifier)
    harness.engine = harness.build()
    run = harness.start("notifier")
    assert harness.advance(run) == "finished:completed"
    logging.getLogger("tests.after").info("after the run")

    lines = json_lines()
    sending = next(line for line in lines if line["logger"] == "tests.notify")
    step = Step.objects.get(run=run, name="notify")
    assert sending["run_id"] == str(run.id)
    assert sending["step_id"] == step.step_id == "0000.tool.notify"
    assert sending["effect_key"] == step.effect_key
    assert sending["message"] == "sending hello"
    assert sending["level"] == "INFO"
    assert sending["time"].endswith("+00:00")
    after = next(line for line in lines if line["logger"] == "tests.after")
    assert not {"run_id", "step_id", "effect_key"} & set(after)


def test_a_line_keeps_the_context_its_caller_gave_and_its_traceback(json_lines):
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("tests.explicit").exception("failed", extra={"run_id": "r-1"})
    (line,) = [line for line in json_lines() if line["logger"] == "tests.explicit"]
    assert line["run_id"] == "r-1"
    assert "step_id" not in line
    assert "ValueError: boom" in line["exception"]


def _log_one_line(log_format: str) -> subprocess.CompletedProcess:
    code = (
        "import django, logging; django.setup(); "
        "logging.getLogger('holdfast.check').warning('one line')"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "HOLDFAST_LOG_FORMAT": log_format,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_setting_turns_every_line_into_json():
    done = _log_one_line("json")
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stderr.strip().splitlines()[-1])
    assert {key: line[key] for key in ("level", "logger", "message")} == {
        "level": "WARNING",
        "logger": "holdfast.check",
        "message": "one line",
    }


def test_an_unknown_log_format_is_refused_at_start():
    done = _log_one_line("xml")
    assert done.returncode != 0
    assert "HOLDFAST_LOG_FORMAT must be 'plain' or 'json', not 'xml'" in done.stderr
