"""The streamed VAE decoder (memory/vae_stream.py) and its grid of tiles (memory/vae_grid.py): the same function as
diffusers' decoder, chunk by chunk; tiles that cover the frame and blend to one; the policy that picks them."""
from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLHunyuanVideo

import configs.presets as presets
from memory.vae import (
    STREAM_CHUNKS,
    STREAM_FACTOR,
    STREAM_FIXED,
    VaeDecodePolicy,
    VaeTiling,
    memory_estimate,
    streamed_decode,
    work,
)
from memory.vae_grid import MIN_TILE, OVERLAP, GridTiling, axis_weights, cuts, grid_candidates, grid_decode
from memory.vae_stream import StreamedDecoder, attention, decode, layer_stats

REAL = (18, 76, 80)          # a middle section of the job: 69 frames at 608×640, in latents


@pytest.fixture(scope="module")
def vae():
    torch.manual_seed(0)
    cfg = dict(presets._TINY_CONFIGS["vae"])
    cfg["block_out_channels"] = (8, 16, 16, 16)        # a 2×-wide up block: the resnet shortcut runs too
    return AutoencoderKLHunyuanVideo(**cfg).eval()


def _z(frames, h, w, seed=1):
    return torch.randn(1, 16, frames, h, w, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", [(1, 4, 5), (3, 4, 6), (6, 5, 3)])
@pytest.mark.parametrize("chunk_bytes, channels_last", [(1, False), (4000, True), (1 << 30, False), (1 << 30, True)])
@torch.no_grad()
def test_the_streamed_decoder_is_diffusers_decoder(vae, shape, chunk_bytes, channels_last):
    z = vae.post_quant_conv(_z(*shape))
    reference = vae.decoder(z)
    out = StreamedDecoder(chunk_bytes, channels_last)(vae.decoder, z)
    assert out.shape == reference.shape and out.is_contiguous()
    # float32: only the GroupNorm statistics' order of additions differs (1 byte per chunk: one frame per call)
    assert (out - reference).abs().max().item() < 2e-5


@torch.no_grad()
def test_one_frame_per_call_when_the_chunk_is_small_and_under_a_scratch_limit(vae, monkeypatch):
    z = vae.post_quant_conv(_z(3, 4, 6))
    frames_per_call = []
    conv3d = torch.nn.functional.conv3d

    def counting(x, weight, *args, **kwargs):
        out = conv3d(x, weight, *args, **kwargs)
        if tuple(weight.shape[2:]) == (3, 3, 3):                # the causal convolutions (not the shortcuts)
            frames_per_call.append(out.shape[2])
        return out

    monkeypatch.setattr(torch.nn.functional, "conv3d", counting)
    decode(vae.decoder, z, chunk_bytes=1 << 30)
    assert max(frames_per_call) == 9                      # a large chunk: all 9 pixel frames in one call
    frames_per_call.clear()
    StreamedDecoder(1 << 30, scratch_limit=1)(vae.decoder, z)
    assert set(frames_per_call) == {1}                    # MIOpen's scratch limit: one output frame per call


@torch.no_grad()
def test_attention_in_slices_of_queries_is_the_same(vae):
    attn = vae.decoder.mid_block.attentions[0]
    x = torch.randn(1, 16, 3, 4, 5)
    tokens = x.permute(0, 2, 3, 4, 1).flatten(1, 3)
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import prepare_causal_attention_mask

    mask = prepare_causal_attention_mask(3, 20, x.dtype, x.device, batch_size=1)
    reference = attn(tokens, attention_mask=mask).unflatten(1, (3, 4, 5)).permute(0, 4, 1, 2, 3)
    for score_bytes in (1, 600, 512 << 20):
        assert (attention(attn, x, score_bytes) - reference).abs().max().item() < 2e-5


def test_channels_last_statistics_are_the_groups_statistics():
    x = torch.randn(2, 16, 3, 5, 7) * 3 + 1
    flat = layer_stats(x, 4, 1e-6)
    strided = layer_stats(x.contiguous(memory_format=torch.channels_last_3d), 4, 1e-6)
    rows = x.reshape(2, 4, -1)
    expected_rstd = torch.rsqrt(rows.var(-1, correction=0) + 1e-6)
    for mean, rstd in (flat, strided):
        assert torch.allclose(mean, rows.mean(-1), atol=1e-5) and torch.allclose(rstd, expected_rstd, rtol=1e-5)


# ---- the grid -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length, n", [(76, 1), (76, 2), (80, 3), (19, 2), (100, 7)])
def test_cuts_cover_the_axis_with_the_overlap_and_no_tile_past_the_edge(length, n):
    spans = cuts(length, n)
    assert len(spans) == n and spans[0][0] == 0 and spans[-1][0] + spans[-1][1] == length
    assert len({size for _, size in spans}) == 1
    for (a, sa), (b, _) in zip(spans, spans[1:]):
        assert a + sa - b >= OVERLAP                                          # neighbours share ≥ the overlap
    weights = axis_weights(length, spans, 8)
    total = torch.zeros(length * 8)
    for (start, size), w in zip(spans, weights):
        assert w.shape == (size * 8,) and (w >= 0).all()
        total[start * 8:(start + size) * 8] += w
    assert torch.allclose(total, torch.ones_like(total), atol=1e-6)          # the blend sums to one everywhere


def test_the_grid_does_less_work_than_diffusers_tiles_of_the_same_size():
    # 256 px tiles (32 latents) decode 96 × 104 latents of a 76 × 80 frame; a grid with tiles no larger: 3 × 3
    assert work(VaeTiling(256, 0), REAL) == 18 * 96 * 104
    grid = GridTiling(3, 3)
    _, rows, cols = grid.spans(*REAL)
    assert max(rows) <= 32 and max(cols) <= 32 and work(grid, REAL) == 18 * sum(rows) * sum(cols) < 18 * 96 * 104
    assert work(GridTiling(1, 2), REAL) == 18 * 76 * 88                       # 1.16× the frame's work
    candidates = grid_candidates(REAL, 1 << 30)
    assert GridTiling(1, 1) in candidates
    assert all(min(GridTiling(r.rows, r.cols).spans(*REAL)[1] + GridTiling(r.rows, r.cols).spans(*REAL)[2])
               >= MIN_TILE for r in candidates if r.rows > 1 or r.cols > 1)


@torch.no_grad()
def test_a_pixel_covered_by_one_tile_is_that_tiles_decode(vae):
    z = _z(1, 40, 24)
    tiling = GridTiling(2, 1)
    (r0, rs), (r1, _) = cuts(40, 2)
    out = grid_decode(vae, z, tiling)
    first = decode(vae.decoder, vae.post_quant_conv(z[:, :, :, r0:r0 + rs]))
    alone = r1 * 8                                                           # rows before the second tile starts
    assert out.shape == (1, 3, 1, 320, 192)
    assert torch.equal(out[..., :alone, :], first[..., :alone, :].to(out.dtype))
    assert torch.allclose(grid_decode(vae, z, GridTiling(1, 1)), decode(vae.decoder, vae.post_quant_conv(z)))


@torch.no_grad()
def test_fewer_tiles_are_closer_to_the_whole_frame(vae):
    z = _z(1, 32, 32)
    whole = vae.decode(z).sample

    def error(out):
        return (out - whole).abs().mean().item()

    two = error(grid_decode(vae, z, GridTiling(2, 1)))
    nine = error(grid_decode(vae, z, GridTiling(3, 3)))
    VaeTiling(128, 0).apply(vae)
    try:
        diffusers_tiles = error(vae.decode(z).sample)
    finally:
        vae.use_tiling = False
    assert two < nine and two < diffusers_tiles


# ---- the policy -----------------------------------------------------------------------------------------------------
class _RealVae:              # what the policy reads of the full-size VAE
    class config:
        block_out_channels = (128, 256, 512, 512)
    dtype = torch.float16


def test_the_estimate_covers_the_h100_measurements():
    # fp16, channels-last, 1 GiB chunks (BENCHMARKS.md, "The streamed decoder"): peak allocated GiB; the last one a
    # small tile with 256 MiB chunks (the GPU test below)
    measured = {((18, 76, 80), GridTiling(2, 1)): 12.87, ((9, 76, 80), GridTiling(1, 1)): 11.05,
                ((19, 76, 80), GridTiling(2, 1)): 13.51, ((19, 76, 80), GridTiling(1, 2)): 13.44,
                ((9, 40, 48), GridTiling(1, 1, chunk_bytes=256 << 20)): 4187519488 / 2**30}
    for (shape, tiling), gb in measured.items():
        est = memory_estimate(tiling, shape)
        assert gb * 2**30 <= est <= 1.15 * gb * 2**30, (shape, tiling, est / 2**30)
    whole_frames = STREAM_FACTOR * 128 * 69 * 608 * 640 * 2 + STREAM_CHUNKS * (1 << 30) + STREAM_FIXED
    assert whole_frames > 20 * 2**30                      # a middle section's whole frames do not fit the cap


def test_under_the_20_gb_cap_the_streamed_policy_takes_two_tiles_where_diffusers_took_sixteen():
    available = 20 * 2**30 - (512 << 20) - (512 << 20)
    reserve = 4 << 30
    streamed = VaeDecodePolicy(workspace_reserve=reserve, streamed=True).plan(_RealVae, REAL, available)
    tiled = VaeDecodePolicy(workspace_reserve=reserve, streamed=False).plan(_RealVae, REAL, available)
    assert isinstance(streamed[0], GridTiling) and streamed[0].rows * streamed[0].cols == 2
    assert memory_estimate(streamed[0], REAL) + reserve <= available
    assert tiled[0] == VaeTiling(256, 0) and work(tiled[0], REAL) > 1.4 * work(streamed[0], REAL)
    mems = [memory_estimate(t, REAL) for t in streamed]                     # on out-of-memory: clearly smaller
    assert len(streamed) > 2 and all(b < 0.7 * a for a, b in zip(mems, mems[1:]))


@torch.no_grad()
def test_an_out_of_memory_tile_retries_with_a_smaller_grid(vae):
    z = _z(1, 40, 40)
    failed = []

    def fault(tiling):
        if not failed:
            failed.append(tiling)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    policy = VaeDecodePolicy(streamed=True, fault=fault)
    out = policy.decode(vae, z, available=None)
    assert failed == [GridTiling(1, 1, chunk_bytes=policy.chunk_bytes)]
    second = policy.plan(vae, (1, 40, 40), None)[1]
    assert [a["ok"] for a in policy.attempts] == [False, True] and second.rows * second.cols > 1
    assert torch.equal(out, grid_decode(vae, z, second))


def test_gpus_decode_streamed_and_the_cpu_with_diffusers_decoder(monkeypatch):
    assert streamed_decode("cpu")["streamed"] is False
    nvidia = streamed_decode("cuda")
    assert nvidia["streamed"] and nvidia["channels_last"] and nvidia["chunk_bytes"] == 1 << 30
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert streamed_decode("cuda")["streamed"] and not streamed_decode("cuda")["channels_last"]
    from memory.manager import MemoryManager

    assert MemoryManager(device="cpu").vae_policy.streamed is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the full-size VAE's peak memory")
@torch.no_grad()
def test_on_a_gpu_the_full_size_decoder_stays_under_its_estimate():
    device = torch.device("cuda", torch.cuda.current_device())
    vae = AutoencoderKLHunyuanVideo().to(device, torch.float16).eval()
    shape, tiling = (9, 40, 48), GridTiling(1, 1, chunk_bytes=256 << 20)
    z = torch.randn((1, 16) + shape, device=device, dtype=torch.float16) * 0.1
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = grid_decode(vae, z, tiling, channels_last=streamed_decode(device)["channels_last"])
    peak = torch.cuda.max_memory_allocated(device) - base
    assert out.shape == (1, 3, 33, 320, 384) and torch.isfinite(out).all()
    assert peak <= memory_estimate(tiling, shape)
