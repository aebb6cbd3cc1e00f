"""LoRAs for the transformer: the "LoRAs" setting, reading and checking the files, their key formats, the deltas.

The setting is text, one LoRA per comma or line: `style.safetensors:0.8, other.safetensors:-0.5` (strength
−2…2, 1 when left out). A bare name is looked up in the LoRA folder (`--lora-dir`, default configs/lora.py), a
path is used as it is. Every file is read and checked against the transformer before the job starts (before any
stage loads a model): a non-safetensors file, a file over the size limit, a key that matches no layer of the
transformer, or a wrong rank or shape is refused with an InputError naming the file and the first bad key.

Key formats (all end up as diffusers module names of HunyuanVideoFramepackTransformer3DModel; pipeline/lora_keys.py
resolves the names, this module the roles):
- diffusers / PEFT: `transformer.<module>.lora_A.weight` / `.lora_B.weight` (the `transformer.` and PEFT's
  `base_model.model.` prefixes are optional); alpha from the `lora_adapter_metadata` that diffusers saves.
- kohya / musubi-tuner: `lora_unet_<module with _ for .>.lora_down.weight` / `.lora_up.weight` / `.alpha`;
  OneTrainer: the same after `lora_transformer_` (or dotted after `lora_transformer.`); musubi-tuner's
  convert_lora.py `--target other`: `diffusion_model.<module with . for _>.lora_A.weight` (FramePack's names:
  `transformer.blocks.0.attn.to.q`).
- HunyuanVideo's original names (Tencent's `double_blocks.0.img_attn_qkv`, ComfyUI's `double_blocks.0.img_attn.qkv`,
  `img_mod.lin`, `single_blocks.0.linear1` …, OneTrainer's OMI `transformer.double_blocks.0.img_attn_qkv.0`), with
  `diffusion_model.` or no prefix, `lora_up/lora_down` or `lora_A/lora_B`: mapped here (not with diffusers'
  `_convert_hunyuan_video_lora_to_diffusers`, which splits at a fixed hidden size of 3072 and chunks the down
  factors of the token refiner's qkv and of the final modulation); fused layers are split at the model's own
  sizes, the final layer's modulation rows swap halves (shift, scale → diffusers' scale, shift).
- Full differences beside or instead of a pair: `<module>.diff` (added to the weight) and `.diff_b` (to the bias),
  as ComfyUI reads them (FastVideo-style files); strength applies, alpha does not.
- Keys of another model in the same file (`lora_te1_…`, `text_encoders.…`, OneTrainer's `llama.…`/`clip_l.…` and
  `bundle_emb.…`) are skipped: the job's log says which and why, job.json counts them (`skipped_keys`).
A refusal names the key as the file writes it.

Applying: each LoRA gives a low-rank delta per Linear weight (`up @ down`, alpha/rank and the strength folded into
`up`) and its full differences per tensor; the LoRAs of one tensor are concatenated (summed) into one delta, which
memory/deltas.py merges into every device copy of the tensor as it is loaded (resident or streamed). PEFT's layer
injection is not used: it would compute the LoRA branch in every forward (extra kernels per layer per step), while a
merged weight costs nothing per step once loaded, and the host copy of the weights is never touched (nothing to
undo after a failed job).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch
from torch import nn

from common.errors import InputError
from common.files import file_sha256
from configs.lora import LORA
from memory.deltas import WeightDelta, clear_deltas, set_deltas
from memory.hostpack import _ATTR, HostPack
from pipeline import lora_keys

log = logging.getLogger(__name__)

FIELD = "LoRAs"          # the setting's name in messages (configs/controls.py: field of "loras")


# ---- the setting ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoraChoice:
    name: str              # as given: a file name in the LoRA folder, or a path
    strength: float = 1.0

    def spec(self) -> str:
        return f"{self.name}:{self.strength:g}"


def parse_spec(text) -> tuple[LoraChoice, ...]:
    """The "LoRAs" setting → choices. Accepts text ("a.safetensors:0.8, b.safetensors") or a list of such items
    (the CLI's repeated --lora). Raises InputError naming the setting."""
    if text is None:
        return ()
    if isinstance(text, (list, tuple)):
        text = ",".join(str(t) for t in text)
    if not isinstance(text, str):
        raise InputError(FIELD, f"text like 'style.safetensors:0.8' is required, got {type(text).__name__}")
    if len(text) > LORA.max_text_chars:
        raise InputError(FIELD, f"{len(text)} characters; the setting may have at most {LORA.max_text_chars} (at "
                                f"most {LORA.max_count} LoRAs, each 'file.safetensors:strength')")
    out = []
    for item in re.split(r"[,\n]", text):
        item = item.strip()
        if not item:
            continue
        name, strength = item, 1.0
        head, sep, tail = item.rpartition(":")
        if sep and head and not re.fullmatch(r"[\\/].*", tail):       # "C:\x.safetensors" keeps its drive
            try:
                strength = float(tail)
                name = head.strip()
            except ValueError:
                if not tail.lower().endswith(".safetensors") and "\\" not in tail and "/" not in tail:
                    raise InputError(FIELD, f"{item!r}: {tail.strip()!r} is not a strength; write "
                                            f"'file.safetensors:0.8'") from None
        lo, hi = LORA.strength_min, LORA.strength_max
        if not lo <= strength <= hi:                           # (NaN too)
            raise InputError(FIELD, f"{item!r}: strength {strength:g} is out of range; use a value between "
                                    f"{lo:g} and {hi:g}")
        out.append(LoraChoice(name, strength))
    if len(out) > LORA.max_count:
        raise InputError(FIELD, f"{len(out)} LoRAs; at most {LORA.max_count} at once")
    return tuple(out)


def names_only(spec) -> None:
    """A client's setting (page, API): every LoRA must be a file of the LoRA folder, named by its file name; a path
    is refused (the command line, run by the machine's own user, may give paths). Raises InputError."""
    for choice in parse_spec(spec):
        name = choice.name
        if not name or name != Path(name).name or name in (".", "..") or "\\" in name or name.startswith("~") \
                or Path(name).is_absolute():
            raise InputError(FIELD, f"{name[:80]!r}: name a file of the LoRA folder (its file name, as the list "
                                    f"shows it), not a path")


def listed_only(spec, folder) -> None:
    """A client's LoRAs (after `names_only`) must be files of the LoRA folder's list; one that is not is refused
    naming it and the folder's list, never the folder's path (a client sees this). Raises InputError."""
    listed = set(lora_files(folder))
    for choice in parse_spec(spec):
        if choice.name not in listed:
            raise InputError(FIELD, f"{choice.name[:80]!r} is not in the LoRA folder's list; pick a file from it "
                                    f"(Refresh list after adding one)")


def format_spec(choices) -> str:
    return ", ".join(c.spec() for c in choices)


def lora_files(folder) -> list[str]:
    """The .safetensors files of the LoRA folder (names, sorted); [] when it does not exist."""
    folder = Path(folder) if folder else Path(LORA.folder)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() == ".safetensors")


