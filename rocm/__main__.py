"""``python -m rocm doctor [--json] [--probe | --no-probe] [--probe-timeout S] [--probe-tiers 1,2,3] [--small]
[--attention | --no-attention] [--reset]``.

Applies the environment profile first (before torch is imported), as app.py and the CLI do, so the probe children
and the attention timing run with the settings SteadyFrame uses; the report shows your own environment and what
the profile adds. Progress lines go to stderr while it probes and times, so ``--json`` output stays clean.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from rocm.doctor_text import render_text
from rocm.env import apply_env_profile


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rocm", description="SteadyFrame ROCm/GPU tools")
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="report backend, versions, environment warnings, conv tier probes")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    group = doc.add_mutually_exclusive_group()
    group.add_argument("--probe", dest="probe", action="store_true", default=None,
                       help="run the probe table even on CPU (small shapes)")
    group.add_argument("--no-probe", dest="probe", action="store_false", help="skip the probe table")
    doc.add_argument("--probe-timeout", type=float, default=30.0, help="seconds per conv in the probe child")
    doc.add_argument("--probe-tiers", default="1,2,3,4", help="tiers to probe, e.g. 1,2,3,4,5 (5 = CPU, slow)")
    doc.add_argument("--small", action="store_true", default=None,
                     help="probe and time small shapes (quick check)")
    att = doc.add_mutually_exclusive_group()
    att.add_argument("--attention", dest="attention", action="store_true", default=None,
                     help="time the attention backends even on CPU (small shape)")
    att.add_argument("--no-attention", dest="attention", action="store_false", help="skip the attention timing")
    doc.add_argument("--reset", action="store_true",
                     help="delete the stored conv verdicts and remembered fallbacks (compiled blocks, fp8 "
                          "compute) first (they are re-learnt on the next runs)")
    doc.add_argument("-v", "--verbose", action="store_true", help="log what is being done")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")

    user_env = dict(os.environ)
    apply_env_profile()            # before torch, exactly like app.py / the CLI
    from rocm.doctor import collect

    tiers = tuple(int(t) for t in args.probe_tiers.split(",") if t.strip())

    def progress(line: str) -> None:
        sys.stderr.write(f"doctor: {line}\n")
        sys.stderr.flush()

    report = collect(probe=args.probe, probe_timeout_s=args.probe_timeout, probe_tiers=tiers, small=args.small,
                     environ=user_env, attention=args.attention, reset=args.reset, progress=progress)
    sys.stdout.write((json.dumps(report, indent=2, default=str) if args.json else render_text(report)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
