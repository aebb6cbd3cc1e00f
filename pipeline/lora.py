"""LoRAs for the transformer: the "LoRAs" setting, reading and checking the files, their key formats, the deltas.

The setting is text, one LoRA per comma or line: `style.safetensors:0.8, other.safetensors:-0.5` (strength
−2…2, 1 when left out). A bare name is looked up in the LoRA folder (`--lora-dir`, default configs/lora.py), a
path is used as it is. Every file is read and checked against the transformer before the job starts (before any
stage loads a model): a non-safetensors file, a file over the size limit, a key that matches no layer of the
transformer, or a wrong rank or shape is refused with an InputError naming the file and the first bad key.

Key formats (all end up as diffusers module names of HunyuanVideoFramepackTransformer3DModel):
- diffusers / PEFT: `transformer.<module>.lora_A.weight` / `.lora_B.weight` (the `transformer.` and PEFT's
  `base_model.model.` prefixes are optional); alpha from the `lora_adapter_metadata` that diffusers saves.
- original HunyuanVideo names (`double_blocks.0.img_attn_qkv.lora_A.weight`, `diffusion_model.` prefix or
  none): diffusers' own `_convert_hunyuan_video_lora_to_diffusers` (what HunyuanVideoLoraLoaderMixin uses).
- kohya / musubi-tuner / ComfyUI: `lora_unet_<module with _ for .>.lora_down.weight` / `.lora_up.weight` /
  `.alpha`, or the same with dots after `diffusion_model.`. Written here (`_canonical`, `_underscored_names`):
  diffusers converts that naming for Flux and Wan (`_convert_kohya_flux_lora_to_diffusers`,
  `_convert_musubi_wan_lora_to_diffusers`) but not for HunyuanVideo. Underscored names are resolved against the
  module names the model really has (FramePack's musubi LoRAs use the diffusers names: `x_embedder`,
  `clean_x_embedder`, `image_projection` …) and against the original HunyuanVideo names.
- Also written here (`_split_single_linear1`): diffusers splits a single block's fused `linear1` (q, k, v, mlp) at a
  fixed hidden size of 3072; it is split at the model's own hidden size first, so the tiny preset works too.

Applying: each LoRA gives a low-rank delta per Linear weight (`up @ down`, alpha/rank and the strength folded into
`up`); the LoRAs of one weight are concatenated into one delta, which memory/deltas.py merges into every device
copy of the weight as it is loaded (resident or streamed). PEFT's layer injection is not used: it would compute the
LoRA branch in every forward (extra kernels per layer per step), while a merged weight costs nothing per step once
loaded, and the host copy of the weights is never touched (nothing to undo after a failed job).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from common.files import file_sha256
from configs.lora import LORA
from memory.deltas import WeightDelta, clear_deltas, set_deltas
from common.errors import InputError
from memory.hostpack import HostPack
from memory.hostpack import _ATTR

log = logging.getLogger(__name__)

FIELD = "LoRAs"          # the setting's name in messages (configs/controls.py: field of "loras")
# Original HunyuanVideo module tails in a double / single block, and top-level modules (for underscored names).
_DOUBLE = ("img_mod.linear", "img_attn_qkv", "img_attn_proj", "img_mlp.fc1", "img_mlp.fc2", "txt_mod.linear",
           "txt_attn_qkv", "txt_attn_proj", "txt_mlp.fc1", "txt_mlp.fc2")
_SINGLE = ("linear1", "linear2", "modulation.linear")
_TOP = ("img_in.proj", "time_in.mlp.0", "time_in.mlp.2", "vector_in.in_layer", "vector_in.out_layer",
        "guidance_in.mlp.0", "guidance_in.mlp.2", "final_layer.linear", "final_layer.adaLN_modulation.1")
_PREFIXES = ("base_model.model.", "diffusion_model.", "transformer.")
_ORIGINAL = re.compile(r"^(double_blocks|single_blocks|img_in|txt_in|time_in|vector_in|guidance_in|final_layer)\b")


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


def format_spec(choices) -> str:
    return ", ".join(c.spec() for c in choices)


def lora_files(folder) -> list[str]:
    """The .safetensors files of the LoRA folder (names, sorted); [] when it does not exist."""
    folder = Path(folder) if folder else Path(LORA.folder)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() == ".safetensors")


def resolve(name: str, folder) -> Path:
    folder = Path(folder) if folder else Path(LORA.folder)
    given = Path(name).expanduser()
    path = given if given.is_absolute() or len(given.parts) > 1 else folder / given     # a bare name: the folder's
    if path.is_file():
        return path
    raise InputError(FIELD, f"{name}: no such file (looked in {path.parent.resolve()}); put it in the LoRA folder or give "
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
def _strip(key: str) -> str:
    for p in _PREFIXES:
        if key.startswith(p):
            return key[len(p):]
    return key


def _underscored_names(model: nn.Module) -> dict[str, str]:
    """Underscored → dotted, for the model's own (diffusers) Linear names and the original HunyuanVideo names."""
    cfg = model.config
    names = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    names += [f"double_blocks.{i}.{t}" for i in range(cfg.num_layers) for t in _DOUBLE]
    names += [f"single_blocks.{i}.{t}" for i in range(cfg.num_single_layers) for t in _SINGLE]
    names += list(_TOP)
    return {n.replace(".", "_"): n for n in names}


