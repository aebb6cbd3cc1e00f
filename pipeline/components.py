"""The models of a job: loaded from the Hugging Face hub / a local folder (real weights), or built (tiny preset).

Real weights are stored in the standard Hugging Face cache (HF_HOME / HF_HUB_CACHE) unless `model_dir` points at a
folder laid out like the repos: `<model_dir>/<owner>/<repo>/<subfolder>/...` (e.g.
`<model_dir>/hunyuanvideo-community/HunyuanVideo/vae/config.json`). Only safetensors weights are loaded (no pickle).
The models are built empty and their weights stay in the (memory-mapped) files until memory/ reads each part
straight into its place (host RAM per the host plan, or the GPU for a stage): no full copy at load time
(memory/loader.py). Files that do not match the class exactly fall back to the library's loader (a RAM copy).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from common.environment import read_environment
from common.errors import WeightsNotFound
from configs.presets import ComponentSource, ModelPreset, get_preset
from memory.llama_trim import trim_llama
from memory.loader import IncompatibleWeights, load_from_files
from pipeline.text import template_crop_start
from pipeline.tiny import build_tiny_models

log = logging.getLogger(__name__)

MODEL_ROLES = ("text_encoder", "text_encoder_2", "vae", "image_encoder", "transformer")


@dataclass
class Components:
    preset: ModelPreset
    mode: str
    tokenizer: object
    text_encoder: torch.nn.Module
    tokenizer_2: object
    text_encoder_2: torch.nn.Module
    vae: torch.nn.Module
    feature_extractor: object
    image_encoder: torch.nn.Module
    transformer: torch.nn.Module
    crop_start: int
    revisions: dict = field(default_factory=dict)     # role -> commit hash, "local:<path>" or "tiny:seed=N"
    warm: dict = field(default_factory=dict)          # speeds these models showed in this process once warm (the
                                                      # next job's ETA starts from them: pipeline/eta.py)

    def models(self) -> dict[str, torch.nn.Module]:
        return {role: getattr(self, role) for role in MODEL_ROLES}


def _dtype(name: str) -> torch.dtype:
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache, read at call time (HF_HUB_CACHE, else HF_HOME/hub, else the library default)."""
    chosen = read_environment().hub_cache
    if chosen is not None:
        return chosen
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _not_found(preset: ModelPreset, mode: str, role: str, src: ComponentSource, where: str, reason: str):
    sub = f"/{src.subfolder}" if src.subfolder else ""
    return WeightsNotFound(
        f"{role}: the weights of {src.repo}{sub} ({src.size_gb:g} GB; the '{preset.name}' preset needs "
        f"{preset.download_gb(mode):g} GB in all) are not in {where} and could not be downloaded ({reason}). "
        f"Download them once with network access (they are kept in {hf_cache_dir()}), or point --model-dir at a "
        f"folder laid out like the repos, or try the app without any download: --preset tiny."
    )


def download_errors() -> tuple[type[BaseException], ...]:
    """The errors a download can end with: huggingface_hub's (HTTP, offline, missing entries: all OSError), the
    HTTP client's, Xet's, and the file system's."""
    import httpx
    from huggingface_hub import errors

    return (OSError, httpx.HTTPError, getattr(errors, "XetDownloadError", OSError))


def _local_folder(model_dir: Path, src: ComponentSource) -> Path | None:
    base = model_dir / src.repo
    folder = base / src.subfolder if src.subfolder else base
    return folder if folder.is_dir() else None


