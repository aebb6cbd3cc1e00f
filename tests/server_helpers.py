"""Helpers for the server tests: the app launched in this process on 127.0.0.1 (a free port) with the session's
tiny models, gradio_client clients, job folders, and the browser (Playwright + Debian's chromium)."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("STEADYFRAME_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
REQUIRE_BROWSER = os.environ.get("STEADYFRAME_REQUIRE_BROWSER", "").strip() not in ("", "0", "false", "no")
JOB_ID = r"^\d{8}-\d{6}-[0-9a-f]{6}$"        # jobfolder.folder.new_job_id: time + random, never user text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    blocks: object
    runner: object
    outputs: Path
    config: object

    def client(self, downloads: Path, **kw):
        return api_client(self.url, downloads, **kw)

    def jobs(self) -> list[Path]:
        """The job folders (not the app's own hidden ones: .staged, .examples)."""
        if not self.outputs.exists():
            return []
        return sorted(d for d in self.outputs.iterdir() if d.is_dir() and not d.name.startswith("."))


@functools.cache
def _tls_context():
    import ssl

    return ssl.create_default_context()


def api_client(url: str, downloads: Path | None = None, **kw):
    """A gradio_client Client of the app at `url` (plain http on 127.0.0.1), quiet, its downloads in `downloads`.

    gradio_client opens an httpx client for each request, and httpx builds a TLS context for each (reading the whole
    CA bundle: about 20 ms of CPU) though no request here uses TLS: 255 contexts, 5 s of CPU, in test_queue_api.py
    and test_api_features.py alone. One context, made once, is handed to every request instead (gradio_client
    passes `ssl_verify` on to httpx as `verify`; a context there is used as it is)."""
    if downloads is not None:
        kw["download_files"] = str(downloads)
    return settled_client_class()(url, verbose=False, ssl_verify=_tls_context(), **kw)


@functools.cache
def settled_client_class():
    """gradio_client's Client, less a race of its own (gradio_client 2.7): once a call has completed and nothing else
    is pending, the server closes the session's stream; a call sent before the client's reader has read that close
    is filed under the closing reader, which then cancels it (`CancelledError`, though the server ran the call: a
    CI run lost a /queue_remove so). Each call here first lets a stream about to close finish closing (at most 5 s),
    so the next one opens a stream of its own."""
    from gradio_client import Client

    class SettledClient(Client):
        def send_data(self, data, hash_data, protocol, request_headers):
            end = time.monotonic() + 5
            while time.monotonic() < end:
                with self.pending_lock:
                    closing = self.stream_open and not self.pending_event_ids
                if not closing:
                    break
                time.sleep(0.01)
            return super().send_data(data, hash_data, protocol, request_headers)

    return SettledClient


def tiny_runner(outputs: Path, components, cap_gb: float = 20, **config):
    """The one runner (not started) of `outputs`' queue, running jobs in this process on the CPU with the session's
    tiny components (built once per test session)."""
    from configs.runtime import Config
    from jobs.local import LocalExecutor
    from jobs.models import ComponentCache
    from jobs.runner import open_runner
    from pipeline.components import load_components

    def loader(preset, mode, model_dir):
        return components if mode == components.mode else load_components("tiny", mode)

    cfg = Config(preset="tiny", outputs=Path(outputs), vram_cap_gb=cap_gb, **config)
    executor = LocalExecutor(cfg, ComponentCache("tiny", loader=loader), torch.device("cpu"))
    return open_runner(cfg, executor, device_type="cpu")[0]


@contextlib.contextmanager
def launched(outputs: Path, components, *argv: str, max_file_size: int | None = None):
    """`python app.py --preset tiny ...` in this process, as main() launches it (launch options from the command
    line), serving until the block ends."""
    import app as app_module
    from ui.launch import launch_options, parse_args, serve

    port = free_port()
    config = parse_args(["--preset", "tiny", "--outputs", str(outputs), "--port", str(port), *argv])
    runner = tiny_runner(Path(outputs).resolve(), components, config.vram_cap_gb, lora_dir=config.lora_dir)
    blocks = app_module.build_app(config, runner)
    kwargs = launch_options(config).kwargs()
    if max_file_size is not None:
        kwargs["max_file_size"] = max_file_size
    assert kwargs["server_name"] == "127.0.0.1"
    serve(blocks, **kwargs, prevent_thread_lock=True)             # (quiet: the app's launch options say so)
    try:
        yield Server(f"http://127.0.0.1:{port}/", blocks, runner, Path(outputs).resolve(), config)
    finally:
        blocks.close()
        runner.close(timeout=60)


@contextlib.contextmanager
def app_process(outputs: Path, *argv: str, log_path: Path, env: dict | None = None, start_timeout: float = 120,
                preset: str = "tiny"):
    """`python app.py --preset tiny` started as a user starts it (its own process, a free port on 127.0.0.1,
    writing into `outputs`, its output in `log_path`); yields (url, the Popen); stopped when the block ends."""
    port = free_port()
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1",
                **(env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "app.py", "--preset", preset, "--port", str(port), "--outputs",
                                 str(outputs), *argv], cwd=ROOT, env=full_env, stdout=log_file,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"app.py exited with {proc.returncode}; see {log_path}")
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"app.py did not answer on {url} within {start_timeout:.0f} s")
                time.sleep(0.1)
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def saved_image(tmp_path_factory, width: int, height: int, seed: int) -> Path:
    """A test image (tests.conftest.make_image) saved as a PNG in a fresh temporary folder."""
    from tests.conftest import make_image

    path = tmp_path_factory.mktemp("images") / "start.png"
    make_image(width, height, seed=seed).save(path)
    return path


