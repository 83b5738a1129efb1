"""Log lines as JSON objects, one a line, for a log platform to follow one run by
(``HOLDFAST_LOG_FORMAT=json``; settings' LOGGING names these classes).

Every line carries ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``;
and, when the line was written while the engine worked on a run, ``run_id``,
``step_id`` and ``effect_key`` as far as they are known (or as a caller passed them
in ``extra=``), and ``exception`` with the traceback when there is one.

Logging is configured before the apps are loaded, so this module imports none of
them: the composition root hands it the engine's context reader
(``agentruns.runtime.observe.log_context``) once they are.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime

CONTEXT_FIELDS = ("run_id", "step_id", "effect_key")

_read_context: Callable[[], dict[str, str]] = dict


def install_context(read: Callable[[], dict[str, str]]) -> None:
    """Where the run and step a log line is about are read from (config/wiring.py)."""
    global _read_context
    _read_context = read


class RunContextFilter(logging.Filter):
    """Puts the run, step and effect key the engine is working on onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            context = _read_context()
        except Exception:
            context = {}
        for field in CONTEXT_FIELDS:
            if getattr(record, field, None) is None and field in context:
                setattr(record, field, context[field])
        return True


# django-q2's three INFO lines per task: enqueued (in the process that starts a run),
# picked up (the worker) and processed (the monitor).
_TASK_CHATTER = re.compile(r"Enqueued \[|Processed '|\S+ processing \S+ '")


class TaskChatterFilter(logging.Filter):
    """Drops django-q2's per-task INFO lines unless the log level is DEBUG.

    Every run's wake-up is a task, so at INFO they were three lines (and their
    formatting and writing) per run saying what the run's own events already say;
    a failed task is still logged (at ERROR), and so are the cluster's start and stop.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO or logging.getLogger().isEnabledFor(logging.DEBUG):
            return True
        return not _TASK_CHATTER.match(record.getMessage())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = str(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)
