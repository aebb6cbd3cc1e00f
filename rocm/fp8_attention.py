"""fp8 attention through NVIDIA's cuDNN frontend (the job's "fp8 attention" setting; opt-in).

The attention product runs in float8 e4m3 in cuDNN's fused flash-attention kernel (`sdpa_fp8` of the cuDNN frontend,
`nvidia-cudnn-frontend` on PyPI, the optional extra `fp8-attention`: a maintained library made for the job, no
hand-written kernel). This module prepares its inputs and reads its output; rocm/sdpa.py (the attention guard, the
one place that picks a kernel) sends a call here when the job asked for fp8 attention and the call fits (a CUDA GPU
of compute capability 9.0 or newer with the frontend installed; half-precision q/k/v; head size ≤ 128 and a
multiple of 16; no mask, no dropout, not causal: FramePack's transformer attends so, its text tokens cut to the
prompt's length instead of masked). Any other call, and every call where the frontend is absent, runs in bf16 as
before.

**The quantization** (`quantize`), after SageAttention's observations on video DiTs (HunyuanVideo among them), with
the per-tensor descales that cuDNN's Hopper fp8 kernel takes (one float32 per tensor; its block-scaled MXFP8 form is
Blackwell-only):

- *K is smoothed*: its mean over the tokens is subtracted (per batch, head and channel). Every score of a query
  changes by the same amount (q·mean), which softmax ignores, so the result is exact in real arithmetic, while the
  large shared channels real models have (outliers that would take e4m3's 3 mantissa bits) are gone before rounding.
- *V is smoothed* the same way and its mean added back to the output (each output row is a convex combination of
  V's rows, so O = P·(V − m) + m exactly): the fp8 output (Hopper's kernel writes e4m3) only carries the deviation.
- *Per-head scales*: each head's q and k are multiplied by r and 1/r (r = √(amax k / amax q) of that head), which
  leaves q·kᵀ unchanged and gives both the same range; then one scale per tensor maps its largest value to 448
  (e4m3's largest). fp8 is floating point, so heads of smaller range keep their relative precision down to 2^-15 of
  the largest (e4m3's normal range).
- The softmax's probabilities are rounded to e4m3 inside the kernel at scale 448 (they lie in [0, 1]: the bound
  cuDNN's documentation gives), the output at 448 / amax(V − m) (|O − m| ≤ amax(V − m)).

**FlashAttention-3's fp8 kernel** (Tri Dao's Hopper kernels, `flash_attn_3`; not on PyPI: built from the
flash-attention repository's `hopper/` folder, scripts/build_flash_attention_3.sh builds just the forward this
model uses in ~2 minutes on 16 cores): where it is installed and the GPU is a Hopper (compute capability 9.x, the
only one it is built for), the process runs its fp8 calls through it instead of cuDNN's (`kernel`, chosen once per
process): on an H200 its kernel took 4.80 ms against cuDNN's fp8 5.54 and FlashAttention-4's bf16 5.86 at this
model's shape, in one run (BENCHMARKS.md). It takes one descale per batch and head, so its quantization (`quantize(...,
kernel=FA3)`) skips the balance and scales each head of q, k and v by its own largest value (K and V still
smoothed); it writes bf16 (no output rounding) and keeps its probabilities in e4m3 at 2^8 (its softmax subtracts
8 from the row's largest exponent), which `emulate(..., kernel=FA3)` follows.

`emulate` runs the same arithmetic in float32 with every rounding the kernel makes (tests compare it against the
float reference on the CPU, outlier channels included); `attention` runs it on the GPU. The quantization is
written here, not taken from a library, because both kernels take already quantized tensors and leave the
choice of scales to their caller (SageAttention's kernels, which do both, are not installable here).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)          # 448
P_SCALE = FP8_MAX                               # the probabilities (≤ 1) are stored × 448 inside the kernel
MIN_CAPABILITY = (9, 0)                         # Hopper: cuDNN's fp8 flash attention forward (sm_90 and newer)
MIN_CUDNN = 90100                               # cuDNN 9.1: fp8 SDPA forward on Hopper
EXTRA = 'pip install nvidia-cudnn-frontend (or pip install -e ".[fp8-attention]")'
CUDNN, FA3 = "cuDNN frontend", "FlashAttention-3"  # the two fp8 kernels (`kernel`)
FA3_MAJOR = 9                                   # FlashAttention-3's kernels are Hopper's (sm_90a) alone
FA3_P_SCALE = 256.0                             # its probabilities in e4m3: exp2(s - max + 8), at most 2^8
_TINY = torch.finfo(torch.float32).tiny


@dataclass
class Quantized:
    """q, k, v in e4m3 (the caller's shapes (batch, heads, tokens, dim)), their descales (float32, real value =
    stored × descale: (1, 1, 1, 1) each for cuDNN, (batch, heads, 1, 1) for FlashAttention-3) and V's mean over
    tokens (float32, added back to the output). cuDNN's output is stored at V's scale (|O − m| ≤ amax(V − m)):
    scale_o = 1 / descale_v."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    descale_q: torch.Tensor
    descale_k: torch.Tensor
    descale_v: torch.Tensor
    v_mean: torch.Tensor

    @property
    def scale_o(self) -> torch.Tensor:
        return 1.0 / self.descale_v

    @property
    def descale_o(self) -> torch.Tensor:
        return self.descale_v


