"""Lines from a file descriptor, each awaited until a deadline.

Standard library only: ``benchmarks/throughput.py`` (the project's Python) and
``benchmarks/dbos_queue.py`` (run by DBOS's own virtualenv, as a script) both read
their children's pipes with it.
"""

from __future__ import annotations

import os
import select
import time


class LineReader:
    """Reads the descriptor itself (select + os.read): a buffered file object may hold a
    line select cannot see, and a line that never comes must not block past the deadline.
    ``error`` is what a timeout or the end of input raises, with what was awaited."""

    def __init__(self, fd: int, error: type[Exception] = RuntimeError):
        self.fd = fd
        self.error = error
        self.buffer = b""

    def readline(self, deadline: float, what: str) -> str:
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self.error(f"timed out waiting for {what}")
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise self.error(f"end of input while waiting for {what}")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()
