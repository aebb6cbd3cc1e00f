"""The command line's logging: the terminal shows warnings (-v: stage messages and tracebacks too); a log file keeps
every message and every traceback, whatever the flags (the error line says where it is)."""
from __future__ import annotations

import logging
from logging.handlers import RotatingFileHandler
from pathlib import Path

from common.environment import read_environment

log = logging.getLogger("cli.commands")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_log_file: list[Path] = []          # the log file of this process, once setup_logging() opened it


def log_path() -> Path:
    """The command line's log file: <cache>/logs/cli.log (common.paths), two files of 2 MB at most."""
    return read_environment().cache_root / "logs" / "cli.log"


def log_file_note() -> str:
    return f"; it is in {_log_file[0]}" if _log_file else ""


class _TerminalFilter(logging.Filter):
    """Records logged with extra={"terminal": False} (a traceback without -v) go to the log file only; so does the
    runner's line on a failed job (the command line says the failure itself, as `error: ...`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "terminal", True) and not (record.name == "jobs.runner" and "failed:" in record.msg)


def setup_logging(quiet: bool, verbose: bool) -> None:
    """The terminal shows warnings (-v: stage messages and tracebacks too); the log file keeps every message and
    every traceback, whatever the flags."""

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format=LOG_FORMAT,
                        datefmt="%H:%M:%S")
    root = logging.getLogger()
    for handler in root.handlers:
        handler.addFilter(_TerminalFilter())
        if not verbose:
            handler.setLevel(logging.WARNING)       # the progress bar tells the story; -v shows stage messages
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = RotatingFileHandler(path, maxBytes=2 << 20, backupCount=1, encoding="utf-8")
    except OSError as e:
        log.warning("no log file (%s): %s", path, e)
        return
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(file_handler)
    _log_file[:] = [path]
