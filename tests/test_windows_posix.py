"""Nothing on a job's path assumes POSIX (issue 31): each POSIX-only call has a portable way or degrades with a clear
message, shown here on a simulated Windows (the POSIX-only function taken away with monkeypatch, sys.platform set to
"win32"); and a scan of the package code finds each POSIX-only name only where an allow-list says how it is guarded.
Fast (no server, no model): torch is imported for the weight files only.
"""
from __future__ import annotations

import ast
import errno
import logging
import mmap
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import common.files as files
import common.portable as portable
from tests.conftest import ROOT


def _windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(files, "REFUSED_RETRY_S", (0, 0, 0), raising=False)


def _refused(real, times: int | None):
    """A rename that Windows refuses `times` times (None: always), as when an antivirus scans a file just written."""
    calls = []

    def rename(src, dst):
        calls.append(dst)
        if times is None or len(calls) <= times:
            raise PermissionError(errno.EACCES, "Access is denied", str(src))
        return real(src, dst)

    return rename, calls


# ---- app.py: the server's wait ---------------------------------------------------------------------------------------
def _serve_until_stopped():
    """app.py's serve_until_stopped, run alone (importing app.py loads gradio and torch: 3 s)."""
    tree = ast.parse((ROOT / "app.py").read_text("utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "serve_until_stopped")
    space = {"signal": signal, "log": logging.getLogger("test"), "gr": SimpleNamespace(Blocks=object),
             **{name: getattr(portable, name) for name in ("STOP_SIGNALS", "handle_signal", "wait_for_stop")}}
    exec(compile(ast.Module([node], []), str(ROOT / "app.py"), "exec"), space)
    return space["serve_until_stopped"]


def _app():
    closed = []
    return SimpleNamespace(close=lambda: closed.append("app"),
                           runner=SimpleNamespace(close=lambda timeout: closed.append("runner"))), closed


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_the_app_waits_for_ctrl_c_without_signal_pause(monkeypatch):
    """Windows has no signal.pause (Availability: Unix): the app used to crash there right after it started."""
    monkeypatch.delattr(signal, "pause")
    sleeps = []

    def sleep(s):                             # Ctrl-C on the third look
        sleeps.append(s)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(portable, "time", SimpleNamespace(sleep=sleep))
    before = signal.getsignal(signal.SIGTERM)
    app, closed = _app()
    assert _serve_until_stopped()(app) == signal.SIGINT
    assert sleeps == [portable.WAIT_S] * 3 and closed == ["app"]          # the runner: app.stop_runner
    assert signal.getsignal(signal.SIGTERM) is before                  # its handler is taken away again


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_sigterm_during_the_wait_stops_the_app(monkeypatch):
    sleeps = []
    monkeypatch.setattr(portable, "time", SimpleNamespace(
        sleep=lambda s: (sleeps.append(s), signal.raise_signal(signal.SIGTERM))))
    app, closed = _app()
    assert _serve_until_stopped()(app) == signal.SIGTERM
    assert sleeps == [portable.WAIT_S] and closed == ["app"]


@pytest.mark.timeout(20)
def test_a_stop_whose_signal_never_wakes_the_main_thread_still_ends_the_wait():
    """The stop came true without a signal reaching the main thread (its handler ran just before the wait began, or
    the kernel gave the signal to another thread): signal.pause waited for a next signal that never came -- CI saw
    a SIGTERM'd app finish its whole job. The wait ends within a look."""
    flag = threading.Event()
    threading.Timer(0.3, flag.set).start()
    began = time.monotonic()
    portable.wait_for_stop(flag.is_set)
    assert time.monotonic() - began < 0.3 + portable.WAIT_S + 5.0


# ---- common/portable.py: signal handlers and CPUs -------------------------------------------------------------------
def test_a_handler_outside_the_main_thread_is_not_set_and_said(caplog):
    """signal.signal raises ValueError outside the main thread (the CLI's Ctrl-C handler, run from a thread)."""
    out = []
    thread = threading.Thread(target=lambda: out.append(portable.handle_signal("SIGINT", lambda *_: None)))
    with caplog.at_level(logging.WARNING, logger="common.portable"):
        thread.start()
        thread.join()
    out[0]()                                                        # restores nothing, raises nothing
    assert "only in the main thread" in caplog.text


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_a_signal_the_platform_lacks_or_refuses_is_skipped(monkeypatch, caplog):
    monkeypatch.delattr(signal, "SIGTERM")                          # as SIGBREAK on Linux
    assert portable.handle_signal("SIGTERM", lambda *_: None) is portable._nothing

    def refuse(signum, handler):                                    # Windows: only SIGINT, SIGTERM, SIGBREAK, ...
        raise ValueError("invalid signal value")

    monkeypatch.setattr(signal, "signal", refuse)
    with caplog.at_level(logging.WARNING, logger="common.portable"):
        assert portable.handle_signal("SIGINT", lambda *_: None) is portable._nothing
    assert "SIGINT cannot be handled here" in caplog.text


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread only")
def test_a_handler_is_set_and_put_back():
    before = signal.getsignal(signal.SIGINT)
    restore = portable.handle_signal("SIGINT", lambda *_: None)
    assert signal.getsignal(signal.SIGINT) is not before
    restore()
    restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_cpus_without_sched_getaffinity(monkeypatch):
    """os.sched_getaffinity: Linux only (the video writer's thread count)."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert portable.usable_cpus() == (os.cpu_count() or 1)


# ---- common/files.py: fsync, renames, deletes -----------------------------------------------------------------------
def test_an_atomic_write_syncs_through_a_writable_descriptor(tmp_path, monkeypatch):
    """On Windows os.fsync calls _commit, which fails (EBADF) on a descriptor opened read-only: every atomic write
    failed there."""
    real = os.fsync

    def windows_fsync(fd):
        try:
            os.write(fd, b"")                                       # EBADF when not open for writing
        except OSError:
            raise OSError(errno.EBADF, "Bad file descriptor") from None
        real(fd)

    monkeypatch.setattr(os, "fsync", windows_fsync)
    path = files.atomic_write_json(tmp_path / "job.json", {"a": 1})
    assert path.read_text("utf-8") == '{\n  "a": 1\n}'


def test_an_atomic_write_waits_for_a_scanner_and_then_says_why(tmp_path, monkeypatch):
    _windows(monkeypatch)
    rename, calls = _refused(os.replace, 2)
    monkeypatch.setattr(os, "replace", rename)
    files.atomic_write_bytes(tmp_path / "a.bin", b"new")
    assert (tmp_path / "a.bin").read_bytes() == b"new" and len(calls) == 3

    rename, calls = _refused(os.replace, None)
    monkeypatch.setattr(os, "replace", rename)
    with pytest.raises(PermissionError, match="another program .* has it or a file in it open"):
        files.atomic_write_bytes(tmp_path / "a.bin", b"newer")
    assert (tmp_path / "a.bin").read_bytes() == b"new" and len(calls) == 4
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]                # no temp file left


def test_a_refused_rename_on_linux_is_not_tried_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    rename, calls = _refused(os.replace, None)
    monkeypatch.setattr(os, "replace", rename)
    with pytest.raises(PermissionError, match="Access is denied"):
        files.atomic_write_bytes(tmp_path / "a.bin", b"x")
    assert len(calls) == 1


def test_a_new_name_never_replaces_a_folder(tmp_path):
    """POSIX's rename silently replaces an empty folder; Windows refuses: both refuse now, and say so."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    with pytest.raises(FileExistsError, match="exists already"):
        files.rename_new(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "src").is_dir()
    assert files.rename_new(tmp_path / "src", tmp_path / "new") == tmp_path / "new" and (tmp_path / "new").is_dir()


def test_a_file_windows_will_not_delete_stays(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"1")
    real = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name == "a":
            raise PermissionError(errno.EACCES, "The process cannot access the file", str(self))
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    assert files.unlink_if_possible(tmp_path / "a") is False and (tmp_path / "a").exists()
    assert files.unlink_if_possible(tmp_path / "gone") is True


# ---- jobfolder/folder.py: the job folder's rename -------------------------------------------------------------------
def test_a_job_folder_is_renamed_once_the_scanner_lets_go(tmp_path, monkeypatch):
    """A job folder is made as .<id>.partial and renamed; Windows refuses while a file in it is open (an antivirus
    scanning the images just written)."""
    from jobfolder import folder
    from jobfolder.folder import Job

    monkeypatch.setattr(folder, "package_versions", dict)          # (torch refuses to import on a fake Windows)
    _windows(monkeypatch)
    rename, calls = _refused(os.rename, 2)
    monkeypatch.setattr(os, "rename", rename)
    job = Job.create(tmp_path, {"prompt": "x"}, {})
    assert job.dir.is_dir() and (job.dir / "job.json").is_file() and len(calls) == 3

    rename, calls = _refused(os.rename, None)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(PermissionError, match=r"could not rename .*\.partial to \d{8}-.*another program"):
        Job.create(tmp_path, {"prompt": "y"}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [job.id]          # the half-made folder is gone


# ---- pipeline/prompt_cache.py: eviction ------------------------------------------------------------------------------
def test_the_prompt_cache_evicts_around_a_file_windows_keeps(tmp_path, monkeypatch):
    """Windows does not delete a file another process has open or mapped (safetensors maps it): a job's prompt
    encoding used to fail with PermissionError in the eviction after its write."""
    from pipeline.prompt_cache import PromptCache

    for i in range(4):
        (tmp_path / f"{i}.safetensors").write_bytes(b"x" * 100)
        os.utime(tmp_path / f"{i}.safetensors", ns=(i * 10**9, i * 10**9))
    real = Path.unlink

    def unlink(self, missing_ok=False):
        if self.name == "0.safetensors":
            raise PermissionError(errno.EACCES, "The process cannot access the file", str(self))
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    cache = PromptCache(tmp_path, max_bytes=250)
    assert cache.evict() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.safetensors", "3.safetensors"]


# ---- rocm/faults.py: the probe child's crash fault ------------------------------------------------------------------
def test_the_crash_fault_needs_no_resource_module(monkeypatch):
    """`resource` is Unix only: a crash fault in a probe child used to end in ImportError on Windows."""
    from rocm.faults import Fault, FaultPlan

    class Aborted(Exception):
        pass

    def abort():
        raise Aborted

    monkeypatch.setitem(sys.modules, "resource", None)                     # import resource: ImportError
    monkeypatch.setattr(os, "abort", abort)
    with pytest.raises(Aborted):
        FaultPlan._fire(Fault(tier=0, kind="crash"), in_child=True)


# ---- memory/hostbudget.py: cgroups and /proc -------------------------------------------------------------------------
def test_the_host_budget_reads_no_proc_or_cgroup_off_linux(monkeypatch):
    from common.units import GIB
    from memory import hostbudget

    def read(path):
        raise AssertionError(f"read {path} on Windows")

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(hostbudget, "_read", read)
    assert hostbudget.cgroup_memory_limit() is None
    rss = hostbudget.rss_breakdown()
    assert rss["rss"] == rss["anon"] > 0 and rss["file"] == rss["shmem"] == 0          # psutil's RSS
    budget, text = hostbudget.default_host_budget(total=32 * GIB)
    assert budget > 0 and "cgroup" not in text and "32.0 GB of RAM" in text


# ---- memory/weightfiles.py: pread, O_DIRECT, fadvise, madvise, O_BINARY ----------------------------------------------
def test_weight_files_read_without_the_posix_calls(tmp_path, monkeypatch):
    """Windows has neither os.preadv nor os.O_DIRECT, os.posix_fadvise or mmap.MADV_DONTNEED, and opens a file
    descriptor in text mode unless told O_BINARY."""
    import torch
    from safetensors.torch import save_file

    from memory.weightfiles import WeightFiles

    big = torch.arange(3000, dtype=torch.int32)
    save_file({"pad": torch.ones(3, dtype=torch.uint8), "big": big}, str(tmp_path / "model.safetensors"))
    for name in ("preadv", "O_DIRECT", "posix_fadvise"):
        monkeypatch.delattr(os, name, raising=False)
    monkeypatch.delattr(mmap, "MADV_DONTNEED", raising=False)
    binary, flags, real_open = 1 << 30, [], os.open

    def windows_open(path, flag, *args, **kwargs):
        flags.append(flag)
        return real_open(path, flag & ~binary, *args, **kwargs)

    monkeypatch.setattr(os, "O_BINARY", binary, raising=False)
    monkeypatch.setattr(os, "open", windows_open)
    src = WeightFiles.open(tmp_path).tensors["big"]
    assert flags and all(f & binary for f in flags)
    buf = torch.empty(src.nbytes, dtype=torch.uint8)
    src.file.read_into(buf, src.offset, threads=2)
    assert torch.equal(buf.view(torch.int32), big)
    slot = torch.empty(1 << 16, dtype=torch.uint8)
    assert src.file.read_direct(slot, src.offset, 100) is None                  # no O_DIRECT: buffered instead
    src.file.will_need(src.offset, src.nbytes)
    assert torch.equal(src.file.view(src), big)
    src.file.drop(src.offset, src.nbytes, cache=True)


# ---- the scan: POSIX-only names in the package code -----------------------------------------------------------------
PACKAGES = ("cli", "common", "configs", "farm", "jobs", "memory", "pipeline", "rocm", "ui", "video")
POSIX_ATTRS = {      # module -> names that are Unix-only, or behave differently enough on Windows to need a guard
    "os": {"uname", "fork", "forkpty", "killpg", "getpgid", "setsid", "setpgrp", "pread", "pwrite", "preadv",
           "pwritev", "posix_fadvise", "O_DIRECT", "O_CLOEXEC", "WNOHANG", "getuid", "geteuid", "getgid",
           "sched_getaffinity", "sched_setaffinity", "setpriority", "getpriority", "PRIO_PROCESS", "nice", "sysconf",
           "statvfs", "getloadavg", "mkfifo", "wait3", "wait4", "symlink",
           "kill"},            # Windows: kill() is TerminateProcess for any signal but the two console events
    "signal": {"pause", "signal", "SIGKILL", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGCHLD", "SIGQUIT",
               "alarm", "setitimer", "pthread_kill", "pthread_sigmask", "sigwait", "siginterrupt"},
    "mmap": {"MADV_DONTNEED", "MADV_WILLNEED"},
}
POSIX_MODULES = {"fcntl", "resource", "termios", "pwd", "grp", "pty", "tty", "posix", "crypt", "syslog"}
POSIX_KEYWORDS = {"start_new_session", "preexec_fn", "pass_fds", "process_group"}      # subprocess.Popen's
POSIX_METHODS = {"add_signal_handler", "remove_signal_handler"}                          # asyncio's loop
POSIX_PATHS = re.compile(r"(?<![\w.])/(?:proc|sys)(?=/|$)|libc\.so")
FORK_METHODS = {"get_context", "set_start_method"}                                       # multiprocessing's

_PROBE = "guarded by os.name == 'posix' (rocm/probe.py: the probe child's process group and lifeline; Windows: " \
         "proc.kill(), no lifeline)"
ALLOWED = {
    "common/portable.py": {"signal.signal": "handle_signal: only in the main thread, only for a signal the platform "
                                            "has, ValueError/OSError caught"},
    "memory/hostbudget.py": {"/proc": "_linux() first; elsewhere psutil's RSS",
                             "/sys": "_linux() first; elsewhere no cgroup limit"},
    "memory/weightfiles.py": {"os.preadv": "hasattr(os, 'preadv') else seek + readinto; with a descriptor only after "
                                           "direct_io_available()",
                              "os.O_DIRECT": "direct_io_available() (hasattr, at call time)",
                              "os.posix_fadvise": "hasattr(os, 'posix_fadvise')",
                              "mmap.MADV_DONTNEED": "hasattr(mmap, 'MADV_DONTNEED')"},
    "rocm/allocator.py": {"libc.so": "_glibc(): Linux only (sys.platform), OSError caught: 'not glibc, left alone'"},
    "rocm/arch.py": {"/sys": "KFD topology and driver versions read with OSError caught: None where there is none "
                             "(Windows, WSL2, containers)"},
    "rocm/doctor_text.py": {"/sys": "a message naming where the KFD arch comes from, not a read"},
    "rocm/faults.py": {"resource": "the probe child's crash fault: ImportError caught (no core-size limit)"},
    "rocm/probe.py": {"os.killpg": _PROBE, "signal.SIGKILL": _PROBE, "pass_fds": _PROBE, "start_new_session": _PROBE},
    "rocm/probe_child.py": {"os.fork": "start_reaper: os.name != 'posix' returns first",
                            "os.killpg": "the reaper, forked only on POSIX", "os.getpgid": "the reaper (POSIX)",
                            "signal.SIGKILL": "the reaper (POSIX) and prctl (Linux only, sys.platform)"},
    "video/section_writer.py": {name: "_lower_priority: Linux only (sys.platform); elsewhere PRIO_PROCESS is the "
                                      "whole process" for name in ("os.setpriority", "os.getpriority",
                                                                   "os.PRIO_PROCESS")},
}


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def posix_names(text: str) -> set[tuple[str, int]]:
    """(name, line) of every POSIX-only call, import, keyword or path in Python source (not its docstrings or
    comments)."""
    tree = ast.parse(text)
    docs, alias, found = _docstrings(tree), {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                alias[a.asname or top] = top
                if top in POSIX_MODULES:
                    found.add((top, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in POSIX_MODULES:
                found.add((node.module.split(".")[0], node.lineno))
            found |= {(f"{node.module}.{a.name}", node.lineno) for a in node.names
                      if a.name in POSIX_ATTRS.get(node.module, ())}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            module = alias.get(node.value.id, "") if isinstance(node.value, ast.Name) else ""
            if node.attr in POSIX_ATTRS.get(module, ()):
                found.add((f"{module}.{node.attr}", node.lineno))
            if node.attr in POSIX_METHODS:
                found.add((node.attr, node.lineno))
        elif isinstance(node, ast.keyword) and node.arg in POSIX_KEYWORDS:
            found.add((node.arg, node.lineno))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in FORK_METHODS:
            if any(isinstance(a, ast.Constant) and a.value in ("fork", "forkserver") for a in node.args):
                found.add(("fork start method", node.lineno))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found |= {(m, node.lineno) for m in POSIX_PATHS.findall(node.value)}
    return found


def _package_files() -> list[Path]:
    return [ROOT / "app.py"] + [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_posix_only_names_only_where_guarded():
    """app.py and the packages (not benchmarks/, Linux GPU-machine tools, nor tests/) use a POSIX-only name only
    where ALLOWED says how it is guarded; every entry of ALLOWED is still used."""
    unlisted, used = [], set()
    for path in _package_files():
        rel = path.relative_to(ROOT).as_posix()
        for name, line in sorted(posix_names(path.read_text("utf-8"))):
            if name in ALLOWED.get(rel, {}):
                used.add((rel, name))
            else:
                unlisted.append(f"{rel}:{line}: {name}")
    assert not unlisted, "POSIX-only names outside the allow-list (make them portable, or guard them and list " \
                         f"them with the reason): {unlisted}"
    stale = sorted(f"{rel}: {name}" for rel, names in ALLOWED.items() for name in names if (rel, name) not in used)
    assert not stale, f"allow-list entries no longer used (remove them): {stale}"


def test_the_scan_finds_what_it_is_for():
    source = '''"""Reads /proc/self/status (a docstring: not a read)."""
import fcntl, os, signal as sig
from os import pread
import multiprocessing, subprocess
def f(loop):
    sig.pause()
    os.killpg(os.getpgid(0), sig.SIGKILL)
    subprocess.Popen(["x"], start_new_session=True)
    multiprocessing.get_context("fork")
    loop.add_signal_handler(2, f)
    open(f"/proc/{os.getpid()}/status")
    return open("/sys/fs/cgroup/memory.max"), hasattr(os, "preadv"), os.path.join("a", "b")
'''
    assert {n for n, _ in posix_names(source)} == {
        "fcntl", "os.pread", "signal.pause", "os.killpg", "os.getpgid", "signal.SIGKILL", "start_new_session",
        "fork start method", "add_signal_handler", "/proc", "/sys"}
