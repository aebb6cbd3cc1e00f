"""Memory limits: the VRAM cap, the preserved-memory default, host-memory options."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryConfig:
    # Hard cap on what PyTorch may allocate on the GPU (enforced with set_per_process_memory_fraction).
    vram_cap_gb: float = 20.0
    # "GPU inference preserved memory": GB of the cap kept free of resident transformer weights for activations,
    # the VAE and other programs. Larger = fewer weights resident = more streaming per step. Same range as FramePack.
    preserved_gb: float = 6.0
    preserved_min_gb: float = 6.0
    preserved_max_gb: float = 128.0
    # Keep host copies of streamed weights in page-locked memory (fast copies); turn off when host RAM is short.
    pin_host_memory: bool = True
    # Streamed transformer blocks copied ahead of the one computing. Measured on an H100: 2 gained nothing over 1.
    prefetch_depth: int = 1
    # Host RAM budget (--host-ram-gb). None: this machine's RAM (or the memory limit of its cgroup/container)
    # minus a margin for the OS and other programs such as a browser: a share of it, within [min, max] GB.
    host_ram_gb: float | None = None
    host_os_margin_share: float = 0.2
    host_os_margin_min_gb: float = 4.0
    host_os_margin_max_gb: float = 16.0
    # Inside a cgroup limit the OS lives outside the limit: only this much of it is kept back.
    host_cgroup_margin_gb: float = 0.5
    # Kept free inside the budget: page cache while weight files are read, GPU libraries loaded on first use,
    # allocator slack. The plan never fills the budget closer than this.
    host_reserve_gb: float = 1.5
    # The app's own host memory on a GPU machine (Python, torch, the CUDA context and libraries), used before a job
    # measures it (the UI hint, the check at start). A job's plan measures the real figure.
    host_overhead_gb: float = 2.5
    # How the transformer and the Llama text encoder are stored in host RAM: "native" (bf16/fp16) or "fp8"
    # (e4m3fn + a scale per output channel, half the bytes; turned back into bf16 on the GPU before use).
    weight_storage: str = "native"
    # Pinned buffers that carry weight-file reads to the GPU (two of them).
    staging_mb: int = 64
    # Threads reading weight files at once (a large read is cut into pieces; benchmarks/read_speed.py). On the H100
    # machine's virtual disk (1.76 GiB/s) 4, 8 or 16 threads were no faster than one, so one is the default; a local
    # NVMe disk may gain from 4-8.
    read_threads: int = 1
    # Read weight files that go to the GPU with O_DIRECT (Linux), past the page cache: under a memory cgroup buffered
    # reads make the kernel reclaim cache pages while it reads (memory/weightfiles.py). False: buffered reads.
    direct_io: bool = True
    # NVIDIA: run PyTorch's CUDA allocator with expandable segments (set before torch starts, only where the user set
    # no PYTORCH_*ALLOC_CONF; rocm/env.py). Keeps the VAE decode's kernels, speed and frames independent of what
    # earlier stages left in the allocator's cache.
    cuda_expandable_segments: bool = True
    # The transformer's resident blocks that the host budget leaves in the weight files are read while the first
    # sampling step already runs the blocks before them (memory/lateload.py) instead of before the stage starts.
    # STEADYFRAME_LATE_LOAD=0/1 overrides it for a run (common/environment.py, configs/options.py).
    late_load: bool = True
    # And when a transformer stage ends, those blocks stay on the GPU through the VAE decode as far as the decode's
    # tiles leave room (the same tiles as without them), so the next section does not read them again
    # (memory/parking.py). STEADYFRAME_PARK=0/1 overrides it for a run.
    park_file_blocks: bool = True
    # Prompt embeddings kept on disk (outputs/.cache/prompts) so a repeated prompt skips the text encoders.
    prompt_cache_mb: int = 512


WEIGHT_STORAGES = ("native", "fp8")


MEMORY = MemoryConfig()
