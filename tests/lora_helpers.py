"""Tiny LoRA files for the tiny transformer, in each key format people have, and the weights merged by hand.

Each writer returns the file and `expected`: module name (diffusers) → the delta (out × in) its keys stand for,
computed here independently of pipeline/lora.py (the hand merge the tests compare with).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

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
    """The transformer's weights with each (expected deltas, strength) added: W + Σ s·ΔW. An expected key is a
    module (its weight gets the delta) or a tensor's own name ("….weight", "….bias": a full difference)."""
    state = {k: v.detach().clone() for k, v in tr.state_dict().items()}
    for expected, strength in deltas:
        for name, delta in expected.items():
            state[name if name.endswith((".weight", ".bias")) else f"{name}.weight"] += strength * delta
    return state


# ---- the layouts of issue 32 (tests/test_lora_formats.py) -----------------------------------------------------------
# ComfyUI's own HunyuanVideo module names (comfy/ldm/hunyuan_video/model.py on flux/layers.py: Modulation.lin,
# SelfAttention.qkv/.proj, nn.Sequential MLPs, MLPEmbedder in_layer/out_layer, LastLayer) → the diffusers module(s)
# each one is, in the order of its output rows. "swap": its rows are (shift, scale), diffusers' norm_out reads
# (scale, shift) (AdaLayerNormContinuous), so the two halves trade places.
COMFY_NAMES = {
    "double_blocks.0.img_mod.lin": ["transformer_blocks.0.norm1.linear"],
    "double_blocks.0.txt_mod.lin": ["transformer_blocks.0.norm1_context.linear"],
    "double_blocks.0.img_attn.qkv": ["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k",
                                     "transformer_blocks.0.attn.to_v"],
    "double_blocks.0.txt_attn.qkv": ["transformer_blocks.0.attn.add_q_proj", "transformer_blocks.0.attn.add_k_proj",
                                     "transformer_blocks.0.attn.add_v_proj"],
    "double_blocks.0.img_attn.proj": ["transformer_blocks.0.attn.to_out.0"],
    "double_blocks.0.txt_attn.proj": ["transformer_blocks.0.attn.to_add_out"],
    "double_blocks.0.img_mlp.0": ["transformer_blocks.0.ff.net.0.proj"],
    "double_blocks.0.img_mlp.2": ["transformer_blocks.0.ff.net.2"],
    "double_blocks.0.txt_mlp.0": ["transformer_blocks.0.ff_context.net.0.proj"],
    "double_blocks.0.txt_mlp.2": ["transformer_blocks.0.ff_context.net.2"],
    "single_blocks.0.linear1": ["single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_k",
                                "single_transformer_blocks.0.attn.to_v", "single_transformer_blocks.0.proj_mlp"],
    "single_blocks.0.linear2": ["single_transformer_blocks.0.proj_out"],
    "single_blocks.0.modulation.lin": ["single_transformer_blocks.0.norm.linear"],
    "txt_in.input_embedder": ["context_embedder.proj_in"],
    "txt_in.t_embedder.in_layer": ["context_embedder.time_text_embed.timestep_embedder.linear_1"],
    "txt_in.t_embedder.out_layer": ["context_embedder.time_text_embed.timestep_embedder.linear_2"],
    "txt_in.c_embedder.in_layer": ["context_embedder.time_text_embed.text_embedder.linear_1"],
    "txt_in.c_embedder.out_layer": ["context_embedder.time_text_embed.text_embedder.linear_2"],
    "txt_in.individual_token_refiner.blocks.0.self_attn.qkv": [
        "context_embedder.token_refiner.refiner_blocks.0.attn.to_q",
        "context_embedder.token_refiner.refiner_blocks.0.attn.to_k",
        "context_embedder.token_refiner.refiner_blocks.0.attn.to_v"],
    "txt_in.individual_token_refiner.blocks.0.self_attn.proj": [
        "context_embedder.token_refiner.refiner_blocks.0.attn.to_out.0"],
    "txt_in.individual_token_refiner.blocks.0.mlp.0": ["context_embedder.token_refiner.refiner_blocks.0.ff.net.0.proj"],
    "txt_in.individual_token_refiner.blocks.0.mlp.2": ["context_embedder.token_refiner.refiner_blocks.0.ff.net.2"],
    "txt_in.individual_token_refiner.blocks.0.adaLN_modulation.1": [
        "context_embedder.token_refiner.refiner_blocks.0.norm_out.linear"],
    "time_in.in_layer": ["time_text_embed.timestep_embedder.linear_1"],
    "time_in.out_layer": ["time_text_embed.timestep_embedder.linear_2"],
    "vector_in.in_layer": ["time_text_embed.text_embedder.linear_1"],
    "vector_in.out_layer": ["time_text_embed.text_embedder.linear_2"],
    "guidance_in.in_layer": ["time_text_embed.guidance_embedder.linear_1"],
    "guidance_in.out_layer": ["time_text_embed.guidance_embedder.linear_2"],
    "final_layer.linear": ["proj_out"],
    "final_layer.adaLN_modulation.1": ["swap", "norm_out.linear"],
}


