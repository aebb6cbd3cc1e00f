"""`python -m cli ...` and the `steadyframe-cli` command. The ROCm environment profile is applied before anything
imports torch, and glibc's heap thresholds fixed, when this module is imported (as app.py does)."""
import sys

import rocm  # first: the ROCm environment profile must be applied before anything imports torch
from configs.options import requested_device_index

rocm.apply_env_profile(device_index=requested_device_index(sys.argv[1:]))     # the GPU the jobs run on
rocm.configure_host_heap()       # fixed glibc thresholds: RSS given back between sections and jobs

from cli import commands, queue, studio  # noqa: E402


def run() -> int:
    if sys.argv[1:2] == ["queue"]:
        return queue.main(sys.argv[2:])
    if sys.argv[1:2] == ["studio"]:
        return studio.main(sys.argv[2:])
    return commands.main()


if __name__ == "__main__":
    sys.exit(run())
