"""Face restoration as a post step (post/faces.py, GFPGAN v1.3/v1.4's network; post/facedetect.py, RetinaFace):
each face found is aligned, restored by the tiny twin and pasted back, the rest of the frame kept bit for bit; the
published layouts (GFPGAN: 87.1 M parameters, GFPGANv1.4.pth's 332 MiB; the detector's) are recognised; a file in
the real layout is read and run; other architectures, unreadable and missing files are refused naming the field
before anything runs; the step reaches the queue from the pre-flight, the command line and the page's controls; a
default download is kept only with its recorded sha256."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from common.errors import InputError
from post import facedetect, faces
from post.job import PostFolders, prepare, run_post
from post.modelfiles import LOADERS, ModelRef, check_file
from post.process import FACE_TEMPLATE, restore_faces, similarity
from post.steps import parse_step, request_from
from tests.post_helpers import conv_flops, pattern_video, video_shape

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")      # conftest: the tiny networks on one thread


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return pattern_video(tmp_path_factory.mktemp("faces") / "src.mp4", frames=6)


def _save_twin(folder: Path, name: str = "face.safetensors") -> Path:
    """The tiny twin saved in the published layout (flat names; a .pth wrapped in params_ema as BasicSR saves)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in faces.tiny_face_model().state_dict().items()}
    if name.endswith(".safetensors"):
        save_file(state, str(folder / name))
    else:
        torch.save({"params_ema": state}, folder / name)
    return folder / name


def _face_at(x: float, y: float, side: float) -> np.ndarray:
    """The five landmarks of an upright face `side` pixels wide centred at (x, y), where GFPGAN's template has them."""
    return (FACE_TEMPLATE / 512.0 - 0.5) * side + np.array([x, y])


def test_each_found_face_is_aligned_restored_and_pasted_back_and_the_rest_kept_bit_for_bit():
    model = faces.tiny_face_model()
    rng = np.random.default_rng(5)
    frames = [rng.integers(0, 256, (64, 80, 3), dtype=np.uint8) for _ in range(3)]
    spots = {0: [_face_at(24, 28, 32)], 1: [], 2: [_face_at(24, 28, 32), _face_at(60, 40, 24)]}
    ids = {id(f): n for n, f in enumerate(frames)}

    def find(frame):
        return spots[ids[id(frame)]]

    out = restore_faces(model, frames, 1.0, CPU, torch.float32, find)
    assert [f.shape for f in out] == [(64, 80, 3)] * 3 and all(f.dtype == np.uint8 for f in out)
    assert out[1] is frames[1]                                             # no face: the frame as it was
    for n in (0, 2):
        assert np.array_equal(out[n][:, 48:] if n == 0 else out[n][:, 76:], frames[n][:, 48:] if n == 0 else
                              frames[n][:, 76:])                          # away from the faces: bit for bit
        assert np.abs(out[n][20:36, 16:32].astype(int) - frames[n][20:36, 16:32]).mean() > 5   # the model's work
    assert not np.array_equal(out[2][34:46, 54:66], frames[2][34:46, 54:66])                  # the second face
    again = restore_faces(faces.tiny_face_model(), frames, 1.0, CPU, torch.float32, find)
    assert all(np.array_equal(a, b) for a, b in zip(out, again))                             # same bytes each run
    bf16 = restore_faces(faces.tiny_face_model().to(torch.bfloat16), frames, 1.0, CPU, torch.bfloat16, find)
    assert all(f.shape == (64, 80, 3) and np.array_equal(a[:, 76:], f[:, 76:]) for a, f in zip(frames, bf16))
    half = restore_faces(model, frames, 0.5, CPU, torch.float32, find)
    d_full = np.abs(out[0][28, 24].astype(int) - frames[0][28, 24]).sum()
    d_half = np.abs(half[0][28, 24].astype(int) - frames[0][28, 24]).sum()
    assert abs(d_half - d_full / 2) <= 3


