"""Errors a user can cause, and what to tell them."""
from __future__ import annotations

from pathlib import Path


class InputError(ValueError):
    """Bad input: names the field and says what to do. Raised before any model is loaded.

    A problem with a file keeps the file (`path`) apart from the text (`message` holds "{file}" where the file is
    named) and the advice for the page (`advice`, e.g. "Upload a PNG, JPEG or WebP image."): the page names the file
    by its name, the command line by its full path and without the page's advice (`cli_text`)."""

    def __init__(self, field: str, message: str, *, path=None, advice: str = ""):
        self.field = field
        self.path = Path(path) if path is not None else None
        self.template = message
        self.advice = advice
        self.message = self._text(self.path.name if self.path is not None else None, advice)
        super().__init__(f"{field}: {self.message}")

    def _text(self, file: str | None, advice: str) -> str:
        text = self.template.replace("{file}", file) if file is not None else self.template
        return f"{text}. {advice}" if advice else text

    def cli_text(self, name: str | None = None) -> str:
        """The message for a terminal: the option or key `name` (default: the field) and the file's full path."""
        file = str(self.path.resolve()) if self.path is not None else None
        return f"{name or self.field}: {self._text(file, '')}"


class WeightsNotFound(RuntimeError):
    """Real weights are neither on disk nor downloadable."""


class JobStopped(Exception):
    """Raised inside a job when its cancel token is set; the orchestrator turns it into a clean stop."""
