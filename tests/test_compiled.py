"""Compiled transformer blocks and fp8 compute (pipeline/compiled.py): off on the CPU by default, the switch from
every door, a tiny job compiled (forced on the CPU) against eager, streaming and the attention guard under compile,
and --fp8-compute refused where it cannot run."""
from __future__ import annotations

import argparse
import logging
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from common.errors import InputError
from configs.options import add_process_options, config_from
from pipeline import compiled
from pipeline.events import Done, LogLine, Progress
from pipeline.request import Request
from tests.conftest import make_image
from tests.model_helpers import small_transformer

CAN_COMPILE = shutil.which("g++") or shutil.which("c++") or shutil.which("cl")
NEEDS_COMPILER = pytest.mark.skipif(not CAN_COMPILE, reason="no C++ compiler: torch.compile cannot build CPU kernels "
                                                            "on this machine")


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch):
    """Compiled kernels go to a folder of the test (not the user's cache)."""
    monkeypatch.setenv(compiled.CACHE_VAR, str(tmp_path / "kernels"))
    return tmp_path / "kernels"


def _config(*args):
    p = argparse.ArgumentParser()
    add_process_options(p)
    return config_from(p, p.parse_args(list(args)))


def _lines(events) -> str:
    return "\n".join(e.message for e in events if isinstance(e, LogLine))


def test_compile_is_off_on_the_cpu_by_default(tiny_original, caplog):
    assert _config().compile is True                    # on by default (for GPUs) ...
    assert "GPU" in compiled.unavailable(torch.device("cpu"))
    with caplog.at_level(logging.INFO, logger="pipeline.compiled"):
        blocks = compiled.for_job(tiny_original.transformer, torch.device("cpu"))
    assert blocks.enabled is False                       # ... eager on the CPU, said in one line
    assert "transformer blocks: eager (compiled blocks are for GPUs" in caplog.text


def test_the_switch_reaches_the_denoiser_from_the_cli_the_page_and_the_api(tiny_original, tmp_path):
    from jobs.execute import compile_choice as _compile

    assert _config("--no-compile").compile is False
    assert _compile(_config("--no-compile")) == "off" and _compile(_config()) == "auto"
    # the page's advanced setting and the /video API parameter: one control, checked like every other
    from configs.controls import control

    c = control("compile")
    assert c.widget == "radio" and c.advanced and c.api_name == "compile" and c.default == "on"
    assert Request.from_mapping({"image": make_image(), "compile": "off"}).compile == "off"
    from pipeline.request import prepare

    with pytest.raises(InputError, match="compile"):
        prepare(Request.from_mapping({"image": make_image(), "compile": "sometimes"}), 64)
    # each reaches the job's blocks: the log line says which switch made them eager
    from pipeline.orchestrator import generate

    def eager_reason(request, process):
        prepared = prepare(request, tiny_original.preset.default_resolution)
        events = list(generate(prepared, tiny_original, outputs=tmp_path, compile=process))
        assert isinstance(events[-1], Done)
        return [line for line in _lines(events).splitlines() if "transformer blocks:" in line]

    short = dict(image=make_image(), prompt="a cat", seconds=1.0, steps=2)
    assert "eager (--no-compile)" in eager_reason(Request(**short), "off")[0]
    assert "eager (off for this job)" in eager_reason(Request(**short, compile="off"), "auto")[0]
    assert "for GPUs" in eager_reason(Request(**short), "auto")[0]