def test_the_alignment_recovers_a_similarity_transform():
    angle, scale, shift = 0.3, 1.7, np.array([12.0, -5.0])
    rot = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    src = _face_at(40, 30, 20)
    m = similarity(src, src @ rot.T + shift)
    assert np.allclose(m, np.hstack((rot, shift[:, None])), atol=1e-9)


def test_the_detector_loads_from_facexlibs_layout_and_finds_the_tiny_faces(tmp_path):
    """RetinaFace MobileNet-0.25 with facexlib's names ("module." prefixes as in its file: 426,608 parameters, its
    1.79 MB); another file is refused naming the face detector; the tiny twin finds faces whose five points are
    where GFPGAN's template has them."""
    net = facedetect.tiny_detector()
    state = net.state_dict()
    assert sum(v.numel() for k, v in state.items() if "running" not in k and "num_batches" not in k) == 426_608
    assert {"body.stage1.0.0.weight", "fpn.output1.0.weight", "ssh3.conv7x7_3.1.running_var",
            "LandmarkHead.2.conv1x1.weight"} <= set(state)
    torch.save({"module." + k: v for k, v in state.items()}, tmp_path / "detection_mobilenet0.25_Final.pth")
    assert len(check_file(ModelRef("detector", "detection_mobilenet0.25_Final.pth"), tmp_path)) == 64
    save_file({"conv_first.weight": torch.zeros(8, 3, 3, 3)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(InputError) as e:
        check_file(ModelRef("detector", "other.safetensors"), tmp_path)
    assert e.value.field == "face detector" and "RetinaFace" in str(e.value)
    frame = np.random.default_rng(2).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    found = facedetect.detect(LOADERS["detector"](tmp_path / "detection_mobilenet0.25_Final.pth"), frame, CPU)
    assert 1 <= len(found) <= 8 and all(f.score > facedetect.THRESHOLD for f in found)
    first = found[0]
    side = first.box[2] - first.box[0]
    centre = np.array([(first.box[0] + first.box[2]) / 2, (first.box[1] + first.box[3]) / 2])
    assert np.allclose(first.landmarks, _face_at(*centre, side), atol=0.05 * side)


def test_the_published_gfpgan_layout_is_recognised_at_full_size():
    with torch.device("meta"):
        full = faces.GFPGAN()
    state = full.state_dict()
    assert sum(v.numel() for v in state.values()) == 87_143_276     # × 4 bytes: GFPGANv1.4.pth's 332 MiB (listed)
    assert tuple(state["conv_body_first.weight"].shape) == (32, 3, 1, 1)
    assert tuple(state["final_linear.weight"].shape) == (16 * 512, 256 * 16)
    assert tuple(state["stylegan_decoder.noises.noise14"].shape) == (1, 1, 512, 512)
    assert faces.detect({"params_ema": state})[0] == faces.FaceSpec()


@pytest.mark.parametrize("name", ["face.safetensors", "face.pth"])
def test_a_face_model_file_in_the_real_layout_is_read_checked_and_run(tmp_path, name):
    path = _save_twin(tmp_path, name)
    assert check_file(ModelRef("face", name), tmp_path) and len(check_file(ModelRef("face", name), tmp_path)) == 64
    loaded = LOADERS["face"](path)
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    assert torch.equal(loaded(x), faces.tiny_face_model()(x))


def test_other_architectures_and_bad_files_are_refused_naming_the_face_model_and_never_run(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *a, **k: ran.append(a) or None)
    save_file({"quantize.embedding.weight": torch.zeros(4, 4), "encoder.conv_in.weight": torch.zeros(4, 3, 3, 3)},
              str(tmp_path / "codeformer.safetensors"))
    save_file({"conv_first.weight": torch.zeros(8, 3, 3, 3)}, str(tmp_path / "esrgan.safetensors"))
    state = faces.tiny_face_model().state_dict()
    del state["condition_shift.0.0.weight"]
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "cut.safetensors"))

    class Payload:                      # a pickle that would run code when unpickled unsafely
        def __reduce__(self):
            return (ran.append, ("executed",))

    (tmp_path / "evil.pth").write_bytes(pickle.dumps({"toRGB.0.weight": Payload()}))
    for name, words in (("codeformer.safetensors", "RestoreFormer / CodeFormer) is not supported"),
                        ("esrgan.safetensors", "not a GFPGAN face model"),
                        ("cut.safetensors", "does not fit GFPGAN v1.3/v1.4"),
                        ("evil.pth", "could not be read as a model file"),
                        ("mine.pth", "there is no mine.pth in"),
                        ("../x.pth", "is not a model file name")):
        with pytest.raises(InputError) as e:
            check_file(ModelRef("face", name), tmp_path)
        assert e.value.field == "face model" and words in str(e.value), (name, str(e.value))
    assert not ran


