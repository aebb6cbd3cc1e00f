"""Compiled transformer blocks (on by default on GPUs) and fp8 matrix products (`--fp8-compute`, opt-in).

**Compiled blocks.** The 20 double-stream and 40 single-stream blocks are two classes; `torch.compile` traces each
class's `forward` once and every block of that class reuses the compiled code (dynamo takes the block as an input,
its parameters as graph inputs). A block's `forward` becomes a small dispatcher, set once per loaded transformer:
compiled or eager, per job (`CompiledBlocks.enabled`). What memory/ hangs on a block (the streaming hook that points
a streamed block's parameters at its device slot, memory/streaming.py) wraps this dispatcher from the outside, so
hooks run eagerly around the compiled computation and never inside it; a streamed block swapped in and out has
parameters of the same shape, dtype and device each time, so it does not recompile. LoRAs are merged into the
weights' device copies (memory/deltas.py): no recompile per job either. Attention inside compiled code is one opaque
operator that runs rocm/sdpa.py's checked kernel choice (its chunked fallback on ROCm included).

Compiled, two products take forms of their own (pipeline/block_forms.py): the MLP's GELU in the product's epilogue
on NVIDIA GPUs, and the single-stream block's output product without its concatenation; eager runs diffusers' own.

Graphs are static, one per class and set of input shapes: a resolution bucket with a prompt length in tokens (and
the negative prompt's with CFG > 1) compiles once per process, 12-27 s the first time on an H200 and 2-5 s from
the disk cache; every later job of those shapes reuses it (no recompile: counted in benchmarks/compiled.py). Static
graphs keep a request on the same kernels whatever ran before it (`configure()` says why dynamic sizes did not).
Up to RECOMPILE_LIMIT (64) shape sets per process; past that dynamo runs a block eagerly.

Compiled kernels are kept across restarts in `<cache root>/compile` (TorchInductor's caches: TORCHINDUCTOR_CACHE_DIR,
unless set already), so a restarted app only traces the blocks again (seconds) instead of compiling them.

Eager: on the CPU (compiling the tiny preset costs more than it saves), where PyTorch has no Triton (e.g. some
Windows builds), with `--no-compile`, or when a job's "Compiled transformer" is off. One log line says which.

**Falling back.** A block class whose compiled forward fails to compile or fails on its first call (a Triton or
Inductor error: RDNA1/RDNA2, where Triton is not supported; a Windows PyTorch with a broken triton-windows; an old
driver) makes every block eager for the rest of the process, and the call that failed runs eagerly: the job goes on
(the same seed, the same steps), with one warning naming the error and `--no-compile`. The failure is remembered for
this GPU and PyTorch (rocm/fallbacks.py, beside the conv verdicts; `python -m rocm doctor` shows it, `--reset`
forgets it), so the next start does not try. An out-of-memory error is not a compiler failure and is raised as
it is (the memory layer streams more and runs the step again).

**fp8 compute** (row-wise scaling; one scale per tensor where the GPU's PyTorch has no row-wise fp8 product): each
Linear inside the blocks multiplies in float8 e4m3 with PyTorch's own fp8 product (`torch._scaled_mm`, cuBLASLt /
hipBLASLt, the kernel torchao's float8 inference calls too; no hand-written kernels). Its weight is kept in fp8:
stored as e4m3 values with a scale per row in host RAM (memory/fp8.py, whatever `--fp8` says: the same rounding the
product would apply) and copied to the device in that form (resident blocks, streamed slots, parked blocks), so a
product only quantizes its activation per token (fused into the compiled block) and a streamed block copies half
the bytes. LoRAs are merged into the device copy (turned to bf16, merged, quantized again).
Needs fp8 tensor cores: NVIDIA compute capability 8.9+ (Ada, Hopper, Blackwell) or AMD gfx942/gfx950 (MI300,
MI350) and gfx12 (RDNA4) with a PyTorch that supports fp8 products there (checked by a small product at start; MI300
multiplies e4m3fnuz, so there the kept e4m3fn weight is read as e4m3fnuz, exactly: `as_fnuz`). Where that product
fails, the blocks multiply in bf16 with one warning, remembered for the GPU and PyTorch (rocm/fallbacks.py).
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch._dynamo.config as dynamo_config
import torch._inductor.config as inductor_config
from torch import nn
from torch._dynamo.exc import TorchDynamoException
from torch._dynamo.utils import counters
from torch.utils._triton import has_triton

from common.environment import read_environment
from memory import fp8
from memory.hostpack import HostPack
from pipeline import block_forms, fp8_rows
from rocm import fallbacks
from rocm.arch import device_facts

log = logging.getLogger(__name__)

CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"
PREPARING = "preparing kernels (first job only)"
FP8_ARCHS = ("gfx942", "gfx950", "gfx1200", "gfx1201")      # AMD GPUs with fp8 matrix cores
_ATTR = "_steadyframe_compiled"
_COMPILED: dict[type, object] = {}                          # one compiled forward per block class, per process


def unavailable(device: torch.device) -> str | None:
    """Why blocks cannot be compiled on `device` (None: they can)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"compiled blocks are for GPUs; the {device.type.upper()} runs them eagerly"
    if not has_triton():
        return "this PyTorch install has no Triton (the GPU compiler torch.compile needs), so blocks run eagerly"
    return None