@NEEDS_COMPILER
def test_a_tiny_job_compiled_streamed_and_guarded_matches_eager_and_a_second_job_compiles_nothing(
        tiny_original, tmp_path, kernel_cache):
    """Under a cap that streams a block (the CPU plan) and inside a guard that chunks attention: the hooks run
    around the compiled blocks, attention is the guard's (its choice recorded), the latents are eager's within 1e-4,
    and the same job again (blocks swapped in and out again, a new guard per stage) compiles nothing and gives the
    same bits."""
    from memory.hostpack import HostPack
    from memory.manager import MemoryManager
    from pipeline.orchestrator import generate
    from pipeline.request import prepare
    from rocm.sdpa import AttentionGuard

    pack = HostPack.of(tiny_original.transformer)
    cap = 1.0 + (pack.rest.nbytes + pack.blocks[0].nbytes) / 2**30

    def job(name, mode):
        request = Request(image=make_image(), prompt="a cat walks", seconds=1.0, steps=3, seed=5)
        memory = MemoryManager(device="cpu", cap_gb=cap, preserved_gb=1.0, plan_on_cpu=True)
        graphs = compiled.compiled_graphs()
        with AttentionGuard("cpu", chunk_budget_bytes=4096, force_chunked=True, label="transformer") as guard:
            events = list(generate(prepare(request, 64), tiny_original, memory, outputs=tmp_path / name,
                                   compile=mode))
        assert isinstance(events[-1], Done), events[-1]
        assert any(r.streamed_bytes_per_pass for r in memory.records if r.name == "transformer")   # swapped
        assert guard.choices and all("chunks of" in text for text in guard.choices.values())
        latents = load_file(str(events[-1].job_dir / "latents.safetensors"))
        preparing = [e for e in events if isinstance(e, Progress) and compiled.PREPARING in (e.message or "")]
        return latents, compiled.compiled_graphs() - graphs, preparing, _lines(events)

    eager, _, _, eager_log = job("eager", "auto")                   # the CPU: eager
    first, graphs, preparing, log = job("first", "force")
    assert "transformer blocks: compiled" in log and "transformer blocks: eager" in eager_log
    assert graphs >= 2 and len(preparing) == 1                       # the page said why the first step took long
    assert "kernels prepared in" in log and any(kernel_cache.iterdir())
    second, graphs, preparing, _ = job("second", "force")
    assert graphs == 0 and preparing == []                           # no recompile for the same job again
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention
    for key in first:
        assert torch.equal(first[key], second[key]), key             # the same request, the same bits
        torch.testing.assert_close(first[key], eager[key], atol=1e-4, rtol=0)   # and eager's latents within 1e-4


def test_blocks_are_set_up_between_stages_only(tiny_original):
    from diffusers import HunyuanVideoFramepackTransformer3DModel
    from diffusers.hooks import HookRegistry, ModelHook

    cfg = dict(tiny_original.preset.tiny_configs["transformer"])
    tr = HunyuanVideoFramepackTransformer3DModel(**cfg).eval()
    HookRegistry.check_if_exists_or_initialize(tr.transformer_blocks[0]).register_hook(ModelHook(), "some hook")
    with pytest.raises(RuntimeError, match="hooks attached"):
        compiled.install(tr)


def test_fp8_compute_is_refused_with_a_clear_message_where_it_cannot_run():
    from jobs.models import models_for

    with pytest.raises(compiled.Fp8ComputeUnavailable, match="--fp8-compute needs a GPU with fp8 tensor cores.*CPU"):
        compiled.fp8_recipe(torch.device("cpu"))
    config = _config("--preset", "tiny", "--fp8-compute")
    assert config.fp8_compute is True
    with pytest.raises(compiled.Fp8ComputeUnavailable, match="Leave --fp8-compute off"):
        models_for(config, torch.device("cpu"))
    assert models_for(_config("--preset", "tiny"), torch.device("cpu")).fp8_compute is None


