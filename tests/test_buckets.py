"""Any resolution (issue 13): bucket tables for 640, 720, 960 … and custom sizes; what a size costs under the VRAM
cap; the refusal of a size that cannot fit, with the nearest size that does (pipeline/buckets.py,
memory/resolution.py, pipeline/resolution.py)."""
from __future__ import annotations

import json

import pytest

from common.errors import InputError
from common.units import GIB
from configs.generation import BUCKETS_640
from configs.presets import HUNYUAN, TINY
from memory.plan import framepack_tokens
from memory.resolution import model_figures, resolution_cost
from pipeline.buckets import BUCKET_TARGETS, bucket_table, nearest_bucket, scaled_sizes
from pipeline.request import Request, prepare
from pipeline.resolution import JobSize, check_fits, custom_size, job_size, refusal
from tests.conftest import job_folders, make_image

ASPECTS = {"16:9": (1080, 1920), "9:16": (1920, 1080), "4:3": (600, 800), "square": (1000, 1000),
           "21:9": (900, 2100)}


# ---- tables -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", [320, 640, 720, 960, 1280, 2048])
def test_every_bucket_is_a_multiple_of_16_with_an_area_near_the_target_squared(target):
    table = bucket_table(target)
    assert len(table) == 14 and len(set(table)) == 14
    for h, w in table:
        assert h % 16 == 0 and w % 16 == 0
        assert 0.9 <= h * w / target ** 2 <= 1.0, (target, h, w)
    assert table == tuple((w, h) for h, w in reversed(table))          # portrait and landscape mirror each other


def test_the_640_table_is_framepacks_and_the_larger_ones_scale_it():
    assert bucket_table(640) == BUCKETS_640                             # today's behaviour, unchanged
    assert BUCKET_TARGETS == (640, 720, 960)
    assert bucket_table(960)[0] == (624, 1440) and (912, 960) in bucket_table(960)
    assert (688, 720) in bucket_table(720)
    for target in (720, 960):
        ratios = [w / h for h, w in bucket_table(target)]
        assert ratios == sorted(ratios, reverse=True)                   # FramePack's order: widest first
        for (h, w), (h0, w0) in zip(bucket_table(target), BUCKETS_640):
            assert abs(w / h - w0 / h0) < 0.04                          # the same aspect ratios


@pytest.mark.parametrize("target", [640, 720, 960])
@pytest.mark.parametrize("aspect", list(ASPECTS))
def test_an_image_gets_the_bucket_of_the_closest_aspect_ratio(target, aspect):
    h, w = ASPECTS[aspect]
    bh, bw = nearest_bucket(h, w, target)
    error = abs(bw / bh - w / h) / (w / h)
    others = [abs(b[1] / b[0] - w / h) / (w / h) for b in bucket_table(target)]
    assert error <= min(others) + 0.02
    if aspect == "16:9":
        assert bw > bh and abs(bw / bh - 16 / 9) < 0.08          # the table has 1.73 (640) / 1.71 (720)
    if aspect == "square":
        assert abs(bh - bw) <= 48


def test_prepare_crops_to_the_bucket_or_to_the_custom_size():
    image = make_image(800, 600)
    p = prepare(Request(image=image, resolution=960), 640)
    assert (p.height, p.width) == (816, 1056) == (p.image.height, p.image.width)
    p = prepare(Request(image=image), 640)
    assert (p.height, p.width) == nearest_bucket(600, 800, 640) == (544, 704)        # the default: 640
    p = prepare(Request(image=image, width=400, height=208), 640)
    assert (p.height, p.width) == (208, 400) == (p.image.height, p.image.width)