def cache_folder() -> Path:
    """Where compiled kernels are kept between runs: TORCHINDUCTOR_CACHE_DIR if set, else <cache root>/compile."""
    chosen = os.environ.get(CACHE_VAR)
    return Path(chosen) if chosen else read_environment().cache_root / "compile"


def use_cache_folder() -> Path:
    """Point TorchInductor's caches (compiled graphs, Triton kernels, autotuning) at `cache_folder()`."""
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault(CACHE_VAR, str(folder))
    return folder


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a recompile counts as one more)."""
    return int(counters["stats"]["unique_graphs"])


def blocks_of(transformer: nn.Module) -> list[nn.Module]:
    return list(transformer.transformer_blocks) + list(transformer.single_transformer_blocks)


def machine(device: torch.device) -> tuple[str, str]:
    """(this GPU as rocm/fallbacks.py names it, the torch version): what a remembered fallback is kept for."""
    facts = device_facts(device)
    return fallbacks.gpu_label(facts.name, facts.reported_arch), facts.torch_version


def compiled_forward(cls: type[nn.Module]):
    """The one compiled forward of a block class, made at its first compiled call. Not before: torch.compile's
    first use in a process imports dynamo's tracer (1.5 s on a 2-core machine), which a process whose blocks run
    eagerly (the CPU, --no-compile, a job with compiling off) never needs."""
    forward = _COMPILED.get(cls)
    if forward is None:
        forward = _COMPILED.setdefault(cls, torch.compile(block_forms.compiled_form(cls), dynamic=False))
    return forward


class CompiledBlocks:
    """The dispatchers of one transformer's blocks; `enabled` chooses compiled or eager for the next calls. A
    compiled block class failing to compile or on its first call turns them all eager (`failed` says why)."""

    def __init__(self, transformer: nn.Module):
        self.enabled = False
        self.failed: str | None = None              # the compiler error that made this process eager
        self.device: torch.device | None = None     # the job's device (whose failure is remembered)
        self.worked: set[type] = set()              # block classes whose compiled forward has run here
        self.prepared: set[tuple] = set()          # shapes whose kernels were prepared in this process
        for block in blocks_of(transformer):
            registry = getattr(block, "_diffusers_hook", None)
            if registry is not None and registry.hooks:
                raise RuntimeError(f"{type(block).__name__} has hooks attached ({', '.join(registry.hooks)}); "
                                   f"set up compiled blocks between stages")
            block.forward = self._dispatcher(block)
        block_forms.fuse_blocks(blocks_of(transformer))

    def _dispatcher(self, block: nn.Module):
        cls = type(block)
        eager = cls.forward.__get__(block)          # the class's own forward (a removed hook leaves a bound copy)

        def forward(*args, **kwargs):
            if self.enabled and self.failed is None:
                try:
                    out = compiled_forward(cls)(block, *_canonical(args), **kwargs)
                except torch.OutOfMemoryError:
                    raise
                except Exception as e:      # any compiler or first-call failure: eager from here on (the docstring)
                    if cls in self.worked and not isinstance(e, TorchDynamoException):
                        raise               # a class that ran compiled before: not the compiler's failure
                    self._fall_back(cls, e)
                    return eager(*args, **kwargs)
                self.worked.add(cls)
                return out
            return eager(*args, **kwargs)

        return forward

    def _fall_back(self, cls: type, error: Exception) -> None:
        text = " ".join(str(error).split())[:300] or type(error).__name__
        self.failed = f"{cls.__name__}: {type(error).__name__}: {text}"
        self.enabled = False                        # eager from here on (no "preparing kernels" for this job)
        log.warning("compiled transformer blocks failed (%s); running them eagerly from here on (the same job, the "
                    "same seed). Remembered for this GPU and PyTorch, so later starts run eagerly at once; "
                    "--no-compile skips compiling altogether, `python -m rocm doctor --reset` tries again",
                    self.failed)
        if self.device is not None:
            gpu, version = machine(self.device)
            fallbacks.remember(fallbacks.COMPILE, gpu, version, self.failed)

    def is_new(self, key: tuple) -> bool:
        """Will the next call with these shapes compile (first use in this process, compiled mode)?"""
        return self.enabled and key not in self.prepared


RECOMPILE_LIMIT = 64      # static graphs per block class (dynamo's default, 8, would send the 9th shape to eager)


def configure() -> None:
    """The compiler's settings for the same video every run. Graphs are static (one per set of input shapes: a
    resolution bucket, a prompt length in tokens), so a request always runs the same graph whatever ran before it
    in the process: with dynamic sizes, a later, more general graph took over shapes an earlier one had served, and
    the same request gave other bits. Inductor picks its kernels' configurations without timing them on the device
    (timing can choose another reduction order in another run: a cold compile and a warm cache gave other bits)."""
    inductor_config.deterministic = True
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
            break


def _canonical(x):
    """A contiguous tensor with the strides of a fresh one (the same memory: sizes of 1 have any stride). The
    single-stream blocks return a slice whose batch stride differs; one layout means one graph per shape."""
    if isinstance(x, torch.Tensor):
        if x.is_contiguous() and x.dim() > 1:
            strides, step = [], 1
            for size in reversed(x.shape):
                strides.append(step)
                step *= size
            strides.reverse()
            if tuple(strides) != x.stride():
                return x.as_strided(x.shape, strides, x.storage_offset())
        return x
    if isinstance(x, tuple):
        return tuple(_canonical(t) for t in x)
    return x


def install(transformer: nn.Module) -> CompiledBlocks:
    """The transformer's dispatchers, set on its blocks the first time (call between stages, before any hook)."""
    configure()
    blocks = getattr(transformer, _ATTR, None)
    if blocks is None:
        blocks = CompiledBlocks(transformer)
        setattr(transformer, _ATTR, blocks)
    return blocks


