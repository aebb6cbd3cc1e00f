"""A battery of bad inputs through the app's API (gradio_client against the launched app on 127.0.0.1): each one is
answered with a message that names the field, no job folder is made for it, and the server keeps serving; odd but
valid images (RGBA, CMYK, 16-bit, palette, grayscale) and odd prompts (unicode, 10k characters) make videos."""
from __future__ import annotations

import json
import re
import struct
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
from PIL import Image

from configs import LIMITS
from tests.conftest import make_image
from tests.server_helpers import JOB_ID, job_info, temp_leftovers

GOOD = dict(prompt="a boat drifts on a calm lake", seconds=1.2, steps=1, seed=3)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(width: int, height: int, *, complete: bool) -> bytes:
    """A 1-bit PNG of width×height. complete=True: every row is there (all zeros: a few hundred kB that decode
    to width×height pixels); False: only the header claims the size."""
    head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
    z = zlib.compressobj(9)
    row = b"\x00" * (1 + (width + 7) // 8)
    rows = height if complete else 4
    data = b"".join(z.compress(row * 1000) for _ in range(rows // 1000)) + z.compress(row * (rows % 1000))
    return head + _chunk(b"IDAT", data + z.flush()) + _chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    make_image(96, 80).save(d / "good.png")
    rng = np.random.RandomState(0)
    (d / "random.png").write_bytes(rng.bytes(4096))
    (d / "empty.png").write_bytes(b"")
    whole = (d / "good.png").read_bytes()
    (d / "truncated.png").write_bytes(whole[: len(whole) // 2])
    (d / "text.jpg").write_text("this is a text file, not a JPEG\n" * 20)
    Image.new("RGB", (9000, 64), (30, 90, 160)).save(d / "wide.png")
    (d / "bomb.png").write_bytes(png_bomb(30000, 30000, complete=True))
    (d / "header_only.png").write_bytes(png_bomb(9000, 8000, complete=False))
    make_image(63, 100).save(d / "small.png")
    make_image(96, 80).convert("RGBA").save(d / "rgba.png")
    rgba = np.asarray(make_image(96, 80).convert("RGBA")).copy()
    rgba[:, :40, 3] = 0                                                    # half transparent
    Image.fromarray(rgba, "RGBA").save(d / "rgba.png")
    make_image(96, 80).convert("CMYK").save(d / "cmyk.jpg")
    gray16 = (np.asarray(make_image(96, 80).convert("L"), dtype=np.uint16) * 257)
    Image.fromarray(gray16.astype(np.uint16)).save(d / "gray16.png")
    assert Image.open(d / "gray16.png").mode.startswith("I;16")
    make_image(96, 80).convert("P", palette=Image.ADAPTIVE, colors=16).save(d / "palette.png")
    make_image(96, 80).convert("L").save(d / "gray.webp")
    return d


def _file(files, name):
    from gradio_client import handle_file

    return handle_file(str(files / name))


# (id, changes to a good request, what the message must contain: the field first)
REFUSED = [
    ("random-bytes", {"image": "random.png"}, ["image:", "random.png is not a PNG, JPEG or WebP image",
                                               "Upload a PNG, JPEG or WebP image"]),
    ("empty-file", {"image": "empty.png"}, ["image:", "empty.png is empty (0 bytes)"]),
    ("truncated-png", {"image": "truncated.png"}, ["image:", "not a readable image"]),
    ("text-named-jpg", {"image": "text.jpg"}, ["image:", "text.jpg is not a PNG, JPEG or WebP image"]),
    ("9000x64", {"image": "wide.png"}, ["image:", "9000×64", "at most 8192 pixels"]),
    ("bomb-30000x30000", {"image": "bomb.png"}, ["image:", "decompression bomb guard"]),
    ("header-claims-9000x8000", {"image": "header_only.png"}, ["image:", "9000×8000 pixels", "limit is 8192×8192"]),
    ("63px", {"image": "small.png"}, ["image:", "63×100", "at least 64 pixels"]),
    ("broken-end-image", {"end_image": "random.png"}, ["end image:", "random.png is not a PNG, JPEG or WebP image"]),
    ("no-image", {"image": None}, ["image:", "no image given"]),
    ("end-image-with-f1", {"end_image": "good.png", "mode": "f1"}, ["end image:", "only the original mode"]),
    ("seconds-0", {"seconds": 0}, ["seconds:", "out of range", "between 1 and 120"]),
    ("seconds-0.5", {"seconds": 0.5}, ["seconds:", "0.5 is out of range", "between 1 and 120"]),
    ("seconds-negative", {"seconds": -1}, ["seconds:", "-1 is out of range"]),
    ("seconds-121", {"seconds": 121}, ["seconds:", "121 is out of range"]),
    ("seconds-nan", {"seconds": "nan"}, ["seconds:", "nan is not a finite number"]),
    ("seconds-inf", {"seconds": "inf"}, ["seconds:", "inf is not a finite number"]),
    ("seconds-text", {"seconds": "five"}, ["seconds:", "'five' is not a number"]),
    ("steps-0", {"steps": 0}, ["steps:", "0 is out of range"]),
    ("steps-1000", {"steps": 1000}, ["steps:", "1000 is out of range", "between 1 and 100"]),
    ("steps-2.5", {"steps": 2.5}, ["steps:", "2.5 must be a whole number"]),
    ("crf-negative", {"crf": -1}, ["crf:", "-1 is out of range"]),
    ("crf-52", {"crf": 52}, ["crf:", "52 is out of range", "between 0 and 51"]),
    ("gs-nan", {"gs": "NaN"}, ["distilled CFG (gs):", "not a finite number"]),
    ("seed-negative", {"seed": -5}, ["seed:", "-5 is out of range"]),
    ("seed-huge", {"seed": 2**70}, ["seed:", "out of range"]),
    ("mode-unknown", {"mode": "sideways"}, ["mode:", "'sideways' is not one of original, f1"]),
    ("sampler-unknown", {"sampler": "dpm++"}, ["sampler:", "'dpm++' is not one of unipc, unipc_bh2, euler"]),
    ("resolution-not-16", {"resolution": 100}, ["resolution:", "100 is not a multiple of 16"]),
    ("prompt-not-text", {"prompt": 12345}, ["prompt:", "text is required, got int"]),
    ("teacache-2", {"teacache": 2}, ["TeaCache threshold:", "out of range"]),
]


@pytest.mark.parametrize("changes,expected", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_bad_input_is_refused_naming_the_field(server, client, files, changes, expected):
    from gradio_client.exceptions import AppError

    values = dict(GOOD, image=_file(files, "good.png"))
    values.update({k: _file(files, v) if k in ("image", "end_image") and v else v for k, v in changes.items()})
    before = server.jobs()
    with pytest.raises(AppError) as e:
        client.predict(**values, api_name="/video")
    message = str(e.value)
    assert message.startswith(expected[0]), message
    for part in expected[1:]:
        assert part in message, message
    assert server.jobs() == before                          # nothing was started: no job folder
    assert not server.runner.busy


def _call(server, data) -> tuple[int, str]:
    """POST /gradio_api/call/video with a raw JSON body (what a non-Python client may send), then read the result
    stream; returns (HTTP status, body)."""
    base = server.url.rstrip("/")
    body = data if isinstance(data, bytes) else json.dumps({"data": data}).encode()
    request = urllib.request.Request(base + "/gradio_api/call/video", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            event = json.loads(r.read())["event_id"]
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    with urllib.request.urlopen(f"{base}/gradio_api/call/video/{event}", timeout=60) as r:
        return r.status, r.read().decode()


def test_raw_json_nan_infinity_and_missing_fields(server):
    from ui import settings as st

    values = dict(st.default_values(64), prompt="p", seed=1, seconds=1.2, latent_window=1, steps=10)
    row = [values.get(name) for name in st.CONTROLS]       # the endpoint's inputs, in order; uploads None
    assert json.dumps(row).count(", 1.2,") == 1
    before = server.jobs()
    for literal in ("NaN", "Infinity", "-Infinity"):       # JSON extensions Python's json and JavaScript emit
        body = json.dumps({"data": row}).replace(", 1.2,", f", {literal},").encode()
        status, text = _call(server, body)
        assert "event: error" in text and "seconds: " in text and "is not a finite number" in text, text
    status, text = _call(server, row[:3])                  # fields missing: Gradio itself says how many
    assert "event: error" in text and f"needed: {len(row)}, got: 3" in text, text
    status, text = _call(server, b'{"no data": 1}')
    assert status == 422 and "data" in text
    # a file "uploaded" by naming a server path is refused by Gradio before our code sees it
    status, text = _call(server, [{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}] + row[1:])
    assert "event: error" in text and "not uploaded by a user" in text, text
    assert server.jobs() == before


def test_upload_over_the_size_limit_is_refused(server, client, tmp_path):
    big = tmp_path / "big.png"
    with open(big, "wb") as f:                             # sparse: costs no disk
        f.write(b"\x89PNG\r\n\x1a\n")
        f.truncate(LIMITS.upload_bytes_max + 1)
    with pytest.raises(ValueError, match=r"big\.png exceeds the maximum file size of 67108864 bytes"):
        client.predict(**dict(GOOD, image=_file(tmp_path, "big.png")), api_name="/video")   # refused by the client
    # and by the server, for clients that do not check (a multipart upload, as a browser sends it)
    boundary = "sfboundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.png\"\r\n"
            "Content-Type: image/png\r\n\r\n").encode()
    with open(big, "rb") as f:
        body = head + f.read() + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(server.url + "gradio_api/upload", data=body,
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=60)
    assert e.value.code == 413
    assert f"maximum allowed size of {LIMITS.upload_bytes_max} bytes" in e.value.read().decode()


ACCEPTED = [
    ("rgba", {"image": "rgba.png"}),
    ("cmyk-jpeg", {"image": "cmyk.jpg"}),
    ("16-bit-gray", {"image": "gray16.png"}),
    ("palette", {"image": "palette.png"}),
    ("gray-webp-end-image", {"end_image": "gray.webp"}),
    ("unicode-prompt", {"prompt": "Ein Fuchs 🦊 läuft durch den Schnee — 雪の中を歩く ../../etc/passwd \\ : * ? <>|"}),
    ("10k-prompt", {"prompt": "a slow pan over snowy mountains, " * 304}),
]


@pytest.mark.parametrize("changes", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_odd_but_valid_input_makes_a_video(server, client, files, changes):
    values = dict(GOOD, image=_file(files, "good.png"))
    values.update({k: _file(files, v) if k in ("image", "end_image") else v for k, v in changes.items()})
    video, summary = client.predict(**values, api_name="/video")
    assert summary["status"] == "done" and summary["frames"] == 37, summary
    assert re.match(JOB_ID, summary["job_id"])              # the folder name is generated, never user text
    job = server.outputs / summary["job_id"]
    info = job_info(job)
    assert info["status"] == "done" and (job / "final.mp4").is_file() and (job / "input.png").is_file()
    assert open(video, "rb").read() == (job / "final.mp4").read_bytes()
    prompt = values["prompt"]
    if len(prompt) > LIMITS.prompt_chars_max:
        assert info["settings"]["prompt"] == prompt[:LIMITS.prompt_chars_max]
        assert any(f"{len(prompt)} characters; only the first {LIMITS.prompt_chars_max} are used" in w
                   for w in summary["warnings"]), summary
    else:
        assert info["settings"]["prompt"] == prompt and summary["warnings"] == []
    # only job folders, the example images and the (emptied) staging folder
    assert {p.name for p in server.outputs.iterdir()} - {".examples", ".staged", ".queue"} == {d.name for d in server.jobs()}
    assert not any((server.outputs / ".staged").glob("*"))
    assert not temp_leftovers(server.outputs)


def test_after_the_battery_the_server_still_serves(server, client, files):
    video, summary = client.predict(**dict(GOOD, image=_file(files, "good.png"), seconds=2.4, steps=2),
                                    api_name="/video")
    assert summary["status"] == "done" and summary["frames"] == 73
    with urllib.request.urlopen(server.url, timeout=20) as r:
        assert r.status == 200
