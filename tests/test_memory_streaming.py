"""Host packs and block streaming on the CPU: the real code path (plain copies instead of a side stream)."""
from __future__ import annotations

import pytest
import torch
from diffusers import HunyuanVideoFramepackTransformer3DModel

from common.units import GIB
from memory.hostpack import HostPack, block_list
from memory.manager import MemoryManager
from memory.streaming import BlockStreamer
from pipeline.text import encode_prompt
from tests.model_helpers import step_inputs, two_steps


@pytest.fixture(scope="module")
def deep_transformer(tiny_original):
    """The tiny preset's transformer config with 3 dual + 4 single blocks (so the ring of slots wraps)."""
    cfg = dict(tiny_original.transformer.config)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    cfg.update(num_layers=3, num_single_layers=4)
    torch.manual_seed(1)
    return HunyuanVideoFramepackTransformer3DModel(**cfg).eval().requires_grad_(False)


def _cap_gb(pack, n_resident):
    return (pack.rest.nbytes + sum(c.nbytes for c in pack.blocks[:n_resident])) / GIB


def test_pack_is_the_only_host_copy(deep_transformer):
    params = {id(p): p for p in deep_transformer.parameters()}
    pack = HostPack.of(deep_transformer)
    assert HostPack.of(deep_transformer) is pack                        # built once, kept on the model
    assert len(pack.blocks) == 7 and pack.intact()
    hosts = [(c.host.data_ptr(), c.host.data_ptr() + c.nbytes) for c in pack.chunks]
    for p in deep_transformer.parameters():
        assert any(lo <= p.data_ptr() < hi for lo, hi in hosts)        # every weight lives in a chunk buffer
    assert {id(p) for p in deep_transformer.parameters()} == set(params)  # same Parameter objects
    weights = sum(p.numel() * p.element_size() for p in deep_transformer.parameters())
    assert weights <= pack.nbytes <= weights + 256 * len(params) + 256 * 64  # no second copy, only alignment
    assert block_list(deep_transformer)[3] is deep_transformer.single_transformer_blocks[0]


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_streamed_transformer_gives_exactly_the_resident_output(deep_transformer, depth):
    inputs = step_inputs(deep_transformer)
    reference = two_steps(deep_transformer, inputs)
    pack = HostPack.of(deep_transformer)
    mm = MemoryManager(device="cpu", cap_gb=_cap_gb(pack, 2), preserved_gb=0, prefetch_depth=depth,
                       plan_on_cpu=True)
    # room for block 0 and one more dual block: block 0 and the last blocks (the two last single blocks) stay
    # resident (memory/plan.py), blocks 1–4 are streamed
    seen = []
    probe = deep_transformer.single_transformer_blocks[0].register_forward_pre_hook(
        lambda m, a: seen.append(m.proj_out.weight.data_ptr()))
    try:
        with mm.stage("transformer", transformer=deep_transformer) as rec:
            streamed = two_steps(deep_transformer, inputs)
    finally:
        probe.remove()
    assert all(torch.equal(a, b) for a, b in zip(streamed, reference))
    assert "3/7 blocks" in rec.placement["transformer"] and rec.stream_misses == 0
    assert rec.streamed_bytes_per_pass == sum(c.nbytes for c in pack.blocks[1:5])
    host = pack.blocks[3].host.data_ptr()
    assert seen and all(ptr != host for ptr in seen)         # the block ran from a slot copy, not the host pack
    assert pack.intact()                                      # and everything points back at the host afterwards


def test_streaming_the_tiny_preset_through_the_manager(tiny_original):
    tr = tiny_original.transformer
    inputs = step_inputs(tr, seed=3)
    reference = two_steps(tr, inputs)
    pack = HostPack.of(tr)
    mm = MemoryManager(device="cpu", cap_gb=_cap_gb(pack, 1), preserved_gb=0, plan_on_cpu=True)
    for _ in range(2):                                        # two sections: the stage is entered twice
        with mm.stage("transformer", transformer=tr) as rec:
            assert all(torch.equal(a, b) for a, b in zip(two_steps(tr, inputs), reference))
        assert rec.stream_misses == 0 and "1/2 blocks" in rec.placement["transformer"]
    assert pack.intact()