def for_job(transformer: nn.Module, device: torch.device, *, process: bool = True, job: str = "on",
            force: bool = False) -> CompiledBlocks:
    """Compiled or eager blocks for one job, said in one log line. `process`: False with --no-compile; `job`: the
    job's "compile" setting; `force`: compile even on the CPU (tests)."""
    blocks = install(transformer)
    why = ("--no-compile" if not process else "off for this job" if job == "off"
           else None if force else unavailable(device))
    if why is None:
        blocks.device = torch.device(device)
        gpu, version = machine(device)
        before = blocks.failed or fallbacks.failed(fallbacks.COMPILE, gpu, version)
        if before:
            why = (f"compiling failed on {gpu} with PyTorch {version} before ({before[:200]}); remembered, not "
                   "tried again: `python -m rocm doctor --reset` forgets it")
    blocks.enabled = why is None
    if why is None:
        folder = use_cache_folder()
        log.info("transformer blocks: compiled (torch.compile; kernels kept in %s)", folder)
    else:
        log.info("transformer blocks: eager (%s)", why)
    return blocks


class KernelTimer:
    """Measures the step that prepares kernels for new shapes: logs its time and the graphs compiled."""

    def __init__(self, blocks: CompiledBlocks, key: tuple):
        self.blocks, self.key = blocks, key
        self.active = blocks.is_new(key)
        self.graphs = compiled_graphs() if self.active else 0
        self.t0 = time.monotonic()
        self.seconds = 0.0

    def first_step_done(self) -> None:
        if not self.active:
            return
        self.active = False
        self.blocks.prepared.add(self.key)
        self.seconds = time.monotonic() - self.t0
        log.info("kernels prepared in %.1f s (%d graphs compiled; later jobs of this shape reuse them)",
                 self.seconds, compiled_graphs() - self.graphs)


