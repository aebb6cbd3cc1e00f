"""fp8 attention (rocm/fp8_attention.py, chosen in rocm/sdpa.py): the quantize / smooth / descale arithmetic against
the float reference (random inputs and the outlier channels of video DiTs), the guard's routing eagerly and inside
compiled code, the bf16 fallback when the kernel fails, the job's switch from the page, the CLI and the API down to
the transformer's attention, and the refusal where the device or the install lacks it.

cuDNN's kernel needs a Hopper GPU; here its arithmetic is `emulate` (every rounding the kernel makes, in float32),
standing in for `fa.run` where a test sends CPU tensors through the guard. The GPU figures are in BENCHMARKS.md."""
from __future__ import annotations

import logging
import math
import shutil
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from common.errors import InputError
from pipeline.events import Done
from pipeline.request import Request
from rocm import fp8_attention as fa
from rocm import sdpa
from tests.cli_helpers import cli
from tests.conftest import make_image

CAN_COMPILE = shutil.which("g++") or shutil.which("c++") or shutil.which("cl")


def _reference(q, k, v, scale=None):
    """Attention in float64: the truth the fp8 path is measured against."""
    q, k, v = (t.double() for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


def _cosine(a, b) -> tuple[float, float]:
    """(whole tensor, worst row) cosine similarity."""
    a, b = a.double(), b.double()
    return F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item(), F.cosine_similarity(a, b, dim=-1).min().item()


def _qkv(seed=0, heads=4, tokens=512, dim=64, outliers=False, dtype=torch.bfloat16):
    """q, k, v in diffusers' layout ((batch, tokens, heads, dim) seen as (batch, heads, tokens, dim)); `outliers`:
    a few K channels with a large mean over the tokens, per head (what SageAttention found in video DiTs)."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, tokens, heads, dim, generator=gen) for _ in range(3))
    if outliers:
        bias = torch.zeros(1, 1, heads, dim)
        bias[..., :8] = 20.0
        k = k + bias
    return tuple(t.to(dtype).transpose(1, 2) for t in (q, k, v))


def test_quantized_values_are_the_smoothed_balanced_inputs_within_e4m3_rounding():
    q, k, v = _qkv(outliers=True)
    z = fa.quantize(q, k, v)
    assert z.q.dtype == z.k.dtype == z.v.dtype == torch.float8_e4m3fn
    assert z.q.stride() == q.stride() and z.k.shape == k.shape          # the callers' layout, no copy to another
    qf, kf, vf = q.double(), k.double(), v.double()
    ks = kf - kf.mean(dim=-2, keepdim=True)                             # K smoothed over the tokens
    m = vf.mean(dim=-2, keepdim=True)
    torch.testing.assert_close(z.v_mean.double(), m, rtol=1e-5, atol=1e-6)
    r = (ks.abs().amax(dim=(-2, -1), keepdim=True) / qf.abs().amax(dim=(-2, -1), keepdim=True)).sqrt()
    for stored, descale, x in ((z.q, z.descale_q, qf * r), (z.k, z.descale_k, ks / r), (z.v, z.descale_v, vf - m)):
        assert descale.shape == (1, 1, 1, 1) and descale.dtype == torch.float32
        values = stored.double()
        assert values.abs().max().item() == fa.FP8_MAX                  # the largest value uses e4m3's whole range
        back = values * descale.double()                                # descale undoes the scale
        step = torch.maximum(x.abs() * 2.0 ** -4, descale.double() * 2.0 ** -9)   # e4m3: 3 mantissa bits
        assert ((back - x).abs() <= step * 1.001).all()
    # the per-head balance leaves every product q·k as it was, and gives q and k the same range in each head
    torch.testing.assert_close((qf * r) @ (ks / r).transpose(-2, -1), qf @ ks.transpose(-2, -1))
    torch.testing.assert_close((qf * r).abs().amax(dim=(-2, -1)), (ks / r).abs().amax(dim=(-2, -1)))


def test_smoothing_k_and_v_changes_nothing_in_exact_arithmetic():
    """Why smoothing is allowed: softmax ignores a constant per query (q·mean(k)), and each output row is a convex
    combination of V's rows (O = P (V - m) + m)."""
    q, k, v = (t.double() for t in _qkv(outliers=True))
    mk, mv = k.mean(dim=-2, keepdim=True), v.mean(dim=-2, keepdim=True)
    torch.testing.assert_close(_reference(q, k - mk, v - mv) + mv, _reference(q, k, v))


def test_fp8_attention_matches_the_float_reference():
    q, k, v = _qkv(seed=1)
    z = fa.quantize(q, k, v)
    whole, worst_row = _cosine(fa.emulate(z), _reference(q, k, v))
    assert whole >= 0.995 and worst_row >= 0.98                          # the bar: ≥ 0.995
    # a softmax scale other than 1/sqrt(d) is honoured
    whole, _ = _cosine(fa.emulate(z, scale=0.05), _reference(q, k, v, scale=0.05))
    assert whole >= 0.995


def test_outlier_channels_need_k_smoothed():
    """The synthetic case of SageAttention's paper: K channels with a large shared mean. Plain per-tensor scaling
    rounds away the part of those channels that differs between tokens; smoothing K first keeps it."""
    q, k, v = _qkv(seed=2, outliers=True)
    truth = _reference(q, k, v)
    smoothed = _cosine(fa.emulate(fa.quantize(q, k, v)), truth)
    plain = _cosine(fa.emulate(fa.quantize(q, k, v, smooth=False, per_head=False)), truth)
    assert smoothed[0] >= 0.995 and smoothed[1] >= 0.99
    assert plain[0] < 0.99 and plain[1] < 0.95                            # what the smoothing is for


@pytest.fixture
def cpu_kernel(monkeypatch):
    """cuDNN's fp8 kernel replaced by its arithmetic on the CPU (`emulate`), so CPU tensors take the fp8 path
    through the guard: the quantization, the routing and the output layout are the real code's. Records the calls
    that asked."""
    asked = []

    def fits(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        asked.append(tuple(query.shape))
        return attn_mask is None and query.dim() == 4 and not is_causal

    monkeypatch.setattr(fa, "fits", fits)
    monkeypatch.setattr(fa, "run", lambda z, dtype, scale=None, with_mean=True: fa.emulate(z, scale, dtype,
                                                                                         with_mean=with_mean))
    monkeypatch.setattr(sdpa, "_FP8_FAILED", [])
    return asked


def test_the_guard_runs_fitting_calls_in_fp8_only_inside_the_switch(cpu_kernel):
    q, k, v = _qkv(seed=3, tokens=128)
    plain = torch._C._nn.scaled_dot_product_attention(q, k, v)
    with sdpa.AttentionGuard("cpu", force_chunked=True, label="transformer") as guard:
        assert torch.equal(F.scaled_dot_product_attention(q, k, v), plain) or not cpu_kernel   # switch off: bf16
        assert cpu_kernel == [] and guard.choices and sdpa.FP8_CHOICE not in guard.choices.values()
        with sdpa.fp8_attention(True):
            assert sdpa.fp8_requested()
            out = F.scaled_dot_product_attention(q, k, v)
            masked = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(128, 128, dtype=torch.bool))
        assert not sdpa.fp8_requested()
    assert torch.equal(out, fa.emulate(fa.quantize(q, k, v), out_dtype=q.dtype))
    assert not torch.equal(out, plain) and _cosine(out, plain)[0] >= 0.995
    torch.testing.assert_close(masked, plain, atol=2e-2, rtol=0)     # a masked call does not fit: bf16 as before
    assert sdpa.FP8_CHOICE in guard.choices.values()                  # recorded for job.json


@pytest.mark.skipif(not CAN_COMPILE, reason="no C++ compiler: torch.compile cannot build CPU kernels here")
@pytest.mark.parametrize("kernel", ["cpu_kernel", "cpu_fa3"])
def test_compiled_code_traces_the_quantization_and_calls_the_fp8_operator(kernel, request):
    """cuDNN's form and FlashAttention-3's (its descales one per head) both traced into the compiled function."""
    asked = request.getfixturevalue(kernel)
    q, k, v = _qkv(seed=4, tokens=64, heads=2, dim=32)
    v = v + 3.0          # a mean over the tokens: the operator leaves it out, the compiled graph adds it back
    fn = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c) * 1.0, dynamic=False)
    with sdpa.AttentionGuard("cpu", force_chunked=True) as guard, sdpa.fp8_attention(True):
        compiled_out = fn(q, k, v)
        eager_out = F.scaled_dot_product_attention(q, k, v)
    assert sdpa.FP8_CHOICES[fa.chosen()] in guard.choices.values()
    if kernel == "cpu_fa3":
        assert asked and all(call[3] == (1, 2) for call in asked)        # per-head descales reached the kernel
    torch.testing.assert_close(compiled_out.float(), eager_out.float(), atol=2e-2, rtol=0)   # ~1 bf16 step at 3
    assert _cosine(compiled_out, _reference(q, k, v))[0] >= 0.995


