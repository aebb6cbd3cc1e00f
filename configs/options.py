"""Every process option, declared once: the ones both programs take (`python app.py` and `python -m cli`), the
app's own (who can reach its server), and the one `Config` (configs/runtime.py) built from them. Light: argparse
only."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common.environment import read_environment
from configs.lora import LORA
from configs.memory import MEMORY
from configs.presets import PRESETS
from configs.runtime import Config, FarmOptions, WebOptions


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose errors are one line (a typo in a value: `--mode F1`, `--seconds five`), not the usage block
    before it: `prog: error: the problem (prog -h lists the options)`, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} -h` lists the options)\n")


def outputs_problem(path: Path, *, create: bool = False) -> str | None:
    """Why jobs cannot be written in the folder `path` (None: they can): it is a file, a part of it is a file, or
    (`create`: made when missing, then a file written in it and deleted) it cannot be written."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder; give a folder (it is made when missing)"
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is a file, not a folder; give a folder (it is made when missing)"
            break
    if not create:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as e:
        return f"cannot write in {path} ({e.strerror or type(e).__name__}); give a folder you can write to"
    return None


TEMP_MAX_AGE_S = 24 * 3600                # Gradio's cached uploads/videos (a copy per shown video) live this long


def add_process_options(p: argparse.ArgumentParser, *, preset_default: str | None = None) -> None:
    """What runs the jobs: the models, where jobs are written, the memory limits, the farm. --preset's default None
    means "not given": Config takes hunyuan then; a command that continues a job folder takes that job's preset."""
    p.add_argument("--preset", choices=sorted(PRESETS), default=preset_default,
                   help="hunyuan: the real models (about 42 GB, downloaded once); tiny: tiny random models built in "
                        "code, no download (to try it)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="a folder laid out like the Hugging Face repos (nothing is downloaded when given)")
    p.add_argument("--outputs", "--out", dest="outputs", type=Path, default=Path("outputs"),
                   help="where jobs are written, and the queue kept (default outputs/)")
    p.add_argument("--vram-cap-gb", type=float, default=MEMORY.vram_cap_gb,
                   help=f"hard cap on GPU memory (default {MEMORY.vram_cap_gb:g} GB)")
    p.add_argument("--host-ram-gb", type=float, default=MEMORY.host_ram_gb,
                   help="host RAM this program may use; weights that do not fit are read from the weight files when "
                        "needed (default: this machine's RAM minus a margin for the OS and a browser; logged)")
    p.add_argument("--lora-dir", type=Path, default=Path(LORA.folder),
                   help=f"folder of LoRA files (.safetensors), named by their file name (default {LORA.folder}/)")
    p.add_argument("--upscaler-dir", type=Path, default=Path("upscalers"),
                   help="folder of upscaler files (ESRGAN family: .pth, .safetensors) for post-processing, named by "
                        "their file name; the default Real-ESRGAN is downloaded there on first use (default upscalers/)")
    p.add_argument("--interpolator-dir", type=Path, default=Path("interpolators"),
                   help="folder of RIFE 4.25 files for frame interpolation; the default is downloaded there on first "
                        "use (default interpolators/)")
    p.add_argument("--fp8", action="store_true",
                   help="keep the transformer and the Llama text encoder in fp8 in host RAM (half the RAM and half "
                        "the bytes streamed per step; weights rounded to 3 mantissa bits, see README)")
    p.add_argument("--no-compile", action="store_true",
                   help="run the transformer blocks eagerly (default on a GPU: compiled with torch.compile, about 20 "
                        "%% faster a step; the first job prepares kernels, kept for later starts)")
    p.add_argument("--fp8-compute", action="store_true",
                   help="multiply the transformer blocks' Linears in fp8, their weights kept in fp8 (NVIDIA RTX 40xx/H100 or newer, AMD "
                        "MI300/MI350/RDNA4): faster, slightly less exact; refused on other devices")
    p.add_argument("--no-pin", action="store_true", help="do not page-lock host copies (when host RAM is short)")
    p.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: the GPU if there is one)")
    p.add_argument("--gpus-per-job", type=_positive, default=1, metavar="N",
                   help="split each job over N GPUs of this machine, from --device on (sequence parallelism: a "
                        "step takes about 1/N of the time; N cards of one kind, NCCL/RCCL; default 1)")
    g = p.add_argument_group("job farm (Ray; see README, \"Several GPUs\")")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run jobs on a running Ray cluster, one worker per GPU: 'auto' (the cluster of this "
                            "machine) or its address (host:6379 or ray://host:10001); --outputs must be a path "
                            "every machine shares")
    where.add_argument("--gpus", type=parse_gpus, default=(), metavar="0,1",
                       help="start a local Ray with one worker per listed GPU; jobs run side by side")
    where.add_argument("--cpu-workers", type=_positive, default=0, metavar="N",
                       help="a local Ray with N workers on the CPU (to try the farm with --preset tiny)")