def test_a_custom_size_needs_both_sides_of_at_least_64():
    assert custom_size(0, 0) is None and custom_size(None, None) is None
    assert custom_size(96, 64) == (64, 96)
    with pytest.raises(InputError) as e:
        custom_size(512, 0)
    assert e.value.field == "custom height" and "both" in e.value.message
    with pytest.raises(InputError) as e:
        custom_size(32, 512)
    assert e.value.field == "custom width" and "at least 64" in e.value.message
    with pytest.raises(InputError) as e:
        prepare(Request(image=make_image(), width=100, height=64), 64)
    assert e.value.field == "custom width" and "multiple of 16" in e.value.message


# ---- what a size costs -------------------------------------------------------------------------------------------
def test_tokens_count_the_window_and_the_clean_latents():
    """(H/16)·(W/16)·(window + 2 clean 1× frames) + the 2× and 4× history + SigLIP + text tokens."""
    assert framepack_tokens(912, 960, 9) == 57 * 60 * (9 + 2) + 29 * 30 + 4 * 15 * 15 + 729 + 256


@pytest.mark.parametrize("preset", [HUNYUAN, TINY], ids=["hunyuan", "tiny"])
def test_the_cost_grows_with_the_size(preset):
    figures = model_figures(preset)
    costs = [resolution_cost(figures, *nearest_bucket(1, 1, t), 9, 20) for t in (320,) + BUCKET_TARGETS + (1280,)]
    for a, b in zip(costs, costs[1:]):
        assert b.tokens > a.tokens and b.activation_bytes > a.activation_bytes
        assert b.transformer_floor > a.transformer_floor and b.vae_floor > a.vae_floor
    longer = resolution_cost(figures, 608, 640, 18, 20)
    assert longer.tokens > costs[1].tokens and longer.vae_floor > costs[1].vae_floor   # a longer window costs too


def test_the_real_models_at_960_fit_the_20_gb_cap_and_say_what_they_cost():
    cost = resolution_cost(model_figures(HUNYUAN), 912, 960, 9, 20)
    assert cost.fits and cost.tokens == 40375
    assert 4 << 30 < cost.activation_bytes < 6 << 30          # 40,375 × 3072 × 2 bytes × 20
    text = cost.describe()
    assert "960×912" in text and "40,375 tokens" in text and "fits under the 20 GB cap" in text


def test_the_plan_before_start_shows_the_tiles_the_job_starts_with_on_nvidia(monkeypatch):
    """On NVIDIA the decode keeps room for cuDNN's workspace beside its tiles (memory.vae.cudnn_workspace_reserve):
    the plan shown before Start names the same (smaller) tiles the job then uses; on ROCm and the CPU no room."""
    import torch

    import memory.manager
    from memory.vae import VaeDecodePolicy, cudnn_workspace_reserve, streamed_decode
    from pipeline.resolution import plan_text

    reserve = cudnn_workspace_reserve("cuda")
    assert reserve == 4 << 30 and cudnn_workspace_reserve("cpu") == 0
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert cudnn_workspace_reserve("cuda") == 0
    monkeypatch.setattr(torch.version, "hip", None)

    figures = model_figures(HUNYUAN)
    plain = resolution_cost(figures, 608, 640, 9, 20)
    kept = resolution_cost(figures, 608, 640, 9, 20, workspace_reserve=reserve)
    assert kept.fits and plain.fits and kept.vae_floor == plain.vae_floor    # the reserve never refuses a size
    assert kept.vae_tiling.size < plain.vae_tiling.size                     # 192 px instead of 256 px at 19 latents
    available = 20 * 2**30 - figures.vae_bytes - (512 << 20)

    class _Vae:       # the policy reads only these two attributes
        config = type("C", (), {"block_out_channels": (figures.vae_channels,)})
        dtype = torch.float16

    assert kept.vae_tiling == VaeDecodePolicy(workspace_reserve=reserve).plan(_Vae, (19, 76, 80), available)[0]

    text = lambda: plan_text(HUNYUAN, 20, 640, 0, 0, 9, (608, 640))          # noqa: E731
    monkeypatch.setattr(memory.manager, "default_device", lambda: torch.device("cpu"))
    assert f"{plain.vae_tiling.size}px tiles" in text()
    # on a GPU the job decodes with the streamed decoder (memory/vae_stream.py): the plan shows its grid
    streamed = resolution_cost(figures, 608, 640, 9, 20, workspace_reserve=reserve,
                               stream=streamed_decode("cuda"))
    assert streamed.vae_tiling.describe() == "2×1 tiles, streamed" or \
        streamed.vae_tiling.describe() == "1×2 tiles, streamed"
    assert streamed.vae_tile_bytes + reserve <= available
    monkeypatch.setattr(memory.manager, "default_device", lambda: torch.device("cuda"))
    assert streamed.vae_tiling.describe() in text()


