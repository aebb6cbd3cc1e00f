"""The compiled blocks' own forms of three products: the MLP's product with its GELU, the single-stream block's
output product without its concatenation, and the attention's q, k and v as one product (issue 46).

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
- **The attention's q, k and v are one product** (`joined_products`): diffusers multiplies the same tokens by three
  3,072-wide weights; one product on the three joined (9,216 wide) fills the GPU better (on an H200, 644 against
  727 TFLOP/s for a 3,072- and a 12,288-wide bf16 product of the step's tokens, 950 against 1,290 in fp8:
  benchmarks/products.py). The weights are joined at each call (LoRAs are merged into them, streamed blocks bring
  them), then the output is split; the rest of diffusers' processor is unchanged (`joined_attention`).
- **GELU rides in the product's epilogue** on CUDA: `torch._addmm_activation(..., use_gelu=True)`, PyTorch's call
  of cuBLASLt's bias + GELU (tanh) epilogue, behind one opaque operator (`steadyframe::linear_gelu_tanh`) so
  Inductor keeps it whole. Elsewhere (the CPU, ROCm) the same math as diffusers', which Inductor fuses as before.
Written here because neither diffusers nor Inductor makes these two rewrites (Inductor's Triton GEMM templates,
which could fuse an epilogue, lost to cuBLAS on every large product of this step: BENCHMARKS.md, autotuning).
fp8 compute keeps diffusers' forms (its Linears are `Fp8Linear`, products of their own).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


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


def linear_gelu(linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """gelu(linear(x), approximate="tanh"), in one product where `_epilogue` allows."""
    if _epilogue(linear, x):
        return torch.ops.steadyframe.linear_gelu_tanh(x, linear.weight, linear.bias)
    return F.gelu(linear(x), approximate="tanh")


def split_linear(linear: nn.Module, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """linear(cat([first, second], -1)) without the concatenation: two products on the weight's two column blocks
    (views), summed. A Linear that is not a plain one (fp8's) gets the concatenation."""
    if type(linear) is not nn.Linear:
        return linear(torch.cat([first, second], dim=-1))
    k = first.shape[-1]
    return F.linear(first, linear.weight[:, :k], linear.bias) + F.linear(second, linear.weight[:, k:])


def joined_products(linears, x: torch.Tensor) -> list[torch.Tensor]:
    """[linear(x) for linear in linears] as one product on their weights joined by rows, its output split again:
    plain Linears (all with a bias or none), or fp8's Linears with weights kept in fp8 (their class's `joined`).
    Others (LoRA layers, a mix) are called one by one."""
    kind = type(linears[0])
    if any(type(linear) is not kind for linear in linears):
        return [linear(x) for linear in linears]
    if kind is nn.Linear and len({linear.bias is None for linear in linears}) == 1:
        bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
        out = F.linear(x, torch.cat([linear.weight for linear in linears]), bias)
    elif hasattr(kind, "joined") and (out := kind.joined(linears, x)) is not None:
        pass
    else:
        return [linear(x) for linear in linears]
    return list(out.split([linear.out_features for linear in linears], dim=-1))


def joined_attention(attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                     attention_mask: torch.Tensor | None = None,
                     image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None):
    """diffusers' `HunyuanVideoAttnProcessor2_0` with each stream's q, k and v from one product
    (`joined_products`); every other step as there."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.embeddings import apply_rotary_emb

    if attn.add_q_proj is None and encoder_hidden_states is not None:
        hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
    query, key, value = (t.unflatten(2, (attn.heads, -1))
                         for t in joined_products([attn.to_q, attn.to_k, attn.to_v], hidden_states))
    if attn.norm_q is not None:
        query = attn.norm_q(query)
    if attn.norm_k is not None:
        key = attn.norm_k(key)
    if image_rotary_emb is not None:
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            text = encoder_hidden_states.shape[1]
            query = torch.cat([apply_rotary_emb(query[:, :-text], image_rotary_emb, sequence_dim=1),
                               query[:, -text:]], dim=1)
            key = torch.cat([apply_rotary_emb(key[:, :-text], image_rotary_emb, sequence_dim=1),
                             key[:, -text:]], dim=1)
        else:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
    if attn.add_q_proj is not None and encoder_hidden_states is not None:
        eq, ek, ev = (t.unflatten(2, (attn.heads, -1)) for t in
                      joined_products([attn.add_q_proj, attn.add_k_proj, attn.add_v_proj], encoder_hidden_states))
        if attn.norm_added_q is not None:
            eq = attn.norm_added_q(eq)
        if attn.norm_added_k is not None:
            ek = attn.norm_added_k(ek)
        query, key, value = (torch.cat([a, b], dim=1) for a, b in ((query, eq), (key, ek), (value, ev)))
    processor = attn.processor
    hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                          is_causal=False, backend=processor._attention_backend,
                                          parallel_config=processor._parallel_config)
    hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
    if encoder_hidden_states is not None:
        text = encoder_hidden_states.shape[1]
        hidden_states, encoder_hidden_states = hidden_states[:, :-text], hidden_states[:, -text:]
        if getattr(attn, "to_out", None) is not None:
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if getattr(attn, "to_add_out", None) is not None:
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states


class _JoinedProcessor:
    """diffusers' `HunyuanVideoAttnProcessor2_0` with `joined_attention` while it is being compiled; eager calls run
    diffusers' own. Set on a processor by swapping its class (`fuse_blocks`)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        if torch.compiler.is_compiling():
            return joined_attention(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        return super().__call__(attn, hidden_states, encoder_hidden_states,   # type: ignore[misc]
                                attention_mask, image_rotary_emb)


@functools.cache
def _joined_processor_class() -> type:
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    return type("JoinedHunyuanVideoAttnProcessor", (_JoinedProcessor, HunyuanVideoAttnProcessor2_0), {})


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
    """Give the double-stream blocks' MLP GELU modules (diffusers' `GELU`, tanh) and every block's attention
    processor (diffusers' `HunyuanVideoAttnProcessor2_0`) their compiled forms, once."""
    from diffusers.models.activations import GELU
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0

    for block in blocks:
        for module in list(block.modules()):
            if type(module) is GELU and module.approximate == "tanh":
                module.__class__ = _fused_gelu_class()
            processor = getattr(module, "processor", None)
            if type(processor) is HunyuanVideoAttnProcessor2_0:
                processor.__class__ = _joined_processor_class()


def single_block_forward(block, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                         temb: torch.Tensor, attention_mask: torch.Tensor | None = None,
                         image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None, *args, **kwargs):
    """A single-stream block (diffusers' `HunyuanVideoSingleTransformerBlock`) with the MLP's GELU in its product
    and `proj_out` split (the module docstring): the same steps, each through the block's own modules. The video and
    text tokens run as one sequence (text last); returns them apart again."""
    text = encoder_hidden_states.shape[1]
    residual = torch.cat([hidden_states, encoder_hidden_states], dim=1)
    normed, gate = block.norm(residual, emb=temb)
    if type(block.act_mlp) is nn.GELU and block.act_mlp.approximate == "tanh":
        mlp = linear_gelu(block.proj_mlp, normed)
    else:
        mlp = block.act_mlp(block.proj_mlp(normed))
    attn, attn_text = block.attn(hidden_states=normed[:, :-text, :], encoder_hidden_states=normed[:, -text:, :],
                                 attention_mask=attention_mask, image_rotary_emb=image_rotary_emb)
    out = residual + gate.unsqueeze(1) * split_linear(block.proj_out, torch.cat([attn, attn_text], dim=1), mlp)
    return out[:, :-text, :], out[:, -text:, :]


def compiled_form(cls: type):
    """The function the compiler traces for a block class: ours for the single-stream block, else its forward."""
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoSingleTransformerBlock

    return single_block_forward if cls is HunyuanVideoSingleTransformerBlock else getattr(cls, "forward")