def _rows_by_hand(tr, targets, rows):
    """A tensor of the fused source layer's rows → {diffusers module: its rows}, sized by the modules' own rows."""
    if targets[0] == "swap":
        half = rows.shape[0] // 2
        return {targets[1]: torch.cat([rows[half:], rows[:half]])}
    sizes = [_linear(tr, m).out_features for m in targets]
    assert sum(sizes) == rows.shape[0]
    return dict(zip(targets, torch.split(rows, sizes)))


def _fused_pair(tr, g, targets, rank=RANK):
    modules = targets[1:] if targets[0] == "swap" else targets
    out_f = sum(_linear(tr, m).out_features for m in modules)
    return _pair(g, out_f, _linear(tr, modules[0]).in_features, rank)


def write_comfy_native(tr, path: Path, roles=("lora_down", "lora_up"), seed: int = 10, alpha: float = 2.0):
    """ComfyUI's own HunyuanVideo names on every layer they have: diffusion_model.double_blocks.0.img_attn.qkv.…;
    with kohya's lora_down/lora_up + .alpha, or PEFT's lora_A/lora_B (no alpha: scale 1)."""
    g = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}
    kohya = roles[0] == "lora_down"
    scale = alpha / RANK if kohya else 1.0
    for name, targets in COMFY_NAMES.items():
        a, b = _fused_pair(tr, g, targets)
        tensors[f"diffusion_model.{name}.{roles[0]}.weight"] = a
        tensors[f"diffusion_model.{name}.{roles[1]}.weight"] = b
        if kohya:
            tensors[f"diffusion_model.{name}.alpha"] = torch.tensor(alpha)
        for module, up in _rows_by_hand(tr, targets, b).items():
            expected[module] = scale * up @ a
    save_file(tensors, str(path))
    return path, expected


