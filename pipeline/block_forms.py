"""The compiled blocks' own forms of two products: the MLP's product with its GELU, and the single-stream block's
output product without its concatenation (issue 46).

A profile of one compiled step at 608×640 (H200, `benchmarks/compiled.py step --profile`) put 23 ms of its ~65 ms
of Inductor's fused kernels in two places that are memory traffic only:
- The single-stream block computes `proj_out(cat([attention, gelu(proj_mlp(x))], -1))`: the MLP's product writes
  18,485 × 12,288 values, and one fused kernel reads them back with the attention's, applies GELU and writes the
  15,360-wide concatenation for `proj_out` to read (17.5 ms a step over 40 blocks).
- The double-stream blocks' MLP (diffusers' `GELU` module, `proj` then GELU) reads and writes its 12,288-wide
  product once more for the GELU (5.7 ms a step over 20 blocks).

Here, inside the compiled blocks only (eager keeps diffusers' own forward, bit for bit):
- **`proj_out` is split along its input**: `proj_out(cat([a, m], -1)) = a @ Wa.T + m @ Wm.T + b`, two products on
  views of the same weight, so the concatenation is never written. The single-stream block's forward is written
  here for that (`single_block_forward`, the same steps as diffusers' `HunyuanVideoSingleTransformerBlock.forward`,
  its modules called as they are: norm, attention, Linears; LoRAs are merged into their weights, so they apply).
- **GELU rides in the product's epilogue** on CUDA: `torch._addmm_activation(..., use_gelu=True)`, PyTorch's call
  of cuBLASLt's bias + GELU (tanh) epilogue, behind one opaque operator (`steadyframe::linear_gelu_tanh`) so
  Inductor keeps it whole. Elsewhere (the CPU, ROCm) the same math as diffusers', which Inductor fuses as before.
- **Elsewhere the tanh GELU is written as `x · sigmoid(2u)`** (`gelu_tanh`; u = √(2/π)(x + 0.044715x³), the same
  function: (1 + tanh u) / 2 = sigmoid(2u)). Inductor lowers `tanh` to libdevice's correctly rounded tanh, dozens
  of instructions, but `exp` (in sigmoid) to the GPU's fast exp2. Under fp8 compute the MLP's GELU sits in the
  kernel that quantizes its output per token, which evaluates it twice (the row's largest value, then the values):
  with tanh those kernels were bound by arithmetic, 51 ms of an fp8 step on an H200 (37 ms the single-stream
  block's, 14 ms the double-stream blocks'), several times their memory traffic.
Written here because neither diffusers nor Inductor makes these rewrites (Inductor's Triton GEMM templates,
which could fuse an epilogue, lost to cuBLAS on every large product of this step: BENCHMARKS.md, autotuning).
Under fp8 compute the MLP's output Linear (`Fp8Linear`, products of its own) takes the GELU instead: its
`gelu_rows` applies it while quantizing its input per token, one pass over the rows with the attention's output
read in place (pipeline/fp8_rows.py), in the single-stream blocks (`single_block_forward`) and the double-stream
blocks' MLPs (diffusers' `FeedForward`, given a compiled form here the way its GELU module is).
Under fp8 attention through FlashAttention-3 the blocks' attention processors (diffusers'
`HunyuanVideoAttnProcessor2_0`) take a compiled form too: the q/k/v products' outputs go straight to
rocm/fp8_qkv.py's Triton passes (the q/k norms, the rotary embedding, K and V's smoothing and the head scales, with
nothing written in bf16 between) and the kernel, instead of diffusers' steps and the attention guard's
quantization; every other case keeps diffusers' processor.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from rocm import fp8_qkv, sdpa


@torch.library.custom_op("steadyframe::linear_gelu_tanh", mutates_args=())
def linear_gelu_tanh(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x @ weight.T + bias, approximate="tanh") in one product: cuBLASLt's GELU epilogue on CUDA."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.is_cuda and torch.version.hip is None:
        out = torch._addmm_activation(bias, rows, weight.t(), use_gelu=True)
    else:
        out = F.gelu(F.linear(rows, weight, bias), approximate="tanh")
    return out.view(*x.shape[:-1], weight.shape[0])


@linear_gelu_tanh.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _epilogue(linear: nn.Module, x: torch.Tensor) -> bool:
    """Whether gelu(linear(x)) can run as one product with its GELU in the epilogue (a plain bf16/fp16 Linear with a
    bias on an NVIDIA GPU; fp8's Fp8Linear and other devices keep the separate GELU)."""
    return (type(linear) is nn.Linear and linear.bias is not None and x.is_cuda and torch.version.hip is None
            and x.dtype in (torch.bfloat16, torch.float16))


_TWO_SQRT_2_OVER_PI = 2.0 * math.sqrt(2.0 / math.pi)


def gelu_tanh(h: torch.Tensor) -> torch.Tensor:
    """gelu(h, approximate="tanh") as h · sigmoid(2u), computed in float32 (the module docstring: a form Inductor
    compiles to fast exponentials instead of libdevice's tanh), in h's dtype (half precision computed in float32)."""
    hf = h if h.dtype in (torch.float32, torch.float64) else h.float()
    return (hf * torch.sigmoid(_TWO_SQRT_2_OVER_PI * (hf + 0.044715 * hf * hf * hf))).to(h.dtype)


def linear_gelu(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """gelu(linear(x), approximate="tanh"), in one product where `_epilogue` allows, else `gelu_tanh` of it."""
    if _epilogue(linear, x):
        return torch.ops.steadyframe.linear_gelu_tanh(x, linear.weight, linear.bias)
    return gelu_tanh(linear(x))


def split_linear(linear: nn.Module, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """linear(cat([first, second], -1)) without the concatenation: two products on the weight's two column blocks
    (views), summed. A Linear that is not a plain one (fp8's) gets the concatenation."""
    if type(linear) is not nn.Linear:
        return linear(torch.cat([first, second], dim=-1))
    k = first.shape[-1]
    return F.linear(first, linear.weight[:, :k], linear.bias) + F.linear(second, linear.weight[:, k:])


class _FusedGELU(nn.Module):
    """diffusers' `GELU` module (a Linear `proj`, then GELU) with the product and a tanh GELU in one call while it is
    being compiled; eager calls run diffusers' forward. Set on a module by swapping its class (`fuse_blocks`)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() and self.approximate == "tanh":
            return linear_gelu(self.proj, hidden_states)
        return super().forward(hidden_states)   # type: ignore[misc]  # the forward of the class it is mixed into


@functools.cache
def _fused_gelu_class() -> type:
    """diffusers' `GELU` with `_FusedGELU`'s forward in front (made once, at the first use)."""
    from diffusers.models.activations import GELU

    return type("FusedGELU", (_FusedGELU, GELU), {})


def fuse_blocks(blocks) -> None:
    """Give the double-stream blocks' MLPs (diffusers' `FeedForward`) and their GELU modules (diffusers' `GELU`,
    tanh), and the blocks' attention processors (diffusers' `HunyuanVideoAttnProcessor2_0`), their compiled forms,
    once."""
    from diffusers.models.activations import GELU
    from diffusers.models.attention import FeedForward
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    for block in blocks:
        for module in list(block.modules()):
            if type(module) is GELU and module.approximate == "tanh":
                module.__class__ = _fused_gelu_class()
            elif type(module) is FeedForward:
                module.__class__ = _fused_feed_forward_class()
            elif type(getattr(module, "processor", None)) is HunyuanVideoAttnProcessor2_0:
                module.processor.__class__ = _fused_processor_class()


class _FusedAttnProcessor:
    """diffusers' `HunyuanVideoAttnProcessor2_0` whose attention, while compiled under fp8 attention through
    FlashAttention-3 (`sdpa.fp8_prequantized`), goes from the q/k/v products straight to the kernel's e4m3 inputs in
    rocm/fp8_qkv.py's passes (the q/k norms, the rotary embedding, K and V's smoothing and the head scales in them);
    otherwise, and for a call those passes do not take, diffusers' call."""

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, image_rotary_emb=None) -> torch.Tensor:
        if (torch.compiler.is_compiling() and attention_mask is None and encoder_hidden_states is not None
                and image_rotary_emb is not None and getattr(self, "_parallel_config", None) is None
                and sdpa.fp8_prequantized()):
            out = _prequantized_attention(attn, hidden_states, encoder_hidden_states, image_rotary_emb)
            if out is not None:
                return out
        return super().__call__(attn, hidden_states, encoder_hidden_states,   # type: ignore[misc]  # (mixed in)
                                attention_mask, image_rotary_emb)


