"""Forward this project's log records to a job's event stream (the UI's log panel) while the job runs."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from pipeline.events import LogLine

PROJECT_LOGGERS = ("pipeline", "memory", "rocm")


class _ListHandler(logging.Handler):
    def __init__(self, sink: list):
        super().__init__(logging.INFO)
        self.sink = sink
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        level = "error" if record.levelno >= logging.ERROR else "warning" if record.levelno >= logging.WARNING \
            else "info"
        message = record.getMessage() if not record.exc_info else record.getMessage()
        self.sink.append(LogLine(level, message))


@contextmanager
def capture_logs() -> Iterator[list]:
    sink: list[LogLine] = []
    handler = _ListHandler(sink)
    loggers = [logging.getLogger(name) for name in PROJECT_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        if lg.level == logging.NOTSET or lg.level > logging.INFO:
            lg.setLevel(logging.INFO)
    try:
        yield sink
    finally:
        for lg, level in zip(loggers, levels):
            lg.removeHandler(handler)
            lg.setLevel(level)