def api_job(image: Path, settings: dict, **overrides) -> dict:
    """Keyword arguments of a /video API call: the image file, `settings`, then `overrides`."""
    from gradio_client import handle_file

    return {"image": handle_file(str(image)), **settings, **overrides}


def job_info(job_dir: Path) -> dict:
    return json.loads((Path(job_dir) / "job.json").read_text("utf-8"))


def wait_for(condition, timeout: float = 60, every: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def temp_leftovers(outputs: Path) -> list[Path]:
    """The pipeline's temp files (atomic writes, partial videos) left in job folders."""
    return [p for p in Path(outputs).rglob(".*") if p.is_file() and (p.name.endswith(".tmp") or ".partial" in p.name)]


def browser_or_skip() -> Path:
    """Chromium for Playwright; a missing browser skips, or fails where STEADYFRAME_REQUIRE_BROWSER is set (CI)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "the playwright package"
    else:
        missing = None if CHROMIUM.exists() else str(CHROMIUM)
    if missing:
        if REQUIRE_BROWSER:
            raise RuntimeError(f"STEADYFRAME_REQUIRE_BROWSER is set but {missing} is missing")
        pytest.skip(f"{missing} is not installed (set STEADYFRAME_REQUIRE_BROWSER=1 to make this an error)")
    return CHROMIUM


class Gate:
    """A forward pre-hook that holds the `call`-th call of a module (1-based) until released, so a test can act
    at an exact point of a job (a stage running, a tab still open). Use as a context manager."""

    def __init__(self, module, call: int = 1, timeout: float = 120):
        import threading

        self.call, self.timeout, self.count = call, timeout, 0
        self.reached, self.released = threading.Event(), threading.Event()
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.count += 1
        if self.count == self.call:
            self.reached.set()
            if not self.released.wait(self.timeout):
                raise RuntimeError("Gate: never released")

    def wait(self, timeout: float = 120) -> None:
        assert self.reached.wait(timeout), "the job never reached the gate"

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
        self.handle.remove()


class Fault:
    """A forward pre-hook that raises `error` on every call while active (a job that fails)."""

    def __init__(self, module, error: Exception):
        self.error = error
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        raise self.error

    def __enter__(self) -> "Fault":
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()
