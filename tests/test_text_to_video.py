"""Text-to-video (issue 32): no start image, the video starts from seeded noise or a plain colour
(pipeline/text_to_video.py, after FramePack-Studio's "Latent Image")."""
from __future__ import annotations

import pytest
import torch

from common.errors import InputError
from jobfolder.checkpoint import load_checkpoint
from pipeline.events import Done, LogLine
from pipeline.request import Request, prepare
from tests.conftest import make_image, run_job
from video.mp4 import read_frames

FAST = dict(prompt="a lighthouse at dusk", seconds=1.2, steps=2, teacache=0.0, resolution=64)


@pytest.fixture(scope="module")
def noise_job(tiny_original, tmp_path_factory):
    """One text-to-video job from noise (seed 11), shared by the tests below: (events, Done)."""
    return run_job(Request.from_mapping({**FAST, "start_from": "noise", "seed": 11}), tiny_original,
                   tmp_path_factory.mktemp("noise"))


def test_noise_job_runs_to_done_and_writes_a_video(noise_job):
    events, last = noise_job
    assert isinstance(last, Done) and not last.stopped, last
    frames = read_frames(last.video)
    assert frames.shape[1:] == (64, 64, 3) and frames.shape[0] == last.frames > 0     # the resolution's square
    logs = " ".join(e.message for e in events if isinstance(e, LogLine))
    assert "[before VAE decode]" in logs and "[before VAE encode]" not in logs      # noise: the VAE encode skipped
    start = load_checkpoint(last.job_dir)[0]["start_latent"]
    assert start.shape[-2:] == (8, 8) and 0.5 < start.std() < 1.5                  # a standard normal draw


def _latents(components, outputs, **kw):
    _, last = run_job(Request.from_mapping({**FAST, **kw}), components, outputs)
    assert isinstance(last, Done), last
    return load_checkpoint(last.job_dir)[0]


def test_same_seed_same_latents_other_seed_differs(noise_job, tiny_original, tmp_path):
    a = load_checkpoint(noise_job[1].job_dir)[0]
    b = _latents(tiny_original, tmp_path / "b", start_from="noise", seed=11)
    c = _latents(tiny_original, tmp_path / "c", start_from="noise", seed=12)
    assert torch.equal(a["start_latent"], b["start_latent"]) and torch.equal(a["real"], b["real"])
    assert not torch.allclose(a["start_latent"], c["start_latent"]) and not torch.allclose(a["real"], c["real"])


def test_colour_start_is_a_plain_image_of_the_resolution():
    p = prepare(Request.from_mapping({**FAST, "start_from": "green", "resolution": 128}))
    assert (p.height, p.width) == (128, 128) and p.image.getpixel((5, 7)) == (0, 177, 64)
    p = prepare(Request.from_mapping({**FAST, "start_from": "white", "width": 128, "height": 64}))
    assert (p.height, p.width) == (64, 128) and p.image.getextrema() == ((255, 255),) * 3


def test_image_to_video_without_an_image_names_the_field():
    with pytest.raises(InputError) as e:                       # the command line's words
        Request.from_mapping(FAST)
    assert e.value.field == "image" and "missing" in str(e.value) and "--start-from noise" in str(e.value)
    with pytest.raises(InputError) as e:                       # the page's and API's
        prepare(Request(image=None, **FAST))
    assert e.value.field == "image" and "no image given" in str(e.value) and "start from noise" in str(e.value)


def test_text_to_video_refuses_an_image_or_a_video():
    with pytest.raises(InputError) as e:
        prepare(Request.from_mapping({**FAST, "start_from": "noise", "image": make_image(64, 64)}))
    assert e.value.field == "start from" and "remove the start image" in str(e.value)
    with pytest.raises(InputError) as e:
        prepare(Request.from_mapping({**FAST, "start_from": "noise", "input_video": "x.mp4", "mode": "f1"}))
    assert e.value.field == "start from"
    with pytest.raises(InputError) as e:
        Request.from_mapping({**FAST, "start_from": "sepia"})
        prepare(Request.from_mapping({**FAST, "start_from": "sepia"}))
    assert e.value.field == "start from"


def test_the_page_values_start_without_an_image():
    from ui.settings import request_from_values

    p = prepare(request_from_values({"prompt": "a fox", "start_from": "noise", "resolution": 64}))
    assert p.request.image is None and (p.height, p.width) == (64, 64)
    with pytest.raises(InputError) as e:
        prepare(request_from_values({"prompt": "a fox", "resolution": 64}))
    assert e.value.field == "image"
