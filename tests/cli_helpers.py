"""The command line as a user runs it, for every test that needs it: `cli(...)` (a process of its own), the
environment such a process gets (`cli_env`), and how far a job folder got (`sections_done`)."""
from __future__ import annotations

import os

from pipeline.checkpoint import load_checkpoint
from tests.conftest import ROOT
from tests.kill_helpers import shared


def cli_env() -> dict[str, str]:
    """This process's environment, offline, with the repository on PYTHONPATH."""
    return dict(os.environ, HF_HUB_OFFLINE="1",
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def cli(*args, cwd=ROOT, timeout=300):
    """`python -m cli ARGS` as a user runs it, with this process's environment: a process of its own, forked from a
    server that imported torch and the pipeline once (tests/kill_helpers.py), so each costs no 5 s of imports."""
    return shared().completed([str(a) for a in args], cwd=cwd, env=cli_env(), timeout=timeout)


def sections_done(job_dir) -> int:
    """Sections a job folder's checkpoint holds (0: none yet, or not readable)."""
    try:
        return load_checkpoint(job_dir)[1]["sections_done"]
    except (FileNotFoundError, OSError, ValueError):
        return 0
