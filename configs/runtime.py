"""One process's configuration: what the app (`python app.py`) and the command line (`python -m cli`) run with.

A `Config` is built once per process, from the defaults below and the command line (configs/options.py declares
every option once, for both programs), and is then passed to whatever needs it: the runner, the page.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from configs.lora import LORA
from configs.memory import MEMORY


@dataclass(frozen=True)
class FarmOptions:
    """Where jobs run when not in this process (farm/): --ray, --gpus, --cpu-workers."""
    address: str | None = None           # --ray: "auto" (the cluster this machine belongs to) or a cluster address
    gpus: tuple[int, ...] = ()           # --gpus: a local Ray with one worker per listed GPU
    cpu_workers: int = 0                 # --cpu-workers: a local Ray with N workers on the CPU (tests, trying it)

    @property
    def enabled(self) -> bool:
        return bool(self.address or self.gpus or self.cpu_workers)


@dataclass(frozen=True)
class WebOptions:
    """The app's server: who can reach it and how (the command line's app-only options)."""
    host: str = "127.0.0.1"
    port: int | None = None
    share: bool = False
    inbrowser: bool = False
    auth: tuple[tuple[str, str], ...] = ()          # (user, password) per --auth
    admins: tuple[str, ...] = ()                     # --admin
    temp_max_age_s: float = 24 * 3600.0             # Gradio's copies of uploads and shown videos live this long


@dataclass(frozen=True)
class Config:
    preset: str = "hunyuan"                          # "hunyuan" (the real models) or "tiny"
    model_dir: Path | None = None                    # a local folder laid out like the repos (nothing downloaded)
    outputs: Path = Path("outputs")
    vram_cap_gb: float = MEMORY.vram_cap_gb
    host_ram_gb: float | None = MEMORY.host_ram_gb  # None: what the machine can spare (memory/hostbudget.py)
    lora_dir: Path = Path(LORA.folder)
    upscaler_dir: Path = Path("upscalers")           # post-processing's model files (post/modelfiles.py)
    interpolator_dir: Path = Path("interpolators")
    fp8: bool = False                                # the transformer and the Llama kept in fp8 in host RAM
    pin: bool = True                                 # page-locked host copies
    compile: bool = True                             # compiled transformer blocks on GPUs (--no-compile: eager)
    fp8_compute: bool = False                        # --fp8-compute: block Linears multiply in fp8 (pipeline/compiled.py)
    device: str | None = None                        # None: the GPU if there is one
    gpus_per_job: int = 1                            # --gpus-per-job: one job split over N GPUs (jobs/split.py)
    late_load: bool = MEMORY.late_load               # MemoryConfig's switches, or the environment's for a run
    park: bool = MEMORY.park_file_blocks             # (common/environment.py STEADYFRAME_LATE_LOAD, _PARK,
    direct_io: bool = MEMORY.direct_io               # _DIRECT_IO)
    farm: FarmOptions = field(default_factory=FarmOptions)
    web: WebOptions = field(default_factory=WebOptions)

    @property
    def weight_storage(self) -> str:
        return "fp8" if self.fp8 else "native"

    def memory_options(self) -> dict:
        """What this process's MemoryManagers are built with (besides the device and a job's preserved memory)."""
        return dict(cap_gb=self.vram_cap_gb, host_ram_gb=self.host_ram_gb, weight_storage=self.weight_storage,
                    pin_host_memory=self.pin, late_load=self.late_load, park=self.park, direct_io=self.direct_io)
