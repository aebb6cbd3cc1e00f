"""The post steps' model files: where they are, which are downloaded by default, how they are read (safely) and
checked, and the hash job.json records for each.

- Upscalers: any ESRGAN-family file (.pth, .pt, .safetensors) the user drops in the upscalers folder (`--upscaler-dir`,
  default `upscalers/`), named by its file name; the default for ×2 and ×4 is Real-ESRGAN's own release, downloaded
  into that folder on first use.
- Interpolation: RIFE 4.25 (`flownet.pkl`, a state dict), in the interpolators folder (`--interpolator-dir`,
  default `interpolators/`); downloaded there on first use as `rife-4.25.pth` unless a file is given.
- Face restoration: a GFPGAN v1.3 / v1.4 file (post/faces.py) in the upscalers folder; the default is GFPGAN's own
  release `GFPGANv1.4.pth`, downloaded there on first use, as is the face detector it needs
  (`detection_mobilenet0.25_Final.pth`, facexlib's RetinaFace: post/facedetect.py).
- The tiny preset's models are built in code (random, same classes): nothing is read or downloaded.

Files are read with `torch.load(..., weights_only=True)` (tensors only, never code) or safetensors. The one
pre-flight (`check_models`) reads every named file and recognises its architecture before a job is queued; a
default not downloaded yet is checked when the job downloads it. Light at import (no torch): the pre-flight and
the command line import it before any model loads.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from common.errors import InputError, WeightsNotFound
from common.files import file_sha256

log = logging.getLogger(__name__)

SUFFIXES = (".pth", ".pt", ".pkl", ".safetensors")
FILE_BYTES_MAX = 2 << 30            # an upscaler or flow network is well under this; larger is not one of them
DEFAULT_RIFE = "rife-4.25.pth"
DEFAULT_FACE = "GFPGANv1.4.pth"
DEFAULT_DETECTOR = "detection_mobilenet0.25_Final.pth"      # the face step's face finder (post/facedetect.py)


@dataclass(frozen=True)
class Download:
    """A default model file: its name in its folder, where it is published (tried in order), and its sha256 where
    it is known (checked before the file is kept)."""
    name: str
    urls: tuple[str, ...]
    sha256: str | None = None

    @property
    def url(self) -> str:
        return self.urls[0]


# Each default checked against its source (the `search` / `fetch` tools, 2026-11-28; the commits read are named):
# - RealESRGAN_x2plus.pth / RealESRGAN_x4plus.pth: xinntao/Real-ESRGAN (BSD-3-Clause, LICENSE), the addresses that
#   its inference_realesrgan.py downloads (commit a4abfb2, lines 62 and 74) and docs/model_zoo.md lists; RRDBNet,
#   64 features, 23 blocks, scale 2 / 4. Real-ESRGAN publishes no checksum; the sha256 below are the ones that
#   other projects pin for these exact addresses (ten files of several projects for each, all agreeing; 67,040,989
#   and 67,061,725 bytes).
# - GFPGANv1.4.pth: TencentARC/GFPGAN (Apache-2.0, LICENSE), the address of its README's model list and of
#   inference_gfpgan.py's `--version 1.4` (commit 7552a77, line 101: the v1.3.0 release, not v1.3.4); arch "clean",
#   channel multiplier 2 (post/faces.py). No checksum published upstream; the sha256 is the one two independent
#   projects pin for that address.
# - detection_mobilenet0.25_Final.pth: facexlib's RetinaFace MobileNet-0.25 (xinntao/facexlib, MIT, LICENSE), the
#   address facexlib's init_detection_model downloads it from (facexlib/detection/__init__.py at commit 260620a);
#   1,789,735 bytes as another project records it; no checksum published: it is run only if it loads strictly
#   (post/facedetect.py).
# - rife-4.25.pth: Practical-RIFE 4.25 (hzwer/Practical-RIFE, MIT; README at commit 17d8c7a: "4.25 - 2024.09.19",
#   published only on Google Drive / Baidu as flownet.pkl, which no program can fetch without a session). The
#   GitHub mirrors that RIFE tools download it from as rife425.pth: NevermindNilas/TAS-Models-Host's `main` release
#   (TheAnimeScripter's model registry, src/model/registry.py at cf75789: TASURL + "rife425.pth") first, then
#   styler00dollar/VSGAN-tensorrt-docker's `models` release (the address used before; VSGAN's own tree does not name
#   this file, only third-party downloaders do). No checksum is published for either; the file is run only if it
#   loads strictly as RIFE 4.25's IFNet (post/rife.py).
DOWNLOADS = {
    "RealESRGAN_x2plus.pth": Download(
        "RealESRGAN_x2plus.pth", ("https://github.com/xinntao/Real-ESRGAN/releases/download/v0.2.1/RealESRGAN_x2plus.pth",),
        "49fafd45f8fd7aa8d31ab2a22d14d91b536c34494a5cfe31eb5d89c2fa266abb"),
    "RealESRGAN_x4plus.pth": Download(
        "RealESRGAN_x4plus.pth", ("https://github.com/xinntao/Real-ESRGAN/releases/download/v0.1.0/RealESRGAN_x4plus.pth",),
        "4fa0d38905f75ac06eb49a7951b426670021be3018265fd191d2125df9d682f1"),
    DEFAULT_FACE: Download(
        DEFAULT_FACE, ("https://github.com/TencentARC/GFPGAN/releases/download/v1.3.0/GFPGANv1.4.pth",),
        "e2cd4703ab14f4d01fd1383a8a8b266f9a5833dacee8e6a79d3bf21a1b6be5ad"),
    DEFAULT_DETECTOR: Download(
        DEFAULT_DETECTOR, ("https://github.com/xinntao/facexlib/releases/download/v0.1.0/"
                           "detection_mobilenet0.25_Final.pth",)),
    DEFAULT_RIFE: Download(
        DEFAULT_RIFE, ("https://github.com/NevermindNilas/TAS-Models-Host/releases/download/main/rife425.pth",
                       "https://github.com/styler00dollar/VSGAN-tensorrt-docker/releases/download/models/rife425.pth")),
}
DEFAULT_UPSCALER = {2: "RealESRGAN_x2plus.pth", 4: "RealESRGAN_x4plus.pth"}


@dataclass(frozen=True)
class ModelRef:
    """A step's model: its kind ("upscaler" | "interpolator" | "face"), its file name. Face models live in the
    upscalers folder (image-to-image files, as ComfyUI's upscale_models folder holds GFPGAN too)."""
    kind: str
    name: str

    def folder(self, upscaler_dir: Path, interpolator_dir: Path) -> Path:
        return Path(interpolator_dir if self.kind == "interpolator" else upscaler_dir)


FIELDS = {"upscaler": "upscaler", "interpolator": "interpolation model", "face": "face model",
          "detector": "face detector"}


def model_field(kind: str) -> str:
    return FIELDS[kind]


def resolve(ref: ModelRef, folder: Path) -> Path:
    """The file of a named model in its folder (InputError naming the field: a bad name, a missing file that is no
    default). A default not downloaded yet resolves to where it will be."""
    field = model_field(ref.kind)
    name = ref.name
    if not name or "/" in name or "\\" in name or name.startswith(".") or Path(name).suffix.lower() not in SUFFIXES:
        raise InputError(field, f"{name!r} is not a model file name; give the name of a {', '.join(SUFFIXES)} file "
                                f"in {Path(folder).name}/")
    path = Path(folder) / name
    if not path.is_file() and name not in DOWNLOADS:
        there = sorted(p.name for p in Path(folder).glob("*") if p.suffix.lower() in SUFFIXES) \
            if Path(folder).is_dir() else []
        raise InputError(field, f"there is no {name} in {Path(folder).name}/ (found: "
                                f"{', '.join(there[:8]) or 'nothing'}); put the file there or leave the default")
    return path


def read_state(path: Path, field: str) -> dict:
    """A model file's tensors by name, read safely; InputError naming the field when it cannot be."""
    import torch

    path = Path(path)
    size = path.stat().st_size
    if size > FILE_BYTES_MAX:
        raise InputError(field, f"{{file}} is {size / 1e9:.1f} GB, larger than any model of this kind", path=path)
    try:
        if path.suffix.lower() == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 — any unreadable file is the same answer for the user
        log.info("model file %s unreadable: %s", path, e)
        raise InputError(field, "{file} could not be read as a model file (tensors only: a .safetensors file or a "
                                "PyTorch state dict)", path=path) from None
    if not isinstance(state, dict):
        raise InputError(field, "{file} holds no state dict", path=path)
    return state


def _built(path: Path, field: str, build):
    """`build(state)` of the file's state dict; a file that is not that architecture (ValueError, which
    UnknownArchitecture is) becomes an InputError naming `field` -- nothing of it was run."""
    try:
        return build(read_state(path, field))
    except ValueError as e:
        raise InputError(field, f"{{file}}: {e}", path=path) from None


def load_upscaler(path: Path):
    """(model, spec) of an upscaler file; InputError naming "upscaler" for an unknown architecture (never run)."""
    from post.esrgan import upscaler_from_state

    return _built(path, "upscaler", upscaler_from_state)


def load_interpolator(path: Path):
    from post.rife import ifnet_from_state

    return _built(path, "interpolation model", ifnet_from_state)


def load_face_model(path: Path):
    """The face model of a file (GFPGAN v1.3 / v1.4); InputError naming "face model" for any other architecture
    (never run)."""
    from post.faces import face_model_from_state

    return _built(path, "face model", face_model_from_state)


def load_detector(path: Path):
    """The face detector of a file (facexlib's RetinaFace MobileNet-0.25); InputError naming "face detector"."""
    from post.facedetect import detector_from_state

    return _built(path, "face detector", detector_from_state)


LOADERS = {"upscaler": load_upscaler, "interpolator": load_interpolator, "face": load_face_model,
           "detector": load_detector}


def fetch(ref: ModelRef, folder: Path) -> Path:
    """The model's file, downloaded into its folder first if it is a default that is not there yet: each published
    address in turn, to a temporary name, kept only when its sha256 is the recorded one (where one is recorded)."""
    path = resolve(ref, folder)
    if path.is_file():
        return path
    download = DOWNLOADS[ref.name]
    Path(folder).mkdir(parents=True, exist_ok=True)
    from torch.hub import download_url_to_file

    partial = path.with_name(f".{path.name}.download")
    failures = []
    for url in download.urls:
        log.info("downloading %s from %s (first use)", download.name, url)
        try:
            download_url_to_file(url, str(partial), progress=False)
        except Exception as e:  # noqa: BLE001 — no network, a moved file: the next address, then one message
            failures.append(f"{url}: {type(e).__name__}")
            continue
        sha = file_sha256(partial)
        if download.sha256 is not None and sha != download.sha256:
            partial.unlink(missing_ok=True)
            failures.append(f"{url}: sha256 {sha[:12]}… is not the published file's {download.sha256[:12]}…")
            continue
        partial.replace(path)
        return path
    raise WeightsNotFound(f"{model_field(ref.kind)}: {download.name} is not in {Path(folder)} and could not be "
                          f"downloaded ({'; '.join(failures)}); download it from {download.url} into that folder")


def check_file(ref: ModelRef, folder: Path) -> str | None:
    """The pre-flight's check of one model: the file read and its architecture recognised (InputError otherwise).
    Returns the file's sha256, or None for a default not downloaded yet."""
    path = resolve(ref, folder)
    if not path.is_file():
        return None
    LOADERS[ref.kind](path)
    return file_sha256(path)
