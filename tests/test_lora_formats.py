"""LoRA files that were refused before issue 32, each built in its real key layout for the tiny transformer (the real
diffusers class) and applied through a transformer stage: ComfyUI's own HunyuanVideo names (fused layers split,
the final modulation's halves swapped), full differences (.diff / .diff_b), OneTrainer (lora_transformer_… with
.alpha, and its OMI keys), a FramePack LoRA converted by musubi-tuner for other tools, a file that also holds
text-encoder keys (skipped, and said). Each equals the hand merge; the modulations keep ComfyUI's meaning; a refusal
names the key as the file writes it."""
from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from common.errors import InputError
from pipeline import lora
from pipeline.logcapture import capture_logs
from tests.lora_helpers import (
    COMFY_NAMES,
    RANK,
    TEXT_ENCODER_KEYS,
    merged_as_loaded,
    merged_by_hand,
    weights_in_stage,
    worst_difference,
    write_comfy_native,
    write_fastvideo_diffs,
    write_musubi_other,
    write_onetrainer,
    write_onetrainer_omi,
    write_with_text_encoder,
)


@pytest.fixture(scope="module")
def tr():
    """The tiny preset's transformer alone (the real class, seeded weights): no other model is needed here."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    from configs.presets import TINY

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(32)
        model = HunyuanVideoFramepackTransformer3DModel(**TINY.tiny_configs["transformer"])
    return model.eval().requires_grad_(False)


LAYOUTS = {
    "comfy_lora_up_down": write_comfy_native,
    "comfy_lora_A_B": partial(write_comfy_native, roles=("lora_A", "lora_B")),
    "fastvideo_diff": write_fastvideo_diffs,
    "onetrainer": write_onetrainer,
    "onetrainer_omi": write_onetrainer_omi,
    "musubi_converted_other": write_musubi_other,
    "with_text_encoder": write_with_text_encoder,
}


def _tensor(name: str) -> str:
    return name if name.endswith((".weight", ".bias")) else f"{name}.weight"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_applied_equals_the_hand_merge(tr, tmp_path, layout):
    path, expected = LAYOUTS[layout](tr, tmp_path / f"{layout}.safetensors")
    before = {k: v.clone() for k, v in tr.state_dict().items()}
    loras = lora.load_set(f"{path.name}:0.7", tmp_path, tr)
    assert loras.loras[0].layers() == {_tensor(n).rsplit(".", 1)[0] for n in expected}
    want = merged_by_hand(tr, [(expected, 0.7)])
    assert worst_difference(merged_as_loaded(tr, loras), want) <= 1e-5
    # the hand merge changes every tensor the file stands for, and nothing else (so the comparison can fail)
    changed = {k for k in before if float((want[k] - before[k]).abs().max()) > 1e-4}
    assert changed == {_tensor(n) for n in expected}
    assert worst_difference(dict(tr.state_dict()), before) == 0.0          # the host copy never changed


def test_comfy_names_cover_every_hunyuan_layer(tr):
    """The ComfyUI file of the test above holds a LoRA on every layer HunyuanVideo has: every Linear of the diffusers
    model but FramePack's own image projection."""
    linears = {n for n, m in tr.named_modules() if isinstance(m, nn.Linear)}
    reached = {m for targets in COMFY_NAMES.values() for m in targets if m != "swap"}
    assert reached <= linears
    assert linears - reached == {"image_projection.up", "image_projection.down"}


