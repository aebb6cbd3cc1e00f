"""Shared fixtures: tiny real models (built in code, seeded), test images, a job runner that collects events."""
from __future__ import annotations

import os
from pathlib import Path

# The test workers (pyproject.toml: pytest-xdist, one per core and one more) share the machine's cores: each worker,
# and every app or CLI process it starts, gets its share of PyTorch's threads (at least one). Set before anything imports torch (its thread pool reads it once).
# With every process at the default (one thread per core) the workers' threads fought over the cores: the CPU-heavy
# files took a third longer.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import numpy as np
import pytest
from solo_room import pytest_configure, pytest_runtest_protocol, pytest_unconfigure  # noqa: F401  (hooks)

from ui.settings import use_own_upload_folder

ROOT = Path(__file__).resolve().parents[1]      # the repository (pytest puts it on sys.path: `pythonpath`)

# Nothing at test time touches the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Every job encodes its prompt (tests assert the stages a job runs); tests/test_prompt_cache.py turns the cache on.
os.environ.setdefault("STEADYFRAME_PROMPT_CACHE", "off")
# Each test process (an xdist worker) has an upload folder of its own, as each app has (its apps' folders go inside):
# the same image uploaded to servers of two workers is then two files, and a server that stops deletes only its own.
use_own_upload_folder()


# The long tests: marked `slow` (the quick loop `python -m pytest -m "not slow"` skips them) and given their own time
# limit (pytest-timeout; every other test gets pyproject.toml's default). Keys: a file, or "file::test" (a prefix of
# the test's name). Durations measured on a 2-core machine without a GPU (`--durations`), in the comments.
LONG_TESTS = {
    "test_resume.py": 900,                                          # kills and resumes CLI jobs: 30-90 s each
    "test_browser.py": 1200,                                        # the app in its own process + Chromium
    "test_server_soak.py": 1800,                                    # 13 jobs in a row
    "test_server_fuzz.py": 1200,
    "test_server_survival.py": 900,
    "test_server_inputs.py": 900,
    "test_server_security.py": 900,
    "test_server_resume.py": 900,
    "test_newcomer.py::test_cli_progress_bar_names_the_stage": 600,     # 58 s
    "test_newcomer.py::test_installer_does_nothing": 600,              # 29 s
    "test_newcomer.py::test_the_app_says_at_start": 600,               # 19 s
    "test_cli.py": 600,                                             # the CLI in its own process: 8-20 s each
    # Whole tiny jobs, child processes and benchmarks (each 5-40 s idle, up to 100 s on a busy machine): the full
    # suite runs them; the quick loop keeps the logic, planning, checks and unit tests.
    "test_prompt_cache.py": 600,
    "test_split.py": 600,                   # processes joined by torch.distributed (gloo), whole split jobs
    "test_generate.py": 600,
    "test_runner.py": 600,
    "test_parity_diffusers.py": 600,
    "test_fp8.py": 600,
    "test_host_loading.py": 600,
    "test_oom.py": 600,
    "test_rocm_probe.py": 600,
    "test_rocm_persistence.py": 600,
    "test_rocm_benchmark.py": 600,
    "test_vae_decode_benchmark.py": 600,
    "test_rocm_coverage.py": 600,
    "test_validation_once.py": 600,
    "test_errors_cause.py::test_the_cli_logs": 600,
    "test_patches.py::test_a_job_": 600,
    "test_patches.py::test_the_job_uses": 600,
    "test_video.py::test_a_job_samples": 600,
    "test_memory_stages.py::test_job_": 600,
    "test_rocm_doctor.py::test_json_report_with_small_probe": 600,
    "test_newcomer.py::test_cli_messages": 600,
    "test_newcomer.py::test_resuming_a_complete_job": 600,
    "test_newcomer.py::test_a_failed_job_pops_up": 600,
}


def long_test_limit(item) -> int | None:
    name = f"{item.path.name}::{item.name}"
    return next((limit for key, limit in LONG_TESTS.items()
                 if name.startswith(key if "::" in key else key + "::")), None)


# The test files that take longest (their tests together, on a 2-core machine: a whole-suite run of 2026-11-28),
# longest first: the suite runs on two workers (pytest-xdist, whole files to one worker: pyproject.toml), which take
# files in this order first, then the others, so neither waits long for the other at the end. pyproject.toml turns
# off xdist's own reordering (`--no-loadscope-reorder`: by default it sorts files by their number of tests, which put
# the long one-test files last and undid this order).
LONGEST_FILES = ("test_browser_ui.py", "test_farm.py", "test_kill_anywhere.py", "test_server_fuzz.py",
                 "test_rocm_probe.py", "test_server_abuse.py", "test_browser.py", "test_server_soak.py",
                 "test_split.py", "test_one_queue.py", "test_compiled.py", "test_resume.py",
                 "test_browser_contrast.py", "test_browser_queue_line.py", "test_video.py", "test_newcomer.py",
                 "test_server_resume.py", "test_browser_follow.py", "test_queue_api.py", "test_rocm_verdicts.py",
                 "test_server_survival.py", "test_faults.py", "test_browser_lora.py", "test_clean_stop.py",
                 "test_queue_line.py", "test_done_verified.py", "test_host_loading.py", "test_lora.py",
                 "test_server_inputs.py", "test_lease.py", "test_browser_keyframes.py", "test_browser_post.py",
                 "test_extend_resume.py", "test_oom.py", "test_generate.py", "test_extend.py",
                 "test_browser_queue.py", "test_timeline.py", "test_extend_modes.py", "test_runner.py",
                 "test_parity_diffusers.py", "test_server_security.py", "test_parking.py", "test_batch_restart.py",
                 "test_browser_timeline.py", "test_api_features.py", "test_browser_buckets.py",
                 "test_browser_extend.py", "test_buckets.py", "test_repeat_job.py", "test_cli.py",
                 "test_validation_once.py", "test_doors.py", "test_keyframes.py", "test_prompt_cache.py",
                 "test_queue_damage.py", "test_post.py", "test_layering.py", "test_cli_interrupted.py")