def test_fp8_compute_converts_the_block_linears_only_and_keeps_their_parameters():
    tr = small_transformer()
    before = {n: m.weight for n, m in tr.named_modules() if isinstance(m, torch.nn.Linear)}
    x = torch.randn(64, 32, dtype=torch.bfloat16)
    q = tr.transformer_blocks[0].attn.to_q
    reference = q(x)
    n = compiled.use_fp8_compute(tr, "rowwise")
    converted = {name for name, m in tr.named_modules() if isinstance(m, compiled.Fp8Linear)}
    assert n == len(converted) > 0
    assert all(name.startswith(("transformer_blocks.", "single_transformer_blocks.")) for name in converted)
    assert not any(".norm" in f".{name}" for name in converted)       # the modulation layers stay bf16
    assert "transformer_blocks.0.attn.to_q" in converted
    assert all(dict(tr.named_modules())[name].weight is before[name] for name in converted)   # same Parameters
    out = q(x)                                  # not packed yet: its bf16 weight is quantized for the product
    err = float((out.float() - reference.float()).norm() / reference.float().norm())
    assert 0 < err < 0.08                                              # fp8 rounding: close, not equal
    q.fp8_recipe = "tensorwise"                 # one activation scale, the weight's row scales after the product
    err = float((q(x).float() - reference.float()).norm() / reference.float().norm())
    assert 0 < err < 0.08