def _scale(x: torch.Tensor) -> torch.Tensor:
    """The per-tensor descale that maps the largest |x| to e4m3's largest value, shaped (1, 1, 1, 1)."""
    return (x.abs().amax().float() / FP8_MAX).clamp(min=_TINY).reshape(1, 1, 1, 1)


def _centered_amax(x: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """max |x − mean| over tokens and channels (dims -2, -1) per batch and head, read off each channel's largest and
    smallest value: x's largest deviation is max − mean or mean − min, and float rounding is monotonic, so this is
    the very value the centred tensor's amax gives, bit for bit. The compiled block reads x once for the mean, the
    maximum and the minimum together (one pass instead of a second over x − mean: BENCHMARKS.md, the fp8 step's
    profile)."""
    top = x.amax(dim=-2, keepdim=True) - mean
    bottom = mean - x.amin(dim=-2, keepdim=True)
    return torch.maximum(top, bottom).amax(dim=-1, keepdim=True)


def _to_fp8(x: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    return (x / descale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, smooth: bool = True,
             per_head: bool = True, kernel: str | None = None) -> Quantized:
    """q, k, v (batch, heads, tokens, dim) in e4m3 with their descales for `kernel` (default: this process's,
    `chosen`): K and V smoothed; for cuDNN q/k balanced per head and one scale per tensor, for FlashAttention-3 one
    scale per batch and head (the module's docstring); `smooth` / `per_head` False: plain per-tensor scales (the
    comparison in tests). The e4m3 tensors keep the memory layout of the inputs (diffusers' (batch, tokens, heads,
    dim) seen transposed)."""
    qf, kf, vf = q.float(), k.float(), v.float()
    if smooth:
        k_mean, v_mean = kf.mean(dim=-2, keepdim=True), vf.mean(dim=-2, keepdim=True)
    else:
        k_mean = v_mean = vf.new_zeros((*vf.shape[:-2], 1, vf.shape[-1]))
    fa3 = per_head and (kernel or chosen()) == FA3
    if fa3:     # one descale per batch and head; K's and V's from the means' pass (`_centered_amax`)
        dq, dk, dv = ((a / FP8_MAX).clamp(min=_TINY) for a in (qf.abs().amax(dim=(-2, -1), keepdim=True),
                                                               _centered_amax(kf, k_mean), _centered_amax(vf, v_mean)))
    kf, vf = kf - k_mean, vf - v_mean                   # (exact where the means are zeros: not smoothing)
    if not fa3:
        if per_head:
            aq = qf.abs().amax(dim=(-2, -1), keepdim=True).clamp(min=_TINY)
            ak = kf.abs().amax(dim=(-2, -1), keepdim=True).clamp(min=_TINY)
            r = (ak / aq).sqrt()
            qf, kf = qf * r, kf / r
        dq, dk, dv = _scale(qf), _scale(kf), _scale(vf)
    out = [_to_fp8(x, d) for x, d in ((qf, dq), (kf, dk), (vf, dv))]
    laid = [torch.empty_strided(t.shape, t.stride(), dtype=FP8, device=t.device).copy_(x)
            for t, x in zip((q, k, v), out)]
    return Quantized(laid[0], laid[1], laid[2], dq, dk, dv, v_mean)


def emulate(z: Quantized, scale: float | None = None, out_dtype: torch.dtype = torch.float32,
            kernel: str = CUDNN, with_mean: bool = True) -> torch.Tensor:
    """`kernel`'s fp8 arithmetic in float32 (every rounding it makes: inputs, probabilities, and cuDNN's e4m3
    output): what `attention` computes (`run`'s `with_mean` as there), up to the order of the sums. For tests and
    the CPU."""
    q = z.q.float() * z.descale_q
    k = z.k.float() * z.descale_k
    v = z.v.float() * z.descale_v
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))              # unnormalised, as flash attention keeps it
    denom = p.sum(dim=-1, keepdim=True)
    p_scale = FA3_P_SCALE if kernel == FA3 else P_SCALE
    p8 = (p * p_scale).to(FP8).float() / p_scale
    o = (p8 @ v) / denom
    if kernel != FA3:                                              # cuDNN's Hopper kernel writes e4m3
        o = (o * z.scale_o).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * z.descale_o
    return (o + z.v_mean if with_mean else o).to(out_dtype)


