"""Errors a user can cause, and what to tell them."""
from __future__ import annotations


class InputError(ValueError):
    """Bad input: names the field and says what to do. Raised before any model is loaded."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class WeightsNotFound(RuntimeError):
    """Real weights are neither on disk nor downloadable."""


class JobStopped(Exception):
    """Raised inside a job when its cancel token is set; the orchestrator turns it into a clean stop."""
