"""Tiny LoRA files for the tiny transformer, in each key format people have, and the weights merged by hand.

Each writer returns the file and `expected`: module name (diffusers) → the delta (out × in) its keys stand for,
computed here independently of pipeline/lora.py (the hand merge the tests compare with).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 4


def _pair(g, out_f, in_f, rank=RANK):
    return torch.randn(rank, in_f, generator=g) * 0.3, torch.randn(out_f, rank, generator=g) * 0.3


def _linear(tr, name):
    return dict(tr.named_modules())[name]


def write_diffusers(tr, path: Path, seed: int = 0, alpha: float = 8.0):
    """diffusers / PEFT: transformer.<module>.lora_A/B.weight; alpha in diffusers' lora_adapter_metadata."""
    g = torch.Generator().manual_seed(seed)
    modules = ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.ff.net.0.proj",
               "single_transformer_blocks.0.proj_out", "image_projection.up", "norm_out.linear"]
    tensors, expected = {}, {}
    for m in modules:
        lin = _linear(tr, m)
        a, b = _pair(g, lin.out_features, lin.in_features)
        tensors[f"transformer.{m}.lora_A.weight"], tensors[f"transformer.{m}.lora_B.weight"] = a, b
        expected[m] = (alpha / RANK) * b @ a
    meta = {"lora_adapter_metadata": json.dumps({"r": RANK, "lora_alpha": alpha})}
    save_file(tensors, str(path), metadata=meta)
    return path, expected


def write_musubi(tr, path: Path, seed: int = 1, alpha: float = 2.0):
    """kohya / musubi-tuner on FramePack's diffusers names: lora_unet_<module with _>.lora_down/up + .alpha."""
    g = torch.Generator().manual_seed(seed)
    modules = ["transformer_blocks.0.attn.add_k_proj", "single_transformer_blocks.0.attn.to_v",
               "context_embedder.token_refiner.refiner_blocks.0.attn.to_q", "time_text_embed.guidance_embedder.linear_1"]
    tensors, expected = {}, {}
    for m in modules:
        lin = _linear(tr, m)
        a, b = _pair(g, lin.out_features, lin.in_features)
        key = "lora_unet_" + m.replace(".", "_")
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = a, b
        tensors[f"{key}.alpha"] = torch.tensor(alpha)
        expected[m] = (alpha / RANK) * b @ a
    save_file(tensors, str(path))
    return path, expected


def _hunyuan_original(tr, g):
    """Original HunyuanVideo names with fused qkv / linear1: (name → (A, B)), expected deltas (unscaled)."""
    h = tr.config.num_attention_heads * tr.config.attention_head_dim
    out, expected = {}, {}
    a, b = _pair(g, 3 * h, h)                                   # img_attn_qkv: one A, B stacked q, k, v
    out["double_blocks.0.img_attn_qkv"] = (a, b)
    for i, m in enumerate(("to_q", "to_k", "to_v")):
        expected[f"transformer_blocks.0.attn.{m}"] = b[i * h:(i + 1) * h] @ a
    mlp = _linear(tr, "single_transformer_blocks.0.proj_mlp").out_features
    a, b = _pair(g, 3 * h + mlp, h)                             # single block linear1: q, k, v, mlp
    out["single_blocks.0.linear1"] = (a, b)
    for i, m in enumerate(("attn.to_q", "attn.to_k", "attn.to_v")):
        expected[f"single_transformer_blocks.0.{m}"] = b[i * h:(i + 1) * h] @ a
    expected["single_transformer_blocks.0.proj_mlp"] = b[3 * h:] @ a
    lin = _linear(tr, "transformer_blocks.0.ff_context.net.2")
    a, b = _pair(g, lin.out_features, lin.in_features)
    out["double_blocks.0.txt_mlp.fc2"] = (a, b)
    expected["transformer_blocks.0.ff_context.net.2"] = b @ a
    return out, expected


def write_comfy(tr, path: Path, seed: int = 2, alpha: float = 1.0):
    """ComfyUI / kohya with original HunyuanVideo names: diffusion_model.double_blocks.0.img_attn_qkv.lora_down…"""
    g = torch.Generator().manual_seed(seed)
    pairs, expected = _hunyuan_original(tr, g)
    tensors = {}
    for name, (a, b) in pairs.items():
        tensors[f"diffusion_model.{name}.lora_down.weight"] = a
        tensors[f"diffusion_model.{name}.lora_up.weight"] = b
        tensors[f"diffusion_model.{name}.alpha"] = torch.tensor(alpha)
    save_file(tensors, str(path))
    return path, {m: (alpha / RANK) * d for m, d in expected.items()}


def write_musubi_hunyuan(tr, path: Path, seed: int = 3):
    """musubi-tuner HunyuanVideo: lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight (no alpha: scale 1)."""
    g = torch.Generator().manual_seed(seed)
    pairs, expected = _hunyuan_original(tr, g)
    tensors = {}
    for name, (a, b) in pairs.items():
        key = "lora_unet_" + name.replace(".", "_")
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = a, b
    save_file(tensors, str(path))
    return path, expected


def write_original_peft(tr, path: Path, seed: int = 4):
    """HunyuanVideo's original names with PEFT's lora_A/lora_B (what diffusers' own conversion reads)."""
    g = torch.Generator().manual_seed(seed)
    pairs, expected = _hunyuan_original(tr, g)
    tensors = {}
    for name, (a, b) in pairs.items():
        tensors[f"{name}.lora_A.weight"], tensors[f"{name}.lora_B.weight"] = a, b
    save_file(tensors, str(path))
    return path, expected


WRITERS = {"diffusers": write_diffusers, "musubi": write_musubi, "comfy": write_comfy,
           "musubi_hunyuan": write_musubi_hunyuan, "original_peft": write_original_peft}


def merged_by_hand(tr, deltas: list[tuple[dict, float]]) -> dict[str, torch.Tensor]:
    """The transformer's weights with each (expected deltas, strength) added: W + Σ s·ΔW."""
    state = {k: v.detach().clone() for k, v in tr.state_dict().items()}
    for expected, strength in deltas:
        for module, delta in expected.items():
            state[f"{module}.weight"] += strength * delta
    return state