def test_the_compiled_operator_leaves_v_mean_to_the_graph_and_its_bf16_fallback_too(cpu_fa3, monkeypatch):
    """`steadyframe::fp8_attention` returns the kernel's output without V's mean (the graph adds it where it reads
    the output); when the kernel fails, its bf16 output less the mean, so the graph's add restores it."""
    q, k, v = _qkv(seed=8, tokens=64, heads=2, dim=32)
    v = v + 3.0
    z = fa.quantize(q, k, v, kernel=fa.FA3)
    args = (q, k, v, z.q, z.k, z.v, z.descale_q, z.descale_k, z.descale_v, z.v_mean, None)
    with sdpa.fp8_attention(True):
        bare = torch.ops.steadyframe.fp8_attention(*args)
    torch.testing.assert_close(bare.float(), fa.emulate(z, kernel=fa.FA3, with_mean=False), atol=2e-2, rtol=0)
    assert bare.float().mean().abs() < 0.5 < 3.0 - 0.5          # the mean (3) is not in it

    def broken(z, dtype, scale=None, with_mean=True):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(fa, "run", broken)
    fn = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c) * 1.0, dynamic=False)
    with sdpa.AttentionGuard("cpu", force_chunked=True), sdpa.fp8_attention(True):
        fallback = torch.ops.steadyframe.fp8_attention(*args)
        compiled_out = fn(q, k, v) if CAN_COMPILE else None
    plain = torch._C._nn.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(fallback.float() + z.v_mean, plain.float(), atol=2e-2, rtol=0)
    if compiled_out is not None:
        torch.testing.assert_close(compiled_out.float(), plain.float(), atol=2e-2, rtol=0)


