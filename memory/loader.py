"""A model from its folder without reading its weights: the class built empty from its config, its tensors found in
the safetensors files, and a file-backed host pack attached (memory/hostpack.py).

Nothing of the weights is read here: the parameters are meta tensors of the requested dtype (buffers the model
computes itself, such as rotary frequencies, are built as usual). Where each chunk then lives (pinned RAM,
pageable RAM, or read from the files when a stage needs it) is the host plan's choice (memory/hostplan.py), made
by the memory manager when a job starts. Every tensor the model saves must be in the files with the right shape;
otherwise `IncompatibleWeights` says which (the caller may fall back to the library's own loader). A caller's
`prepare` then shapes the model before its pack is made (the text encoder drops what it never runs,
memory/llama_trim.py): only the modules the model has then become chunks, so tensors it dropped are never read.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from common.units import GIB
from memory.hostpack import HostPack
from memory.weightfiles import WeightFileError, WeightFiles

log = logging.getLogger(__name__)


class IncompatibleWeights(WeightFileError):
    """The files do not hold exactly the tensors the model class expects."""


def build_empty(cls, folder: Path) -> nn.Module:
    """The model class built from the folder's config on the meta device (buffers real), in eval mode."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        if hasattr(cls, "load_config"):                    # diffusers (ConfigMixin)
            model = cls.from_config(cls.load_config(folder))
        else:                                              # transformers (PreTrainedModel)
            model = cls(cls.config_class.from_pretrained(folder))
    return model.eval().requires_grad_(False)


def _keep_fp32(model: nn.Module, name: str) -> bool:
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    return any(k in name.split(".") for k in keep)


def _check(model: nn.Module, files: WeightFiles) -> None:
    expected = model.state_dict(keep_vars=True)
    missing = [n for n in expected if n not in files.tensors]
    wrong = [f"{n} {tuple(files.tensors[n].shape)} ≠ {tuple(t.shape)}" for n, t in expected.items()
             if n in files.tensors and tuple(files.tensors[n].shape) != tuple(t.shape)]
    if missing or wrong:
        what = (f"missing {', '.join(missing[:3])}" + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
                if missing else f"wrong shapes: {', '.join(wrong[:3])}")
        raise IncompatibleWeights(f"{files.folder}: the weight files do not match {type(model).__name__} ({what})")
    extra = sorted(set(files.tensors) - set(expected))
    if extra:
        log.debug("%s: %d tensors in the files are not used (%s ...)", files.folder, len(extra), extra[0])


def load_from_files(cls, folder: str | Path, dtype: torch.dtype,
                    prepare: Callable[[nn.Module, WeightFiles], object] | None = None) -> nn.Module:
    """`cls` from `folder` with its weights left in the files (read when a stage needs them). `prepare(model, files)`
    runs on the checked model (meta parameters of their final dtypes) before the pack is made."""
    folder = Path(folder)
    files = WeightFiles.open(folder)
    model = build_empty(cls, folder)
    _check(model, files)
    for module_name, module in model.named_modules():
        for name, p in list(module._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            full = f"{module_name}.{name}".lstrip(".")
            target = torch.float32 if _keep_fp32(model, full) else dtype
            p.data = torch.empty(p.shape, dtype=target, device="meta")
    if prepare is not None:
        prepare(model, files)
    pack = HostPack.from_files(model, files)
    log.info("%s: %.2f GB in %d weight file(s), %.2f GB of it in %d chunk(s); nothing read yet", cls.__name__,
             files.nbytes / GIB, len(files.files), sum(c.file_bytes for c in pack.chunks) / GIB, len(pack.chunks))
    return model
