"""Bounds for the page's un-queued handlers (live hints, End, the random seed): they bypass Gradio's queue, so
nothing else stops a client from starting as many at once as it likes. Each guarded handler runs at most `limit`
calls at a time; a call beyond that returns its `busy` answer at once instead of waiting for a thread.
Together with input checks that make every handler's work bounded (ui/hints.py), no burst of calls can hold the
server's cores."""
from __future__ import annotations

import functools
import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class HandlerGuard:
    def __init__(self, limit: int = 2):
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self.refused = 0

    def wrap(self, fn: Callable, busy: Callable[[], object]) -> Callable:
        """`fn` that runs only while a slot is free; otherwise returns `busy()` at once. The wrapper keeps `fn`'s
        signature (Gradio reads it for gr.Request parameters)."""
        @functools.wraps(fn)
        def guarded(*args, **kwargs):
            if not self._slots.acquire(blocking=False):
                with self._lock:
                    self.refused += 1
                return busy()
            try:
                return fn(*args, **kwargs)
            finally:
                self._slots.release()

        return guarded