def write_fastvideo_diffs(tr, path: Path, seed: int = 11):
    """Full differences beside and instead of low-rank pairs: `.diff` (added to the weight) and `.diff_b` (to the
    bias), on diffusers names (a pair with a bias diff, a whole-weight diff, a norm's weight) and on ComfyUI's fused
    and reordered names (split and swapped like the up rows)."""
    g = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}
    p = "diffusion_model."
    m = "transformer_blocks.0.attn.to_q"                       # a pair and a bias diff on one layer
    lin = _linear(tr, m)
    a, b = _pair(g, lin.out_features, lin.in_features)
    tensors[f"{p}{m}.lora_A.weight"], tensors[f"{p}{m}.lora_B.weight"] = a, b
    tensors[f"{p}{m}.diff_b"] = torch.randn(lin.out_features, generator=g)
    expected[m] = b @ a
    expected[f"{m}.bias"] = tensors[f"{p}{m}.diff_b"]
    for m in ("single_transformer_blocks.0.proj_out", "image_projection.up"):       # a whole-weight diff, its bias
        lin = _linear(tr, m)
        tensors[f"{p}{m}.diff"] = torch.randn(lin.out_features, lin.in_features, generator=g) * 0.1
        tensors[f"{p}{m}.diff_b"] = torch.randn(lin.out_features, generator=g) * 0.1
        expected[f"{m}.weight"], expected[f"{m}.bias"] = tensors[f"{p}{m}.diff"], tensors[f"{p}{m}.diff_b"]
    m = "transformer_blocks.0.attn.norm_q"                     # an RMSNorm's weight
    tensors[f"{p}{m}.diff"] = torch.randn(tr.config.attention_head_dim, generator=g) * 0.1
    expected[f"{m}.weight"] = tensors[f"{p}{m}.diff"]
    for name in ("double_blocks.0.img_attn.qkv", "single_blocks.0.linear1", "final_layer.adaLN_modulation.1"):
        targets = COMFY_NAMES[name]
        a, b = _fused_pair(tr, g, targets)
        in_f = a.shape[1]
        tensors[f"{p}{name}.diff"] = torch.randn(b.shape[0], in_f, generator=g) * 0.1
        tensors[f"{p}{name}.diff_b"] = torch.randn(b.shape[0], generator=g) * 0.1
        for suffix, kind in ((".diff", ".weight"), (".diff_b", ".bias")):   # (to_q's bias gets two: they add)
            for module, rows in _rows_by_hand(tr, targets, tensors[f"{p}{name}{suffix}"]).items():
                expected[module + kind] = expected.get(module + kind, 0) + rows
    save_file(tensors, str(path))
    return path, expected


_ONETRAINER = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_add_out",
               "single_transformer_blocks.0.proj_mlp", "context_embedder.token_refiner.refiner_blocks.0.attn.to_v",
               "time_text_embed.timestep_embedder.linear_1", "norm_out.linear", "image_projection.down")


def write_onetrainer(tr, path: Path, seed: int = 12):
    """OneTrainer: lora_transformer_<diffusers module with _>.lora_down/lora_up.weight, an .alpha per layer."""
    g = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}
    for i, m in enumerate(_ONETRAINER):
        lin = _linear(tr, m)
        a, b = _pair(g, lin.out_features, lin.in_features)
        key = "lora_transformer_" + m.replace(".", "_")
        alpha = 1.0 + i                                         # a different alpha per layer
        tensors[f"{key}.lora_down.weight"], tensors[f"{key}.lora_up.weight"] = a, b
        tensors[f"{key}.alpha"] = torch.tensor(alpha)
        expected[m] = (alpha / RANK) * b @ a
    save_file(tensors, str(path))
    return path, expected


def write_onetrainer_omi(tr, path: Path, seed: int = 13):
    """OneTrainer's OMI keys: transformer.<original name>, a fused layer's parts as their own LoRAs (`img_attn_qkv.1`
    is to_k, `linear1.3` the MLP), `img_mlp.fc0`, and the final modulation in the original (shift, scale) order."""
    g = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}
    parts = {"double_blocks.0.img_attn_qkv.1": ["transformer_blocks.0.attn.to_k"],
             "double_blocks.0.txt_attn_qkv.2": ["transformer_blocks.0.attn.add_v_proj"],
             "double_blocks.0.img_mlp.fc0": ["transformer_blocks.0.ff.net.0.proj"],
             "single_blocks.0.linear1.3": ["single_transformer_blocks.0.proj_mlp"],
             "txt_in.individual_token_refiner.blocks.0.self_attn_qkv.0": [
                 "context_embedder.token_refiner.refiner_blocks.0.attn.to_q"],
             "final_layer.adaLN_modulation.1": ["swap", "norm_out.linear"]}
    for name, targets in parts.items():
        a, b = _fused_pair(tr, g, targets)
        tensors[f"transformer.{name}.lora_down.weight"], tensors[f"transformer.{name}.lora_up.weight"] = a, b
        tensors[f"transformer.{name}.alpha"] = torch.tensor(float(RANK))
        for module, up in _rows_by_hand(tr, targets, b).items():
            expected[module] = up @ a
    save_file(tensors, str(path))
    return path, expected