def pytest_xdist_auto_num_workers(config):
    """The workers of `-n auto` (pyproject.toml): one per core and one more. The suite's tests wait a fifth of their
    time (timers, idle checks, servers starting, sweeps), and a third worker fills those waits: on 2 cores the whole
    suite took 560 s against 624 s on two workers (both cores busy 95 % of the run against 84 %; 2026-12-02)."""
    return max(2, len(os.sched_getaffinity(0)) + 1) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))      # stable: file order kept within a rank
    for item in items:
        limit = long_test_limit(item)
        if limit is None:
            continue
        item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))


def job_folders(outputs) -> list[Path]:
    """The job folders of an outputs folder, in name (= time) order: not the app's own hidden ones (.queue, the
    queue's database and copies; .examples; a .partial folder being made)."""
    outputs = Path(outputs)
    if not outputs.is_dir():
        return []
    return sorted(d for d in outputs.iterdir() if d.is_dir() and not d.name.startswith("."))


def uploaded(path) -> str:
    """A copy of the file `path` in Gradio's upload folder, as an upload through the page or the API leaves it (the
    app takes files from clients only from there: ui/settings.py client_file)."""
    import secrets
    import shutil

    from gradio.utils import get_upload_folder

    folder = Path(get_upload_folder()) / f"test-{secrets.token_hex(8)}"
    folder.mkdir(parents=True)
    return str(Path(shutil.copy(path, folder / Path(path).name)).resolve())


def make_image(width: int = 96, height: int = 80, seed: int = 0, mode: str = "RGB"):
    from PIL import Image

    rng = np.random.RandomState(seed)
    # Smooth content (gradients + blobs) rather than pure noise, so the VAE sees image-like input.
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1)
    base += 0.15 * rng.rand(1, 1, 3) + 0.05 * rng.rand(height, width, 3)
    arr = (np.clip(base, 0, 1) * 255).astype(np.uint8)
    img = Image.fromarray(arr, "RGB")
    return img.convert(mode) if mode != "RGB" else img


@pytest.fixture(scope="session")
def tiny_original():
    from pipeline.components import load_components

    return load_components("tiny", "original")


@pytest.fixture(scope="session")
def tiny_f1():
    from pipeline.components import load_components

    return load_components("tiny", "f1")


@pytest.fixture(scope="module")
def one_torch_thread():
    """PyTorch on one CPU thread while a test module runs, for the modules of tiny networks run many times
    (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): with the suite's two workers on two cores, more
    threads only wait for each other (a tiny RIFE batch took 1.5 s on two threads of a busy machine, 0.05 s on one)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved(tiny_original, tmp_path_factory):
    """The tiny models saved where the real repos keep them (tests/model_helpers.py save_like_repos), for tests that
    load the real preset's way from files (modules that need them saved otherwise name theirs for how: test_llama_trim's
    `saved_bf16_llama`, test_repeat_job's `saved_in_load_dtypes`)."""
    from tests.model_helpers import save_like_repos

    root = tmp_path_factory.mktemp("models")
    save_like_repos(tiny_original, root)
    return root


@pytest.fixture(scope="module")
def server_argv() -> tuple[str, ...]:
    """More of the app's command-line options for `server` (none; a module overrides this fixture, as the LoRA
    browser test does with its --lora-dir)."""
    return ()


@pytest.fixture(scope="module")
def server(request, server_argv, tmp_path_factory):
    """The app on the tiny preset, launched in this process on 127.0.0.1, one per test module. A module sets
    `SERVER_MODE = "f1"` for the F1 models (default: the original ones), and overrides `server_argv` for more
    options. (tests/test_browser.py starts the app in its own process instead: its `app_in_own_process`.)"""
    from tests.server_helpers import launched

    mode = getattr(request.module, "SERVER_MODE", "original")
    components = request.getfixturevalue("tiny_f1" if mode == "f1" else "tiny_original")
    with launched(tmp_path_factory.mktemp("outputs"), components, *server_argv) as s:
        yield s


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """A 96×80 start image as a PNG file, one per test module (tests must not change it; a test that deletes it or
    writes beside it takes a copy of its own). At the tiny preset's resolution it is in the 64×48 bucket, as a
    128×96 image is."""
    from tests.server_helpers import saved_image

    return saved_image(tmp_path_factory, 96, 80, seed=4)


@pytest.fixture(scope="module")
def client(server, tmp_path_factory):
    """A gradio_client for `server`."""
    c = server.client(tmp_path_factory.mktemp("downloads"))
    yield c
    c.close()


def run_job(request, components, outputs, memory=None, cancel=None):
    """Prepare `request` as the UI and the CLI do (checked, images decoded once) and run the job to its end;
    returns (events, final event)."""
    from pipeline.orchestrator import generate
    from pipeline.request import prepare

    prepared = prepare(request, components.preset.default_resolution)
    events = list(generate(prepared, components, memory, cancel=cancel, outputs=outputs))
    return events, events[-1]


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for a browser test module (tests/browser_helpers.chromium), closed after it."""
    from tests.browser_helpers import chromium

    yield from chromium()