def resolve(name: str, folder) -> Path:
    """The file of a LoRA choice: a bare name in the LoRA folder, else the path given. A missing one is refused
    naming what was given and what to do, with the folder as it was configured (--lora-dir as its user gave it, or
    the default's name): never the folder's absolute path, which the user did not give (the message may reach a
    client of the app)."""
    folder = Path(folder) if folder else Path(LORA.folder)
    given = Path(name).expanduser()
    bare = not (given.is_absolute() or len(given.parts) > 1)
    path = folder / given if bare else given           # a bare name: the folder's
    if path.is_file():
        return path
    if not bare:                                       # the user's own path, as they gave it
        raise InputError(FIELD, f"{name}: no such file; check the path (a file of the LoRA folder is named by its "
                                f"file name alone)")
    where = (f"the default LoRA folder, '{LORA.folder}' in the current folder" if folder == Path(LORA.folder)
             else f"the LoRA folder, --lora-dir {folder}")
    raise InputError(FIELD, f"{name}: not in {where}; put the file there, name its folder with --lora-dir, or give "
                            f"its path (./{name} for one in the current folder)")


# ---- reading a file -------------------------------------------------------------------------------------------------
def read_file(path: Path, max_mb: int = LORA.max_file_mb) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, metadata) of a LoRA file; refuses what is not a safetensors file or is over the size limit."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        raise InputError(FIELD, "{file} is not a .safetensors file; only safetensors LoRAs are loaded (pickled "
                                ".ckpt/.pt files can run code)", path=path)
    size = path.stat().st_size
    if size > max_mb << 20:
        raise InputError(FIELD, f"{{file}} is {size / 2**20:.0f} MB, over the {max_mb} MB limit for a LoRA (is "
                                f"it a full model?)", path=path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise InputError(FIELD, f"{{file}} is not a readable safetensors file ({str(e)[:120]})", path=path) \
            from None
    return tensors, meta


# ---- key formats ----------------------------------------------------------------------------------------------------
_KEY = re.compile(r"(.+?)\.(?:(lora_A|lora_B|lora_down|lora_up)(?:\.default)?\.weight|(alpha|diff|diff_b))")
_ROLES = {"lora_A": "A", "lora_down": "A", "lora_B": "B", "lora_up": "B", "alpha": "alpha", "diff": "diff",
          "diff_b": "diff_b"}


def _groups(tensors: dict[str, torch.Tensor], path: Path) \
        -> tuple[dict[str, dict[str, tuple[str, torch.Tensor]]], list[tuple[str, str]]]:
    """(module name as the file writes it (prefix dropped) → role → (key, tensor), [(skipped key, why)]): every
    key is a LoRA factor, an alpha, a full difference, or another model's (skipped); anything else is refused."""
    groups: dict[str, dict[str, tuple[str, torch.Tensor]]] = {}
    skipped = []
    for key, value in tensors.items():
        reason = lora_keys.skip_reason(key)
        if reason is not None:
            skipped.append((key, reason))
            continue
        m = _KEY.fullmatch(lora_keys.strip_prefix(key))
        if m is None:
            raise InputError(FIELD, f"{{file}}: key {key!r} is not a LoRA weight (expected '<layer>.lora_A.weight', "
                                    f"'.lora_B.weight', '.lora_down.weight', '.lora_up.weight', '.alpha', or a full "
                                    f"difference '.diff' / '.diff_b'; DoRA, LoHa and LoKr are not supported)",
                             path=path)
        groups.setdefault(m.group(1), {})[_ROLES[m.group(2) or m.group(3)]] = (key, value)
    return groups, skipped


def _metadata_alpha(meta: dict) -> dict[int, float]:
    """rank → alpha from diffusers' `lora_adapter_metadata` (PEFT's LoraConfig: r, lora_alpha); {} without it."""
    try:
        cfg = json.loads(meta.get("lora_adapter_metadata") or "{}")
        return {int(cfg["r"]): float(cfg["lora_alpha"])} if "r" in cfg and "lora_alpha" in cfg else {}
    except (ValueError, TypeError, KeyError):
        return {}


@dataclass
class _Converted:
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)   # module → (A, B·α/r)
    diffs: dict[str, torch.Tensor] = field(default_factory=dict)       # parameter ("….weight"/"….bias") → delta
    origin: dict[str, str] = field(default_factory=dict)               # module → the first file key behind it