# ---- availability -------------------------------------------------------------------------------------------------
def _frontend() -> Any | None:
    """The cuDNN frontend's Python module, or None when it is not installed."""
    try:
        import cudnn  # the optional extra "fp8-attention" (nvidia-cudnn-frontend)
    except ImportError:
        return None
    return cudnn


_FA3: list = []                 # [flash_attn_func or None]: FlashAttention-3, looked up once
_KERNEL: list[str] = []         # [the fp8 kernel of this process], chosen once (`kernel`)


def _flash3() -> Any | None:
    """FlashAttention-3's forward (`flash_attn_interface.flash_attn_func`, the module its build installs), or None
    where it is not installed (or does not import: then said once)."""
    if not _FA3:
        try:
            from flash_attn_interface import flash_attn_func
        except ImportError:
            flash_attn_func = None
        except Exception as e:        # installed but broken (built for another PyTorch or CUDA): cuDNN's kernel
            log.warning("FlashAttention-3 is installed but does not import (%s: %s); fp8 attention uses cuDNN's "
                        "kernel", type(e).__name__, " ".join(str(e).split())[:200])
            flash_attn_func = None
        _FA3.append(flash_attn_func)
    return _FA3[0]


def _fa3_on(device: torch.device) -> bool:
    return (device.type == "cuda" and not torch.version.hip and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device)[0] == FA3_MAJOR and _flash3() is not None)


def kernel(device: torch.device | str | None = None) -> str:
    """The fp8 kernel this process runs, chosen at its first fp8 job (rocm/sdpa.py `fp8_attention`, eagerly):
    FlashAttention-3 where it is installed and `device` (default: the current CUDA device) is a Hopper, else
    cuDNN's. Measured faster (the module's docstring); one choice per process, so compiled blocks keep their graph."""
    if not _KERNEL:
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        _KERNEL.append(FA3 if _fa3_on(torch.device(device)) else CUDNN)
    return _KERNEL[0]


def chosen() -> str:
    """The kernel `kernel` chose (cuDNN's before any choice): read inside compiled code, which cannot ask the
    device; dynamo guards on it."""
    return _KERNEL[0] if _KERNEL else CUDNN


