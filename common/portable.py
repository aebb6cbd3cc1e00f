"""What differs between Linux, macOS and Windows for a process (no torch): the signals it handles, its wait for
them, the CPUs it may use. Each function looks at the platform when called, never at import, so a test can take a
POSIX-only call away (`monkeypatch.delattr(os, "sched_getaffinity")`) and see the portable way taken.

What exists where (https://docs.python.org/3/library/signal.html): signal.pause is "Availability: Unix"; "On
Windows, signal() can only be called with SIGABRT, SIGFPE, SIGILL, SIGINT, SIGSEGV, SIGTERM, or SIGBREAK"; "only the
main thread of the main interpreter is allowed to set a new signal handler". os.sched_getaffinity: Linux and some
Unix only, not macOS or Windows (https://docs.python.org/3/library/os.html).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

STOP_SIGNALS = ("SIGTERM", "SIGBREAK")      # what stops a server besides Ctrl-C; SIGBREAK: Ctrl-Break on Windows
WAIT_S = 0.5                                # where signal.pause is missing: how often the wait looks again


def _nothing() -> None:
    pass


def handle_signal(name: str, handler) -> Callable[[], None]:
    """Install `handler` for the signal called `name` ("SIGINT") where it can be: the platform has that signal and
    this is the main thread. Returns what puts the previous handler back (safe to call twice), or a function that
    does nothing when no handler was installed (said in the log)."""
    signum = getattr(signal, name, None)
    if signum is None:
        log.debug("%s does not exist on this platform (%s): not handled", name, os.name)
        return _nothing
    if threading.current_thread() is not threading.main_thread():
        log.warning("%s is not handled here: Python sets signal handlers only in the main thread (this is %s)",
                    name, threading.current_thread().name)
        return _nothing
    try:
        previous = signal.signal(signum, handler)
    except (ValueError, OSError) as e:           # a signal this platform refuses to handle
        log.warning("%s cannot be handled here: %s", name, e)
        return _nothing

    def restore() -> None:
        signal.signal(signum, signal.SIG_DFL if previous is None else previous)   # None: set outside Python

    return restore


def wait_for_stop(stopped: Callable[[], bool]) -> None:
    """Sleep in the main thread until `stopped()` (a signal handler makes it true); Ctrl-C raises
    KeyboardInterrupt as usual. The wait looks again every WAIT_S on every platform (time.sleep, which a signal
    delivered to the main thread interrupts at once, Ctrl-C on Windows too). It does not use signal.pause: pause
    waits for the *next* signal, so a SIGTERM whose handler ran just before the call (between the check and the
    pause), or one the kernel delivered to another of the process's threads, left the app serving with its stop
    lost (CI saw a SIGTERM'd app finish its whole job and exit 0 only at the next signal). Two looks a second cost
    nothing."""
    while not stopped():
        time.sleep(WAIT_S)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the platform tells it (Linux), else every CPU."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        try:
            return max(1, len(affinity(0)))
        except OSError:
            pass
    return os.cpu_count() or 1
