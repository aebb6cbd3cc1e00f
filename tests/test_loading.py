"""Real-weight loading: tiny models saved in the real repos' layout, loaded offline (HF_HUB_OFFLINE=1)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from common.errors import WeightsNotFound
from configs.presets import HUNYUAN
from memory.llama_trim import EMBED_NAME
from pipeline.components import load_components
from tests.conftest import make_image, run_job
from tests.model_helpers import HUNYUAN_FP32, save_like_repos


def make_hf_cache(components, cache: Path) -> dict[str, str]:
    """Lay the saved repos out as a Hugging Face hub cache: models--owner--name/{refs/main, snapshots/<hash>/}."""
    staging = cache.parent / "staging"
    save_like_repos(components, staging)
    commits = {}
    for src in HUNYUAN.sources(components.mode).values():
        if src.repo in commits:
            continue
        commit = hashlib.sha1(src.repo.encode()).hexdigest()
        repo_dir = cache / ("models--" + src.repo.replace("/", "--"))
        (repo_dir / "refs").mkdir(parents=True)
        (repo_dir / "refs" / "main").write_text(commit)
        (repo_dir / "snapshots").mkdir()
        (staging / src.repo).rename(repo_dir / "snapshots" / commit)
        commits[src.repo] = commit
    return commits


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _same_llama(loaded: torch.nn.Module, built: torch.nn.Module) -> bool:
    """The same trimmed Llama; the loaded one reads its embedding rows from the files (no parameter)."""
    weights = {k: v for k, v in built.state_dict().items() if k != EMBED_NAME}
    every_token = torch.arange(built.embed_tokens.num_embeddings)
    return (loaded.state_dict().keys() == weights.keys()
            and all(torch.equal(loaded.state_dict()[k], v) for k, v in weights.items())
            and torch.equal(loaded.embed_tokens(every_token), built.embed_tokens(every_token)))


def test_model_dir_layout_loads_the_same_models_and_generates(tiny_original, tmp_path):
    save_like_repos(tiny_original, tmp_path / "models")
    assert (tmp_path / "models/hunyuanvideo-community/HunyuanVideo/vae/config.json").exists()
    assert list((tmp_path / "models/lllyasviel/FramePackI2V_HY").glob("*.safetensors"))
    assert not list((tmp_path / "models").rglob("*.bin")) and not list((tmp_path / "models").rglob("*.pt"))
    loaded = load_components(HUNYUAN_FP32, "original", model_dir=tmp_path / "models")
    for role in ("text_encoder", "text_encoder_2", "vae", "image_encoder", "transformer"):
        assert type(getattr(loaded, role)) is type(getattr(tiny_original, role))
        same = _same_llama if role == "text_encoder" else _same_weights
        assert same(getattr(loaded, role), getattr(tiny_original, role)), role
    assert loaded.crop_start == tiny_original.crop_start
    assert loaded.revisions["vae"].startswith("local:")
    ids = loaded.tokenizer("hello <|eot_id|>")["input_ids"]
    assert ids == tiny_original.tokenizer("hello <|eot_id|>")["input_ids"]

    from pipeline.request import Request
    _, last = run_job(Request(image=make_image(96, 80), prompt="p", seconds=1.2, steps=2, teacache=0.0), loaded,
                      tmp_path / "out")
    assert last.frames == 37, getattr(last, "detail", last)


def test_hf_cache_layout_loads_offline(tiny_f1, tmp_path, monkeypatch):
    commits = make_hf_cache(tiny_f1, tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    loaded = load_components(HUNYUAN_FP32, "f1")
    assert _same_weights(loaded.transformer, tiny_f1.transformer)
    assert loaded.revisions["transformer"] == commits["lllyasviel/FramePack_F1_I2V_HY_20250503"]
    assert loaded.revisions["vae"] == commits["hunyuanvideo-community/HunyuanVideo"]


def test_missing_weights_message_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(WeightsNotFound) as info:
        load_components("hunyuan", "original")
    msg = str(info.value)
    assert str(tmp_path / "empty-hub") in msg and "--preset tiny" in msg and "42" in msg
    with pytest.raises(WeightsNotFound) as info:
        load_components("hunyuan", "original", model_dir=tmp_path / "nothing-here")
    assert "nothing-here" in str(info.value) and "--preset tiny" in str(info.value)
