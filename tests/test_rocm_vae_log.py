"""vae_decode_log records and logs a decode; the stall watchdog dumps stacks and names the stage/shape;
trim() is safe on CPU."""

from __future__ import annotations

import logging

import pytest
import rocm_helpers  # noqa: F401  (puts the repo on sys.path)
import torch
from torch import nn

from rocm import memory_status, trim, vae_decode_log
from rocm.conv_fallback import ConvFallback
from rocm.faults import Fault, FaultPlan


class TinyVae(nn.Module):
    def __init__(self, fail=False):
        super().__init__()
        self.conv = nn.Conv3d(4, 3, 3, padding=1)
        self.fail = fail

    def decode(self, z):
        if self.fail:
            raise RuntimeError("decoder exploded")
        return self.conv(z)


def test_record_and_log(caplog):
    fb = ConvFallback(persist=False, probe=None,
                      fault_plan=FaultPlan([Fault(tier=1, kind="miopen_unknown", times=1)]))
    vae, z = TinyVae(), torch.randn(1, 4, 3, 8, 8)
    caplog.set_level(logging.INFO, logger="rocm.vae_log")
    with torch.no_grad(), vae_decode_log(vae, z, stage="VAE decode s1", fallback=fb,
                                         memory_status=lambda: "MEM-LINE") as rec:
        out = vae.decode(z)
        vae.decode(z)
    assert out.shape == (1, 3, 3, 8, 8)
    assert rec.success is True and rec.elapsed_s > 0 and not rec.stalled
    assert rec.tiers == {2: 2} and len(rec.fell_back) == 1
    assert rec.latents_shape == (1, 4, 3, 8, 8) and rec.latents_dtype == "float32"
    assert rec.vae_device == "cpu" and rec.vae_dtype == "float32"
    assert rec.memory_before == rec.memory_after == "MEM-LINE"
    text = caplog.text
    assert "VAE decode s1: start; latents (1, 4, 3, 8, 8) on cpu (float32); VAE on cpu (float32)" in text
    assert "ok in" in text and "MEM-LINE" in text and "{2: 2}" in text
    assert not fb.installed                                # active only inside the block


def test_failure_is_recorded_and_raised(caplog):
    vae, z = TinyVae(fail=True), torch.randn(1, 4, 1, 4, 4)
    caplog.set_level(logging.INFO, logger="rocm.vae_log")
    with pytest.raises(RuntimeError, match="exploded"):
        with vae_decode_log(vae, z, stall_timeout_s=None) as rec:
            vae.decode(z)
    assert rec.success is False and "exploded" in rec.error and rec.elapsed_s is not None
    assert "VAE decode failed after" in caplog.text and "FAILED" in caplog.text


def test_stall_watchdog_names_stage_shape_and_conv(tmp_path, caplog):
    # an in-process 'hang' fault sleeps 1.2 s inside tier 1 of the conv; the watchdog fires at 0.3 s
    fb = ConvFallback(persist=False, probe=None, fault_plan=FaultPlan([Fault(tier=1, kind="hang", seconds=1.2)]))
    dump = open(tmp_path / "stacks.txt", "w+")
    caplog.set_level(logging.WARNING, logger="rocm.vae_log")
    vae, z = TinyVae(), torch.randn(1, 4, 2, 6, 6)
    with torch.no_grad(), vae_decode_log(vae, z, stage="VAE decode s3", stall_timeout_s=0.3, fallback=fb,
                                         dump_file=dump) as rec:
        vae.decode(z)
    dump.flush()
    dump.seek(0)
    stacks = dump.read()
    dump.close()
    assert rec.stalled and rec.success
    assert "STALL" in caplog.text and "VAE decode s3, latents (1, 4, 2, 6, 6)" in caplog.text
    assert "conv conv3d in (1, 4, 2, 6, 6)" in caplog.text
    assert "most recent call first" in stacks and "faults.py" in stacks   # where the main thread was stuck


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU behaviour; the GPU test below covers GPUs")
def test_trim_and_memory_status_on_cpu():
    report = trim("after VAE")
    assert report.device is None and report.freed_bytes == 0 and report.allocated_before is None
    assert "no GPU" in str(report) and report.label == "after VAE"
    assert "CPU" in memory_status()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_trim_and_decode_log_on_gpu(caplog):
    big = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    del big
    report = trim("gpu")
    assert report.device.startswith("cuda") and report.freed_bytes >= 256 * 2**20
    assert report.reserved_after <= report.reserved_before
    vae = TinyVae().cuda().half()
    z = torch.randn(1, 4, 3, 8, 8, device="cuda", dtype=torch.float16)
    caplog.set_level(logging.INFO, logger="rocm.vae_log")
    fb = ConvFallback(persist=False, probe=None)
    with torch.no_grad(), vae_decode_log(vae, z, fallback=fb) as rec:
        vae.decode(z)
    assert rec.success and rec.tiers == {1: 1} and rec.vae_dtype == "float16" and "GiB" in rec.memory_before