@pytest.mark.parametrize("packed_first", [False, True], ids=["marked-then-packed", "packed-then-marked"])
def test_fp8_compute_keeps_weights_in_fp8_on_the_device_resident_streamed_and_with_a_lora(packed_first):
    """The block Linears' weights are stored in fp8 and bound as stored (values + row scales); the product gives
    the bits it gives when it quantizes the bf16 weight itself; a LoRA is merged and quantized again. A model
    packed before fp8 compute is turned on (real weights are packed as they load) changes its storage then."""
    from memory import fp8
    from memory.deltas import WeightDelta, clear_deltas, set_deltas
    from memory.hostpack import HostPack
    from memory.manager import MemoryManager
    from tests.model_helpers import step_inputs, two_steps

    twin = small_transformer()                  # the same weights, never packed: each product quantizes bf16
    compiled.use_fp8_compute(twin, "rowwise")
    inputs = step_inputs(twin, seed=2)
    per_product = two_steps(twin, inputs)
    bf16 = twin.transformer_blocks[0].attn.to_q.weight.detach()
    tr = small_transformer()
    if packed_first:
        plain_bytes = HostPack.of(tr).host_bytes
    compiled.use_fp8_compute(tr, "rowwise")
    q = tr.transformer_blocks[0].attn.to_q
    pack = HostPack.of(tr)
    if packed_first:
        assert pack.host_bytes < plain_bytes        # (tensors this small: alignment and embeddings dominate)
    kept = [e for c in pack.chunks for e in c.entries if e.keep]
    assert len(kept) == sum(isinstance(m, compiled.Fp8Linear) for m in tr.modules()) > 0
    assert all(c.stores_fp8 for c in pack.blocks) and not pack.rest.stores_fp8 and not pack.fp8
    # the device layout is the stored form: a kept weight takes its values and scales' bytes, not bf16's, and
    # a block is copied to the device as its host buffer is (no staging, nothing turned on the device)
    for c in pack.blocks:
        bf16_bytes = sum(-(-e.nbytes // 256) * 256 for e in c.entries)
        assert c.copies_as_stored and c.nbytes == c.host_nbytes < bf16_bytes, (c.name, c.nbytes, bf16_bytes)
        for e in c.entries:
            if e.keep:
                values, scales = fp8.stored_bytes(tuple(e.shape))
                nxt = next((f.offset for f in c.entries if f.offset > e.offset), c.nbytes)
                assert nxt - e.offset == -(-values // 256) * 256 + -(-scales // 256) * 256 < e.nbytes
    resident = MemoryManager(device="cpu", plan_on_cpu=True)
    with resident.stage("transformer", transformer=tr):
        assert q.weight.dtype == fp8.FP8 and q.weight_scale.dtype == torch.float32
        assert torch.equal(q.weight.view(torch.uint8), fp8.quantize(bf16)[0].view(torch.uint8))
        out = two_steps(tr, inputs)
    assert all(torch.equal(a, b) for a, b in zip(out, per_product))
    assert q.weight_scale is None and q.weight.dtype == torch.bfloat16 and torch.isnan(q.weight).all()   # idle
    cap_gb = (pack.rest.nbytes + pack.blocks[0].nbytes) / 2 ** 30
    streaming = MemoryManager(device="cpu", cap_gb=cap_gb, preserved_gb=0, plan_on_cpu=True)
    with streaming.stage("transformer", transformer=tr) as rec:
        out = two_steps(tr, inputs)
    assert "1/2 blocks" in rec.placement["transformer"] and rec.stream_misses == 0
    assert all(torch.equal(a, b) for a, b in zip(out, per_product))
    gen = torch.Generator().manual_seed(3)
    delta = WeightDelta(torch.randn(4, 32, generator=gen) * 0.05, torch.randn(32, 4, generator=gen) * 0.05)
    set_deltas(pack, {"transformer_blocks.0.attn.to_q.weight": delta})
    merged = torch.empty_like(bf16)
    fp8.dequantize_into(merged, *fp8.quantize(bf16))
    WeightDelta(delta.down.to(torch.bfloat16), delta.up.to(torch.bfloat16)).apply(merged)    # the hand merge
    try:
        with resident.stage("transformer", transformer=tr):
            values, scales = fp8.quantize(merged)
            assert torch.equal(q.weight.view(torch.uint8), values.view(torch.uint8))
            assert torch.equal(q.weight_scale, scales)
    finally:
        clear_deltas(pack)


def test_fp8_compute_with_fp8_storage_turns_the_other_weights_on_the_device_resident_and_streamed():
    """fp8 storage rounds the weights that fp8 compute does not keep (the modulation Linears) too: those are turned
    back into bf16 on the device, so a block is staged, not copied as stored; resident and streamed give the same
    bits, and the kept weights bind as stored."""
    from memory import fp8
    from memory.hostpack import HostPack
    from memory.manager import MemoryManager
    from tests.model_helpers import step_inputs, two_steps

    tr = small_transformer()
    inputs = step_inputs(tr, seed=4)
    compiled.use_fp8_compute(tr, "rowwise")
    pack = HostPack.of(tr)
    for c in pack.chunks:
        c.set_fp8(True)
    assert all(c.stores_fp8 and not c.copies_as_stored for c in pack.blocks)
    assert all(c.host_nbytes < c.nbytes for c in pack.blocks)         # the modulation Linears: fp8 on the host
    q = tr.transformer_blocks[0].attn.to_q
    resident = MemoryManager(device="cpu", plan_on_cpu=True)
    with resident.stage("transformer", transformer=tr):
        assert q.weight.dtype == fp8.FP8 and tr.transformer_blocks[0].norm1.linear.weight.dtype == torch.bfloat16
        whole = two_steps(tr, inputs)
    cap_gb = (pack.rest.nbytes + pack.blocks[0].nbytes) / 2 ** 30
    streaming = MemoryManager(device="cpu", cap_gb=cap_gb, preserved_gb=0, plan_on_cpu=True)
    with streaming.stage("transformer", transformer=tr) as rec:
        streamed = two_steps(tr, inputs)
    assert "blocks" in rec.placement["transformer"] and rec.streamed_bytes_per_pass > 0 and rec.stream_misses == 0
    assert all(torch.equal(a, b) for a, b in zip(whole, streamed))


def test_a_compiler_failure_on_the_first_call_goes_on_eagerly_once_and_is_remembered(tiny_original, tmp_path,
                                                                                       monkeypatch, kernel_cache):
    """A fault injected into the compiled forward's first call (as a Triton/Inductor error would come): the job
    finishes eagerly with the frames of --no-compile, one warning naming the error and --no-compile, the failure is
    kept for this GPU and PyTorch, and the next start (a new process) does not try to compile again."""
    from pipeline.orchestrator import generate
    from pipeline.request import prepare
    from rocm import fallbacks

    monkeypatch.setenv("STEADYFRAME_CACHE_DIR", str(tmp_path / "cache"))
    blocks = compiled.install(tiny_original.transformer)
    monkeypatch.setattr(blocks, "failed", None)              # the shared tiny model: restored after the test
    monkeypatch.setattr(blocks, "worked", set())
    cls = type(tiny_original.transformer.transformer_blocks[0])
    calls = []

    def broken(block, *args, **kwargs):
        calls.append(type(block).__name__)
        raise RuntimeError("injected: triton could not build the kernel for this GPU")

    monkeypatch.setitem(compiled._COMPILED, cls, broken)
    request = Request(image=make_image(), prompt="a cat walks", seconds=1.0, steps=2, seed=5)

    def job(name, mode):
        events = list(generate(prepare(request, 64), tiny_original, outputs=tmp_path / name, compile=mode))
        assert isinstance(events[-1], Done), events[-1]
        return events[-1], [e for e in events if isinstance(e, LogLine)]

    eager, _ = job("eager", "off")
    done, lines = job("fault", "force")
    warnings = [e.message for e in lines if "compiled transformer blocks failed" in e.message]
    assert len(warnings) == 1 and calls == [cls.__name__], (warnings, calls)
    assert "injected: triton could not build" in warnings[0] and "--no-compile" in warnings[0]
    assert done.frames == eager.frames
    ours = load_file(str(done.job_dir / "latents.safetensors"))
    theirs = load_file(str(eager.job_dir / "latents.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert done.video.read_bytes() == eager.video.read_bytes()               # the same frames, the same file
    gpu, version = compiled.machine(torch.device("cpu"))
    assert "injected" in fallbacks.failed(fallbacks.COMPILE, gpu, version)

    monkeypatch.setattr(blocks, "failed", None)              # the next start: a new process, the file remembers
    _, lines = job("next", "force")
    text = "\n".join(e.message for e in lines)
    assert calls == [cls.__name__] and "compiled transformer blocks failed" not in text
    assert "transformer blocks: eager (compiling failed on" in text and "doctor --reset" in text
    assert fallbacks.forget() and fallbacks.failed(fallbacks.COMPILE, gpu, version) is None


def test_an_fp8_product_that_fails_on_the_gpu_falls_back_to_bf16_said_once_and_remembered(tmp_path, monkeypatch,
                                                                                           caplog):
    """fp8 cores, but PyTorch's fp8 product fails there (simulated: the probe raises): bf16 products with one
    warning, remembered for this GPU and PyTorch, so the next start does not probe again."""
    from jobs.models import models_for
    from rocm import fallbacks

    monkeypatch.setenv("STEADYFRAME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiled, "_fp8_hardware", lambda device: ("a GPU with fp8 cores", None))
    probes = []

    def probe(device, recipe):
        probes.append(recipe)
        raise RuntimeError(f"injected: no {recipe} fp8 product in this build")

    monkeypatch.setattr(compiled, "_probe", probe)
    config = _config("--preset", "tiny", "--fp8-compute")
    with caplog.at_level(logging.WARNING, logger="jobs.models"):
        assert models_for(config, torch.device("cpu")).fp8_compute is None
    warned = [r.getMessage() for r in caplog.records if "bf16" in r.getMessage()]
    assert len(warned) == 1 and "injected: no rowwise" in warned[0] and probes == ["rowwise", "tensorwise"]
    gpu, version = compiled.machine(torch.device("cpu"))
    assert "injected" in fallbacks.failed(fallbacks.FP8, gpu, version)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jobs.models"):
        assert models_for(config, torch.device("cpu")).fp8_compute is None        # the next start
    assert probes == ["rowwise", "tensorwise"] and "remembered, not tried again" in caplog.text


def test_mi300_multiplies_in_e4m3fnuz_with_the_same_weights():
    """gfx942 (MI300) has fp8 cores for e4m3fnuz, not e4m3fn (issue 40: --fp8-compute was refused there). The kept
    e4m3fn weight read as e4m3fnuz is the same weight exactly (scales doubled, -0 made +0), and the fnuz products
    match the bf16 product as the e4m3fn ones do (PyTorch's CPU _scaled_mm runs both)."""
    from memory import fp8

    assert compiled.recipes_for("gfx942") == ("rowwise-fnuz", "tensorwise-fnuz")
    assert compiled.recipes_for("gfx950") == compiled.recipes_for(None) == ("rowwise", "tensorwise")
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 96, generator=gen).to(torch.bfloat16)
    w[0, :4] = torch.tensor([-1e-30, -0.0, 0.0, 1e-30])          # -0 and values that round to -0
    values, scales = fp8.quantize_rows(w)
    assert (values.view(torch.uint8) == 0x80).any()              # e4m3fn's -0 is there ...
    fnuz, fnuz_scales = compiled.as_fnuz(values, scales)
    assert not torch.isnan(fnuz.float()).any()                   # ... and is not e4m3fnuz's NaN
    assert torch.equal(fnuz.float() * fnuz_scales[:, None], values.float() * scales[:, None])
    x = torch.randn(2, 16, 96, generator=gen).to(torch.bfloat16)
    ref = (x.float() @ w.float().t())
    for recipe in compiled.ALL_RECIPES:
        out = compiled.fp8_linear(x, values, scales, None, recipe).float()
        assert ((out - ref).norm() / ref.norm()).item() < 0.1, recipe
    for kind in ("rowwise", "tensorwise"):
        fn = compiled.fp8_linear(x, values, scales, None, kind).float()
        nuz = compiled.fp8_linear(x, values, scales, None, kind + "-fnuz").float()
        assert ((fn - nuz).norm() / fn.norm()).item() < 0.05, kind


def test_fp8_compute_on_a_simulated_mi300_picks_the_fnuz_product(tmp_path, monkeypatch):
    monkeypatch.setenv("STEADYFRAME_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compiled, "_fp8_hardware", lambda device: ("AMD Instinct MI300X", "gfx942"))
    tried = []
    real = compiled._probe

    def probe(device, recipe):
        tried.append(recipe)
        real(device, recipe)                                     # the real small product, on the CPU here

    monkeypatch.setattr(compiled, "_probe", probe)
    assert compiled.fp8_recipe(torch.device("cpu")) == "rowwise-fnuz" and tried == ["rowwise-fnuz"]


def test_the_step_profiles_idle_gaps_are_the_device_timeline_holes_put_to_the_host_op_then():
    """benchmarks/compiled.py's `idle_gaps` (the `--profile` step's timeline): overlapping kernels count once, a hole
    under the shortest gap is not listed, the lead and the tail are the step's edges, each listed gap names the
    kernels around it and the host ops spanning its start (innermost last), and synchronizing calls are counted."""
    from benchmarks.compiled import idle_gaps

    kernels = [("a", 100, 300), ("b", 250, 400),       # overlapping: busy 100..400
               ("c", 420, 500),                         # a 20 µs hole before it: under min_us
               ("d", 900, 1000)]                        # a 400 µs hole before it
    host = [("step", 0, 1100), ("Torch-Compiled Region", 450, 700), ("cudaStreamSynchronize", 510, 890),
            ("cudaLaunchKernel", 10, 20)]
    g = idle_gaps(kernels, (0, 1100), host, min_us=50)
    assert g["busy_ms"] == pytest.approx(0.48)          # 300 + 80 + 100 µs
    assert g["idle_ms"] == pytest.approx(0.62) and g["lead_ms"] == pytest.approx(0.1)
    assert g["tail_ms"] == pytest.approx(0.1)
    assert [r["ms"] for r in g["gaps"]] == pytest.approx([0.4, 0.1])
    assert g["gaps"][0]["after"] == "c" and g["gaps"][0]["before"] == "d"
    assert g["gaps"][0]["host"] == ["step", "Torch-Compiled Region"]     # the sync starts 10 µs after the hole
    assert g["gaps"][1]["before"] == "a" and g["syncs"] == {"cudaStreamSynchronize": 1}
