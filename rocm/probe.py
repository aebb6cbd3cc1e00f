"""Hang probe: run a convolution in a child process with a timeout, because a stuck MIOpen call or GPU kernel
cannot be interrupted from Python.

The child (``rocm.probe_child``) runs in its own process group and stays warm between jobs. A GPU job runs twice
in it: first a warm-up, whose limit ``warmup_timeout_s`` leaves room for MIOpen's first JIT compile of the kernels
(minutes after a PyTorch or ROCm upgrade, on an empty kernel cache: a timeout there would send a healthy shape to
the CPU for good), then the timed run. When the timed run exceeds ``timeout_s`` (the warm-up its own limit; starting
the child - import torch, GPU init - gets ``startup_timeout_s``) or the child dies, the whole group is killed and that (signature, tier) gets a
``timeout``/``crash`` verdict; the next job starts a fresh child. ``session()`` keeps one child across ``run``
calls (the conv fallback holds one for a job, started before the GPU fills). A child that succeeds also fills
MIOpen's kernel cache
(compiled kernels, shared on disk) for the parent; not its find db, which MIOpen does not write under the profile's
MIOPEN_FIND_MODE=FAST. The child dies with the app, however the app ends (``rocm.probe_child``'s
lifeline and reaper).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common.environment import PROBE_LIFELINE
from configs.rocm_profiles import CPU, DEFAULTS
from rocm.errors import is_oom_text, last_line
from rocm.faults import FaultPlan
from rocm.probe_child import PREFIX
from rocm.signature import ConvSignature

logger = logging.getLogger(__name__)
_REPO_ROOT = str(Path(__file__).resolve().parent.parent)
VERDICT_OUTCOMES = ("ok", "error", "timeout", "crash")
# not verdicts: 'oom' (the parent may hold the memory), 'rejected' (an error that is not the GPU's, e.g. a wrong
# shape: the in-process call raises it too), 'inconclusive' (the child could not start or run the job: the probe
# cannot decide, e.g. a wedged GPU)


@dataclass(frozen=True)
class ProbeJob:
    signature: ConvSignature
    tier: int
    vendor_in_decomposition: bool = True

    def to_json(self) -> dict:
        return {"signature": self.signature.to_dict(), "tier": self.tier,
                "vendor_in_decomposition": self.vendor_in_decomposition}


@dataclass(frozen=True)
class ProbeResult:
    signature: str      # ConvSignature.short()
    key: str
    tier: int
    outcome: str        # ok | error (MIOpen/HIP kind) | timeout | crash | oom | rejected | inconclusive | fault
    elapsed_s: float
    message: str = ""
    pid: int | None = None
    warmup_s: float = 0.0       # the untimed first run (kernel compile included); elapsed_s is the timed run

    @property
    def is_verdict(self) -> bool:
        """ok/error/timeout/crash say something about the tier; oom/rejected/inconclusive do not."""
        return self.outcome in VERDICT_OUTCOMES

    def to_dict(self) -> dict:
        return asdict(self)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it leads its own session), then reap the child."""
    if os.name == "posix":
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    elif proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        logger.error("probe child %d did not die after SIGKILL", proc.pid)


