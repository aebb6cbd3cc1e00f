"""Starting the app's server: its command line (configs/options.py declares the options), the launch options
derived from the Config, what the user is told about who can reach it, and the host-RAM check at start."""
from __future__ import annotations

import argparse
import ipaddress
import logging
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from starlette.middleware import Middleware

from common import patches
from configs import LIMITS, MEMORY
from configs.options import OneLineParser, add_process_options, add_web_options, config_from
from configs.presets import get_preset
from configs.runtime import Config
from memory.estimate import nominal_plan
from memory.hostbudget import default_host_budget
from memory.hostplan import HostBudgetError
from ui.tempfiles import cleanup_lifespan

log = logging.getLogger(__name__)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_UPLOAD = LIMITS.upload_bytes_max     # bytes; Gradio refuses larger uploads


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="steadyframe" if Path(sys.argv[0]).name == "steadyframe" else "app.py",    # the console script or the file
        description="SteadyFrame: FramePack-style image-to-video in your browser.")
    add_process_options(p)
    add_web_options(p)
    return p


def parse_args(argv: list[str] | None = None) -> Config:
    """The app's Config from its command line (a bad value exits with the usage, naming the option)."""
    parser = build_parser()
    return config_from(parser, parser.parse_args(argv))


def is_local_host(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


EVERYONE_SEES = ("without --auth everyone who can open it sees every job, queue entry and video and can stop or "
                 "remove them; add --auth USER:PASS (once per user) so that each user sees only their own")


def security_warnings(config: Config) -> list[str]:
    """What the user should know about who can reach the app."""
    web, out = config.web, []
    if web.share:
        out.append("--share: the app gets a public gradio.live address; anyone who has the link can upload files "
                   "and use your GPU" + ("" if web.auth else f"; {EVERYONE_SEES}"))
    if not is_local_host(web.host):
        out.append(f"--host {web.host}: the app accepts connections from other computers on your network"
                   + ("" if web.auth else f"; there is no login, and {EVERYONE_SEES}"))
    return out


PUBLIC_NOTICE = ("This app is open to everyone who has its address and has no login: everyone sees every job, "
                 "queue entry and video here and can stop or remove them.")


def public_without_login(config: Config) -> bool:
    """Reachable by others (--share, or a host other than this computer) and no login."""
    web = config.web
    return (web.share or not is_local_host(web.host)) and not web.auth


def host_budget_problem(config: Config, device_type: str) -> str | None:
    """Why no job can run under --host-ram-gb (even at the smallest preserved memory, which streams the least),
    checked at start before any model loads; None if a plan fits. Also logs the budget and where it comes from."""

    if config.host_ram_gb is None:
        log.info("%s", default_host_budget()[1])
    try:
        plan = nominal_plan(get_preset(config.preset), "original", config.vram_cap_gb, MEMORY.preserved_min_gb,
                            device_type, config.host_ram_gb, config.weight_storage, fp8_compute=config.fp8_compute)
    except HostBudgetError as e:
        cpu = (" Without a GPU the whole transformer sits in RAM, and the real models are far too slow to be useful "
               "anyway: --preset tiny runs anywhere.") if device_type == "cpu" else ""
        return f"--host-ram-gb: {e}{cpu}"
    log.info("host RAM plan of a 5 s job (estimated before loading): %s", plan.describe())
    return None


BODY_BYTES_MAX = 1 << 20        # a request's body other than an upload (JSON of a call: settings, prompts, LoRAs)
UPLOAD_ROUTES = ("/gradio_api/upload", "/gradio_api/component_server", "/gradio_api/process_recording")
#                 Gradio's multipart routes: each parses its body as a stream bounded by max_file_size
DRAIN_BYTES_MAX = 64 << 20      # an oversized body up to this is read (and dropped) before the 413, so the client
                                # hears it; a larger one is answered at once


class BodyCap:
    """ASGI middleware: a request body over `limit` bytes, other than a multipart upload to one of Gradio's upload
    routes (UPLOAD_ROUTES, which parse it as a stream bounded by max_file_size), is answered 413 without being kept;
    the body is counted as it arrives, so a missing or false Content-Length does not pass either. A body up to
    DRAIN_BYTES_MAX is read and dropped first, so the client (which sends it whole before it reads) hears the 413
    rather than a reset connection. The exemption is by route, not by the Content-Type alone: Gradio's call routes
    (/queue/join, /run/predict, ...) read any body whole whatever it claims to be. Own code: Starlette and FastAPI
    have no body limit of their own."""

    def __init__(self, app, limit: int = BODY_BYTES_MAX):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers") or ()}
        if headers.get(b"content-type", b"").startswith(b"multipart/form-data") \
                and str(scope.get("path", "")).rstrip("/").endswith(UPLOAD_ROUTES):
            return await self.app(scope, receive, send)
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            declared = 0
        if declared > self.limit:
            if declared <= DRAIN_BYTES_MAX:                # read and drop it (nothing kept): a clean answer
                await _drain(receive, 0)
            return await self._refuse(send)
        seen, rest, over, started = 0, True, False, False  # bytes read; more to come; over the limit; answered

        async def counted():
            nonlocal seen, rest, over
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                rest = bool(message.get("more_body"))
                if seen > self.limit:
                    over = True
                    raise _TooLarge
            return message

        async def answer(message):         # the app's own answer to a body cut off (FastAPI: 400) is replaced
            nonlocal started
            if over and not started:
                return
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, answer)
        except _TooLarge:
            pass
        if over and not started:
            if rest:                       # (once the body has ended, receive() waits for the client to go)
                await _drain(receive, seen)
            await self._refuse(send)

    async def _refuse(self, send):
        body = (f'{{"error": "request body over {self.limit >> 20} MB; upload files as files"}}').encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