def _canonical(tensors: dict[str, torch.Tensor], meta: dict, model: nn.Module, path: Path) \
        -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict[str, str]]:
    """(module name (diffusers' or HunyuanVideo's original) → (A, B·alpha/rank), module → its first key in the
    file), from any of the key formats."""
    known = _underscored_names(model)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    origin: dict[str, str] = {}
    for key, value in tensors.items():
        k = _strip(key)
        m = re.fullmatch(r"(.+?)\.(lora_A|lora_B|lora_down|lora_up)(?:\.default)?\.weight|(.+?)\.alpha", k)
        if m is None:
            raise InputError(FIELD, f"{{file}}: key {key!r} is not a LoRA weight (expected '<layer>.lora_A.weight', "
                                    f"'.lora_B.weight', '.lora_down.weight', '.lora_up.weight' or '.alpha'; DoRA "
                                    f"and full-weight diffs are not supported)", path=path)
        module = m.group(1) or m.group(3)
        if module.startswith("lora_unet_"):
            # kohya's `double_blocks_0_img_attn_qkv` → the dotted name it stands for (unknown: left as it is)
            module = known.get(module[len("lora_unet_"):], module)
        role = {"lora_A": "A", "lora_down": "A", "lora_B": "B", "lora_up": "B"}.get(m.group(2), "alpha")
        parts.setdefault(module, {})[role] = value
        origin.setdefault(module, key)
    alphas = _metadata_alpha(meta)
    out = {}
    for module, p in parts.items():
        if "A" not in p or "B" not in p:
            raise InputError(FIELD, f"{{file}}: key {origin[module]!r} has no matching "
                                    f"{'lora_B/lora_up' if 'A' in p else 'lora_A/lora_down'} weight", path=path)
        a, b = p["A"].float(), p["B"].float()
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[1]:
            raise InputError(FIELD, f"{{file}}: key {origin[module]!r}: down {tuple(a.shape)} and up "
                                    f"{tuple(b.shape)} are not a pair of rank-r matrices", path=path)
        rank = a.shape[0]
        alpha = float(p["alpha"]) if "alpha" in p else alphas.get(rank)
        out[module] = (a, b * (alpha / rank) if alpha is not None else b)
    return out, origin


def _metadata_alpha(meta: dict) -> dict[int, float]:
    """rank → alpha from diffusers' `lora_adapter_metadata` (PEFT's LoraConfig: r, lora_alpha); {} without it."""
    try:
        cfg = json.loads(meta.get("lora_adapter_metadata") or "{}")
        return {int(cfg["r"]): float(cfg["lora_alpha"])} if "r" in cfg and "lora_alpha" in cfg else {}
    except (ValueError, TypeError, KeyError):
        return {}


def _split_single_linear1(factors: dict, hidden: int) -> None:
    """single_blocks.N.linear1 (fused q, k, v, mlp) → the diffusers names, split at the model's hidden size."""
    for module in [m for m in factors if re.fullmatch(r"single_blocks\.\d+\.linear1", m)]:
        a, b = factors.pop(module)
        base = module.replace("single_blocks", "single_transformer_blocks").removesuffix(".linear1")
        q, k, v, mlp = torch.split(b, (hidden, hidden, hidden, b.shape[0] - 3 * hidden), dim=0)
        for name, piece in (("attn.to_q", q), ("attn.to_k", k), ("attn.to_v", v), ("proj_mlp", mlp)):
            factors[f"{base}.{name}"] = (a, piece)


