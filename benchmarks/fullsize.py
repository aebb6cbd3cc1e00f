"""Full-size components with random weights, built without a download (for timing and memory measurements).

The real classes with the real sizes (HunyuanVideo's Llama-3-8B-like text encoder, CLIP-L, SigLIP so400m, the
HunyuanVideo VAE, the FramePack transformer), parameters created empty (accelerate's `init_empty_weights`, so
buffers such as rotary frequencies keep their real values) and filled with small normal noise, on the GPU when
there is one (fast) and copied to host memory. Tokenizers are the byte-level ones of the tiny preset: fine for
timing. `--tiny` everywhere in benchmarks/ swaps in the tiny preset instead.

    python3 benchmarks/fullsize.py --out sizes.json     # builds everything once and prints the sizes
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

log = logging.getLogger("benchmarks.fullsize")

LLAMA = dict(vocab_size=128320, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0,
             rms_norm_eps=1e-5, pad_token_id=261, bos_token_id=256, eos_token_id=257)
CLIP = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
            num_attention_heads=12, max_position_embeddings=77, projection_dim=768, hidden_act="quick_gelu",
            bos_token_id=512, eos_token_id=513, pad_token_id=513)
SIGLIP = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
              image_size=384, patch_size=14)
ROLES = ("text_encoder", "text_encoder_2", "vae", "image_encoder", "transformer")


def _fill_(t: torch.Tensor, std: float, gen: torch.Generator, device: torch.device) -> None:
    flat = t.view(-1)
    step = 1 << 28
    for s in range(0, flat.numel(), step):
        n = min(step, flat.numel() - s)
        noise = torch.randn(n, generator=gen, device=device, dtype=torch.float32).mul_(std)
        flat[s:s + n].copy_(noise.to(t.dtype))


def materialize(model: torch.nn.Module, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    """Give every meta parameter a host tensor of `dtype` with N(0, 0.02) values (norm weights: 1)."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    gen = torch.Generator(device).manual_seed(seed)
    for module in model.modules():
        is_norm = "norm" in type(module).__name__.lower()
        for name, p in list(module._parameters.items()):
            if p is None:
                continue
            t = torch.empty(p.shape, dtype=dtype if p.is_floating_point() else p.dtype)
            if is_norm and name == "weight":
                t.fill_(1.0)
            elif name == "bias":
                t.zero_()
            else:
                _fill_(t, 0.02, gen, device)
            module._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
    for module in model.modules():
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_floating_point() and b.device.type == "cpu":
                module._buffers[name] = b.to(torch.float32 if b.dtype == torch.float32 else dtype)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return model.eval().requires_grad_(False)


def _empty(build):
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        return build()


def build_models(roles=ROLES, seed: int = 0) -> dict:
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoFramepackTransformer3DModel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        LlamaConfig,
        LlamaModel,
        SiglipVisionConfig,
        SiglipVisionModel,
    )

    from memory.plan import REAL_TRANSFORMER_CONFIG

    builders = {
        "text_encoder": (lambda: LlamaModel(LlamaConfig(**LLAMA)), torch.float16),
        "text_encoder_2": (lambda: CLIPTextModel(CLIPTextConfig(**CLIP)), torch.float16),
        "vae": (lambda: AutoencoderKLHunyuanVideo(), torch.float16),
        "image_encoder": (lambda: SiglipVisionModel(SiglipVisionConfig(**SIGLIP)), torch.float16),
        "transformer": (lambda: HunyuanVideoFramepackTransformer3DModel(**dict(REAL_TRANSFORMER_CONFIG)),
                        torch.bfloat16),
    }
    out = {}
    for i, role in enumerate(roles):
        t0 = time.perf_counter()
        build, dtype = builders[role]
        out[role] = materialize(_empty(build), dtype, seed + i)
        size = sum(p.numel() * p.element_size() for p in out[role].parameters())
        log.info("%s: %.2f GB of random %s weights in %.1f s", role, size / 1e9, dtype, time.perf_counter() - t0)
    return out


def build_components(tiny: bool = False, seed: int = 0):
    """A `pipeline.components.Components` of full-size random models (or the tiny preset)."""
    from pipeline.components import Components, load_components

    if tiny:
        return load_components("tiny", "original")
    from configs.presets import HUNYUAN
    from memory.llama_trim import trim_llama
    from pipeline.text import template_crop_start
    from pipeline.tiny import build_clip_tokenizer, build_feature_extractor, build_llama_tokenizer

    models = build_models(seed=seed)
    trim_llama(models["text_encoder"])            # as a job loads it (no files: its embedding stays a table)
    tokenizer = build_llama_tokenizer()
    return Components(preset=HUNYUAN, mode="original", tokenizer=tokenizer, tokenizer_2=build_clip_tokenizer(),
                      feature_extractor=build_feature_extractor(SIGLIP["image_size"]),
                      crop_start=template_crop_start(tokenizer), revisions={r: "random" for r in ROLES}, **models)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    comps = build_components(args.tiny)
    sizes = {role: sum(p.numel() * p.element_size() for p in m.parameters()) for role, m in comps.models().items()}
    args.out.write_text(json.dumps({"bytes": sizes}, indent=1))
    print("| model | GB |\n|---|---|")
    for role, b in sizes.items():
        print(f"| {role} | {b / 1e9:.2f} |")


if __name__ == "__main__":
    main()
