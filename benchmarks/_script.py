"""`python3 benchmarks/<name>.py ...` without installing: run it again as `python3 -m benchmarks.<name> ...` with
the repository on PYTHONPATH (same arguments, same working directory), so the packages import as they do everywhere
else and nothing edits sys.path."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def repo_env(environ=None) -> dict[str, str]:
    """The environment with the repository first on PYTHONPATH (for child processes of a benchmark too)."""
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def as_module(file: str) -> None:
    """Replace this process by `python -m benchmarks.<stem of file>` with the same arguments."""
    module = f"benchmarks.{Path(file).stem}"
    os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], repo_env())
