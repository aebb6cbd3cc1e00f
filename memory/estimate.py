"""What a job will cost before anything is loaded: the GPU residency the preserved memory gives and the host plan
from the models' nominal sizes, for the UI's live hint under the preserved-memory slider (`describe_preserved`) and
for the up-front check of --host-ram-gb (app start, CLI) that refuses a budget no plan fits before a single weight
is read (`nominal_plan`).

Sizes: the transformer and the Llama are built on the meta device with the real configs (exact bytes per chunk,
and their fp8 sizes; the size check, memory/resolution.py, reads the transformer's from here too), the Llama
trimmed as a job loads it (memory/llama_trim.py: without its last layers and final norm, and with real weights
without its embedding, whose rows are read from the files per prompt); CLIP, the VAE and SigLIP are one chunk of
their preset size. The process's own memory is not known yet: the larger of what it holds now and an estimate
(configs/memory.py, host_overhead_gb on a GPU). The plan a job makes measures it instead (MemoryManager.arrange_host).
"""
from __future__ import annotations

from functools import lru_cache

from common.units import GB, GIB
from configs.memory import MEMORY
from memory.hostbudget import default_host_budget, job_working_bytes, rss_breakdown
from memory.hostplan import FRAMEPACK_STAGES, HostBudgetError, HostPlan, ModelHost, plan_host
from memory.plan import REAL_TRANSFORMER_CONFIG, ResidencyPlan, Workload, text_residency, transformer_residency

REAL_LLAMA_CONFIG = (("vocab_size", 128320), ("hidden_size", 4096), ("intermediate_size", 14336),
                     ("num_hidden_layers", 32), ("num_attention_heads", 32), ("num_key_value_heads", 8))
NOMINAL_SECTIONS, NOMINAL_FRAMES = 4, 145     # a 5 s video at 30 fps (the default length)


def _items(cfg) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in dict(cfg).items()))