class _Worker:
    """One warm probe child and the thread that reads its reports."""

    def __init__(self, python: str, env: dict, device: str):
        self.device = device
        self.err = tempfile.TemporaryFile(mode="w+b")
        self.lifeline = None           # the write end we hold: when this process dies, the child's reaper fires
        pass_fds: tuple[int, ...] = ()
        if os.name == "posix":
            read_end, self.lifeline = os.pipe()
            env = {**env, PROBE_LIFELINE: str(read_end)}
            pass_fds = (read_end,)
        try:
            self.proc = subprocess.Popen([python, "-m", "rocm.probe_child"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self.err, env=env, pass_fds=pass_fds,
                                         start_new_session=(os.name == "posix"))
        except BaseException:
            if self.lifeline is not None:
                os.close(self.lifeline)
            raise
        finally:
            for fd in pass_fds:
                os.close(fd)
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None     # (both pipes)
        self.stdin, self.stdout = stdin, stdout
        self.events: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.alive = self.send({"device": device})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        for raw in self.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith(PREFIX):
                try:
                    self.events.put(json.loads(line[len(PREFIX):]))
                except ValueError:
                    logger.debug("unparsable probe line: %s", line)
        self.events.put(None)

    def send(self, payload: dict) -> bool:
        try:
            self.stdin.write((json.dumps(payload) + "\n").encode())
            self.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def next_event(self, timeout: float):
        """The next report; raises queue.Empty after ``timeout``; None when the child exited."""
        return self.events.get(timeout=max(0.0, timeout))

    def stderr_tail(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace").strip()[-400:]

    def close(self, graceful: bool = True) -> None:
        """Kill the child's whole group; with ``graceful`` first let it finish on EOF (up to 5 s)."""
        if self.alive and graceful:
            with contextlib.suppress(OSError):
                self.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        self.alive = False
        _kill_group(self.proc)   # also removes anything the child started
        self.reader.join(timeout=5)
        if self.reader.is_alive():
            # a descendant that left the group (setsid) still holds the pipe; closing it now would block on the
            # reader's lock, so leave it to the daemon reader
            logger.error("probe child %d: a descendant escaped its process group and keeps the pipe open", self.pid)
        else:
            self.stdout.close()
        self.err.close()
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None


class HangProbe:
    """Runs ``ProbeJob`` s in a child process with timeouts. ``fault_plan`` is handed to the child through the
    ``STEADYFRAME_CONV_FAULTS`` environment variable (test seam)."""

    def __init__(self, timeout_s: float = DEFAULTS.probe_timeout_s,
                 startup_timeout_s: float = DEFAULTS.probe_startup_timeout_s,
                 fault_plan: FaultPlan | None = None, python: str | None = None, env: dict | None = None,
                 warmup_timeout_s: float | None = None):
        self.timeout_s = float(timeout_s)
        self.warmup_timeout_s = float(warmup_timeout_s if warmup_timeout_s is not None
                                      else max(self.timeout_s, DEFAULTS.probe_warmup_timeout_s))
        self.startup_timeout_s = float(startup_timeout_s)
        self.fault_plan = fault_plan
        self.python = python or sys.executable
        self.env = env
        self.last_pids: list[int] = []     # children started by the last run() (or the current session)
        self._worker: _Worker | None = None
        self._session_depth = 0
        self._lock = threading.RLock()

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if self.fault_plan is not None:
            env.update(self.fault_plan.to_env())
        return env

    @contextlib.contextmanager
    def session(self):
        """Keep one warm child across ``run`` calls within the block; it is shut down at the end."""
        with self._lock:
            if self._session_depth == 0:
                self.last_pids = []
            self._session_depth += 1
        try:
            yield self
        finally:
            with self._lock:
                self._session_depth -= 1
                if self._session_depth == 0:
                    self._stop_worker()

    def prestart(self, device: str) -> str | None:
        """Start the child for ``device`` now, inside a ``session()``, so that it exists before the GPU fills (a
        second HIP context may not fit later, in a VAE decode beside parked blocks and tiles). Returns None, or why
        it could not start (the probe then starts a child at its first job, as without this call)."""
        with self._lock:
            if self._session_depth == 0:
                raise RuntimeError("HangProbe.prestart() belongs inside a session(): outside one nothing keeps it")
            if self._worker is not None and self._worker.device == device and self._worker.alive:
                return None
            self._stop_worker()
            return self._start_worker(device)

    def _stop_worker(self, graceful: bool = True) -> None:
        if self._worker is not None:
            self._worker.close(graceful)
            self._worker = None

    def _start_worker(self, device: str) -> str | None:
        """Start a child and wait until it is ready; returns an error message or None."""
        self._worker = worker = _Worker(self.python, self._child_env(), device)
        self.last_pids.append(worker.pid)
        try:
            event = worker.next_event(self.startup_timeout_s)
        except queue.Empty:
            event = "timeout"
        if isinstance(event, dict) and event.get("event") == "ready":
            return None
        if event == "timeout":
            msg = f"probe child did not become ready within {self.startup_timeout_s:.0f} s"
        else:
            msg = f"probe child exited with code {worker.proc.wait()} before running: {last_line(worker.stderr_tail())}"
        self._stop_worker(graceful=False)
        return msg

    def run(self, jobs: list[ProbeJob], device: str = "cpu") -> list[ProbeResult]:
        """Run every job in order; a hang or crash kills the child and the next job gets a fresh one."""
        with self._lock:
            if self._session_depth == 0:
                self.last_pids = []
            try:
                results = []
                for job in jobs:
                    results.append(self._run_one(job, device))
            finally:
                if self._session_depth == 0:
                    self._stop_worker()
        for r in results:
            log = logger.info if r.outcome == "ok" else logger.warning
            log("probe %s tier %d: %s in %.2f s (first run %.2f s) %s", r.signature, r.tier, r.outcome, r.elapsed_s,
                r.warmup_s, r.message[:200])
        return results

    def _run_one(self, job: ProbeJob, device: str) -> ProbeResult:
        def result(outcome, elapsed=0.0, message="", pid=None, warm_s=0.0):
            return ProbeResult(job.signature.short(), job.signature.key, job.tier, outcome, elapsed, message, pid,
                               warm_s)

        if self._worker is not None and (self._worker.device != device or not self._worker.alive):
            self._stop_worker()
        if self._worker is None:
            problem = self._start_worker(device)
            if problem:       # no room for a second HIP context is memory, not a wedged GPU: in-process from here
                return result("oom" if is_oom_text(problem) else "inconclusive", message=problem)
        worker = self._worker
        assert worker is not None                       # (started above)
        if not worker.send(job.to_json()):
            self._stop_worker(graceful=False)
            return result("inconclusive", message="probe child closed its input", pid=worker.pid)
        first_limit = self.warmup_timeout_s if job.tier != CPU else self.timeout_s
        phase, warm_s = "warm-up", 0.0
        started = time.monotonic()
        deadline = started + first_limit
        while True:
            try:
                event = worker.next_event(deadline - time.monotonic())
            except queue.Empty:
                elapsed = time.monotonic() - started
                self._stop_worker(graceful=False)
                if phase == "warm-up" and job.tier != CPU:
                    message = (f"no result after {first_limit:g} s of the first run (kernel compile included); "
                               f"process group killed")
                else:
                    message = f"no result after {self.timeout_s:g} s; process group killed"
                return result("timeout", elapsed, message, worker.pid, warm_s)
            if event is None:
                code = worker.proc.wait()
                tail = worker.stderr_tail()
                elapsed = time.monotonic() - started
                self._stop_worker(graceful=False)
                return result("crash", elapsed, f"child exited with code {code}: {tail}", worker.pid, warm_s)
            kind = event.get("event")
            if kind == "start":
                started = time.monotonic()
                deadline = started + first_limit
            elif kind == "warm":       # compiled and run once: the timed run starts now
                phase, warm_s = "timed", float(event.get("elapsed_s", 0.0))
                started = time.monotonic()
                deadline = started + self.timeout_s
            elif kind == "done":
                if event.get("ok"):
                    outcome = "ok"
                else:
                    # an error that is not the GPU's (kind 'other') is left to the in-process call to raise
                    outcome = {"oom": "oom", "vendor": "error", "library": "rejected", "declined": "error",
                               "fault": "fault"}.get(event.get("kind"), "rejected")
                    if outcome == "fault":     # the child's GPU state is lost: a new child for the next probe
                        self._stop_worker(graceful=False)
                return result(outcome, float(event.get("elapsed_s", 0.0)), event.get("message", ""), worker.pid,
                              warm_s)