def _snapshot_folder(src: ComponentSource) -> tuple[Path, str]:
    """Download (or find in the cache) the files of one component; returns (folder, commit hash)."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]
    if src.subfolder:
        patterns = [f"{src.subfolder}/{p}" for p in patterns]
    root = Path(snapshot_download(src.repo, revision=src.revision, allow_patterns=patterns,
                                  cache_dir=hf_cache_dir()))
    folder = root / src.subfolder if src.subfolder else root
    if not folder.is_dir() or not any(folder.iterdir()):
        raise FileNotFoundError(f"{folder} is empty")
    return folder, root.name


def resolve(preset: ModelPreset, mode: str, role: str, src: ComponentSource, model_dir: Path | None
            ) -> tuple[Path, str]:
    if model_dir is not None:
        folder = _local_folder(model_dir, src)
        if folder is None:
            raise _not_found(preset, mode, role, src, str(model_dir), "--model-dir has no such folder; "
                             "nothing is downloaded when --model-dir is given")
        return folder, f"local:{folder}"
    try:
        return _snapshot_folder(src)
    except download_errors() as e:   # offline, 404, gated, connection, disk: "could not be downloaded" (any other
        # error is a bug, and keeps its own type and traceback)
        where = f"the Hugging Face cache ({hf_cache_dir()})"
        offline = read_environment().offline
        reason = "HF_HUB_OFFLINE is set" if offline else f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        raise _not_found(preset, mode, role, src, where, reason) from e


def _model_class(role: str):
    from diffusers import AutoencoderKLHunyuanVideo, HunyuanVideoFramepackTransformer3DModel
    from transformers import CLIPTextModel, LlamaModel, SiglipVisionModel

    return {"text_encoder": LlamaModel, "text_encoder_2": CLIPTextModel, "image_encoder": SiglipVisionModel,
            "vae": AutoencoderKLHunyuanVideo, "transformer": HunyuanVideoFramepackTransformer3DModel}.get(role)


def _load_role(role: str, folder: Path, src: ComponentSource):
    from transformers import AutoTokenizer, CLIPTokenizer, SiglipImageProcessorPil


    dt = _dtype(src.dtype)
    if role == "tokenizer":
        return AutoTokenizer.from_pretrained(folder)
    if role == "tokenizer_2":
        return CLIPTokenizer.from_pretrained(folder)
    if role == "feature_extractor":      # the PIL processor: no torchvision (see pipeline/tiny.py)
        return SiglipImageProcessorPil.from_pretrained(folder)
    cls = _model_class(role)
    if cls is None:
        raise KeyError(role)
    # The Llama without what the text stage never runs; with its files, its embedding reads only the prompt's rows
    prepare = (lambda model, files: trim_llama(model, rows_from_files=files)) if role == "text_encoder" else None
    try:
        return load_from_files(cls, folder, dt, prepare=prepare)
    except IncompatibleWeights as e:
        log.warning("%s: %s; loading it with %s.from_pretrained instead (a full copy in host RAM)", role, e,
                    cls.__name__)
    if hasattr(cls, "load_config"):
        return cls.from_pretrained(folder, torch_dtype=dt, use_safetensors=True)
    model = cls.from_pretrained(folder, dtype=dt, use_safetensors=True)
    return trim_llama(model) if role == "text_encoder" else model


def transformer_skeleton(preset: ModelPreset, mode: str, model_dir: str | Path | None = None) -> torch.nn.Module | None:
    """The transformer's layers without weights (on the meta device), from its config: what a LoRA is checked
    against before its job runs. None when the real preset's config is not on this computer yet."""
    from diffusers import HunyuanVideoFramepackTransformer3DModel as Transformer

    if preset.tiny:
        with torch.device("meta"):
            return Transformer(**preset.tiny_configs["transformer"])
    src = preset.sources(mode)["transformer"]
    if model_dir:
        folder = _local_folder(Path(model_dir).expanduser(), src)
    else:                       # the Hugging Face cache only: nothing is downloaded for a check
        from huggingface_hub import snapshot_download

        try:
            root = Path(snapshot_download(src.repo, revision=src.revision, cache_dir=hf_cache_dir(),
                                          local_files_only=True))
        except download_errors():
            return None
        folder = root / src.subfolder if src.subfolder else root
    if folder is None or not (folder / "config.json").is_file():
        return None
    with torch.device("meta"):
        return Transformer.from_config(Transformer.load_config(folder))


def load_components(preset: ModelPreset | str, mode: str = "original", model_dir: str | Path | None = None
                    ) -> Components:
    """Load (or build) every component of `preset` for `mode` on the CPU, in eval mode without gradients."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if preset.tiny:

        parts = build_tiny_models(preset, mode)
        revisions = {role: f"tiny:seed={preset.tiny_seed}" for role in parts}
    else:
        model_dir = Path(model_dir).expanduser() if model_dir else None
        parts, revisions = {}, {}
        for role, src in preset.sources(mode).items():
            folder, revision = resolve(preset, mode, role, src, model_dir)
            log.info("loading %s from %s", role, folder)
            try:
                part = _load_role(role, folder, src)
            except FileNotFoundError as e:      # a folder with the configs but not the weight files (a copy cut short)
                raise WeightsNotFound(f"{role}: {e}: the folder has the configuration but not the weights; copy the "
                                      f"whole {src.repo} repo there again (or remove it to download it)") from None
            if isinstance(part, torch.nn.Module):
                part = part.eval().requires_grad_(False)
            parts[role], revisions[role] = part, revision
    crop_start = template_crop_start(parts["tokenizer"])
    return Components(preset=preset, mode=mode, crop_start=crop_start, revisions=revisions, **parts)