def _norm_weight(norm) -> tuple[torch.Tensor, float] | None:
    """(weight, eps) of diffusers' RMSNorm with a weight and no bias, else None."""
    from diffusers.models.normalization import RMSNorm

    if type(norm) is not RMSNorm or norm.weight is None or getattr(norm, "bias", None) is not None:
        return None
    return norm.weight, float(norm.eps)


def _prequantized_attention(attn, hidden: torch.Tensor, text: torch.Tensor, rotary) -> tuple | None:
    """diffusers' processor's steps with the attention's inputs quantized by rocm/fp8_qkv.py and the kernel called on
    them (`steadyframe::fp8_attention_quantized`, V's mean added back here where the output product reads it), or
    None where those passes do not take this call (then nothing computed here is used: the graph drops it)."""
    single = attn.add_q_proj is None
    norms = [_norm_weight(n) for n in ((attn.norm_q, attn.norm_q, attn.norm_k, attn.norm_k) if single else
                                       (attn.norm_q, attn.norm_added_q, attn.norm_k, attn.norm_added_k))]
    if any(n is None for n in norms) or len({eps for _, eps in norms}) != 1:   # type: ignore[misc]
        return None
    n_a = hidden.shape[1]
    if single:
        x = torch.cat([hidden, text], dim=1)
        q, k, v = attn.to_q(x), attn.to_k(x), attn.to_v(x)
        pieces = [q[:, :n_a], q[:, n_a:], k[:, :n_a], k[:, n_a:], v[:, :n_a], v[:, n_a:]]
    else:
        pieces = [attn.to_q(hidden), attn.add_q_proj(text), attn.to_k(hidden), attn.add_k_proj(text),
                  attn.to_v(hidden), attn.add_v_proj(text)]
    weights = [w for w, _ in norms]     # type: ignore[misc]
    cos, sin = rotary
    if not fp8_qkv.usable(pieces, weights, cos, sin):
        return None
    q8, k8, v8, scales, means = fp8_qkv.quantize(pieces, weights, cos, sin, norms[0][1])   # type: ignore[index]
    b, n, h, d = q8.shape
    descales = [scales[:, i].reshape(b, h, 1, 1) for i in range(3)]
    v_mean = means[:, 1].reshape(b, h, 1, d)
    out = torch.ops.steadyframe.fp8_attention_quantized(q8.transpose(1, 2), k8.transpose(1, 2), v8.transpose(1, 2),
                                                         *descales, v_mean, None, hidden.dtype)
    out = (out.float() + v_mean).to(hidden.dtype).transpose(1, 2).flatten(2, 3)
    video, prompt = out[:, :n_a], out[:, n_a:]
    if getattr(attn, "to_out", None) is not None:
        video = attn.to_out[1](attn.to_out[0](video))
    if getattr(attn, "to_add_out", None) is not None:
        prompt = attn.to_add_out(prompt)
    return video, prompt


