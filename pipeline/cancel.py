"""The cancel token a job checks at every step. Light (threading only), so a UI can hold one without importing
torch or diffusers."""
from __future__ import annotations

import threading

from common.errors import JobStopped


class CancelToken:
    """Set from any thread; the job stops at its next step and keeps what it made."""

    def __init__(self):
        self._event = threading.Event()
        self.lost = False

    def cancel(self) -> None:
        self._event.set()

    def lose(self) -> None:
        """Stop, and write nothing more: another process runs this job now (its runner lost the queue's lease)."""
        self.lost = True
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise JobStopped()