def _convert(groups: dict, meta: dict, names: lora_keys.Names, path: Path) -> _Converted:
    """The file's groups → low-rank factors per diffusers Linear and full differences per parameter; refuses (naming
    the file's key) a name that reaches no layer, a pair that is not one, a fused layer whose rows do not split."""
    def refuse(key, why) -> NoReturn:
        raise InputError(FIELD, f"{{file}}: key {key!r}{why}", path=path)

    alphas = _metadata_alpha(meta)
    out = _Converted()
    for source, p in groups.items():
        first = next(iter(p.values()))[0]
        target = names.resolve(source)
        for module in target.modules:
            if module not in names.modules:
                refuse(first, " matches no layer of the transformer (is it a LoRA for another model?)")
            out.origin.setdefault(module, first)
        if "A" in p or "B" in p or not ("diff" in p or "diff_b" in p):
            if "A" not in p or "B" not in p:
                refuse(first, f" has no matching {'lora_B/lora_up' if 'A' in p else 'lora_A/lora_down'} weight")
            a, b = p["A"][1].float(), p["B"][1].float()
            if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
                refuse(first, f": down {tuple(a.shape)} and up {tuple(b.shape)} are not a pair of rank-r matrices")
            for module in target.modules:
                layer = names.modules[module]
                if not isinstance(layer, nn.Linear):
                    refuse(first, f": {module} is a {type(layer).__name__}, only Linear layers take a LoRA here")
            rank = a.shape[0]
            alpha = float(p["alpha"][1]) if "alpha" in p else alphas.get(rank)
            if alpha is not None:
                b = b * (alpha / rank)
            sizes = [names.modules[m].out_features for m in target.modules]
            pieces = target.split(b, sizes)
            if pieces is None:
                refuse(first, f": up {tuple(b.shape)} does not split into {' + '.join(map(str, sizes))} rows for "
                              f"{', '.join(target.modules)} (a LoRA for another model size?)")
            for module, piece in zip(target.modules, pieces):
                if module in out.factors:                  # two names of one layer: their deltas add
                    a0, b0 = out.factors[module]
                    out.factors[module] = (torch.cat([a0, a]), torch.cat([b0, piece], dim=1))
                else:
                    out.factors[module] = (a, piece)
        for role, kind in (("diff", "weight"), ("diff_b", "bias")):
            if role not in p:
                continue
            key, diff = p[role][0], p[role][1].float()
            params = [f"{m}.{kind}" for m in target.modules]
            missing = [n for n in params if n not in names.params]
            if missing:
                refuse(key, f": {missing[0].rsplit('.', 1)[0]} has no {kind} to add a difference to")
            wanted = [names.params[n].shape for n in params]
            pieces = target.split(diff, [s[0] if len(s) else 0 for s in wanted])
            if pieces is None or any(piece.shape != w for piece, w in zip(pieces, wanted)):
                refuse(key, f": {tuple(diff.shape)} does not fit "
                            f"{', '.join(f'{n} {tuple(w)}' for n, w in zip(params, wanted))} (a LoRA for another "
                            f"model size?)")
            for name, piece in zip(params, pieces):
                out.diffs[name] = out.diffs[name] + piece if name in out.diffs else piece
    return out


