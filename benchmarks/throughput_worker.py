"""A management command with a profiler in every process, for ``throughput.py --profile``.

    python benchmarks/throughput_worker.py worker        # instead of manage.py worker
    python benchmarks/throughput_worker.py sweep --loop  # instead of manage.py sweep --loop

Started by the benchmark instead of the command itself when it profiles. Before
the cluster forks, it arms three things that every process of the cluster
inherits:

- a cProfile profiler timing CPU (not wall) time, started afresh in each forked process (the worker
  processes, the monitor, the pusher, the sentinel);
- a count of every SQL statement the process sends, by its shape, at the psycopg
  level (the engine's own statements go to psycopg directly, past Django's
  cursor wrappers);
- a SIGUSR1 handler that writes both to ``HOLDFAST_BENCH_PROFILE_DIR`` as
  ``<role>-<pid>.prof`` and ``<role>-<pid>.json``, and carries on.

The role (worker, monitor, pusher, sentinel) comes from which of django-q2's
process functions the process runs. Never used outside the benchmark.
"""

from __future__ import annotations

import cProfile
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROFILE_DIR_ENV = "HOLDFAST_BENCH_PROFILE_DIR"

_role = "main"
_profiler: cProfile.Profile | None = None
_statements: Counter[str] = Counter()
_NUMBERS = re.compile(r"\b\d+\b")
_SPACE = re.compile(r"\s+")


def statement_shape(sql: object) -> str:
    """A statement without its literal numbers, cut short: what is counted."""
    text = sql.decode() if isinstance(sql, bytes) else str(sql)
    text = _SPACE.sub(" ", _NUMBERS.sub("N", text)).strip()
    return text[:110]


def _count_statements() -> None:
    import psycopg

    original_execute = psycopg.Cursor.execute
    original_executemany = psycopg.Cursor.executemany

    def execute(self, query, params=None, **kwargs):
        _statements[statement_shape(query)] += 1
        return original_execute(self, query, params, **kwargs)

    def executemany(self, query, params_seq, **kwargs):
        _statements[statement_shape(query)] += 1
        return original_executemany(self, query, params_seq, **kwargs)

    psycopg.Cursor.execute = execute
    psycopg.Cursor.executemany = executemany


def _start_profiler() -> None:
    global _profiler
    _statements.clear()
    # CPU time, not wall time: what a process spends, not what it waits for.
    _profiler = cProfile.Profile(time.process_time)
    _profiler.enable()


def _dump(signum, frame) -> None:
    out = Path(os.environ[PROFILE_DIR_ENV])
    name = f"{_role}-{os.getpid()}"
    if _profiler is not None:
        _profiler.disable()
        _profiler.dump_stats(str(out / f"{name}.prof"))
    (out / f"{name}.json").write_text(json.dumps({"role": _role, "statements": _statements}))
    if _profiler is not None:
        _profiler.enable()


def _with_role(role: str, target):
    def run(*args, **kwargs):
        global _role
        _role = role
        return target(*args, **kwargs)

    return run


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django_q import cluster

    _count_statements()
    cluster.worker = _with_role("worker", cluster.worker)
    cluster.monitor = _with_role("monitor", cluster.monitor)
    cluster.pusher = _with_role("pusher", cluster.pusher)
    cluster.Sentinel = _with_role("sentinel", cluster.Sentinel)
    global _role
    command = argv or ["worker"]
    _role = "sweeper" if command[0] == "sweep" else command[0]
    os.register_at_fork(after_in_child=_start_profiler)
    signal.signal(signal.SIGUSR1, _dump)
    _start_profiler()
    call_command(*command)


if __name__ == "__main__":
    main(sys.argv[1:])
