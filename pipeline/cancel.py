"""The cancel token a job checks at every step. Light (threading only), so a UI can hold one without importing
torch or diffusers."""
from __future__ import annotations

import threading
from typing import Callable

from common.errors import JobStopped


class CancelToken:
    """Set from any thread; the job stops at its next step and keeps what it made."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.lost = False
        # set by a queue's runner: "does this process still run the job?" (it holds the queue's lease); asked before
        # each write to the job's folder, so a runner that lost its lease between two of its own checks (every
        # RENEW_S) writes nothing more even when the job ends meanwhile
        self.fence: Callable[[], bool] | None = None

    def cancel(self) -> None:
        self._event.set()

    def lose(self) -> None:
        """Stop, and write nothing more: another process runs this job now (its runner lost the queue's lease)."""
        self.lost = True
        self._event.set()

    def may_write(self) -> bool:
        """May the job still write to its folder? False once it was lost (then it also stops at its next step)."""
        if not self.lost and self.fence is not None and not self.fence():
            self.lose()
        return not self.lost

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise JobStopped()
