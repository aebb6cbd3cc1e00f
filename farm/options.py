"""The farm's command-line options (`--ray`, `--gpus`, `--cpu-workers`), shared by `python app.py` and the CLI's
`batch`. Light: no Ray import here."""
from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class FarmOptions:
    address: str | None = None           # --ray: "auto" (the cluster this machine belongs to) or a cluster address
    gpus: tuple[int, ...] = ()           # --gpus: start a local Ray with one worker per listed GPU
    cpu_workers: int = 0                 # --cpu-workers: a local Ray with N workers on the CPU (tests, trying it)

    @property
    def enabled(self) -> bool:
        return bool(self.address or self.gpus or self.cpu_workers)


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("job farm (Ray; see README, \"Several GPUs\")")
    where = g.add_mutually_exclusive_group()
    where.add_argument("--ray", metavar="ADDRESS", default=None,
                       help="run jobs on a running Ray cluster, one worker per GPU: 'auto' (the cluster of this "
                            "machine) or its address (host:6379 or ray://host:10001); --outputs must be a path "
                            "every machine shares")
    where.add_argument("--gpus", type=parse_gpus, default=(), metavar="0,1",
                       help="start a local Ray with one worker per listed GPU; jobs run side by side")
    where.add_argument("--cpu-workers", type=_positive, default=0, metavar="N",
                       help="a local Ray with N workers on the CPU (to try the farm with --preset tiny)")


def farm_options(args: argparse.Namespace) -> FarmOptions:
    return FarmOptions(getattr(args, "ray", None), tuple(getattr(args, "gpus", ()) or ()),
                       int(getattr(args, "cpu_workers", 0) or 0))