# ---- one file, a set ------------------------------------------------------------------------------------------------
@dataclass
class LoadedLora:
    path: Path
    name: str
    strength: float
    sha256: str
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]     # diffusers module name → (A, B·alpha/rank)
    diffs: dict[str, torch.Tensor] = field(default_factory=dict)     # parameter name → full difference (.diff/_b)
    skipped: tuple[tuple[str, str], ...] = ()                  # (key, why) of the keys not applied (text encoders)

    def layers(self) -> set[str]:
        return set(self.factors) | {n.rsplit(".", 1)[0] for n in self.diffs}

    def record(self) -> dict:
        out = {"file": self.name, "sha256": self.sha256, "strength": self.strength, "layers": len(self.layers())}
        if self.skipped:
            out["skipped_keys"] = len(self.skipped)
        return out


def _skipped_lines(name: str, skipped) -> list[str]:
    """One line per reason: how many keys, the first few of them."""
    by_reason: dict[str, list[str]] = {}
    for key, reason in skipped:
        by_reason.setdefault(reason, []).append(key)
    return [f"LoRA {name}: {len(keys)} key(s) skipped, {reason}: {', '.join(keys[:3])}"
            f"{', …' if len(keys) > 3 else ''}" for reason, keys in by_reason.items()]


def load_lora(path: Path, model: nn.Module, strength: float = 1.0, name: str | None = None) -> LoadedLora:
    """Read one LoRA file and check it against `model`: every key must reach a layer of the transformer with the
    right shapes, or be another model's (a text encoder's: skipped, with a warning in the job's log). Raises
    InputError naming the file and the first bad key as the file writes it."""
    path = Path(path)
    name = name or path.name
    tensors, meta = read_file(path)
    if not tensors:
        raise InputError(FIELD, "{file} holds no tensors", path=path)
    groups, skipped = _groups(tensors, path)
    if not groups:
        raise InputError(FIELD, f"{{file}} holds nothing for the transformer: its {len(skipped)} key(s) are "
                                f"{skipped[0][1]} (e.g. {skipped[0][0]!r})", path=path)
    names = lora_keys.Names(model)
    c = _convert(groups, meta, names, path)
    for module, (a, b) in c.factors.items():
        key = c.origin[module]
        layer = names.modules[module]
        if a.shape[1] != layer.in_features or b.shape[0] != layer.out_features or a.shape[0] != b.shape[1]:
            raise InputError(FIELD, f"{{file}}: key {key!r}: down {tuple(a.shape)}, up {tuple(b.shape)} do not fit "
                                    f"{module} ({layer.out_features}×{layer.in_features}); wrong rank or shape (a "
                                    f"LoRA for another model size?)", path=path)
    for line in _skipped_lines(name, skipped):
        log.warning(line)
    return LoadedLora(path, name, strength, file_sha256(path), c.factors, c.diffs, tuple(skipped))


