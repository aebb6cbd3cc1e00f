"""Bad input gets a clear error naming the field, before any model loads; odd image modes are converted."""
from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from common.errors import InputError
from pipeline.buckets import nearest_bucket
from pipeline.images import buckets_for, load_image
from pipeline.request import Request, prepare
from tests.conftest import make_image


@pytest.fixture
def good_png(tmp_path):
    path = tmp_path / "good.png"
    make_image(120, 90).save(path)
    return path


def _error(request: Request) -> InputError:
    with pytest.raises(InputError) as info:
        prepare(request, 64)
    return info.value


def test_buckets_640_table_and_nearest():
    assert (608, 640) in buckets_for(640) and len(buckets_for(640)) == 14
    assert nearest_bucket(1080, 1920) == (480, 832)       # 16:9 wide
    assert nearest_bucket(1920, 1080) == (832, 480)       # 9:16 tall
    assert nearest_bucket(400, 1000) == (416, 960)        # widest
    assert nearest_bucket(1000, 1000) in ((608, 640), (640, 608))
    for h, w in buckets_for(320) + buckets_for(64):
        assert h % 16 == 0 and w % 16 == 0


@pytest.mark.parametrize("field,kwargs,needle", [
    ("seconds", dict(seconds=0), "out of range"),
    ("seconds", dict(seconds=-3), "out of range"),
    ("seconds", dict(seconds=121), "out of range"),
    ("seconds", dict(seconds=math.nan), "finite"),
    ("seconds", dict(seconds=math.inf), "finite"),
    ("seconds", dict(seconds="five"), "not a number"),
    ("steps", dict(steps=0), "out of range"),
    ("steps", dict(steps=101), "out of range"),
    ("steps", dict(steps=2.5), "whole number"),
    ("steps", dict(steps=math.nan), "finite"),
    ("crf", dict(crf=-1), "out of range"),
    ("crf", dict(crf=52), "out of range"),
    ("distilled CFG (gs)", dict(gs=math.nan), "finite"),
    ("CFG", dict(cfg=math.inf), "finite"),
    ("CFG rescale", dict(rescale=1.5), "out of range"),
    ("latent window", dict(latent_window=0), "out of range"),
    ("TeaCache threshold", dict(teacache=-0.1), "out of range"),
    ("seed", dict(seed=-1), "out of range"),
    ("seed", dict(seed=None), "number is required"),
    ("mode", dict(mode="backwards"), "not one of"),
    ("sampler", dict(sampler="ddim"), "not one of"),
    ("resolution", dict(resolution=100), "multiple of 16"),
    ("resolution", dict(resolution=16), "out of range"),
    ("preserved memory (GB)", dict(preserved_gb=math.nan), "finite"),
])
def test_out_of_range_numbers_name_the_field(good_png, field, kwargs, needle):
    err = _error(Request(image=good_png, prompt="x", **kwargs))
    assert err.field == field
    assert needle in err.message


def test_missing_unreadable_and_non_image_files(tmp_path):
    assert "not found" in _error(Request(image=tmp_path / "nope.png")).message
    assert _error(Request(image=None)).field == "image"
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    assert "empty" in _error(Request(image=empty)).message
    text = tmp_path / "notes.png"
    text.write_text("this is not an image")
    err = _error(Request(image=text))
    assert err.field == "image" and "not a PNG, JPEG or WebP image" in err.message
    assert "Error)" not in err.message            # issue 33 item 6: no exception class names ("UnidentifiedImageError")
    truncated = tmp_path / "cut.png"
    good = tmp_path / "full.png"
    make_image(200, 200).save(good)
    truncated.write_bytes(good.read_bytes()[:300])
    assert "not a readable image (damaged or cut short)" in _error(Request(image=truncated)).message
    assert _error(Request(image=tmp_path)).field == "image"                 # a folder


def test_image_size_limits(tmp_path):
    small = tmp_path / "small.png"
    Image.new("RGB", (63, 200)).save(small)
    assert "at least 64" in _error(Request(image=small)).message
    huge = tmp_path / "huge.png"
    Image.new("L", (8193, 64)).save(huge)
    assert "at most 8192" in _error(Request(image=huge)).message


def test_end_image_errors_name_the_end_image(good_png, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff garbage")
    assert _error(Request(image=good_png, end_image=bad)).field == "end image"
    err = _error(Request(image=good_png, end_image=good_png, mode="f1"))
    assert err.field == "end image" and "original" in err.message


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "L", "1", "CMYK", "I;16", "I", "F"])
def test_odd_image_modes_are_converted(tmp_path, mode):
    img = make_image(100, 80).convert("L") if mode in ("I;16", "I", "F") else make_image(100, 80).convert(mode)
    if mode == "I;16":
        img = Image.fromarray((np.asarray(img, dtype=np.uint16) * 257).astype(np.uint16)).convert("I;16")
    elif mode in ("I", "F"):
        img = img.convert(mode)
    ext = "jpg" if mode == "CMYK" else "png"
    path = tmp_path / f"img.{ext}"
    if mode not in ("I", "F"):                            # (files of those modes are TIFFs: not taken)
        img.save(path)
    out = load_image(img if mode in ("I", "F") else path)
    assert out.mode == "RGB" and out.size == (100, 80)
    a = np.asarray(out)
    assert a.std() > 5                                    # content survived the conversion (not all black/white)


def test_transparent_pixels_become_white():
    img = Image.new("RGBA", (64, 64), (255, 0, 0, 0))
    assert np.asarray(load_image(img))[0, 0].tolist() == [255, 255, 255]