def test_a_failing_kernel_falls_back_to_bf16_once_said_for_the_process(cpu_kernel, monkeypatch, caplog):
    def broken(z, dtype, scale=None, with_mean=True):
        raise RuntimeError("cudnnGraphNotSupportedError: no engine for this graph")

    monkeypatch.setattr(fa, "run", broken)
    q, k, v = _qkv(seed=5, tokens=64)
    plain = torch._C._nn.scaled_dot_product_attention(q, k, v)
    with caplog.at_level(logging.WARNING, logger="rocm.sdpa"), \
            sdpa.AttentionGuard("cpu", force_chunked=True) as guard, sdpa.fp8_attention(True):
        first = F.scaled_dot_product_attention(q, k, v)
        second = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(first, plain, atol=2e-2, rtol=0)
    assert torch.equal(first, second)
    assert caplog.text.count("fp8 attention failed") == 1 and "no engine for this graph" in caplog.text
    assert sdpa._FP8_FAILED and sdpa.FP8_CHOICE not in guard.choices.values()


def test_unavailable_says_why_and_what_to_do(monkeypatch):
    assert "this job runs on the CPU" in fa.unavailable(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GeForce RTX 4090")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    cuda = torch.device("cuda", 0)
    assert "RTX 4090 has compute capability 8.9" in fa.unavailable(cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(fa, "_frontend", lambda: None)
    assert "not installed: pip install nvidia-cudnn-frontend" in fa.unavailable(cuda)
    monkeypatch.setattr(fa, "_frontend", lambda: SimpleNamespace(backend_version=lambda: 90000))
    assert "cuDNN 9.1 or newer" in fa.unavailable(cuda)
    monkeypatch.setattr(fa, "_frontend", lambda: SimpleNamespace(backend_version=lambda: 91900))
    assert fa.unavailable(cuda) is None
    monkeypatch.setattr(torch.version, "hip", "7.0")
    assert "AMD GPU (ROCm)" in fa.unavailable(cuda)


def test_the_switch_is_a_job_setting_of_the_page_the_api_and_the_cli():
    from cli.commands import add_settings
    from configs.controls import control
    from pipeline.request import prepare

    c = control("fp8_attention")
    assert c.widget == "radio" and c.advanced and c.api_name == "fp8_attention" and c.default == "off"
    assert c.option == "--fp8-attention"
    assert Request.from_mapping({"image": make_image(), "fp8_attention": "on"}).fp8_attention == "on"
    assert Request(image=make_image()).fp8_attention == "off"
    with pytest.raises(InputError, match="fp8 attention"):
        prepare(Request.from_mapping({"image": make_image(), "fp8_attention": "fast"}), 64)
    import argparse

    parser = argparse.ArgumentParser()
    add_settings(parser)
    assert parser.parse_args(["--fp8-attention", "on"]).fp8_attention == "on"


def test_preflight_refuses_fp8_attention_where_the_device_cannot(tmp_path):
    from configs.runtime import Config
    from jobs.preflight import Preflight
    from pipeline.request import prepare

    preflight = Preflight(Config(preset="tiny", outputs=tmp_path))
    request = Request(image=make_image(), prompt="a cat", seconds=1.0, steps=2, fp8_attention="on")
    with pytest.raises(InputError, match="fp8 attention.*runs on the CPU"):
        preflight.prepare(prepare(request, 64))
    preflight.prepare(prepare(Request(image=make_image(), prompt="a cat", seconds=1.0, steps=2), 64))   # off: fine


def test_the_cli_exits_2_before_anything_is_written(tmp_path):
    image = tmp_path / "in.png"
    make_image(100, 100).save(image)
    out = tmp_path / "outputs"
    r = cli("generate", "--preset", "tiny", "--image", image, "--fp8-attention", "on", "--steps", 2, "--out", out)
    assert r.returncode == 2, r.stderr
    assert "fp8 attention" in r.stderr and "CPU" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() or not any(out.rglob("job.json"))


def test_the_switch_reaches_the_transformers_attention_in_a_job(tiny_original, tmp_path, cpu_kernel):
    """A tiny job with the setting on runs its transformer attention through the fp8 path (the emulated kernel);
    the text encoders' attention never asks; off, nothing does. Preflight is the door that refuses it on a CPU:
    here the job is handed to the pipeline directly."""
    from pipeline.orchestrator import generate
    from pipeline.request import prepare

    def job(name, setting):
        cpu_kernel.clear()
        request = Request(image=make_image(), prompt="a cat walks", seconds=1.0, steps=1, seed=3,
                          fp8_attention=setting)
        with sdpa.AttentionGuard("cpu", force_chunked=True, label="transformer") as guard:
            events = list(generate(prepare(request, 64), tiny_original, outputs=tmp_path / name))
        assert isinstance(events[-1], Done), events[-1]
        return load_file(str(events[-1].job_dir / "latents.safetensors")), list(cpu_kernel), guard.choices

    off, asked_off, choices_off = job("off", "off")
    on, asked_on, choices_on = job("on", "on")
    assert asked_off == [] and sdpa.FP8_CHOICE not in choices_off.values()
    assert asked_on and sdpa.FP8_CHOICE in choices_on.values()
    heads = tiny_original.transformer.config.num_attention_heads
    assert all(shape[1] == heads for shape in asked_on)          # only the transformer's calls asked
    assert any(not torch.equal(on[key], off[key]) for key in on)


# ---- FlashAttention-3's fp8 kernel --------------------------------------------------------------------------------
def test_fa3_quantization_scales_each_head_to_e4m3s_range_and_matches_the_float_reference():
    q, k, v = _qkv(seed=6, outliers=True)
    q = q * torch.tensor([1.0, 0.01, 0.5, 0.2]).view(1, 4, 1, 1).to(q.dtype)      # heads of very different ranges
    z = fa.quantize(q, k, v, kernel=fa.FA3)
    assert z.descale_q.shape == (1, 4, 1, 1) and z.descale_v.shape == (1, 4, 1, 1)
    for t in (z.q, z.k, z.v):                       # every head reaches 448: its own scale, no shared one
        assert torch.equal(t.float().abs().amax(dim=(-2, -1)).flatten(), torch.full((4,), 448.0))
    assert z.q.stride() == q.stride()
    truth = _reference(q, k, v)
    whole, row = _cosine(fa.emulate(z, kernel=fa.FA3), truth)
    assert whole >= 0.995 and row >= 0.99
    plain = _cosine(fa.emulate(fa.quantize(q, k, v, smooth=False, per_head=False, kernel=fa.FA3), kernel=fa.FA3),
                    truth)
    assert plain[1] < row                                                 # the smoothing and head scales matter


def test_fa3_descales_of_k_and_v_from_one_pass_are_the_centred_tensors_amax_bit_for_bit():
    """The means' pass gives each channel's largest and smallest value too; the head's amax of x − mean read off
    them is exactly the centred tensor's (float rounding is monotonic), for q/k/v with outlier channels and heads of
    very different ranges."""
    q, k, v = _qkv(seed=9, outliers=True)
    v = v * torch.tensor([1.0, 0.001, 30.0, 0.2]).view(1, 4, 1, 1).to(v.dtype) + 2.0
    z = fa.quantize(q, k, v, kernel=fa.FA3)
    tiny = torch.finfo(torch.float32).tiny
    for x, descale in ((k, z.descale_k), (v, z.descale_v)):
        centred = x.float() - x.float().mean(dim=-2, keepdim=True)
        assert torch.equal(descale, (centred.abs().amax(dim=(-2, -1), keepdim=True) / fa.FP8_MAX).clamp(min=tiny))
    assert torch.equal(z.descale_q, (q.float().abs().amax(dim=(-2, -1), keepdim=True) / fa.FP8_MAX).clamp(min=tiny))


def _fake_fa3(calls):
    """FlashAttention-3's fp8 forward as its arithmetic on the CPU (`emulate`), in its interface: (batch, tokens,
    heads, dim) e4m3 in, descales (batch, heads), bf16 out with the log-sum-exp beside it."""
    def flash_attn_func(q, k, v, softmax_scale=None, q_descale=None, k_descale=None, v_descale=None):
        calls.append((q.dtype, tuple(q.shape), q.stride(-1), tuple(q_descale.shape), softmax_scale))
        b, _, h, _ = q.shape
        z = fa.Quantized(*(t.transpose(1, 2) for t in (q, k, v)),
                         *(d.reshape(b, h, 1, 1) for d in (q_descale, k_descale, v_descale)),
                         torch.zeros(b, h, 1, v.shape[-1]))
        return fa.emulate(z, softmax_scale, torch.bfloat16, kernel=fa.FA3).transpose(1, 2).contiguous(), None
    return flash_attn_func


@pytest.fixture
def cpu_fa3(monkeypatch):
    """This process's fp8 kernel is FlashAttention-3 (its forward emulated on the CPU); `fa.run` is the real one."""
    calls = []
    monkeypatch.setattr(fa, "_FA3", [_fake_fa3(calls)])
    monkeypatch.setattr(fa, "_KERNEL", [fa.FA3])
    monkeypatch.setattr(fa, "fits", lambda q, k, v, mask, p, causal, gqa: mask is None and q.dim() == 4)
    monkeypatch.setattr(sdpa, "_FP8_FAILED", [])
    return calls


def test_the_guard_runs_fp8_calls_through_fa3_in_its_layout_with_the_mean_added_back(cpu_fa3):
    q, k, v = _qkv(seed=7, tokens=128)
    v = v + 3.0                                     # a mean over the tokens: the smoothing takes it out, run adds it
    with sdpa.AttentionGuard("cpu", force_chunked=True, label="transformer") as guard, sdpa.fp8_attention(True):
        out = F.scaled_dot_product_attention(q, k, v, scale=0.1)
    assert cpu_fa3 == [(torch.float8_e4m3fn, (1, 128, 4, 64), 1, (1, 4), 0.1)]
    assert out.dtype == q.dtype and out.stride() == q.stride()           # the fused kernels' layout
    z = fa.quantize(q, k, v, kernel=fa.FA3)
    expected = fa.emulate(z, 0.1, kernel=fa.FA3)         # (the kernel's bf16 output, then the mean: one more
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=0)       # bf16 rounding than emulate)
    assert _cosine(out, _reference(q, k, v, 0.1))[0] >= 0.995
    assert guard.choices and sdpa.FP8_FA3_CHOICE in guard.choices.values()


def test_the_process_takes_fa3_where_installed_on_hopper_and_cudnn_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cuda = torch.device("cuda", 0)

    def choice(capability, installed):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(fa, "_FA3", [_fake_fa3([]) if installed else None])
        monkeypatch.setattr(fa, "_KERNEL", [])
        return fa.kernel(cuda), fa.chosen()

    assert choice((9, 0), True) == (fa.FA3, fa.FA3)
    assert choice((9, 0), False) == (fa.CUDNN, fa.CUDNN)
    assert choice((10, 0), True) == (fa.CUDNN, fa.CUDNN)                  # built for Hopper alone
    monkeypatch.setattr(fa, "_frontend", lambda: None)                     # no cuDNN frontend: FA3 is enough
    monkeypatch.setattr(fa, "_FA3", [_fake_fa3([])])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fa.unavailable(cuda) is None
    monkeypatch.setattr(fa, "_FA3", [None])
    assert "not installed: pip install nvidia-cudnn-frontend" in fa.unavailable(cuda)
    assert "FlashAttention-3: bash scripts/build_flash_attention_3.sh" in fa.unavailable(cuda)


def test_the_build_script_keeps_the_fp8_head_128_forward_and_drops_the_rest():
    """scripts/build_flash_attention_3.sh --dry-run: the flags it builds with and what it would run (nothing runs)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "build_flash_attention_3.sh"
    r = subprocess.run(["bash", str(script), "--dry-run"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "FA3_DIR": "/nonexistent/fa"})
    assert r.returncode == 0, r.stderr
    off = {line.split("=")[0].removeprefix("FLASH_ATTENTION_DISABLE_") for line in r.stdout.splitlines()
           if line.startswith("FLASH_ATTENTION_DISABLE_")}
    assert {"BACKWARD", "SPLIT", "PAGEDKV", "VARLEN", "HDIM64", "HDIM256", "SM80"} <= off
    assert not off & {"FP8", "HDIM128"}                       # what rocm/fp8_attention.py runs stays in
    assert "checkout --quiet 0251105a2fb19d2957484b7f023cd8c115286ced" in r.stdout
    assert "pip install --no-build-isolation --no-deps ." in r.stdout and not Path("/nonexistent/fa").exists()
    bad = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown option '--bogus'" in bad.stderr