def test_modulations_and_fused_layers_keep_comfys_meaning(tr, tmp_path):
    """ComfyUI's layers with their LoRA added (W + alpha/rank·up·down, ComfyUI's row order) compute what the diffusers
    modules compute with the LoRA merged: the same shift/scale/gate of every modulation (the final layer's read
    (shift, scale), diffusers' norm_out (scale, shift)), and the same q, k, v (and MLP input) of every fused layer.
    ComfyUI's base weights are the diffusers ones in ComfyUI's order (the final modulation's halves swapped back)."""
    path, _ = write_comfy_native(tr, tmp_path / "comfy.safetensors", alpha=3.0)
    raw = load_file(str(path))
    merged = copy.deepcopy(tr)
    merged.load_state_dict(merged_as_loaded(tr, lora.load_set(f"{path}:1", None, tr)))
    plain = dict(tr.named_modules())
    h = tr.config.num_attention_heads * tr.config.attention_head_dim
    g = torch.Generator().manual_seed(5)
    x, vec = torch.randn(2, 7, h, generator=g), torch.randn(2, h, generator=g)

    def comfy(name, *modules, swap=False):
        """ComfyUI's layer `name` (built from the plain diffusers modules) with the file's LoRA added: a function."""
        w = torch.cat([plain[m].weight for m in modules])
        b = torch.cat([plain[m].bias for m in modules])
        if swap:
            w, b = torch.cat(w.chunk(2)[::-1]), torch.cat(b.chunk(2)[::-1])
        k = f"diffusion_model.{name}"
        w = w + float(raw[f"{k}.alpha"]) / RANK * raw[f"{k}.lora_up.weight"] @ raw[f"{k}.lora_down.weight"]
        return lambda v: F.linear(v, w, b)

    def ln(v):
        return F.layer_norm(v, (h,), eps=1e-6)

    def close(a, b):
        assert float((a - b).abs().max()) <= 1e-5

    # double block: Modulation(double=True): shift, scale, gate of attention, then of the MLP (img and txt alike)
    for name, module in (("img_mod", "norm1"), ("txt_mod", "norm1_context")):
        layer = comfy(f"double_blocks.0.{name}.lin", f"transformer_blocks.0.{module}.linear")
        shift, scale, gate, shift2, scale2, gate2 = layer(F.silu(vec)).chunk(6, 1)
        ours = getattr(merged.transformer_blocks[0], module)(x, emb=vec)
        for a, b in zip(ours, ((1 + scale[:, None]) * ln(x) + shift[:, None], gate, shift2, scale2, gate2)):
            close(a, b)
    # single block: shift, scale, gate
    shift, scale, gate = comfy("single_blocks.0.modulation.lin",
                               "single_transformer_blocks.0.norm.linear")(F.silu(vec)).chunk(3, 1)
    ours = merged.single_transformer_blocks[0].norm(x, emb=vec)
    close(ours[0], (1 + scale[:, None]) * ln(x) + shift[:, None])
    close(ours[1], gate)
    # token refiner: two gates
    ref = "context_embedder.token_refiner.refiner_blocks.0"
    mod1, mod2 = comfy("txt_in.individual_token_refiner.blocks.0.adaLN_modulation.1",
                       f"{ref}.norm_out.linear")(F.silu(vec)).chunk(2, 1)
    ours = merged.context_embedder.token_refiner.refiner_blocks[0].norm_out(vec)
    close(ours[0], mod1[:, None])
    close(ours[1], mod2[:, None])
    # final layer (LastLayer): shift, scale = adaLN_modulation(vec); diffusers' norm_out reads (scale, shift)
    shift, scale = comfy("final_layer.adaLN_modulation.1", "norm_out.linear", swap=True)(F.silu(vec)).chunk(2, 1)
    close(merged.norm_out(x, vec), (1 + scale[:, None]) * ln(x) + shift[:, None])
    # fused layers: ComfyUI splits qkv as (3, heads, dim) and linear1 as [3·hidden, mlp]
    for name, targets in COMFY_NAMES.items():
        if len(targets) > 1 and targets[0] != "swap":
            fused = comfy(name, *targets)(x)
            close(fused, torch.cat([dict(merged.named_modules())[m](x) for m in targets], dim=-1))
    assert not torch.allclose(merged.norm_out(x, vec), tr.norm_out(x, vec))          # the LoRA did change it


def test_text_encoder_keys_are_skipped_and_said(tr, tmp_path):
    path, expected = write_with_text_encoder(tr, tmp_path / "both.safetensors")
    with capture_logs() as lines:                          # what a job streams to the page's log
        loras = lora.load_set(path.name, tmp_path, tr)
    lo = loras.loras[0]
    assert sorted(k for k, _ in lo.skipped) == sorted(TEXT_ENCODER_KEYS)
    assert lo.layers() == set(expected)
    assert lo.record()["skipped_keys"] == len(TEXT_ENCODER_KEYS)
    warnings = [line.message for line in lines if line.level == "warning"]
    assert len(warnings) == 1, warnings
    assert f"both.safetensors: {len(TEXT_ENCODER_KEYS)} key(s) skipped, text-encoder keys (LoRAs change the " \
           f"transformer only here): " in warnings[0]
    assert sum(k in warnings[0] for k in TEXT_ENCODER_KEYS) == 3 and warnings[0].endswith(", …")   # the first 3
    # a file of text-encoder keys only has nothing to apply: refused
    save_file({k: v for k, v in load_file(str(path)).items() if k in TEXT_ENCODER_KEYS},
              str(tmp_path / "te.safetensors"))
    with pytest.raises(InputError, match=r"te.safetensors holds nothing for the transformer: its 5 key\(s\) are "
                                         r"text-encoder keys"):
        lora.load_set("te.safetensors", tmp_path, tr)