# ---- fp8 compute -------------------------------------------------------------------------------------------------
RECIPES = ("rowwise", "tensorwise")
# MI300 (gfx940/941/942, CDNA3) multiplies fp8 in e4m3fnuz, not the OCP e4m3fn of NVIDIA and of gfx950/gfx12 (AMD's
# CDNA3 ISA guide and ROCm's "Precision support" table; PyTorch's ROCm tests pick float8_e4m3fnuz on gfx94x). There
# the same products run on the weight read as e4m3fnuz (`as_fnuz`) and activations quantized to it.
FNUZ = "-fnuz"
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")
FNUZ_MAX = float(torch.finfo(torch.float8_e4m3fnuz).max)      # 240
ALL_RECIPES = RECIPES + tuple(r + FNUZ for r in RECIPES)


def recipes_for(arch: str | None) -> tuple[str, ...]:
    """The fp8 products to try on a GPU of this architecture, best first."""
    return tuple(r + FNUZ for r in RECIPES) if arch and arch.startswith(FNUZ_ARCHS) else RECIPES


def as_fnuz(values: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same weight in e4m3fnuz, exactly: e4m3fn's bits read as e4m3fnuz are half the value (the same layout,
    exponent bias 8 instead of 7, subnormals included), so the bits stay and the scales double; only e4m3fn's -0
    (0x80, which e4m3fnuz reads as NaN) becomes +0. No rounding, one pass over the bytes."""
    bits = values.view(torch.uint8)
    bits = torch.where(bits == 0x80, torch.zeros_like(bits), bits)
    return bits.view(torch.float8_e4m3fnuz), scales * 2


def _quantize_activation(rows: torch.Tensor, fnuz: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (row) fp8 values and float32 scales of an activation, in e4m3fn or e4m3fnuz."""
    if not fnuz:
        return fp8.quantize_rows(rows)
    amax = rows.abs().amax(dim=1).float()
    s = torch.where(amax > 0, amax / FNUZ_MAX, torch.ones_like(amax))
    return torch.div(rows.float(), s[:, None]).clamp(-FNUZ_MAX, FNUZ_MAX).to(torch.float8_e4m3fnuz), s


class Fp8ComputeUnavailable(RuntimeError):
    """--fp8-compute cannot run here (the message says why and what to do)."""


class Fp8ProductFailed(Fp8ComputeUnavailable):
    """The GPU has fp8 matrix cores but this PyTorch could not multiply in fp8 on it (now, or remembered from an
    earlier start): the products run in bf16 instead, said in one warning (jobs/models.py)."""