async def _drain(receive, seen: int) -> None:
    """Read and drop the rest of a refused body (`seen` bytes of it read already), up to DRAIN_BYTES_MAX in all; it
    stops at the body's end or when the client goes."""
    while seen <= DRAIN_BYTES_MAX:
        message = await receive()
        if message.get("type") != "http.request" or not message.get("more_body"):
            return
        seen += len(message.get("body", b""))


@dataclass(frozen=True)
class LaunchOptions:
    server_name: str
    server_port: int | None
    share: bool
    inbrowser: bool
    auth: list[tuple[str, str]] | None
    blocked_paths: list[str]            # the outputs folder: nothing in it is served as it is (ui/media.py)
    max_file_size: int = MAX_UPLOAD
    temp_max_age_s: float = 24 * 3600.0

    def kwargs(self) -> dict:
        """Blocks.launch() keyword arguments, the page's style included. Gradio serves the files in its upload
        folder (uploads, and the copies of what the page shows: ui/media.py) and nothing of the outputs folder (the
        queue's database, job.json files, other users' videos). The lifespan deletes Gradio's temporary copies of
        uploads and shown videos once older than temp_max_age_s (ui/tempfiles.py says why not Gradio's own
        delete_cache)."""
        from ui.layout import CSS

        return {"server_name": self.server_name, "server_port": self.server_port, "share": self.share,
                "inbrowser": self.inbrowser, "auth": self.auth or None, "allowed_paths": [],
                "blocked_paths": self.blocked_paths,
                "max_file_size": self.max_file_size, "show_error": True, "css": CSS,
                # Gradio's own start-up prints (its URL, "To create a public link, set `share=True` in `launch()`")
                # name its API, not ours: the app logs the address and the public link itself (--share)
                "quiet": True,
                "app_kwargs": {"lifespan": cleanup_lifespan(self.temp_max_age_s),
                               "middleware": [Middleware(BodyCap)]}}      # (starlette: Gradio's)


START_CHECK_S = 60.0     # how long the start check waits for the page to answer (a busy machine's first render)
_ANSWERED = (200, 401, 301, 302, 303, 307, 308)    # what Gradio's own check counts as the page answering


def patient_url_ok(url: str, within_s: float = START_CHECK_S) -> bool:
    """Does the page at `url` answer within `within_s`? Gradio's own check (`gradio.networking.url_ok`, which
    launch() asks before it returns) gives up at the first request that takes over 3 s, and then launch() raises
    "When localhost is not accessible, a shareable link must be created": on a busy 2-core machine the page's
    first render took longer (a CI run of the tests failed so). Written here because Gradio has no setting for it:
    the same question, asked again until `within_s` has passed, each request waiting up to 10 s."""
    import httpx

    deadline = time.monotonic() + within_s
    while True:
        try:
            if httpx.head(url, timeout=10, verify=False).status_code in _ANSWERED:
                return True
        except (httpx.TimeoutException, httpx.ConnectError, ConnectionError):
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def serve(blocks, **kwargs) -> None:
    """`blocks.launch(**kwargs)` (the app's one way to start its server) with Gradio's start check made patient
    (`patient_url_ok`), through the one patch registry."""
    import gradio.networking as networking

    patch = patches.patch(networking, "url_ok", patient_url_ok, "ui.launch.serve")
    try:
        blocks.launch(**kwargs)
    finally:
        patches.restore(patch)


def port_problem(host: str, port: int | None) -> str | None:
    """Why the app cannot listen on ``--port`` (taken by another program), in the app's own terms (Gradio's error
    names its environment variable and launch() parameter); None when it is free or no port was asked for (then the
    first free one from 7860 is taken)."""
    if port is None:
        return None
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return (f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); another program (or "
                    f"another SteadyFrame) uses it. Start with another --port, or leave --port out to take the first "
                    f"free one from 7860.")
    return None


def launch_options(config: Config) -> LaunchOptions:
    web = config.web
    return LaunchOptions(server_name=web.host, server_port=web.port, share=web.share, inbrowser=web.inbrowser,
                         auth=list(web.auth), blocked_paths=[str(Path(config.outputs).expanduser().resolve())],
                         temp_max_age_s=web.temp_max_age_s)