# ---- refusal and the nearest size that fits -------------------------------------------------------------------------
def _fits(preset, hw, cap, window=9):
    return resolution_cost(model_figures(preset), hw[0], hw[1], window, cap).fits


def test_a_resolution_over_the_cap_is_refused_with_the_largest_that_fits():
    image_hw = (1000, 1000)
    size = job_size(*image_hw, 2048)
    error = refusal(size, image_hw, HUNYUAN, 20.0, 9)
    assert error is not None and error.field == "resolution"
    assert "cannot fit" in error.message and "20 GB VRAM cap" in error.message and "transformer" in error.message
    suggested = int(error.message.split("The largest resolution that fits is ")[1].split(" ")[0])
    assert suggested % 16 == 0 and suggested < 2048
    assert refusal(job_size(*image_hw, suggested), image_hw, HUNYUAN, 20.0, 9) is None     # the plan accepts it
    assert not _fits(HUNYUAN, nearest_bucket(*image_hw, suggested + 16), 20.0)           # and it is the nearest
    assert refusal(job_size(*image_hw, 960), image_hw, HUNYUAN, 20.0, 9) is None


def test_a_custom_size_over_the_cap_is_refused_with_the_nearest_of_its_shape():
    size = JobSize(1024, 2048, True, 640)
    error = refusal(size, (1024, 2048), TINY, 3.0, 9)
    assert error is not None and error.field == "custom width" and "VAE decode" in error.message
    text = error.message.split("The nearest size of the same shape that fits is ")[1]
    w, h = (int(v) for v in text.split(" ")[0].split("×"))
    assert (w % 16, h % 16) == (0, 0) and abs(w / h - 2) < 0.05
    assert _fits(TINY, (h, w), 3.0)
    bigger = list(scaled_sizes(1024, 2048))
    assert not _fits(TINY, bigger[bigger.index((h, w)) - 1], 3.0)


def test_check_fits_names_the_field_before_anything_loads():
    prepared = prepare(Request(image=make_image(96, 80), width=2048, height=2048), 64)
    with pytest.raises(InputError) as e:
        check_fits(prepared, TINY, 2.0)
    assert e.value.field == "custom width"
    check_fits(prepared, TINY, 20.0)                             # the same size fits a larger cap
    check_fits(prepare(Request(image=make_image(96, 80)), 64), TINY, 2.0)