def fp8_linear(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
               recipe: str = "rowwise") -> torch.Tensor:
    """x @ (values · scales)ᵀ + bias with one fp8 product (PyTorch's `torch._scaled_mm`: cuBLASLt / hipBLASLt).
    `values` (out, in) e4m3fn and `scales` (out,) float32 are the weight as memory/fp8.py stores it. "rowwise": the
    activation is quantized per token (row) and the product applies both scales; "tensorwise" (GPUs whose PyTorch
    has no row-wise fp8 product): one activation scale, the weight's row scales applied to the float32 output. A
    "-fnuz" recipe (MI300) multiplies in e4m3fnuz: the weight read as such (`as_fnuz`), the activation quantized
    to it."""
    rows = x.reshape(-1, x.shape[-1])
    fnuz = recipe.endswith(FNUZ)
    if fnuz:
        values, scales = as_fnuz(values, scales)
    dtype, top = (torch.float8_e4m3fnuz, FNUZ_MAX) if fnuz else (fp8.FP8, fp8.FP8_MAX)
    if recipe.removesuffix(FNUZ) == "rowwise":
        xq, xs = _quantize_activation(rows, fnuz)
        out = fp8_rows.rowwise_product(xq, xs, values, scales, bias, x.dtype)
    else:
        xs = (rows.abs().amax().float() / top).clamp(min=torch.finfo(torch.float32).tiny)
        xq = torch.div(rows.float(), xs).clamp(-top, top).to(dtype)
        one = torch.ones((), dtype=torch.float32, device=x.device)
        out = torch._scaled_mm(xq, values.t(), scale_a=xs, scale_b=one, out_dtype=torch.float32,
                               use_fast_accum=True)
        out = (out * scales[None, :]).to(x.dtype)
        out = out if bias is None else out + bias
    return out.reshape(*x.shape[:-1], values.shape[0])


class Fp8Linear(nn.Linear):
    """A block Linear under fp8 compute (its class swapped in place; the same Parameters). Bound to a weight kept in
    fp8 (memory/fp8.py: the values in `weight`, the row scales in `weight_scale`) it multiplies them as they are;
    bound to a weight in the model's dtype it quantizes it for the product (per row, as the storage would)."""
    fp8_recipe = "rowwise"

    def fp8_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(e4m3fn values (out, in), float32 row scales (out,)) of the weight: as kept, or quantized now."""
        if self.weight_scale is None:
            return fp8.quantize_rows(self.weight)
        return self.weight, self.weight_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values, scales = self.fp8_weight()
        return fp8_linear(x, values, scales, self.bias, self.fp8_recipe)

    def gelu_rows(self, first: Sequence[torch.Tensor], h: torch.Tensor) -> torch.Tensor:
        """self(cat([*first, gelu_tanh(h)], -1)): the MLP's output product, its input's GELU and per-token
        quantization in one pass (pipeline/fp8_rows.py) under the row-wise recipe; `first`: () or the attention's
        output as one or two (batch, tokens, width) pieces, video then prompt tokens. The compiled blocks' forms
        call it (pipeline/block_forms.py)."""
        if self.fp8_recipe != "rowwise":
            return self(fp8_rows.gelu_cat(first, h))
        values, scales = self.fp8_weight()
        xq, xs = fp8_rows.quantize_gelu_rows(first, h)
        out = fp8_rows.rowwise_product(xq, xs, values, scales, self.bias, h.dtype)
        return out.reshape(*h.shape[:-1], values.shape[0])


def _probe(device: torch.device, recipe: str) -> None:
    """One small fp8 product on `device`, checked against the bf16 product (raises if PyTorch cannot run it)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(64, 64, generator=gen).to(device, torch.bfloat16)
    x = torch.randn(32, 64, generator=gen).to(device, torch.bfloat16)
    values, scales = fp8.quantize_rows(w)
    out = fp8_linear(x, values, scales, None, recipe).float()
    ref = (x @ w.t()).float()
    err = ((out - ref).norm() / ref.norm()).item()
    if not err < 0.1:
        raise RuntimeError(f"the fp8 product is off by {err:.3f} (relative) on this GPU")