def _chunk_sizes(kind: str, config_items: tuple, dtype_bytes: int, files: bool = False, kept: bool = False
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(bytes per chunk in the model's dtype, bytes per chunk in fp8 storage); chunk 0 is the rest, then blocks.
    `files`: the weights are read from files (the Llama's embedding is then no chunk). `kept`: fp8 compute's Linears
    (memory/fp8.py `compute_target`) kept in fp8 in the first, as memory/chunk.py lays them out on the device and,
    without fp8 storage, in host RAM."""
    plain, stored, with_kept = _sizes(kind, config_items, dtype_bytes, files)
    return (with_kept if kept else plain), stored


@lru_cache(maxsize=16)
def _sizes(kind: str, config_items: tuple, dtype_bytes: int, files: bool
           ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """`_chunk_sizes`'s three forms from one model built on the meta device: plain, fp8 storage, fp8 compute's."""
    import torch

    from memory import fp8
    from memory.chunk import ALIGN as _ALIGN
    from memory.chunk import _align
    from memory.hostpack import block_list

    with torch.device("meta"):
        if kind == "transformer":
            from diffusers import HunyuanVideoFramepackTransformer3DModel

            model = HunyuanVideoFramepackTransformer3DModel(**dict(config_items))
        else:
            from transformers import LlamaConfig, LlamaModel

            from memory.llama_trim import trim_llama

            model = trim_llama(LlamaModel(LlamaConfig(**dict(config_items))))
            if files:
                model.embed_tokens = torch.nn.Identity()      # a FileEmbedding: rows read per prompt, no chunk
    blocks = block_list(model)
    in_blocks = {id(m) for b in blocks for m in b.modules()}
    groups = [[m for m in model.modules() if id(m) not in in_blocks]] + [list(b.modules()) for b in blocks]
    names = {id(m): n for n, m in model.named_modules()}
    plain, stored, with_kept = [], [], []
    for modules in groups:
        a = b = c = 0
        for m in modules:
            for name, p in m._parameters.items():
                if p is None:
                    continue
                whole = _align(p.numel() * dtype_bytes)
                a += whole
                if fp8.quantizable(m, name, p):
                    values, scales = fp8.stored_bytes(tuple(p.shape))
                    b += _align(values) + _align(scales)
                    keep = fp8.compute_target(names[id(m)], m) and fp8.kept_fits(tuple(p.shape), whole, _ALIGN)
                    c += _align(values) + _align(scales) if keep else whole
                else:
                    b += whole
                    c += whole
        plain.append(a)
        stored.append(b)
        with_kept.append(c)
    return tuple(plain), tuple(stored), tuple(with_kept)


def transformer_config(preset) -> tuple[tuple, int]:
    """(config items, bytes per weight) of the preset's transformer: the tiny one's config in fp32, the real one's
    in bf16."""
    if preset.tiny:
        return _items(preset.tiny_configs["transformer"]), 4
    return REAL_TRANSFORMER_CONFIG, 2


def transformer_hidden(config_items: tuple) -> int:
    """The transformer's hidden size (diffusers' defaults for what the config leaves out: 24 heads of 128)."""
    cfg = dict(config_items)
    return int(cfg.get("num_attention_heads", 24)) * int(cfg.get("attention_head_dim", 128))


def transformer_device_sizes(preset, weight_storage: str = "native", fp8_compute: bool = False
                             ) -> tuple[tuple[int, ...], int]:
    """(bytes per chunk on the GPU, chunk 0 the rest and then the blocks; the bytes staged beside each streaming
    slot) of the preset's transformer: the one count of what it lays on the device before a job, read by the
    residency estimate here and by the size check (memory/resolution.py), so the two never disagree.

    `fp8_compute`: the Linears fp8 compute multiplies (memory/fp8.py `compute_target`) take their fp8 values and row
    scales, as memory/chunk.py lays them out on the device. fp8 storage (`weight_storage == "fp8"`) leaves the device
    layout as it is, but a streamed block whose stored form is not that layout byte for byte (without fp8 compute
    every block; with it, still those whose modulation Linears are stored in fp8 and turned back to bf16 on the
    device) is copied into a staging buffer of its stored bytes beside its slot (memory/streaming.py)."""
    items, dtype_bytes = transformer_config(preset)
    device, stored = _chunk_sizes("transformer", items, dtype_bytes, kept=fp8_compute)
    stage = max((s for s, d in zip(stored[1:], device[1:]) if s != d), default=0) if weight_storage == "fp8" else 0
    return device, stage


def nominal_transformer_plan(preset, cap_gb: float, preserved_gb: float, workload: Workload = Workload(),
                             weight_storage: str = "native", fp8_compute: bool = False) -> ResidencyPlan:
    """What of the transformer stays on the GPU for a job of `workload` (its bucket and window): the same rule
    (memory/plan.py `transformer_residency`) on the same sizes as the planner when the job runs
    (memory/budget.py), from the config alone; with `fp8_compute` its Linears kept in fp8 on the device."""
    items, dtype_bytes = transformer_config(preset)
    device, stage = transformer_device_sizes(preset, weight_storage, fp8_compute)
    return transformer_residency(device[1:], device[0], int(cap_gb * GIB), int(preserved_gb * GIB), workload,
                                 transformer_hidden(items), dtype_bytes, slot_count=MEMORY.prefetch_depth + 1,
                                 stage_bytes=stage)


def nominal_models(preset, mode: str, cap_gb: float, preserved_gb: float, device_type: str,
                   weight_storage: str = "native", workload: Workload = Workload(),
                   fp8_compute: bool = False) -> list[ModelHost]:
    gpu = device_type == "cuda"
    quant = weight_storage == "fp8"
    items, dtype_bytes = transformer_config(preset)
    tr = _chunk_sizes("transformer", items, dtype_bytes)
    laid = _chunk_sizes("transformer", items, dtype_bytes, kept=True)[0] if fp8_compute else tr[0]   # device layout
    if preset.tiny:
        llama = _chunk_sizes("llama", _items(preset.tiny_configs["llama"]), 4)
        small = {"text_encoder_2": 0.001, "vae": 0.001, "image_encoder": 0.001}
    else:
        llama = _chunk_sizes("llama", REAL_LLAMA_CONFIG, 2, files=True)
        small = {r: getattr(preset, r).size_gb for r in ("text_encoder_2", "vae", "image_encoder")}
    files = not preset.tiny
    out = []
    for name, (plain, stored), device in (("text_encoder", llama, llama[0]), ("transformer", tr, laid)):
        chunk_bytes = stored if quant else device
        streamed: tuple[int, ...] = ()
        if gpu and name == "transformer":
            streamed = nominal_transformer_plan(preset, cap_gb, preserved_gb, workload, weight_storage,
                                                fp8_compute).streamed
        elif gpu:
            text = text_residency(plain[1:], plain[0], int(small["text_encoder_2"] * GB), int(cap_gb * GIB),
                                  slot_count=MEMORY.prefetch_depth + 1)
            streamed = text.streamed if text is not None else ()
        chunks = frozenset(i + 1 for i in streamed)
        transient = tuple((chunk_bytes[i] if i in chunks else 0) if gpu else device[i] for i in range(len(plain)))
        out.append(ModelHost(name, chunk_bytes, tuple(plain) if files else None, transient, chunks))
    for name, size in small.items():
        b = int(size * GB)           # the presets' sizes are the hub's decimal GB
        out.append(ModelHost(name, (b,), (b,) if files else None, (0 if gpu else b,)))
    return out


def nominal_overhead(device_type: str, workload: Workload = Workload()) -> int:
    rss = rss_breakdown()
    now = rss["anon"] + rss["file"] + rss["shmem"]
    estimate = MEMORY.host_overhead_gb * GIB if device_type == "cuda" else 0
    return int(max(now, estimate) + job_working_bytes(NOMINAL_FRAMES, workload.height, workload.width,
                                                      workload.window)
               + (2 * MEMORY.staging_mb << 20 if device_type == "cuda" else 0))


def nominal_plan(preset, mode: str, cap_gb: float, preserved_gb: float, device_type: str,
                 host_ram_gb: float | None = None, weight_storage: str = "native",
                 workload: Workload = Workload(), fp8_compute: bool = False) -> HostPlan:
    """The host plan of a default-length job of `workload` (a request's bucket and window; the default: the nominal
    608×640; `fp8_compute`: the transformer's Linears kept in fp8); raises HostBudgetError (with the minimum) if
    none fits."""
    budget = int(host_ram_gb * GIB) if host_ram_gb is not None else default_host_budget()[0]
    models = nominal_models(preset, mode, cap_gb, preserved_gb, device_type, weight_storage, workload, fp8_compute)
    return plan_host(models, FRAMEPACK_STAGES, NOMINAL_SECTIONS, budget, nominal_overhead(device_type, workload),
                     int(MEMORY.host_reserve_gb * GIB), pinned=device_type == "cuda" and MEMORY.pin_host_memory,
                     gpu=device_type == "cuda")


def describe_preserved(preset, cap_gb: float, preserved_gb: float, device_type: str,
                       host_ram_gb: float | None = None, weight_storage: str = "native",
                       size: tuple[int, int] = (608, 640), window: int = 9, fp8_compute: bool = False) -> str:
    """What the preserved-memory slider means on this machine, in one line (the UI shows it live), with the host
    side: how much host RAM a default job takes of the budget and what is read from the weight files. `size`:
    the job's (height, width), for the activation estimate (memory/resolution.py says what the size costs);
    `fp8_compute`: --fp8-compute's Linears kept in fp8 (half their bytes on the GPU and in RAM)."""
    host = describe_host(preset, cap_gb, preserved_gb, device_type, host_ram_gb, weight_storage, fp8_compute)
    if device_type != "cuda":
        return (f"CPU run: no GPU, so nothing is capped or streamed (the slider only matters on a GPU; "
                f"a {cap_gb:g} GB cap with {preserved_gb:g} GB preserved would apply there). {host}")
    plan = nominal_transformer_plan(preset, cap_gb, preserved_gb, Workload(size[0], size[1], window),
                                    weight_storage, fp8_compute)
    warn = plan.warnings()
    return plan.describe() + (f". Warning: {'; '.join(warn)}" if warn else "") + f". {host}"


def describe_host(preset, cap_gb: float, preserved_gb: float, device_type: str, host_ram_gb: float | None = None,
                  weight_storage: str = "native", fp8_compute: bool = False) -> str:
    """'Host: 21.3 of 24.0 GB (...)' for a default-length job, or why the budget cannot work."""
    try:
        plan = nominal_plan(preset, "original", cap_gb, preserved_gb, device_type, host_ram_gb, weight_storage,
                            fp8_compute=fp8_compute)
    except HostBudgetError as e:
        return f"Host RAM: {e}"
    held = "pinned" if plan.pinned else "in RAM"
    per_section = sum(plan.file_reads(m.name)[1] for m in plan.models)
    per_job = plan.file_reads_per_job - per_section * plan.sections
    files = []
    if per_section:
        files.append(f"{per_section / GIB:.1f} GB read from the weight files per section")
    if per_job:
        files.append(f"{per_job / GIB:.1f} GB per job")
    storage = ", weights in fp8" if weight_storage == "fp8" else ""
    return (f"Host: {plan.peak / GIB:.1f} of {plan.budget / GIB:.1f} GB ({plan.persistent_bytes / GIB:.1f} GB "
            f"{held}{storage}" + (f"; {', '.join(files)}" if files else "") + ")")