_FRAMEPACK = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.norm1_context.linear",
              "transformer_blocks.0.ff.net.0.proj", "single_transformer_blocks.0.proj_mlp",
              "context_embedder.token_refiner.refiner_blocks.0.attn.to_out.0", "image_projection.up",
              "time_text_embed.guidance_embedder.linear_1", "proj_out")


def write_musubi_other(tr, path: Path, seed: int = 14, alpha: float = 2.0):
    """A FramePack LoRA of musubi-tuner (lora_unet_transformer_blocks_0_attn_to_q …, alpha) as its convert_lora.py
    `--target other` writes it for other tools: every `_` of the name a `.` after `diffusion_model.`, lora_A/lora_B,
    no alpha key: both factors scaled by sqrt(alpha/rank)."""
    g = torch.Generator().manual_seed(seed)
    tensors, expected = {}, {}
    root = (alpha / RANK) ** 0.5
    for m in _FRAMEPACK:
        lin = _linear(tr, m)
        a, b = _pair(g, lin.out_features, lin.in_features)
        key = "diffusion_model." + m.replace("_", ".")
        tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a * root, b * root
        expected[m] = (alpha / RANK) * b @ a
    save_file(tensors, str(path))
    return path, expected


TEXT_ENCODER_KEYS = ("lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight",
                     "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight",
                     "lora_te1_text_model_encoder_layers_0_mlp_fc1.alpha",
                     "text_encoders.clip_l.transformer.text_model.encoder.layers.0.self_attn.q_proj.lora_A.weight",
                     "text_encoders.clip_l.transformer.text_model.encoder.layers.0.self_attn.q_proj.lora_B.weight")


def write_with_text_encoder(tr, path: Path, seed: int = 15):
    """A kohya-style file that also holds text-encoder LoRAs (lora_te1_…, ComfyUI's text_encoders.…)."""
    path, expected = write_musubi(tr, path, seed)
    tensors = load_file(str(path))
    g = torch.Generator().manual_seed(seed)
    for key in TEXT_ENCODER_KEYS:
        tensors[key] = torch.tensor(1.0) if key.endswith(".alpha") else torch.randn(4, 8, generator=g)
    save_file(tensors, str(path))
    return path, expected


def weights_in_stage(tr, loras, memory=None) -> dict[str, torch.Tensor]:
    """The transformer's tensors as a stage binds them with `loras` attached (then detached)."""
    from memory.manager import MemoryManager
    from pipeline import lora

    mm = memory or MemoryManager(device="cpu")
    lora.attach(tr, loras)
    try:
        with mm.stage("transformer", transformer=tr):
            return {k: v.detach().clone() for k, v in tr.state_dict().items()}
    finally:
        lora.detach(tr)


def merged_as_loaded(tr, loras) -> dict[str, torch.Tensor]:
    """The transformer's tensors with `loras` merged the way a chunk load merges them (memory/deltas.py: the deltas
    set on the model's host pack, as stored there, applied to a copy of each tensor), without a stage around it (a
    stage costs a garbage collection; tests/test_lora.py and the streamed test run the real stages)."""
    from memory.hostpack import HostPack
    from pipeline import lora

    state = {k: v.detach().clone() for k, v in tr.state_dict().items()}
    lora.attach(tr, loras)
    try:
        for chunk in HostPack.of(tr).chunks:
            for i, delta in chunk.deltas.items():
                delta.apply(state[chunk.entries[i].name])
    finally:
        lora.detach(tr)
    return state


def worst_difference(state, expected) -> float:
    assert state.keys() == expected.keys()
    return max(float((state[k] - expected[k]).abs().max()) for k in state)