def unavailable(device: torch.device | str) -> str | None:
    """Why fp8 attention cannot run on `device` (None: it can), with what to do. Cheap: no graph is built."""
    device = torch.device(device)
    need = "fp8 attention needs an NVIDIA GPU with cuDNN's fp8 flash attention (Hopper: H100/H200, or newer)"
    if device.type != "cuda" or torch.version.hip:
        where = "an AMD GPU (ROCm)" if device.type == "cuda" else f"the {device.type.upper()}"
        return f"{need}; this job runs on {where}. Leave fp8 attention off"
    if not torch.cuda.is_available():
        return f"{need}; PyTorch sees no CUDA GPU here. Leave fp8 attention off"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"{need}; {name} has compute capability {capability[0]}.{capability[1]}. Leave fp8 attention off "
                f"(--fp8-compute's fp8 products still work from 8.9)")
    if _fa3_on(device):
        return None
    cudnn = _frontend()
    if cudnn is None:
        also = (" (or, on this Hopper GPU, FlashAttention-3: bash scripts/build_flash_attention_3.sh)"
                if capability[0] == FA3_MAJOR else "")
        return f"{need} and NVIDIA's cuDNN frontend, which is not installed: {EXTRA}{also}"
    try:
        version = int(cudnn.backend_version())
    except Exception as e:          # the frontend found no usable libcudnn: say so, whatever it raised
        return f"{need}; the cuDNN frontend found no cuDNN library ({type(e).__name__}). Leave fp8 attention off"
    if version < MIN_CUDNN:
        return f"{need} and cuDNN 9.1 or newer; this PyTorch loads cuDNN {version}. Leave fp8 attention off"
    return None


def describe(device: torch.device | str) -> str:
    """One line for `python -m rocm doctor`: the fp8 attention kernel `device` would run, or why none."""
    why = unavailable(device)
    if why is not None:
        return f"off here: {why}"
    return f"available: {FA3 if _fa3_on(torch.device(device)) else CUDNN}"


def fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask, dropout_p: float,
         is_causal: bool, enable_gqa: bool) -> bool:
    """Does this attention call fit the fp8 kernel (the module's docstring)? Others run in bf16."""
    d = query.shape[-1]
    return (query.dim() == 4 and query.is_cuda and query.dtype in (torch.bfloat16, torch.float16)
            and key.dtype == query.dtype and value.dtype == query.dtype and attn_mask is None
            and not dropout_p and not is_causal and not enable_gqa and not query.requires_grad
            and d == key.shape[-1] == value.shape[-1] and d <= 128 and d % 16 == 0
            and key.shape[:2] == query.shape[:2] == value.shape[:2] and key.shape[-2] == value.shape[-2]
            and all(t.stride(-1) == 1 for t in (query, key, value)))


# ---- the cuDNN graph ----------------------------------------------------------------------------------------------
class _Graph:
    """One built cuDNN fp8 SDPA graph for a set of shapes and strides, with its workspace."""

    def __init__(self, cudnn, handle, z: Quantized, out: torch.Tensor, scale: float):
        e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=handle)

        def tensor(name: str, t: torch.Tensor, dtype):
            return graph.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dtype)

        q, k, v = (tensor(n, t, e4m3) for n, t in (("q", z.q), ("k", z.k), ("v", z.v)))
        scalars = {n: graph.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32)
                   for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o")}
        o, _, amax_s, amax_o = graph.sdpa_fp8(q=q, k=k, v=v, **scalars, attn_scale=scale, generate_stats=False,
                                              use_causal_mask=False)
        o.set_output(True).set_dim(list(out.shape)).set_stride(list(out.stride())).set_data_type(e4m3)
        for amax in (amax_s, amax_o):
            amax.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        device = out.device
        self.graph, self.handle = graph, handle
        self.tensors = (q, k, v, scalars, o, amax_s, amax_o)
        self.workspace = torch.empty(max(int(graph.get_workspace_size()), 1), dtype=torch.uint8, device=device)
        self.amax = torch.empty((2, 1, 1, 1, 1), dtype=torch.float32, device=device)
        self.p_scales = (torch.full((1, 1, 1, 1), 1.0 / P_SCALE, device=device),
                         torch.full((1, 1, 1, 1), P_SCALE, device=device))

    def run(self, cudnn, z: Quantized, out: torch.Tensor) -> None:
        q, k, v, scalars, o, amax_s, amax_o = self.tensors
        values = {"descale_q": z.descale_q, "descale_k": z.descale_k, "descale_v": z.descale_v,
                  "descale_s": self.p_scales[0], "scale_s": self.p_scales[1], "scale_o": z.scale_o}
        pack = {q: z.q, k: z.k, v: z.v, o: out, amax_s: self.amax[0], amax_o: self.amax[1]}
        pack.update({scalars[n]: t.contiguous() for n, t in values.items()})
        cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream(out.device).cuda_stream)
        self.graph.execute(pack, self.workspace, handle=self.handle)