def test_nan_array_rejected():
    arr = np.full((64, 64, 3), np.nan, dtype=np.float32)
    with pytest.raises(InputError, match="NaN"):
        load_image(arr)


def test_long_prompt_truncated_with_warning(good_png, caplog):
    prepared = prepare(Request(image=good_png, prompt="word " * 5000), 64)
    assert len(prepared.prompt) == 4000
    assert prepared.warnings and "prompt" in prepared.warnings[0]


def test_lone_surrogate_in_a_prompt_is_refused(good_png):
    """JSON from a browser or script may carry a lone UTF-16 surrogate; the tokenizer would fail mid-job."""
    err = _error(Request(image=good_png, prompt="rain \ud800 on glass"))
    assert err.field == "prompt" and "not valid text" in err.message


def test_unicode_prompt_kept(good_png):
    prompt = "猫が踊る 🐱 — naïve café"
    assert prepare(Request(image=good_png, prompt=prompt), 64).prompt == prompt


def test_bad_input_is_refused_before_a_job_folder_exists(tiny_original, tmp_path):
    """The orchestrator takes only prepared requests: bad input stops at prepare(), before a job folder exists."""
    from tests.conftest import run_job

    out = tmp_path / "outputs"
    with pytest.raises(InputError, match="^image: file not found"):
        run_job(Request(image=tmp_path / "missing.png", prompt="x"), tiny_original, out)
    assert not out.exists()


@pytest.mark.parametrize("kwargs, field, needle", [
    ({"source_job": "20250101-120000-ab12"}, "job to extend", "give the job's folder as the video to extend"),
    ({"image": None, "start_from": "noise", "input_video": "clip.mp4"}, "start from",
     "extending a video starts from its last frame: choose start from 'image'"),
    ({"loop": "on", "input_video": "clip.mp4"}, "loop", "extending a video does not loop"),
    ({"loop": "on", "end_image": "end.png"}, "loop", "a loop ends at its start image, which is its end frame"),
    ({"start_from": "black"}, "start from", "remove the start image, or choose start from 'image' to use it"),
    ({"image": None, "start_from": "white", "end_image": "end.png"}, "end image",
     "text-to-video has no start image to pair an end frame with"),
])
def test_settings_that_contradict_each_other_are_refused_before_any_file_is_read(good_png, kwargs, field, needle):
    """The combinations a job cannot run: each refused naming the field that decides, before an image or a video
    is opened (the paths above do not exist)."""
    err = _error(Request(**{"image": good_png, **kwargs}))
    assert err.field == field and needle in err.message


def test_settings_values_that_are_not_a_job_are_named():
    from pipeline.request import canonical, shown

    with pytest.raises(InputError, match="the settings must be a mapping"):
        Request.from_mapping(["image", "a.png"])
    with pytest.raises(InputError) as e:
        canonical({"latent_window": 9, "window": 5})               # one control under two spellings
    assert e.value.field == "latent window" and "given twice, as 'latent_window' and 'window'" in e.value.message
    assert shown(10 ** 70) == "a number with more than 60 digits" and shown({"a": 1}) == "a dict"
    assert shown("x" * 500).endswith("…") and len(shown("x" * 500)) == 60
    with pytest.raises(InputError, match="text is required, got int"):
        prepare(Request(image="a.png", prompt=5), 64)


def test_arrays_bytes_and_folders_as_images(tmp_path):
    """The Python API takes an array or bytes as well as a path: a float array in 0–1 is scaled, a gray one
    kept, a shape that is no image refused; bytes that are no image are named "the uploaded data"."""
    unit = np.full((64, 64, 3), 0.2, np.float32)
    unit[0, 0] = 1.0
    assert np.asarray(load_image(unit))[:2, 0].tolist() == [[255, 255, 255], [51, 51, 51]]
    assert load_image(np.full((64, 64, 1), 7, np.uint8)).getpixel((0, 0)) == (7, 7, 7)
    with pytest.raises(InputError, match=r"must be H×W, H×W×3 or H×W×4, not \(64, 64, 2\)"):
        load_image(np.zeros((64, 64, 2), np.uint8))
    with pytest.raises(InputError) as e:
        load_image(b"GIF89a not an image we decode")
    assert "the uploaded data is not a PNG, JPEG or WebP image" in e.value.message
    with pytest.raises(InputError, match="is not a file"):
        load_image(tmp_path)
    cut = tmp_path / "cut.png"
    data = (tmp_path / "full.png")
    make_image(96, 80).save(data)
    cut.write_bytes(data.read_bytes()[:200])                        # a PNG that breaks off
    with pytest.raises(InputError, match="is not a readable image \\(damaged or cut short\\)"):
        load_image(cut)
    from pipeline.images import header_pixels

    assert header_pixels(data) == 96 * 80 and header_pixels(tmp_path / "nowhere.png") == 0


def test_an_image_given_as_a_picture_is_held_to_the_same_sides_and_a_unit_float_image_is_scaled():
    with pytest.raises(InputError, match="the image is 32×100; each side needs at least 64 pixels"):
        load_image(Image.new("RGB", (32, 100)))
    with pytest.raises(InputError, match="the image is 8200×64; each side may have at most 8192 pixels"):
        load_image(Image.new("L", (8200, 64)))
    unit = Image.fromarray(np.full((64, 64), 0.5, np.float32), mode="F")      # a float image in 0–1
    assert load_image(unit).getpixel((0, 0)) == (128, 128, 128)