# ---- fp8 compute: the blocks' Linears lie on the GPU in fp8 ------------------------------------------------------
def test_fp8_compute_lowers_the_transformer_floor_by_the_kept_bytes():
    """With --fp8-compute the blocks' Linears lie on the GPU in fp8 values and row scales (memory/chunk.py), so
    the floor (the rest, one resident block, the streaming slots, the activations) is lower by what they save in
    the resident block and each slot: 0.63 GiB at 608×640, window 9 (4.79 → 4.15 GiB). Its sizes are the residency
    estimate's (memory/estimate.py): the floor is its plan with every block but the first streamed. With fp8
    storage too, each slot keeps its staging buffer of the stored block (the modulation Linears are stored in fp8
    and turned back to bf16 on the device)."""
    from configs.memory import MEMORY
    from memory.estimate import _chunk_sizes, nominal_transformer_plan
    from memory.plan import REAL_TRANSFORMER_CONFIG, Workload

    plain, stored = _chunk_sizes("transformer", REAL_TRANSFORMER_CONFIG, 2)
    kept, _ = _chunk_sizes("transformer", REAL_TRANSFORMER_CONFIG, 2, kept=True)
    assert kept[0] == plain[0] and kept[1] < plain[1]             # the rest as it was; a dual block smaller
    saved = (1 + MEMORY.prefetch_depth + 1) * (plain[1] - kept[1])   # block 0 and the slots: dual blocks
    floors = {}
    for storage in ("native", "fp8"):
        for compute in (False, True):
            cost = resolution_cost(model_figures(HUNYUAN, storage, compute), 608, 640, 9, 20)
            plan = nominal_transformer_plan(HUNYUAN, 20, 20, Workload(608, 640, 9), storage, compute)
            assert plan.resident == (0,) and cost.transformer_floor == plan.peak_estimate     # one answer
            floors[storage, compute] = cost.transformer_floor
        assert floors[storage, False] - floors[storage, True] == saved
    assert 0.6 * GIB < saved < 0.7 * GIB
    assert floors["native", False] / GIB == pytest.approx(4.79, abs=0.01)
    assert floors["native", True] / GIB == pytest.approx(4.15, abs=0.01)
    assert floors["fp8", True] - floors["native", True] == (MEMORY.prefetch_depth + 1) * max(stored[1:])


def test_a_size_refused_in_bf16_fits_with_fp8_compute_at_every_door():
    """Under the 20 GB cap the bucket of 1904 for a 640×608 image (1808×1904, window 9) needs a transformer floor
    of 20.5 GiB in bf16 but 19.9 GiB with --fp8-compute: refused without it, accepted with it, by the pre-flight
    (jobs/preflight.py: every job), `check_fits` and the page's memory plan alike."""
    from configs.runtime import Config
    from jobs.preflight import Preflight
    from ui.memory_plan import size_line

    image_hw = (608, 640)
    size = job_size(*image_hw, 1904)
    assert (size.height, size.width) == (1808, 1904)
    bf16 = resolution_cost(model_figures(HUNYUAN), 1808, 1904, 9, 20)
    fp8 = resolution_cost(model_figures(HUNYUAN, fp8_compute=True), 1808, 1904, 9, 20)
    assert fp8.transformer_floor <= 20 * GIB < bf16.transformer_floor and fp8.vae_floor <= 20 * GIB

    error = refusal(size, image_hw, HUNYUAN, 20.0, 9)
    assert error is not None and error.field == "resolution" and "transformer" in error.message
    assert refusal(size, image_hw, HUNYUAN, 20.0, 9, fp8_compute=True) is None
    prepared = prepare(Request(image=make_image(640, 608), resolution=1904), 640)
    with pytest.raises(InputError):
        check_fits(prepared, HUNYUAN, 20.0)
    check_fits(prepared, HUNYUAN, 20.0, fp8_compute=True)
    assert "cannot fit" in size_line(HUNYUAN, 20.0, 1904, 0, 0, 9)[1]
    assert "fits under the 20 GB cap" in size_line(HUNYUAN, 20.0, 1904, 0, 0, 9, fp8_compute=True)[1]

    def preflight(fp8_compute: bool) -> Preflight:
        return Preflight(Config(vram_cap_gb=20, host_ram_gb=512, fp8_compute=fp8_compute))

    request = Request(image=make_image(640, 608), resolution=1904)
    with pytest.raises(InputError) as e:
        preflight(False).prepare(request)
    assert e.value.field == "resolution"
    preflight(True).prepare(request)


def test_nothing_fits_a_cap_below_the_smallest_size():
    error = refusal(job_size(100, 100, 640), (100, 100), HUNYUAN, 1.0, 9)
    assert error is not None and "No resolution fits" in error.message and "raise the VRAM cap" in error.message