@functools.cache
def _fused_processor_class() -> type:
    """diffusers' `HunyuanVideoAttnProcessor2_0` with `_FusedAttnProcessor`'s call in front (made once)."""
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    return type("FusedHunyuanVideoAttnProcessor", (_FusedAttnProcessor, HunyuanVideoAttnProcessor2_0), {})


def _rows_product(linear: nn.Module):
    """The Linear's own product of GELU rows (`Fp8Linear.gelu_rows`: the GELU and the per-token quantization of its
    input in one pass, pipeline/fp8_rows.py), or None for a plain Linear."""
    return getattr(linear, "gelu_rows", None)


def single_block_forward(block, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                         temb: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None, *args, **kwargs):
    """A single-stream block (diffusers' `HunyuanVideoSingleTransformerBlock`) with the MLP's GELU in its product
    and `proj_out` split (the module docstring), or under fp8 compute the GELU in `proj_out`'s quantization of its
    input (`_rows_product`): the same steps, each through the block's own modules. The video and text tokens run as
    one sequence (text last); returns them apart again."""
    text = encoder_hidden_states.shape[1]
    residual = torch.cat([hidden_states, encoder_hidden_states], dim=1)
    normed, gate = block.norm(residual, emb=temb)
    tanh = type(block.act_mlp) is nn.GELU and block.act_mlp.approximate == "tanh"
    rows_product = _rows_product(block.proj_out) if tanh else None
    if rows_product is not None:
        mlp = block.proj_mlp(normed)            # its GELU: in proj_out's quantization below
    elif tanh:
        mlp = linear_gelu(block.proj_mlp, normed)
    else:
        mlp = block.act_mlp(block.proj_mlp(normed))
    attn, attn_text = block.attn(hidden_states=normed[:, :-text, :], encoder_hidden_states=normed[:, -text:, :],
                                 attention_mask=attention_mask, image_rotary_emb=image_rotary_emb)
    if rows_product is not None:
        projected = rows_product((attn, attn_text), mlp)
    else:
        projected = split_linear(block.proj_out, torch.cat([attn, attn_text], dim=1), mlp)
    out = residual + gate.unsqueeze(1) * projected
    return out[:, :-text, :], out[:, -text:, :]