def to_diffusers(factors: dict, model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Original HunyuanVideo names → diffusers module names (diffusers' conversion); diffusers names unchanged."""
    from diffusers.loaders.lora_conversion_utils import _convert_hunyuan_video_lora_to_diffusers

    original = {m: f for m, f in factors.items() if _ORIGINAL.match(m)}
    if not original:
        return dict(factors)
    out = {m: f for m, f in factors.items() if m not in original}
    cfg = model.config
    _split_single_linear1(original, cfg.num_attention_heads * cfg.attention_head_dim)
    state = {}
    for module, (a, b) in original.items():
        state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"] = a, b
    for key, value in _convert_hunyuan_video_lora_to_diffusers(state).items():
        module, role = key.removeprefix("transformer.").rsplit(".lora_", 1)
        a, b = out.get(module, (None, None))
        out[module] = (value, b) if role.startswith("A") else (a, value)
    return out


# ---- one file, a set ------------------------------------------------------------------------------------------------
@dataclass
class LoadedLora:
    path: Path
    name: str
    strength: float
    sha256: str
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]     # diffusers module name → (A, B·alpha/rank)

    def record(self) -> dict:
        return {"file": self.name, "sha256": self.sha256, "strength": self.strength, "layers": len(self.factors)}


def load_lora(path: Path, model: nn.Module, strength: float = 1.0, name: str | None = None) -> LoadedLora:
    """Read one LoRA file and check it against `model`: every key must reach a Linear layer with the right
    shapes. Raises InputError naming the file and the first bad key."""
    path = Path(path)
    tensors, meta = read_file(path)
    if not tensors:
        raise InputError(FIELD, "{file} holds no tensors", path=path)
    canonical, origin = _canonical(tensors, meta, model, path)
    try:
        factors = to_diffusers(canonical, model)
    except (RuntimeError, ValueError, KeyError) as e:
        raise InputError(FIELD, f"{{file}}: its HunyuanVideo keys could not be converted ({str(e)[:120]})",
                         path=path) from None
    modules = dict(model.named_modules())
    firsts = {m: origin.get(m) for m in factors}
    for module, (a, b) in factors.items():
        key = firsts.get(module) or f"{module} (diffusers name)"
        layer = modules.get(module)
        if layer is None:
            raise InputError(FIELD, f"{{file}}: key {key!r} matches no layer of the transformer (is it a LoRA for "
                                    f"another model?)", path=path)
        if not isinstance(layer, nn.Linear):
            raise InputError(FIELD, f"{{file}}: key {key!r}: {module} is a {type(layer).__name__}, only Linear "
                                    f"layers take a LoRA here", path=path)
        if a is None or b is None or a.shape[1] != layer.in_features or b.shape[0] != layer.out_features \
                or a.shape[0] != b.shape[1]:
            shapes = f"down {tuple(a.shape) if a is not None else None}, up {tuple(b.shape) if b is not None else None}"
            raise InputError(FIELD, f"{{file}}: key {key!r}: {shapes} do not fit {module} "
                                    f"({layer.out_features}×{layer.in_features}); wrong rank or shape (a LoRA for "
                                    f"another model size?)", path=path)
    return LoadedLora(path, name or path.name, strength, file_sha256(path), factors)


@dataclass
class LoraSet:
    """The LoRAs of one job, checked. `deltas()`: the merged delta per weight (state-dict name)."""
    loras: list[LoadedLora] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.loras)

    def record(self) -> list[dict]:
        return [lo.record() for lo in self.loras]

    def deltas(self) -> dict[str, WeightDelta]:
        grouped: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for lo in self.loras:
            if lo.strength == 0:
                continue
            for module, (a, b) in lo.factors.items():
                grouped.setdefault(module, []).append((a, b * lo.strength))
        return {f"{module}.weight": WeightDelta(torch.cat([a for a, _ in pairs]).contiguous(),
                                                torch.cat([b for _, b in pairs], dim=1).contiguous())
                for module, pairs in grouped.items()}


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
