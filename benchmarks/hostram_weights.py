"""benchmarks/hostram.py's first step: full-size models with random weights (benchmarks/fullsize.py), or the tiny
preset, saved as safetensors where the real repos keep them, in their sharding, with configs, tokenizers and the
feature extractor (~42 GB at full size)."""
from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("benchmarks.hostram")


def _save(obj, folder: Path, shard: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if shard and hasattr(obj, "state_dict"):
        obj.save_pretrained(folder, max_shard_size=shard)
    else:
        obj.save_pretrained(folder)


def save_weights(root: Path, tiny: bool) -> dict:
    """Every component where the real repos keep it; full-size models are built and saved one at a time."""
    import torch

    from configs.presets import HUNYUAN

    t0 = time.perf_counter()
    sources = HUNYUAN.sources("original")
    shards = {"text_encoder": "5GB", "transformer": "10GB"}          # 4 and 3 shards, like the real repos
    if tiny:
        from pipeline.components import load_components
        from pipeline.tiny import build_tiny_llama

        comps = load_components("tiny", "original")
        parts = {role: getattr(comps, role) for role in sources}
        parts["text_encoder"] = build_tiny_llama(comps.preset)      # whole, as the repo holds it (a job trims it)
    else:
        from benchmarks.fullsize import SIGLIP
        from pipeline.tiny import build_clip_tokenizer, build_feature_extractor, build_llama_tokenizer

        parts = {"tokenizer": build_llama_tokenizer(), "tokenizer_2": build_clip_tokenizer(),
                 "feature_extractor": build_feature_extractor(SIGLIP["image_size"])}
    sizes = {}
    for role, src in sources.items():
        folder = root / src.repo / (src.subfolder or "")
        if (folder / "config.json").exists() and not tiny and role not in parts:
            log.info("%s: already saved in %s", role, folder)
            continue
        if role in parts:
            _save(parts[role], folder, shards.get(role))
            continue
        from benchmarks.fullsize import build_models

        model = build_models(roles=(role,))[role]
        sizes[role] = sum(p.numel() * p.element_size() for p in model.parameters())
        _save(model, folder, shards.get(role))
        del model
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        log.info("%s: %.2f GB saved in %s", role, sizes[role] / 1e9, folder)
    on_disk = sum(p.stat().st_size for p in root.rglob("*.safetensors"))
    return {"seconds": time.perf_counter() - t0, "bytes_on_disk": on_disk, "model_bytes": sizes}
