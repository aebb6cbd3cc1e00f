"""Are the real weights on this computer? Answered from the local folders alone (no network, nothing loaded), so the
app and the command line can say at start-up what is missing, how big it is, where it would go and how to get it."""
from __future__ import annotations

from pathlib import Path

from common.environment import read_environment
from configs.presets import ComponentSource, ModelPreset
from pipeline.components import _local_folder, hf_cache_dir

WEIGHT_SUFFIXES = (".safetensors", ".json", ".model", ".txt")


def _in_hf_cache(src: ComponentSource) -> bool:
    """A snapshot of `src.repo` in the Hugging Face cache with files in `src.subfolder`."""
    snapshots = hf_cache_dir() / ("models--" + src.repo.replace("/", "--")) / "snapshots"
    if not snapshots.is_dir():
        return False
    for snapshot in snapshots.iterdir():
        folder = snapshot / src.subfolder if src.subfolder else snapshot
        if folder.is_dir() and any(p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir()):
            return True
    return False


def missing_components(preset: ModelPreset, mode: str, model_dir: str | Path | None = None
                       ) -> list[tuple[str, ComponentSource]]:
    """(role, source) of every component of `mode` that is neither in --model-dir nor in the Hugging Face cache."""
    if preset.tiny:
        return []
    model_dir = Path(model_dir).expanduser() if model_dir else None
    missing = []
    for role, src in preset.sources(mode).items():
        present = _local_folder(model_dir, src) is not None if model_dir else _in_hf_cache(src)
        if not present:
            missing.append((role, src))
    return missing


def missing_weights_message(preset: ModelPreset, mode: str, model_dir: str | Path | None = None) -> str | None:
    """What to tell a user whose real weights are not here yet (None when nothing is missing)."""
    missing = missing_components(preset, mode, model_dir)
    if not missing:
        return None
    size = sum(src.size_gb for _, src in missing)
    parts = ", ".join(f"{role} ({src.repo}{'/' + src.subfolder if src.subfolder else ''}, {src.size_gb:g} GB)"
                      for role, src in missing if src.size_gb >= 0.01)
    if model_dir:
        how = (f"--model-dir {model_dir} does not hold them (it must be laid out like the repos: "
               f"<dir>/<owner>/<repo>/<subfolder>/...); nothing is downloaded when --model-dir is given.")
    elif read_environment().offline:
        how = (f"HF_HUB_OFFLINE is set, so they cannot be downloaded: download them once with network access (into "
               f"{hf_cache_dir()}), or point --model-dir at a folder laid out like the repos.")
    else:
        how = (f"They are downloaded once, at the first Start, into {hf_cache_dir()} (set HF_HOME to put them "
               f"elsewhere), or point --model-dir at a folder laid out like the repos.")
    return (f"The real model weights are not on this computer yet: {parts}; {size:.1f} GB in all. {how} "
            f"To try the app without any download: --preset tiny.")
