"""Command line of `python app.py`, the launch options derived from it, and the security warnings."""
from __future__ import annotations

import argparse
import sys
import ipaddress
import logging
from dataclasses import dataclass
from pathlib import Path

from configs import LIMITS, MEMORY, PRESETS
from configs.lora import LORA
from farm.options import add_arguments as add_farm_arguments

log = logging.getLogger(__name__)

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_UPLOAD = LIMITS.upload_bytes_max     # bytes; Gradio refuses larger uploads
TEMP_MAX_AGE_S = 24 * 3600                # Gradio's cached uploads/videos (a copy per shown video) live this long


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="steadyframe" if Path(sys.argv[0]).name == "steadyframe" else "app.py",    # the console script or the file
        description="SteadyFrame: FramePack-style image-to-video in your browser.")
    p.add_argument("--preset", choices=sorted(PRESETS), default="hunyuan",
                   help="hunyuan: the real models (about 42 GB, downloaded once); tiny: tiny random models built in "
                        "code, no download (to try the app)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="a folder laid out like the Hugging Face repos (nothing is downloaded when given)")
    p.add_argument("--host", "--server", dest="host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: only this computer can connect)")
    p.add_argument("--port", type=int, default=None, help="port (default: the first free one from 7860)")
    p.add_argument("--share", action="store_true", help="make a public gradio.live link (anyone with it can use "
                                                        "your GPU; combine with --auth)")
    p.add_argument("--inbrowser", action="store_true", help="open the app in the default browser")
    p.add_argument("--auth", action="append", default=None, metavar="USER:PASS",
                   help="protect the whole app with a login; give it once per user (each user then sees and "
                        "controls only their own jobs, queue entries and files)")
    p.add_argument("--admin", action="append", default=[], metavar="USER",
                   help="a user of --auth who sees and controls every user's jobs (the only user always does)")
    p.add_argument("--outputs", type=Path, default=Path("outputs"), help="where jobs are written (default outputs/)")
    p.add_argument("--temp-max-age", type=float, default=TEMP_MAX_AGE_S, metavar="SECONDS",
                   help="delete the server's temporary copies of uploads and shown videos after this long (default "
                        "one day; they are all deleted when the app stops; outputs/ is never touched)")
    p.add_argument("--vram-cap-gb", type=float, default=MEMORY.vram_cap_gb,
                   help=f"hard cap on GPU memory this app may use (default {MEMORY.vram_cap_gb:g} GB)")
    p.add_argument("--host-ram-gb", type=float, default=MEMORY.host_ram_gb,
                   help="host RAM this app may use; weights that do not fit are read from the weight files when "
                        "needed (default: this machine's RAM minus a margin for the OS and a browser; logged)")
    p.add_argument("--lora-dir", type=Path, default=Path(LORA.folder),
                   help=f"folder of LoRA files (.safetensors) listed on the page (default {LORA.folder}/)")
    p.add_argument("--fp8", action="store_true",
                   help="keep the transformer and the Llama text encoder in fp8 in host RAM (half the RAM and half "
                        "the bytes streamed per step; weights rounded to 3 mantissa bits, see README)")
    add_farm_arguments(p)           # --ray / --gpus / --cpu-workers: jobs on several GPUs (farm/)
    return p


def parse_auth(value: str | None) -> tuple[str, str] | None:
    """'user:pass' -> ('user', 'pass'). The password may contain ':'; both parts must be non-empty."""
    if value is None:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise ValueError("--auth: expected USER:PASS, e.g. --auth alice:s3cret")
    return user, password


def parse_auths(values) -> list[tuple[str, str]]:
    """Every --auth USER:PASS (a user given twice is refused: which password would count?)."""
    pairs = [parse_auth(v) for v in ([values] if isinstance(values, str) else values or [])]
    names = [user for user, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--auth: the user {twice[0]!r} is given twice; give each user once")
    return pairs


def is_local_host(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


EVERYONE_SEES = ("without --auth everyone who can open it sees every job, queue entry and video and can stop or "
                 "remove them; add --auth USER:PASS (once per user) so that each user sees only their own")


def security_warnings(args: argparse.Namespace) -> list[str]:
    """What the user should know about who can reach the app."""
    out = []
    if args.share:
        out.append("--share: the app gets a public gradio.live address; anyone who has the link can upload files "
                   "and use your GPU" + ("" if args.auth else f"; {EVERYONE_SEES}"))
    if not is_local_host(args.host):
        out.append(f"--host {args.host}: the app accepts connections from other computers on your network"
                   + ("" if args.auth else f"; there is no login, and {EVERYONE_SEES}"))
    return out


PUBLIC_NOTICE = ("This app is open to everyone who has its address and has no login: everyone sees every job, "
                 "queue entry and video here and can stop or remove them.")


def public_without_login(args: argparse.Namespace) -> bool:
    """Reachable by others (--share, or a host other than this computer) and no login."""
    return (bool(args.share) or not is_local_host(args.host)) and not args.auth


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.auth_pairs = parse_auths(args.auth)
    except ValueError as e:
        parser.error(str(e))
    users = {user for user, _ in args.auth_pairs}
    unknown = [name for name in args.admin if name not in users]
    if unknown:
        parser.error(f"--admin: {unknown[0]!r} is not a user of --auth; give --auth {unknown[0]}:PASSWORD too")
    if args.vram_cap_gb <= 0:
        parser.error("--vram-cap-gb: must be more than 0")
    if args.host_ram_gb is not None and not args.host_ram_gb > 0:
        parser.error("--host-ram-gb: must be more than 0 (GB of host RAM this app may use)")
    if not args.temp_max_age >= 1:
        parser.error("--temp-max-age: must be at least 1 second")
    if args.port is not None and not 0 < args.port < 65536:
        parser.error("--port: must be between 1 and 65535")
    return args


def weight_storage(args: argparse.Namespace) -> str:
    return "fp8" if getattr(args, "fp8", False) else "native"


def host_budget_problem(args: argparse.Namespace, device_type: str) -> str | None:
    """Why no job can run under --host-ram-gb (even at the smallest preserved memory, which streams the least),
    checked at start before any model loads; None if a plan fits. Also logs the budget and where it comes from."""
    from configs import get_preset
    from memory.hostbudget import default_host_budget
    from memory.estimate import nominal_plan
    from memory.hostplan import HostBudgetError

    if args.host_ram_gb is None:
        log.info("%s", default_host_budget()[1])
    try:
        plan = nominal_plan(get_preset(args.preset), "original", args.vram_cap_gb, MEMORY.preserved_min_gb,
                            device_type, args.host_ram_gb, weight_storage(args))
    except HostBudgetError as e:
        cpu = (" Without a GPU the whole transformer sits in RAM, and the real models are far too slow to be useful "
               "anyway: --preset tiny runs anywhere.") if device_type == "cpu" else ""
        return f"--host-ram-gb: {e}{cpu}"
    log.info("host RAM plan of a 5 s job (estimated before loading): %s", plan.describe())
    return None


@dataclass(frozen=True)
class LaunchOptions:
    server_name: str
    server_port: int | None
    share: bool
    inbrowser: bool
    auth: list[tuple[str, str]] | None
    blocked_paths: list[str]            # the outputs folder: nothing in it is served as it is (ui/media.py)
    max_file_size: int = MAX_UPLOAD
    temp_max_age_s: float = TEMP_MAX_AGE_S

    def kwargs(self) -> dict:
        """Blocks.launch() keyword arguments, the page's style included. Gradio serves the files in its upload
        folder (uploads, and the copies of what the page shows: ui/media.py) and nothing of the outputs folder (the
        queue's database, job.json files, other users' videos). The lifespan deletes Gradio's temporary copies of
        uploads and shown videos once older than temp_max_age_s (ui/tempfiles.py says why not Gradio's own
        delete_cache)."""
        from ui.layout import CSS
        from ui.tempfiles import cleanup_lifespan

        return {"server_name": self.server_name, "server_port": self.server_port, "share": self.share,
                "inbrowser": self.inbrowser, "auth": self.auth or None, "allowed_paths": [],
                "blocked_paths": self.blocked_paths,
                "max_file_size": self.max_file_size, "show_error": True, "css": CSS,
                "app_kwargs": {"lifespan": cleanup_lifespan(self.temp_max_age_s)}}


def launch_options(args: argparse.Namespace) -> LaunchOptions:
    outputs = Path(args.outputs).expanduser().resolve()
    return LaunchOptions(server_name=args.host, server_port=args.port, share=bool(args.share),
                         inbrowser=bool(args.inbrowser),
                         auth=getattr(args, "auth_pairs", None) or parse_auths(args.auth),
                         blocked_paths=[str(outputs)], temp_max_age_s=getattr(args, "temp_max_age", TEMP_MAX_AGE_S))
