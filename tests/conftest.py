"""Shared fixtures: tiny real models (built in code, seeded), test images, a job runner that collects events."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]      # the repository (pytest puts it on sys.path: `pythonpath`)

# Nothing at test time touches the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Every job encodes its prompt (tests assert the stages a job runs); tests/test_prompt_cache.py turns the cache on.
os.environ.setdefault("STEADYFRAME_PROMPT_CACHE", "off")


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
def server(tmp_path_factory, tiny_original):
    """The app on the tiny preset, launched in this process on 127.0.0.1, one per test module (a module may define
    its own `server`, as the browser test does)."""
    from tests.server_helpers import launched

    with launched(tmp_path_factory.mktemp("outputs"), tiny_original) as s:
        yield s


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