class _FusedFeedForward(nn.Module):
    """diffusers' `FeedForward` (GELU module, dropout, Linear) whose output Linear, under fp8 compute, takes the GELU
    into its input's quantization (`_rows_product`) while it is being compiled; otherwise diffusers' forward."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if torch.compiler.is_compiling() and not args and not kwargs:
            rows_product = _feed_forward_rows(self)
            if rows_product is not None:
                return rows_product((), self.net[0].proj(hidden_states))
        return super().forward(hidden_states, *args, **kwargs)   # type: ignore[misc]  # the class it is mixed into


def _feed_forward_rows(ff: nn.Module):
    """The output Linear's product of GELU rows for a FeedForward of [tanh GELU, dropout, Linear(, dropout)] whose
    dropouts do nothing, else None."""
    from diffusers.models.activations import GELU

    net = list(ff.net)
    if len(net) < 3 or not isinstance(net[0], GELU) or net[0].approximate != "tanh":
        return None
    quiet = all(isinstance(m, nn.Dropout) and (m.p == 0 or not m.training) for m in net[1:2] + net[3:])
    return _rows_product(net[2]) if quiet else None


@functools.cache
def _fused_feed_forward_class() -> type:
    """diffusers' `FeedForward` with `_FusedFeedForward`'s forward in front (made once, at the first use)."""
    from diffusers.models.attention import FeedForward

    return type("FusedFeedForward", (_FusedFeedForward, FeedForward), {})


def compiled_form(cls: type):
    """The function the compiler traces for a block class: ours for the single-stream block, else its forward."""
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoSingleTransformerBlock

    return single_block_forward if cls is HunyuanVideoSingleTransformerBlock else getattr(cls, "forward")