def _refused(tr, folder, tensors, *patterns):
    save_file(tensors, str(folder / "bad.safetensors"))
    with pytest.raises(InputError) as e:
        lora.load_set("bad.safetensors", folder, tr)
    text = str(e.value)
    assert text.startswith("LoRAs: bad.safetensors: ") and "diffusers name" not in text, text
    for p in patterns:
        assert p in text, text


def test_refusals_name_the_key_in_the_file(tr, tmp_path):
    h = tr.config.num_attention_heads * tr.config.attention_head_dim
    down, up = torch.zeros(RANK, h), torch.zeros(3 * h, RANK)
    key = "diffusion_model.double_blocks.3.img_attn.qkv"       # the tiny model has one double block
    _refused(tr, tmp_path, {f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up},
             f"'{key}.lora_down.weight' matches no layer")
    _refused(tr, tmp_path, {"lora_unet_single_blocks_2_linear2.lora_down.weight": torch.zeros(RANK, 5 * h),
                            "lora_unet_single_blocks_2_linear2.lora_up.weight": torch.zeros(h, RANK)},
             "'lora_unet_single_blocks_2_linear2.lora_down.weight' matches no layer")
    key = "diffusion_model.double_blocks.0.img_attn.qkv"       # rows that are not 3 × hidden
    _refused(tr, tmp_path, {f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": torch.zeros(3 * h + 2, RANK)},
             f"'{key}.lora_down.weight': up ({3 * h + 2}, {RANK}) does not split into {h} + {h} + {h} rows")
    _refused(tr, tmp_path, {"diffusion_model.final_layer.linear.diff": torch.zeros(3, h)},
             "'diffusion_model.final_layer.linear.diff': (3, 32) does not fit proj_out.weight")
    _refused(tr, tmp_path, {"lora_unet_proj_out.hada_w1_a": torch.zeros(2, 2)},
             "'lora_unet_proj_out.hada_w1_a' is not a LoRA weight", "LoHa")


def test_full_differences_in_a_resident_stage(tr, tmp_path):
    """A transformer stage binds the weights with the diffs and pairs merged (two LoRAs: their deltas add)."""
    a, ea = write_fastvideo_diffs(tr, tmp_path / "a.safetensors")
    b, eb = write_comfy_native(tr, tmp_path / "b.safetensors")
    loras = lora.load_set("a.safetensors:0.5, b.safetensors:-1.25", tmp_path, tr)
    assert worst_difference(weights_in_stage(tr, loras), merged_by_hand(tr, [(ea, 0.5), (eb, -1.25)])) <= 1e-5


def test_full_differences_reach_streamed_blocks(tr, tmp_path):
    """Under a cap that streams the single block, the tensors its layers compute with include the diffs too (the
    same merge as a resident load, in the block's slot): hooks on its layers (called once the block is bound to its
    slot) see the hand-merged tensors."""
    from common.units import GIB
    from memory.hostpack import HostPack
    from memory.manager import MemoryManager
    from tests.model_helpers import step_inputs, two_steps

    path, expected = write_fastvideo_diffs(tr, tmp_path / "d.safetensors")
    want = merged_by_hand(tr, [(expected, -1.5)])
    pack = HostPack.of(tr)
    mm = MemoryManager(device="cpu", cap_gb=(pack.rest.nbytes + pack.blocks[0].nbytes) / GIB, preserved_gb=0,
                       plan_on_cpu=True)
    block = tr.single_transformer_blocks[0]
    seen = {}

    def looker(name):
        def look(module, args):
            seen.update({f"single_transformer_blocks.0.{name}.{k}": v.detach().clone()
                         for k, v in module.named_parameters(recurse=False)})
        return look

    handles = [m.register_forward_pre_hook(looker(n)) for n, m in block.named_modules()
               if n and next(m.parameters(recurse=False), None) is not None]
    lora.attach(tr, lora.load_set(f"{path}:-1.5", None, tr))
    try:
        with mm.stage("transformer", transformer=tr) as rec:
            two_steps(tr, step_inputs(tr), steps=1)
    finally:
        lora.detach(tr)
        for h in handles:
            h.remove()
    assert "1/2 blocks" in rec.placement["transformer"], rec.placement
    assert seen.keys() == {f"single_transformer_blocks.0.{n}" for n, _ in block.named_parameters()}
    assert max(float((v - want[k]).abs().max()) for k, v in seen.items()) <= 1e-5
    plain = tr.state_dict()
    for name in ("proj_out.weight", "proj_out.bias", "attn.to_q.bias", "proj_mlp.weight"):   # diffs reached these
        name = f"single_transformer_blocks.0.{name}"
        assert float((seen[name] - plain[name]).abs().max()) > 1e-3, name