# ---- jobs at other sizes ----------------------------------------------------------------------------------------
FAST = dict(prompt="a boat", seconds=1.2, steps=2, seed=3, teacache=0.0)


@pytest.mark.parametrize("size", [dict(resolution=128), dict(width=144, height=80)], ids=["bucket-128", "custom"])
def test_a_tiny_job_at_another_size_makes_frames_of_that_size(tiny_original, tmp_path, size):
    from pipeline.events import Done
    from tests.conftest import run_job
    from video.mp4 import read_frames

    events, last = run_job(Request(image=make_image(96, 80), **FAST, **size), tiny_original, tmp_path)
    assert isinstance(last, Done), last
    expected = (112, 128) if "resolution" in size else (80, 144)           # nearest_bucket(80, 96, 128)
    frames = read_frames(last.video)
    assert frames.shape[1:3] == expected
    settings = json.loads((last.job_dir / "job.json").read_text())["settings"]
    assert {k: settings[k] for k in size} == size


# ---- the command line and the page's runner (the /video API goes through it too) -------------------------------------
def test_cli_custom_size_and_refusal_before_models_load(tmp_path):
    from tests.cli_helpers import cli
    from video.mp4 import read_frames

    image = tmp_path / "in.png"
    make_image(160, 120).save(image)
    out = tmp_path / "outputs"
    r = cli("generate", "--preset", "tiny", "--image", image, "--seconds", 1.2, "--steps", 2, "--width", 96,
            "--height", 64, "--out", out)
    assert r.returncode == 0, r.stderr
    (job,) = job_folders(out)
    assert read_frames(job / "final.mp4").shape[1:3] == (64, 96)
    refused = tmp_path / "refused"
    r = cli("generate", "--preset", "tiny", "--image", image, "--resolution", 2048, "--vram-cap-gb", 3,
            "--out", refused)
    assert r.returncode == 2 and r.stderr.startswith("error: --resolution: 2048")
    assert "The largest resolution that fits is" in r.stderr and "Traceback" not in r.stderr
    assert not refused.exists()
    r = cli("generate", "--preset", "tiny", "--image", image, "--width", 96, "--out", refused)
    assert r.returncode == 2 and "--height:" in r.stderr and not refused.exists()


def test_the_runner_refuses_when_queued_and_the_page_plan_says_why(tmp_path, tiny_original):
    from tests.server_helpers import tiny_runner
    from ui.memory_plan import size_line

    runner = tiny_runner(tmp_path / "outputs", tiny_original, cap_gb=2.0)
    with pytest.raises(InputError) as e:
        runner.submit(Request(image=make_image(96, 80), width=1024, height=1024), waited_on=True)
    assert e.value.field == "custom width" and "nearest size of the same shape that fits is" in e.value.message
    assert runner.store.entries() == [] and not any(runner.store.images_root.glob("*"))     # nothing queued
    assert not runner.models.is_loaded("original")

    at_640 = size_line(TINY, 20.0, 640, 0, 0, 9)
    at_960 = size_line(TINY, 20.0, 960, 0, 0, 9)
    assert at_640[0] == (608, 640) and at_960[0] == (912, 960) and at_640[1] != at_960[1]
    assert "960×912 (the bucket of 960)" in at_960[1] and "fits under the 20 GB cap" in at_960[1]
    size, text = size_line(TINY, 2.0, 640, 1024, 1024, 9)
    assert size == (1024, 1024) and text.startswith("⚠ **Size 1024×1024 (custom) cannot fit:**")
    assert "nearest size of the same shape that fits" in text
    assert size_line(TINY, 20.0, 640, 100, 64, 9)[1].startswith("⚠")           # not a multiple of 16
    assert "both" in size_line(TINY, 20.0, 640, 96, 0, 9)[1]
