"""The prompt-embedding cache: a repeated prompt skips the text encoders (seen in the stages the job ran) and gives
the same video; the key holds everything the embeddings depend on; the folder stays within its size."""
from __future__ import annotations

import json

import pytest
import torch

from memory.manager import MemoryManager
from pipeline.events import Done
from pipeline.prompt_cache import PromptCache, cache_key, prompt_cache_dir
from pipeline.request import Request
from pipeline.text import TextEmbeddings
from tests.conftest import make_image, run_job


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "prompts"
    monkeypatch.setenv("STEADYFRAME_PROMPT_CACHE", str(folder))
    return folder


def _job(comps, outputs, **kw):
    mm = MemoryManager(device="cpu")
    req = Request(image=make_image(96, 80), prompt=kw.pop("prompt", "a heron lifts off the lake"), seconds=1.2,
                  steps=2, teacache=0.0, **kw)
    _, last = run_job(req, comps, outputs, memory=mm)
    assert isinstance(last, Done), getattr(last, "detail", last)
    info = json.loads((last.job_dir / "job.json").read_text())
    return mm.load_order(), info["sections"][-1]["frames_sha256"]


def test_a_repeated_prompt_does_not_load_the_text_encoders(tiny_original, tmp_path, cache_dir):
    first, video1 = _job(tiny_original, tmp_path / "a")
    assert first[0] == "text encoders"
    assert len(list(cache_dir.glob("*.safetensors"))) == 1
    second, video2 = _job(tiny_original, tmp_path / "b")
    assert "text encoders" not in second and second[0] == "VAE encode"
    assert video2 == video1                                    # the cached embeddings are the encoded ones, bit for bit
    other, _ = _job(tiny_original, tmp_path / "c", prompt="a heron lands on the lake")
    assert other[0] == "text encoders"                         # another prompt: encoded (and cached)
    # CFG > 1 uses the negative prompt: it is part of the key
    neg1, _ = _job(tiny_original, tmp_path / "d", cfg=1.5, negative_prompt="blurry")
    neg2, _ = _job(tiny_original, tmp_path / "e", cfg=1.5, negative_prompt="dark")
    neg3, _ = _job(tiny_original, tmp_path / "f", cfg=1.5, negative_prompt="dark")
    assert neg1[0] == neg2[0] == "text encoders" and neg3[0] == "VAE encode"


def test_the_key_holds_what_the_embeddings_depend_on():
    revs = {"text_encoder": "abc", "tokenizer": "abc", "text_encoder_2": "abc", "tokenizer_2": "abc",
            "transformer": "x"}
    base = cache_key("p", None, revs, "native", 95)
    assert base == cache_key("p", None, dict(revs, transformer="y"), "native", 95)   # not the transformer's
    for other in (cache_key("q", None, revs, "native", 95), cache_key("p", "n", revs, "native", 95),
                  cache_key("p", None, dict(revs, text_encoder="def"), "native", 95),
                  cache_key("p", None, revs, "fp8", 95), cache_key("p", None, revs, "native", 94)):
        assert other != base


def _texts(n_tokens: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    emb = TextEmbeddings(torch.randn(1, n_tokens, 32, generator=g), torch.ones(1, n_tokens),
                         torch.randn(1, 16, generator=g))
    return {"cond": emb, "uncond": emb.zeros_like()}


def test_the_cache_is_bounded_least_recently_used_first(tmp_path):
    cache = PromptCache(tmp_path, max_bytes=3 * 70_000)
    for i in range(3):
        cache.put(f"k{i}", _texts(256, i))                      # ~66 KB each
    assert cache.size() <= cache.max_bytes and len(cache.entries()) == 3
    import os
    import time

    old = time.time() - 100
    for i, p in enumerate(sorted(cache.entries(), key=lambda p: p.name)):
        os.utime(p, (old + i, old + i))                         # k0 oldest … k2 newest
    assert cache.get("k0") is not None                          # k0 used now: the newest
    cache.put("k3", _texts(256, 3))
    names = {p.stem for p in cache.entries()}
    assert names == {"k0", "k2", "k3"}                          # k1 was the least recently used
    got = cache.get("k3")
    assert torch.equal(got["cond"].llama, _texts(256, 3)["cond"].llama)


def test_a_damaged_entry_is_a_miss(tmp_path):
    cache = PromptCache(tmp_path)
    cache.put("k", _texts(8, 0))
    (tmp_path / "k.safetensors").write_bytes(b"not a safetensors file")
    assert cache.get("k") is None


def test_where_the_cache_lives(tmp_path):
    assert prompt_cache_dir({"STEADYFRAME_PROMPT_CACHE": "off"}) is None
    assert prompt_cache_dir({"STEADYFRAME_PROMPT_CACHE": str(tmp_path)}) == tmp_path
    assert prompt_cache_dir({"STEADYFRAME_CACHE_DIR": str(tmp_path)}) == tmp_path / "prompts"
    assert prompt_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "steadyframe" / "prompts"