def test_the_faces_step_text():
    assert parse_step("faces").value == 1.0 and parse_step("faces").text() == "faces=1"
    step = parse_step("faces=0.7:GFPGANv1.3.pth")
    assert (step.value, step.model, step.text()) == (0.7, "GFPGANv1.3.pth", "faces=0.7:GFPGANv1.3.pth")
    for text, words in (("faces=2", "choose a strength from 0.05 to 1"), ("faces=x", "is not a number")):
        with pytest.raises(InputError) as e:
            parse_step(text)
        assert e.value.field == "steps" and words in str(e.value)
    with pytest.raises(InputError) as e:
        request_from({"source": "a.mp4", "steps": "faces faces=0.5"})
    assert "faces is given twice" in str(e.value)


def test_a_post_job_restores_faces_with_a_file_and_records_its_hash(tmp_path, source):
    from memory.manager import MemoryManager
    from pipeline.events import Done

    folders = PostFolders(tmp_path / "upscalers", tmp_path / "interpolators", tiny=False)
    with pytest.raises(InputError) as e:                             # refused at the pre-flight, naming the field
        prepare({"source": str(source), "steps": "faces=1:none.pth"}, folders)
    assert e.value.field == "face model" and "there is no none.pth in upscalers/" in str(e.value)
    path = _save_twin(tmp_path / "upscalers")
    torch.save(facedetect.tiny_detector().state_dict(), tmp_path / "upscalers" / "detection_mobilenet0.25_Final.pth")
    checked = prepare({"source": str(source), "steps": "reverse faces=0.8:face.safetensors"}, folders)
    events = list(run_post(checked, MemoryManager(device=CPU), outputs=tmp_path / "out", folders=folders))
    assert isinstance(events[-1], Done) and not events[-1].stopped, events[-1]
    assert video_shape(events[-1].video)[:3] == (6, 64, 48)
    info = json.loads((events[-1].job_dir / "job.json").read_text())
    from common.files import file_sha256

    assert info["models"]["face"] == {"file": "face.safetensors", "sha256": file_sha256(path)}
    assert info["models"]["detector"]["file"] == "detection_mobilenet0.25_Final.pth"
    assert info["settings"]["steps"] == ["reverse", "faces=0.8:face.safetensors"]


