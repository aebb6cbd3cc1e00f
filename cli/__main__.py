"""`python -m cli ...` and the `steadyframe-cli` command. The ROCm environment profile is applied before anything
imports torch, and glibc's heap thresholds fixed, when this module is imported (as app.py does)."""
import rocm  # first: the ROCm environment profile must be applied before anything imports torch

rocm.apply_env_profile()
rocm.configure_host_heap()       # fixed glibc thresholds: RSS given back between sections and jobs

import sys  # noqa: E402

from cli import commands, queue  # noqa: E402


def run() -> int:
    if sys.argv[1:2] == ["queue"]:
        return queue.main(sys.argv[2:])
    return commands.main()


if __name__ == "__main__":
    sys.exit(run())
