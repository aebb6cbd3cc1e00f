"""The one pre-flight: what every job is checked against before it is queued, whoever starts it (page, API, queue
panel, command line, batch file, farm), so that a job that cannot run is refused then, naming the field, and not
when its turn comes.

- its request (pipeline/request.py `prepare`: every field, the images decoded once, an input video read);
- its size fits under the VRAM cap (pipeline/resolution.py), its blocks counted as the process's weight storage
  and --fp8-compute lay them on the GPU;
- the host-RAM budget can hold it (memory/estimate.py: the nominal plan, nothing loaded);
- its LoRAs: each file read and checked against the transformer's layers (its config: nothing loaded);
- a post-processing job (post/): its videos read, its steps planned, each model file read and its architecture
  recognised (post/job.py `check`);
- "fp8 attention" on: the device can run it (rocm/fp8_attention.py `unavailable`: an NVIDIA GPU of compute
  capability 9.0 or newer with the cuDNN frontend installed, or a Hopper GPU with FlashAttention-3 built),
  else the job is refused naming the setting.

`preflight_for(config, device)` builds it, the same way for the app (its runner: Start, the API, the queue panel),
the command line (generate, batch, resume) and `python -m cli queue add`: from the process's Config (cap, host RAM,
weight storage, LoRA folder) and the device its jobs run on (the preserved-vs-cap check is a GPU's).
"""
from __future__ import annotations

from common.errors import InputError
from configs.presets import get_preset
from configs.runtime import Config
from jobs.models import models_for
from memory.estimate import nominal_plan
from memory.hostplan import HostBudgetError
from memory.plan import Workload
from pipeline.resolution import check_fits
from post.steps import PostRequest


def preflight_for(config: Config, device) -> "Preflight":
    """The one pre-flight of a process whose jobs run on `device` (a torch.device), with its models (not loaded:
    jobs/models.py; their transformer's config is what LoRAs are checked against). Raises RuntimeError
    (pipeline.compiled.Fp8ComputeUnavailable) when --fp8-compute cannot run on `device`."""
    return Preflight(config, models_for(config, device), device.type, device=device)


class Preflight:
    def __init__(self, config: Config, models=None, device_type: str = "cpu", *, device=None):
        self.config = config
        self.preset = get_preset(config.preset)
        self.models = models                    # jobs.models.ComponentCache: a loaded transformer for LoRA checks
        self.device_type = device_type
        self.device = device                    # the torch.device jobs run on (None: the first of device_type)
        self._fp8_attention: list[str | None] = []     # why fp8 attention cannot run here, once asked

    @property
    def default_resolution(self) -> int:
        return self.preset.default_resolution

    def prepare(self, request):
        """The checked, prepared request (a PreparedRequest stays as it is; a post job's PostRequest becomes a
        CheckedPost: its videos read, its model files read and recognised). Raises InputError naming the field."""
        from pipeline.request import PreparedRequest, prepare
        from post.job import CheckedPost, folders_of
        from post.job import check as post_check

        if isinstance(request, CheckedPost):
            return request
        if isinstance(request, PostRequest):
            return post_check(request, folders_of(self.config))

        prepared = request if isinstance(request, PreparedRequest) else prepare(request, self.default_resolution)
        self.check(prepared)
        return prepared

    def check(self, prepared) -> None:
        """What a prepared request must pass besides its own fields."""
        request = prepared.request
        cap = self.config.vram_cap_gb
        if self.device_type == "cuda" and request.preserved_gb > cap:    # what the page's hint calls "cannot work"
            raise InputError("preserved memory", f"{request.preserved_gb:g} GB is more than the VRAM cap ({cap:g} "
                                                 f"GB) can preserve: choose at most {cap:g} GB")
        if prepared.source is None:             # an extension's size is its input's
            check_fits(prepared, self.preset, self.config.vram_cap_gb, self.config.weight_storage,
                       self.config.fp8_compute)
        problem = self.host_problem(prepared)
        if problem:
            raise InputError("host RAM", problem)
        if getattr(request, "fp8_attention", "off") == "on":
            problem = self.fp8_attention_problem()
            if problem:
                raise InputError("fp8 attention", problem)
        self.check_loras(request.mode, request.loras)

    def fp8_attention_problem(self) -> str | None:
        """Why this process's device cannot run fp8 attention (None: it can); asked once."""
        if not self._fp8_attention:
            import torch

            from rocm.fp8_attention import unavailable

            self._fp8_attention.append(unavailable(self.device or torch.device(self.device_type)))
        return self._fp8_attention[0]

    def host_problem(self, prepared) -> str | None:
        """Why the host-RAM budget cannot hold the prepared job (its mode, preserved memory, bucket and window;
        checked before any model loads), or None."""
        request = prepared.request
        workload = Workload(prepared.height, prepared.width, request.latent_window)
        try:
            nominal_plan(self.preset, request.mode, self.config.vram_cap_gb, request.preserved_gb, self.device_type,
                         self.config.host_ram_gb, self.config.weight_storage, workload, self.config.fp8_compute)
        except HostBudgetError as e:
            return str(e)
        return None

    def check_loras(self, mode: str, spec) -> None:
        """The LoRAs read and checked against the transformer now. Without the real weights' config on this
        computer yet, only the setting is checked; the files are checked when the job runs."""
        from pipeline import lora

        if not lora.parse_spec(spec):
            return
        model = self.models.transformer_for_checks(mode) if self.models is not None else None
        if model is not None:
            lora.load_set(spec, self.config.lora_dir, model)