def test_the_command_line_and_the_page_controls_make_the_faces_step(tmp_path, source, capsys):
    from cli.commands import main
    from ui.panel_post import DEFAULT_FACE, steps_of

    out = tmp_path / "out"
    assert main(["post", str(source), "--steps", "faces=3", "--outputs", str(out), "--preset", "tiny"]) == 2
    assert "--steps: faces=3: choose a strength from 0.05 to 1" in capsys.readouterr().err
    assert main(["post", str(source), "--steps", "faces=1:none.pth", "--outputs", str(out),
                 "--upscaler-dir", str(tmp_path / "ups")]) == 2
    assert "face model: there is no none.pth in ups/" in capsys.readouterr().err
    assert not out.exists() or not any(d.is_dir() and not d.name.startswith(".") for d in out.iterdir())
    assert main(["post", str(source), "--steps", "faces=0.5", "--outputs", str(out), "--preset", "tiny", "-q"]) == 0
    (job,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert video_shape(job / "final.mp4")[:3] == (6, 64, 48)
    assert steps_of("off", 60, "×2", None, 0, 0, 1, 1, False, False, 0.6, DEFAULT_FACE) == ["faces=0.6", "upscale=2"]
    assert steps_of("off", 60, "off", None, 0, 0, 1, 1, False, False, 1, "mine.pth") == ["faces=1:mine.pth"]
    assert steps_of("off", 60, "off", None, 0, 0, 1, 1, True, False, 0, "mine.pth") == ["pingpong"]


def test_a_default_download_tries_each_address_and_keeps_only_the_published_bytes(tmp_path, monkeypatch):
    """fetch() through file:// addresses (urllib, no network): a failing address is skipped, a file whose sha256 is
    not the recorded one is not kept, the right one is; each default names its verified source."""
    from common.errors import WeightsNotFound
    from common.files import file_sha256
    from post import modelfiles as mf

    assert mf.DOWNLOADS["GFPGANv1.4.pth"].url.endswith("/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth")
    assert all(d.sha256 for n, d in mf.DOWNLOADS.items() if n not in (mf.DEFAULT_RIFE, mf.DEFAULT_DETECTOR))
    good = _save_twin(tmp_path / "src", "good.pth")
    bad = tmp_path / "src" / "bad.pth"
    bad.write_bytes(good.read_bytes()[:-1] + b"x")
    folder = tmp_path / "upscalers"
    missing = (tmp_path / "src" / "none.pth").as_uri()
    monkeypatch.setitem(mf.DOWNLOADS, "GFPGANv1.4.pth",
                        mf.Download("GFPGANv1.4.pth", (missing, bad.as_uri()), file_sha256(good)))
    with pytest.raises(WeightsNotFound) as e:
        mf.fetch(ModelRef("face", "GFPGANv1.4.pth"), folder)
    assert "is not the published file's" in str(e.value) and "URLError" in str(e.value)
    assert sorted(p.name for p in folder.iterdir()) == []                   # nothing half-written is left
    monkeypatch.setitem(mf.DOWNLOADS, "GFPGANv1.4.pth",
                        mf.Download("GFPGANv1.4.pth", (missing, bad.as_uri(), good.as_uri()), file_sha256(good)))
    path = mf.fetch(ModelRef("face", "GFPGANv1.4.pth"), folder)
    assert path.read_bytes() == good.read_bytes() and sorted(p.name for p in folder.iterdir()) == ["GFPGANv1.4.pth"]


def test_faces_too_small_to_restore_are_left_alone():
    """The tiny detector sees a face at every anchor; those of the 16-pixel anchors have eyes 4 pixels apart, under
    GFPGAN's 5: find_faces keeps only the larger ones."""
    frame = np.random.default_rng(3).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    net = facedetect.tiny_detector()
    everything = facedetect.detect(net, frame, CPU, limit=200)
    kept = facedetect.find_faces(net, frame, CPU)
    assert any(f.box[2] - f.box[0] < 20 for f in everything) and kept
    assert all(np.linalg.norm(p[0] - p[1]) >= facedetect.EYES_MIN_PX for p in kept)


def test_the_benchmarks_arithmetic_floor_of_a_face_is_what_the_face_model_computes():
    """benchmarks/post_steps.py's bound for the face step divides by `flop_per_face`: within 1 % of the
    convolutions the model runs on one face (counted op by op, its modulated convolutions included)."""
    model = faces.tiny_face_model()
    side = faces.TINY.size
    counted = conv_flops(model, torch.rand(1, 3, side, side))
    assert counted == pytest.approx(faces.flop_per_face(faces.TINY), rel=0.01)