def _fp8_hardware(device: torch.device) -> tuple[str, str | None]:
    """(the GPU's name, its AMD architecture or None) when it has fp8 matrix cores; raises Fp8ComputeUnavailable
    (what to do) when it has none."""
    if device.type != "cuda":
        raise Fp8ComputeUnavailable(f"--fp8-compute needs a GPU with fp8 tensor cores (NVIDIA RTX 40xx / Ada, H100 "
                                    f"or newer; AMD MI300, MI350 or RDNA4); this job runs on the {device.type.upper()}."
                                    f" Leave --fp8-compute off (--fp8 still halves the host RAM).")
    name, arch = torch.cuda.get_device_name(device), None
    if torch.version.hip:
        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "").split(":")[0]
        if not arch.startswith(FP8_ARCHS):
            raise Fp8ComputeUnavailable(f"--fp8-compute needs fp8 matrix cores ({', '.join(FP8_ARCHS)}); {name} is "
                                        f"{arch or 'unknown'}. Leave --fp8-compute off.")
    elif torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise Fp8ComputeUnavailable(f"--fp8-compute needs fp8 tensor cores (compute capability 8.9 or newer: RTX 40xx,"
                                    f" L4, H100 …); {name} has {major}.{minor}. Leave --fp8-compute off.")
    return name, arch


def fp8_recipe(device: torch.device) -> str:
    """The fp8 product this GPU runs ("rowwise", else "tensorwise"; with "-fnuz" on MI300). Raises
    Fp8ComputeUnavailable where the GPU has no fp8 cores, Fp8ProductFailed where PyTorch's fp8 product fails on it
    (remembered: rocm/fallbacks.py)."""
    device = torch.device(device)
    name, arch = _fp8_hardware(device)
    gpu, version = machine(device)
    before = fallbacks.failed(fallbacks.FP8, gpu, version)
    if before:
        raise Fp8ProductFailed(f"--fp8-compute failed on {gpu} with PyTorch {version} before ({before[:200]}); "
                               "remembered, not tried again (`python -m rocm doctor --reset` forgets it)")
    failures = []
    for recipe in recipes_for(arch):
        try:
            _probe(device, recipe)
            return recipe
        except Exception as e:      # this PyTorch has no such fp8 product on this GPU: try the next recipe
            failures.append(f"{recipe}: {str(e).strip().splitlines()[-1][:160] if str(e).strip() else type(e).__name__}")
    fallbacks.remember(fallbacks.FP8, gpu, version, "; ".join(failures))
    raise Fp8ProductFailed(f"--fp8-compute: this PyTorch cannot multiply in fp8 on {name} ({'; '.join(failures)}); "
                           "remembered for this GPU and PyTorch")


def use_fp8_compute(transformer: nn.Module, recipe: str = "rowwise", device: torch.device | None = None) -> int:
    """Make the block Linears of `transformer` multiply in fp8, their weights kept in fp8 on the device (call between
    stages; the same Parameters; a pack the model has takes the fp8 storage now, quantizing on `device` when it is
    a GPU). Returns how many Linears were converted."""
    if recipe not in ALL_RECIPES:
        raise ValueError(f"fp8 recipe {recipe!r}: one of {', '.join(ALL_RECIPES)}")
    names = []
    for name, module in transformer.named_modules():
        if fp8.compute_target(name, module):
            module.__class__ = Fp8Linear
            module.fp8_recipe = recipe
            fp8.keep_on_device(module)
            names.append(name)
    pack = HostPack.existing(transformer)
    if pack is not None:
        pack.keep_marked(device)
    fp8_rows.prepare()                  # its kernel's operator, registered before any block is traced
    log.info("fp8 compute: %d block Linears multiply in float8 e4m3 (%s scaling), weights kept in fp8 on the device",
             len(names), recipe)
    return len(names)