_HANDLES: dict[int, Any] = {}
_GRAPHS: dict[tuple, _Graph] = {}


def _graph_for(z: Quantized, out: torch.Tensor, scale: float) -> _Graph:
    key = (out.device.index, tuple(z.q.shape), z.q.stride(), z.k.stride(), z.v.stride(), tuple(z.k.shape),
           out.stride(), float(scale))
    graph = _GRAPHS.get(key)
    if graph is None:
        cudnn = _frontend()
        assert cudnn is not None                        # (checked before fp8 attention is on)
        index = out.device.index if out.device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(index):
            handle = _HANDLES.get(index) or _HANDLES.setdefault(index, cudnn.create_handle())
            graph = _GRAPHS[key] = _Graph(cudnn, handle, z, out, scale)
        log.info("fp8 attention: cuDNN graph built for q %s, k %s", tuple(z.q.shape), tuple(z.k.shape))
    return graph


def run(z: Quantized, dtype: torch.dtype, scale: float | None = None, kernel: str | None = None,
        with_mean: bool = True) -> torch.Tensor:
    """softmax(q kᵀ · scale) v of inputs quantized for `kernel` (default: this process's, `chosen`) through its fp8
    kernel, back in `dtype` and in the fused kernels' layout ((batch, heads, tokens, dim) stored token-major).
    `with_mean` False: without V's mean (z.v_mean), for a caller that adds it where it reads the output (compiled
    blocks: rocm/sdpa.py). Raises what the kernel raises when it cannot run."""
    b, h, n, d = z.q.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    result = torch.empty((b, n, h, d), dtype=dtype, device=z.q.device).transpose(1, 2)
    mean = z.v_mean if with_mean else 0.0
    if (kernel or chosen()) == FA3:     # (batch, tokens, heads, dim) in and out; descales (batch, heads)
        q8, k8, v8 = (t.transpose(1, 2) for t in (z.q, z.k, z.v))
        descales = [x.expand(b, h, 1, 1).reshape(b, h) for x in (z.descale_q, z.descale_k, z.descale_v)]
        flash = _flash3()
        assert flash is not None                        # (chosen only where it imports: `kernel`)
        out = flash(q8, k8, v8, softmax_scale=scale, q_descale=descales[0], k_descale=descales[1],
                    v_descale=descales[2])
        out = (out[0] if isinstance(out, tuple) else out).transpose(1, 2)      # already the fused kernels' layout
        if out.dtype == dtype and out.stride() == result.stride():
            return out.add_(z.v_mean.to(dtype)) if with_mean else out     # in place: one pass
        return result.copy_(out.float() + mean)
    out = torch.empty((b, n, h, d), dtype=FP8, device=z.q.device).transpose(1, 2)
    _graph_for(z, out, scale).run(_frontend(), z, out)
    return result.copy_(out.float() * z.descale_o + mean)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None,
              kernel: str | None = None) -> torch.Tensor:
    """`run` of `quantize`: the whole fp8 attention of one call that `fits`, eagerly (compiled blocks quantize
    inside their graph instead: rocm/sdpa.py)."""
    return run(quantize(query, key, value, kernel=kernel), query.dtype, scale, kernel)