def test_teacache_still_works_with_streaming(deep_transformer):
    inputs = step_inputs(deep_transformer, seed=5)
    reference = two_steps(deep_transformer, inputs, teacache=0.15)
    pack = HostPack.of(deep_transformer)
    mm = MemoryManager(device="cpu", cap_gb=_cap_gb(pack, 0), preserved_gb=0, plan_on_cpu=True)
    with mm.stage("transformer", transformer=deep_transformer) as rec:
        streamed = two_steps(deep_transformer, inputs, teacache=0.15)
    assert "1/7 blocks" in rec.placement["transformer"]      # block 0 stays resident even with no budget
    assert all(torch.equal(a, b) for a, b in zip(streamed, reference))


def test_out_of_order_call_is_a_counted_miss_and_still_exact(deep_transformer):
    pack = HostPack.of(deep_transformer)
    blocks = pack.block_modules
    streamer = BlockStreamer(blocks[1:], pack.blocks[1:], torch.device("cpu"), depth=2)
    hidden = torch.randn(1, 8, 32)
    enc = torch.randn(1, 4, 32)
    temb = torch.randn(1, 32)
    ref = blocks[4](hidden, enc, temb)
    streamer.attach()
    try:
        out = blocks[4](hidden, enc, temb)                   # block 4 first: not what was prefetched
        again = blocks[4](hidden, enc, temb)
    finally:
        streamer.detach()
    assert streamer.misses == 2
    assert all(torch.equal(a, b) for a, b in zip(out, ref)) and all(torch.equal(a, b) for a, b in zip(again, ref))
    assert pack.intact()


def test_text_encoder_streams_when_it_does_not_fit(tiny_original):
    from transformers import LlamaConfig, LlamaModel

    from memory.llama_trim import trim_llama

    c = tiny_original
    # the tiny preset's Llama keeps one layer once trimmed (no blocks); this one keeps three, as a job trims it
    torch.manual_seed(0)
    llama_model = trim_llama(LlamaModel(LlamaConfig(**dict(c.preset.tiny_configs["llama"], num_hidden_layers=5))))
    llama_model.eval().requires_grad_(False)
    ref = encode_prompt(c.tokenizer, llama_model, c.tokenizer_2, c.text_encoder_2, "a cat", c.crop_start, "cpu")
    llama, clip = HostPack.of(llama_model), HostPack.of(c.text_encoder_2)
    cap_gb = (llama.rest.nbytes + llama.blocks[0].nbytes + clip.nbytes) / GIB + 2.0   # 2 GB text reserve
    mm = MemoryManager(device="cpu", cap_gb=cap_gb, plan_on_cpu=True)
    with mm.stage("text encoders", text_encoder=llama_model, text_encoder_2=c.text_encoder_2) as rec:
        out = encode_prompt(c.tokenizer, llama_model, c.tokenizer_2, c.text_encoder_2, "a cat", c.crop_start, "cpu")
    assert "1/3 blocks" in rec.placement["text_encoder"]
    assert "resident" in rec.placement["text_encoder_2"]
    assert torch.equal(out.llama, ref.llama) and torch.equal(out.pooled, ref.pooled)
    roomy = MemoryManager(device="cpu", cap_gb=20, plan_on_cpu=True)
    with roomy.stage("text encoders", text_encoder=llama_model, text_encoder_2=c.text_encoder_2) as rec:
        pass
    assert rec.streamed_bytes_per_pass == 0                   # fits: loaded whole


def test_weights_moved_behind_the_managers_back_are_repacked(tiny_original):
    vae = tiny_original.vae
    pack = HostPack.of(vae)
    vae.to(torch.float32)                                       # a no-op move keeps the pack
    assert HostPack.of(vae) is pack
    for p in vae.parameters():
        p.data = p.data.clone()                                 # as `.to(device)` and back would do
    assert not pack.intact()
    fresh = HostPack.of(vae)
    assert fresh is not pack and fresh.intact()
