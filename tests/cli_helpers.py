"""The command line as a user runs it, for every test that needs it: `cli(...)` (a process of its own), one killed
(SIGKILL) once its job has finished some sections (`killed_after`), the environment such a process gets (`cli_env`),
and how far a job folder got (`sections_done`)."""
from __future__ import annotations

import os
import time

from jobfolder.checkpoint import load_checkpoint
from tests.conftest import ROOT, job_folders
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


def killed_after(sections: int, out, *args, timeout: float = 240):
    """`python -m cli ARGS` (a process of its own, as `cli` starts it) killed with SIGKILL as soon as the first job
    folder in `out` holds `sections` finished sections: (that folder, or None when the process ended first or the
    time ran out; the process, ended: its `exitcode`, its stderr in the file `err`)."""
    proc = shared().start(*map(str, args), separate=True, cwd=ROOT, env=cli_env())
    job, deadline = None, time.monotonic() + timeout
    while time.monotonic() < deadline and proc.is_alive():
        folders = job_folders(out)
        if folders and sections_done(folders[0]) >= sections:
            job = folders[0]
            break
        time.sleep(0.01)
    proc.kill()
    proc.join(30)
    return job, proc
