"""Command-line jobs in processes that can be killed (SIGKILL) at any moment, cheaply.

A fork server (multiprocessing's "forkserver") imports torch, diffusers, PyAV and the pipeline once; every job is a
process forked from it (about a second to build the tiny models, no 5 s of imports each), runs
`python -m cli ...` as the command line does, and can be killed like any process. Nothing in the server has run
a torch operation, so forking it is safe (no thread pools exist yet).

A child can also kill itself at a named moment (`KillAt`): the Nth call of a function of the pipeline, at its start
or right after it returns, for the moments a random kill time seldom hits (the final file's copy).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PRELOAD = ["torch", "diffusers", "transformers", "av", "PIL.Image", "numpy", "safetensors.torch",
           "cli.commands", "pipeline.components", "pipeline.orchestrator", "pipeline.tiny", "pipeline.resume",
           # the model classes, which those import only when a job needs them (the pre-flight's sizes, the tiny
           # models): each child imported them again (diffusers' transformers package alone: 0.5-1 s per child)
           "diffusers.models.transformers", "diffusers.models.autoencoders", "transformers.models.llama.modeling_llama",
           "transformers.models.clip.modeling_clip", "transformers.models.siglip.modeling_siglip"]


@dataclass(frozen=True)
class KillAt:
    """Kill the child (SIGKILL) at the `call`th call of `module.attribute` ("jobfolder.folder:atomic_copy"), when it
    starts (`after=False`) or right after it returned. With `errno`, that call raises OSError(errno) instead (a
    full disk: errno.ENOSPC), and the child goes on."""
    target: str
    call: int = 1
    after: bool = False
    errno: int = 0


def _kill_at(spec: KillAt) -> None:
    import importlib

    module_name, _, attribute = spec.target.partition(":")
    owner_name, _, method = attribute.partition(".")
    module = importlib.import_module(module_name)
    owner = getattr(module, owner_name) if method else module
    name = method or attribute
    real, calls = getattr(owner, name), []

    def dying(*args, **kwargs):
        calls.append(1)
        if len(calls) == spec.call and spec.errno:
            raise OSError(spec.errno, os.strerror(spec.errno), str(args[0]) if args else None)
        if len(calls) == spec.call and not spec.after:
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if len(calls) == spec.call:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, dying)


def _child(argv: list[str], log_path: str, kill_at: KillAt | None, err_path: str | None = None,
           cwd: str | None = None, env: dict | None = None, code: str | None = None) -> None:
    """`python -m cli ARGV` in a forked child (`python -c CODE` with `code`): its output in `log_path` (stderr in
    `err_path` when given), in `cwd` with the environment `env` (default: the server's, offline)."""
    for path, fds in ((log_path, (1, 2) if err_path is None else (1,)), (err_path, (2,))):
        if path is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for target in fds:
                os.dup2(fd, target)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if cwd is not None:
        os.chdir(cwd)
    if kill_at is not None:
        _kill_at(kill_at)
    status = 1
    try:
        if code is not None:
            sys.argv = ["-c", *argv]
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
            status = 0
        else:
            from cli.__main__ import run

            sys.argv = ["python -m cli", *argv]
            status = run()
    except SystemExit as e:                     # argparse's errors and --help, as the interpreter reports them
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:  # an uncaught error: the traceback, as the interpreter prints it
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _save_coverage()
        os._exit(status)


def _save_coverage() -> None:
    """Under coverage.py (`patch = fork` restarts it in a forked child), save what this child measured: it ends
    with os._exit, which skips coverage's own save at exit. Nothing without coverage."""
    cov = getattr(sys.modules.get("coverage"), "Coverage", None)
    current = cov.current() if cov is not None else None
    if current is not None:
        current.stop()
        current.save()


class JobProcesses:
    """Start `python -m cli` command lines as forked children of one fork server."""

    def __init__(self, logs: Path):
        self.logs = Path(logs)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._context = multiprocessing.get_context("forkserver")
        self._context.set_forkserver_preload(PRELOAD)
        self._count = 0

    def start(self, *argv, kill_at: KillAt | None = None, separate: bool = False, cwd=None, env=None, code=None):
        """`python -m cli ARGV` (`python -c CODE ARGV` with `code`) started in a forked child."""
        self._count += 1
        log = self.logs / f"child-{self._count}.log"
        err = self.logs / f"child-{self._count}.err" if separate else None
        proc = self._context.Process(target=_child, args=([str(a) for a in argv], str(log), kill_at,
                                                          err and str(err), cwd and str(cwd), env, code),
                                            daemon=True)
        proc.start()
        proc.log, proc.err = log, err
        return proc

    def completed(self, argv, *, cwd=None, env=None, timeout: float = 300, code=None):
        """`python -m cli ARGV` (`python -c CODE ARGV` with `code`) run to its end, as subprocess.run(...,
        capture_output=True, text=True) reports it."""
        import subprocess

        proc = self.start(*argv, separate=True, cwd=cwd, env=env, code=code)
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["python", "-m", "cli", *map(str, argv)], timeout)
        return subprocess.CompletedProcess(["python", "-m", "cli", *map(str, argv)], proc.exitcode,
                                           tail(proc.log, None), tail(proc.err, None))

    def run(self, *argv, kill_at: KillAt | None = None, timeout: float = 300) -> int:
        proc = self.start(*argv, kill_at=kill_at)
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise TimeoutError(f"pipeline {' '.join(map(str, argv))} ran over {timeout} s:\n{tail(proc.log)}")
        return proc.exitcode


def tail(path: Path, chars: int | None = 3000) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return text if chars is None else text[-chars:]


_SHARED: list[JobProcesses] = []


def shared() -> JobProcesses:
    """This test process's fork server (made at the first use)."""
    if not _SHARED:
        import tempfile

        _SHARED.append(JobProcesses(Path(tempfile.mkdtemp(prefix="cli-children-"))))
    return _SHARED[0]


def job_folder(out: Path) -> Path | None:
    """The job folder in `out`, once it exists (a folder being made is hidden: its name starts with a dot)."""
    if not out.is_dir():
        return None
    found = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    return found[0] if found else None


def wait_for_folder(out: Path, proc, timeout: float = 120) -> tuple[Path | None, float]:
    """(the job's folder, when it appeared by time.monotonic()); (None, now) when the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folder = job_folder(out)
        if folder is not None:
            return folder, time.monotonic()
        if not proc.is_alive():
            return None, time.monotonic()
        time.sleep(0.002)
    raise TimeoutError(f"no job folder in {out} after {timeout} s:\n{tail(proc.log)}")