def test_watchdog_covers_the_first_synchronize(monkeypatch, caplog, tmp_path):
    """On a wedged GPU the synchronize before the decode hangs already: the watchdog must be running by then."""
    import time

    import rocm.vae_log as vae_log

    calls = []

    def slow_first_sync(device):
        calls.append(device)
        if len(calls) == 1:
            time.sleep(1.0)

    monkeypatch.setattr(vae_log, "synchronize", slow_first_sync)
    caplog.set_level(logging.WARNING, logger="rocm.vae_log")
    vae, z = TinyVae(), torch.randn(1, 4, 1, 4, 4)
    with open(tmp_path / "stacks.txt", "w") as dump:
        with torch.no_grad(), vae_decode_log(vae, z, stage="VAE decode s9", stall_timeout_s=0.3,
                                             memory_status=lambda: "MEM", dump_file=dump) as rec:
            vae.decode(z)
    assert len(calls) == 2 and rec.stalled and rec.success
    assert "STALL" in caplog.text and "VAE decode s9" in caplog.text


def test_the_hang_probe_guards_every_stage_that_runs_convolutions(tiny_original, tmp_path, monkeypatch):
    """Issue 40: the probe was on around VAE decode only; VAE encode and the image encoder (and the transformer's
    patch embedding) run convolutions through MIOpen too. A tiny job: each of those stages enters the probing
    block (which probes only on ROCm), named."""
    from pipeline.request import Request
    from rocm.conv_fallback import ConvFallback
    from tests.conftest import make_image, run_job

    stages = []
    original = ConvFallback.probing

    def recording(self, enabled=None):
        stages.append(self.stage)
        return original(self, enabled)

    monkeypatch.setattr(ConvFallback, "probing", recording)
    _, done = run_job(Request(image=make_image(), prompt="a cat", seconds=1.0, steps=1, seed=2), tiny_original,
                      tmp_path)
    assert type(done).__name__ == "Done", done
    assert {"VAE encode", "image encoder", "transformer", "VAE decode"} <= set(stages), stages


def test_the_stall_dump_reads_threads_that_run_python_meanwhile():
    """The stacks of a stall are read under the GIL while other threads run Python (the CI: faulthandler's dump, which
    reads them without it, killed a test worker mid-dump); every other thread is named with its current function."""
    import threading

    from rocm.vae_log import all_stacks

    stop = threading.Event()

    def busy_python_work():
        while not stop.is_set():
            sorted(str(n) for n in range(200))

    threads = [threading.Thread(target=busy_python_work, name=f"busy-{n}", daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    try:
        dumps = [all_stacks("stall") for _ in range(200)]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    last = dumps[-1]
    assert last.startswith("stall (most recent call first):")
    for n in range(3):
        assert f"(busy-{n}):" in last
    assert last.count("in busy_python_work") >= 3
    assert "test_the_stall_dump_reads_threads_that_run_python_meanwhile" not in last  # the caller's own (the timer)