def add_web_options(p: argparse.ArgumentParser) -> None:
    """The app's server: where it listens and who may use it."""
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
    p.add_argument("--temp-max-age", type=float, default=TEMP_MAX_AGE_S, metavar="SECONDS",
                   help="delete the server's temporary copies of uploads and shown videos after this long (default "
                        "one day; they are all deleted when the app stops; outputs/ is never touched)")


def parse_gpus(text: str) -> tuple[int, ...]:
    """'0,1' -> (0, 1). Raises argparse.ArgumentTypeError naming the option and what to write."""
    try:
        gpus = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GPU numbers separated by commas, e.g. --gpus 0,1 (not {text!r})")
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"expected distinct GPU numbers from 0, e.g. --gpus 0,1 (not {text!r})")
    return gpus


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of workers from 1, e.g. --cpu-workers 2 (not {text!r})")
    return n


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
    pairs = [pair for pair in (parse_auth(v) for v in ([values] if isinstance(values, str) else values or []))
             if pair is not None]
    names = [user for user, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--auth: the user {twice[0]!r} is given twice; give each user once")
    return pairs


def config_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Config:
    """The process's Config from parsed options (each checked here: a bad value exits with the usage, naming the
    option)."""
    if getattr(args, "vram_cap_gb", 1) <= 0:
        parser.error("--vram-cap-gb: must be more than 0")
    if getattr(args, "host_ram_gb", None) is not None and not args.host_ram_gb > 0:
        parser.error("--host-ram-gb: must be more than 0 (GB of host RAM this program may use)")
    problem = outputs_problem(Path(args.outputs))
    if problem:
        parser.error(f"--out: {problem}")
    model_dir = getattr(args, "model_dir", None)
    if model_dir and getattr(args, "preset", None) != "tiny" and not Path(model_dir).expanduser().is_dir():
        parser.error(f"--model-dir: no such folder: {model_dir} (it must be a folder laid out like the Hugging Face "
                     f"repos: <dir>/<owner>/<repo>/...)")
    if getattr(args, "preset", None) == "tiny" and getattr(args, "model_dir", None):
        parser.error("--model-dir: the tiny preset builds small random models in code and reads no weights; drop "
                     "--model-dir, or use it with --preset hunyuan")
    web = WebOptions()
    if hasattr(args, "host"):
        try:
            auth = tuple(parse_auths(args.auth))
        except ValueError as e:
            parser.error(str(e))
        users = {user for user, _ in auth}
        unknown = [name for name in args.admin if name not in users]
        if unknown:
            parser.error(f"--admin: {unknown[0]!r} is not a user of --auth; give --auth {unknown[0]}:PASSWORD too")
        if not args.temp_max_age >= 1:
            parser.error("--temp-max-age: must be at least 1 second")
        if args.port is not None and not 0 < args.port < 65536:
            parser.error("--port: must be between 1 and 65535")
        web = WebOptions(args.host, args.port, bool(args.share), bool(args.inbrowser), auth, tuple(args.admin),
                         float(args.temp_max_age))
    farm = FarmOptions(getattr(args, "ray", None), tuple(getattr(args, "gpus", ()) or ()),
                       int(getattr(args, "cpu_workers", 0) or 0))
    env = read_environment()
    return Config(preset=args.preset or "hunyuan", model_dir=args.model_dir, outputs=Path(args.outputs),
                  vram_cap_gb=float(args.vram_cap_gb), host_ram_gb=args.host_ram_gb, lora_dir=Path(args.lora_dir),
                  upscaler_dir=Path(args.upscaler_dir), interpolator_dir=Path(args.interpolator_dir), fp8=bool(args.fp8), pin=not args.no_pin,
                  compile=not args.no_compile, fp8_compute=bool(args.fp8_compute), device=args.device,
                  gpus_per_job=int(getattr(args, "gpus_per_job", 1) or 1), farm=farm,
                  web=web,
                  late_load=_either(env.late_load, MEMORY.late_load), park=_either(env.park, MEMORY.park_file_blocks),
                  direct_io=_either(env.direct_io, MEMORY.direct_io))


def _either(chosen: bool | None, configured: bool) -> bool:
    return configured if chosen is None else chosen


def requested_device_index(argv) -> int | None:
    """N of ``--device cuda:N`` on a command line, read before the parser runs (the ROCm profile is applied before
    torch starts, for the GPU the jobs will use); None when absent or not of that form."""
    args = list(argv)
    for i, arg in enumerate(args):
        value = arg.partition("=")[2] if arg.startswith("--device=") else (
            args[i + 1] if arg == "--device" and i + 1 < len(args) else None)
        if value is not None:
            kind, _, number = value.partition(":")
            return int(number) if kind == "cuda" and number.isdigit() else None
    return None
