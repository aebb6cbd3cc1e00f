"""LoRA key names: which modules of HunyuanVideoFramepackTransformer3DModel (diffusers) a module name of a LoRA file
stands for, in each naming the tools people train with write, and which keys are not the transformer's (skipped).

A key is `<prefix><module>.<role>`; pipeline/lora.py reads the role, this module the rest. The prefixes
`diffusion_model.`, `transformer.`, `lora_transformer.` and PEFT's `base_model.model.` are dropped (one of them).
Module names, all resolved to diffusers modules:
- diffusers' own names (`transformer_blocks.0.attn.to_q`): diffusers / PEFT, FramePack's musubi-tuner LoRAs,
  OneTrainer's diffusers keys;
- the same with every `.` written `_`, after `lora_unet_` (kohya, musubi-tuner) or `lora_transformer_` (OneTrainer's
  `lora_transformer_transformer_blocks_0_attn_to_q` with `.alpha`);
- the same with every `_` written `.` (musubi-tuner's convert_lora.py `--target other` on a FramePack LoRA writes
  `diffusion_model.transformer.blocks.0.attn.to.q.lora_A.weight`, alpha folded into both factors): resolved by
  comparing the names with `_` for `.`;
- HunyuanVideo's original names as Tencent's code spells them (`double_blocks.0.img_attn_qkv`, `img_mod.linear`,
  `img_mlp.fc1`: musubi-tuner's HunyuanVideo LoRAs, diffusion-pipe), as ComfyUI's model spells them
  (`img_attn.qkv`, `img_mod.lin`, `img_mlp.0`, `modulation.lin`, `time_in.in_layer`), as OneTrainer's OMI keys spell
  them (the parts of a fused layer as `img_attn_qkv.0` … `linear1.3`, `img_mlp.fc0`), and each with `_` for `.`.

Fused original layers stand for several diffusers modules, their output rows in order: `img_attn.qkv` → to_q, to_k,
to_v; `txt_attn.qkv` → add_q_proj, add_k_proj, add_v_proj; a single block's `linear1` → to_q, to_k, to_v, proj_mlp
(sized by the model's own layers, so any model size splits right). Their input is one, so a LoRA's down factor is
shared and only its up rows (or a full diff's rows) are split.

Modulations keep their chunk order except one: HunyuanVideo's final layer computes `shift, scale` from
`final_layer.adaLN_modulation.1`, diffusers' `norm_out` (AdaLayerNormContinuous) reads `scale, shift` from its
linear, so that layer's rows swap halves (up rows, diff rows, bias). `img_mod`/`txt_mod` (shift, scale, gate twice:
AdaLayerNormZero), a single block's `modulation` (shift, scale, gate: AdaLayerNormZeroSingle) and the token
refiner's `adaLN_modulation` (two gates: HunyuanVideoAdaNorm) are in the same order in both.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

PREFIXES = ("base_model.model.", "diffusion_model.", "lora_transformer.", "transformer.")
UNDERSCORED = ("lora_unet_", "lora_transformer_")

# Keys of other models in the same file: skipped (and said), never refused.
_SKIPPED = (
    (re.compile(r"^(lora_te\d*[_.]|text_encoders?(_\d+)?[._]|(llama|clip_l)\.)"),
     "text-encoder keys (LoRAs change the transformer only here)"),
    (re.compile(r"^bundle_emb\."), "bundled text embeddings (not applied here)"),
)

# Original HunyuanVideo modules inside a block: (spellings, the diffusers module(s) it stands for, in row order).
_DOUBLE = (
    (("img_mod.linear", "img_mod.lin"), ("norm1.linear",)),
    (("txt_mod.linear", "txt_mod.lin"), ("norm1_context.linear",)),
    (("img_attn_qkv", "img_attn.qkv"), ("attn.to_q", "attn.to_k", "attn.to_v")),
    (("txt_attn_qkv", "txt_attn.qkv"), ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")),
    (("img_attn_proj", "img_attn.proj"), ("attn.to_out.0",)),
    (("txt_attn_proj", "txt_attn.proj"), ("attn.to_add_out",)),
    (("img_mlp.fc1", "img_mlp.0", "img_mlp.fc0"), ("ff.net.0.proj",)),
    (("img_mlp.fc2", "img_mlp.2"), ("ff.net.2",)),
    (("txt_mlp.fc1", "txt_mlp.0", "txt_mlp.fc0"), ("ff_context.net.0.proj",)),
    (("txt_mlp.fc2", "txt_mlp.2"), ("ff_context.net.2",)),
    (("img_attn_q_norm", "img_attn.norm.query_norm"), ("attn.norm_q",)),
    (("img_attn_k_norm", "img_attn.norm.key_norm"), ("attn.norm_k",)),
    (("txt_attn_q_norm", "txt_attn.norm.query_norm"), ("attn.norm_added_q",)),
    (("txt_attn_k_norm", "txt_attn.norm.key_norm"), ("attn.norm_added_k",)),
)
_SINGLE = (
    (("linear1",), ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")),
    (("linear2",), ("proj_out",)),
    (("modulation.linear", "modulation.lin"), ("norm.linear",)),
    (("q_norm", "norm.query_norm"), ("attn.norm_q",)),
    (("k_norm", "norm.key_norm"), ("attn.norm_k",)),
)
_REFINER = (
    (("self_attn_qkv", "self_attn.qkv"), ("attn.to_q", "attn.to_k", "attn.to_v")),
    (("self_attn_proj", "self_attn.proj"), ("attn.to_out.0",)),
    (("mlp.fc1", "mlp.0", "mlp.fc0"), ("ff.net.0.proj",)),
    (("mlp.fc2", "mlp.2"), ("ff.net.2",)),
    (("adaLN_modulation.1",), ("norm_out.linear",)),
    (("norm1",), ("norm1",)),
    (("norm2",), ("norm2",)),
)
# (original block list, diffusers block list, config field with their count, table)
_BLOCKS = (("double_blocks", "transformer_blocks", "num_layers", _DOUBLE),
           ("single_blocks", "single_transformer_blocks", "num_single_layers", _SINGLE),
           ("txt_in.individual_token_refiner.blocks", "context_embedder.token_refiner.refiner_blocks",
            "num_refiner_layers", _REFINER))
_TOP = (
    (("img_in.proj",), ("x_embedder.proj",)),
    (("txt_in.input_embedder",), ("context_embedder.proj_in",)),
    (("txt_in.t_embedder.mlp.0", "txt_in.t_embedder.linear_1", "txt_in.t_embedder.in_layer"),
     ("context_embedder.time_text_embed.timestep_embedder.linear_1",)),
    (("txt_in.t_embedder.mlp.2", "txt_in.t_embedder.linear_2", "txt_in.t_embedder.out_layer"),
     ("context_embedder.time_text_embed.timestep_embedder.linear_2",)),
    (("txt_in.c_embedder.linear_1", "txt_in.c_embedder.in_layer"),
     ("context_embedder.time_text_embed.text_embedder.linear_1",)),
    (("txt_in.c_embedder.linear_2", "txt_in.c_embedder.out_layer"),
     ("context_embedder.time_text_embed.text_embedder.linear_2",)),
    (("time_in.mlp.0", "time_in.in_layer"), ("time_text_embed.timestep_embedder.linear_1",)),
    (("time_in.mlp.2", "time_in.out_layer"), ("time_text_embed.timestep_embedder.linear_2",)),
    (("guidance_in.mlp.0", "guidance_in.in_layer"), ("time_text_embed.guidance_embedder.linear_1",)),
    (("guidance_in.mlp.2", "guidance_in.out_layer"), ("time_text_embed.guidance_embedder.linear_2",)),
    (("vector_in.in_layer",), ("time_text_embed.text_embedder.linear_1",)),
    (("vector_in.out_layer",), ("time_text_embed.text_embedder.linear_2",)),
    (("final_layer.linear",), ("proj_out",)),
)
_SWAPPED = "final_layer.adaLN_modulation.1"          # (shift, scale) → norm_out.linear's (scale, shift)
_BLOCK = re.compile(r"^(double_blocks|single_blocks|txt_in\.individual_token_refiner\.blocks)\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class Target:
    """The diffusers module(s) a file's module name stands for: one, or the parts of a fused layer in row order;
    `swapped`: its two halves are stored the other way round."""
    modules: tuple[str, ...]
    swapped: bool = False

    def split(self, rows: torch.Tensor, sizes: list[int]) -> list[torch.Tensor] | None:
        """A tensor with the source layer's output rows first (a LoRA's up factor, a full diff, a bias diff) → one
        piece per module (`sizes`: their rows). None when the rows do not add up (one plain module: as it is, its
        shape is checked by the caller)."""
        if len(self.modules) == 1 and not self.swapped:
            return [rows]
        if rows.ndim == 0 or rows.shape[0] != sum(sizes) or (self.swapped and rows.shape[0] % 2):
            return None
        if self.swapped:
            half = rows.shape[0] // 2
            return [torch.cat([rows[half:], rows[:half]])]
        return list(torch.split(rows, sizes))


def _entries(table) -> dict[str, Target]:
    """spelling → Target; a fused layer's parts also by index (OneTrainer's OMI: `img_attn_qkv.0` is to_q)."""
    out = {}
    for spellings, modules in table:
        for s in spellings:
            out[s] = Target(modules)
            if len(modules) > 1:
                out.update({f"{s}.{i}": Target((m,)) for i, m in enumerate(modules)})
    return out


_IN_BLOCK = {original: (diffusers, field, _entries(table)) for original, diffusers, field, table in _BLOCKS}
_AT_TOP = {**_entries(_TOP), _SWAPPED: Target(("norm_out.linear",), swapped=True)}


def skip_reason(key: str) -> str | None:
    """Why a key of the file is skipped (another model's, e.g. a text encoder's), or None."""
    for pattern, reason in _SKIPPED:
        if pattern.match(key):
            return reason
    return None


def strip_prefix(key: str) -> str:
    for p in PREFIXES:
        if key.startswith(p):
            return key[len(p):]
    return key


def _original(name: str) -> Target | None:
    """An original HunyuanVideo / ComfyUI / OMI module name → its diffusers module(s); None when it is not one."""
    m = _BLOCK.match(name)
    if m is None:
        return _AT_TOP.get(name)
    diffusers, _, entries = _IN_BLOCK[m.group(1)]
    t = entries.get(m.group(3))
    if t is None:
        return None
    return Target(tuple(f"{diffusers}.{m.group(2)}.{part}" for part in t.modules), t.swapped)


class Names:
    """Module names of one model (diffusers), and every spelling of them a LoRA file may use."""

    def __init__(self, model: nn.Module):
        self.modules = dict(model.named_modules())
        self.params = dict(model.named_parameters())
        cfg = model.config
        own = [n for n, m in self.modules.items() if n and next(m.parameters(recurse=False), None) is not None]
        originals = list(_AT_TOP)
        for original, (_, count_field, entries) in _IN_BLOCK.items():
            originals += [f"{original}.{i}.{s}" for i in range(getattr(cfg, count_field, 0) or 0) for s in entries]
        self._underscored: dict[str, str] = {}
        for name in own + originals:                       # the model's own names first
            self._underscored.setdefault(name.replace(".", "_"), name)

    def resolve(self, name: str) -> Target:
        """A module name from a file (prefix dropped) → the diffusers module(s). A name that stands for nothing
        known comes back as it is (one module the model does not have: the caller refuses it, naming its key)."""
        for prefix in UNDERSCORED:
            if name.startswith(prefix):
                name = self._underscored.get(name[len(prefix):], name)
                break
        else:
            if name not in self.modules and _original(name) is None:
                name = self._underscored.get(name.replace(".", "_"), name)     # `_` written `.` (musubi "other")
        if name in self.modules:
            return Target((name,))
        return _original(name) or Target((name,))
