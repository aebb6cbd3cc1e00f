"""`python -m pipeline ...`: the ROCm environment profile is applied before torch is imported."""
import sys

import rocm

rocm.apply_env_profile()
rocm.configure_host_heap()       # fixed glibc thresholds: RSS given back between sections and jobs

from pipeline.cli import main  # noqa: E402  (after the environment profile, on purpose)

sys.exit(main())