@dataclass
class LoraSet:
    """The LoRAs of one job, checked. `deltas()`: the merged delta per tensor (state-dict name)."""
    loras: list[LoadedLora] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loras)

    def record(self) -> list[dict]:
        return [lo.record() for lo in self.loras]

    def deltas(self) -> dict[str, WeightDelta]:
        grouped: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        full: dict[str, torch.Tensor] = {}
        for lo in self.loras:
            if lo.strength == 0:
                continue
            for module, (a, b) in lo.factors.items():
                grouped.setdefault(f"{module}.weight", []).append((a, b * lo.strength))
            for name, diff in lo.diffs.items():
                full[name] = full[name] + lo.strength * diff if name in full else lo.strength * diff
        out = {}
        for name in list(grouped) + [n for n in full if n not in grouped]:
            pairs = grouped.get(name)
            down = torch.cat([a for a, _ in pairs]).contiguous() if pairs else None
            up = torch.cat([b for _, b in pairs], dim=1).contiguous() if pairs else None
            out[name] = WeightDelta(down, up, full.get(name))
        return out


def load_set(spec, folder, model: nn.Module) -> LoraSet:
    """The job's LoRAs from the setting's text (checked, read, checked against the transformer)."""
    return LoraSet([load_lora(resolve(c.name, folder), model, c.strength, c.name) for c in parse_spec(spec)])


def attach(model: nn.Module, loras: LoraSet) -> None:
    """From now on every device copy of `model`'s weights has the LoRAs merged (none: the plain weights)."""

    pack = HostPack.of(model)
    set_deltas(pack, loras.deltas())
    if loras:
        log.info("LoRAs: %s", ", ".join(f"{lo.name} × {lo.strength:g} ({len(lo.factors)} layers)"
                                        for lo in loras.loras))


def detach(model: nn.Module) -> None:
    """Forget the LoRAs (the host copy was never changed: the next load is the plain weights)."""

    pack = model.__dict__.get(_ATTR)           # none yet: nothing was attached (never packs a model here)
    if pack is not None:
        clear_deltas(pack)
