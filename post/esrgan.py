"""ESRGAN-family upscalers: the architecture of a model file is recognised from its state dict's keys and shapes, and
only then built and loaded; a file of any other architecture is refused (UnknownArchitecture) and never executed.

Why not spandrel (the library ComfyUI uses for these files): its wheel declares torchvision as a dependency, which
this project must not install (it pins its own torch), and `import spandrel` fails without torchvision (its
registry imports every architecture, LaMa's imports torchvision.transforms), so even `pip install --no-deps
spandrel` cannot load an ESRGAN file here. The two architectures video upscaling uses are small and published,
so they are written here from their published descriptions:

- RRDBNet (ESRGAN, Real-ESRGAN x4plus / x2plus, and most community ".pth" upscalers): BasicSR's parameter names
  (`conv_first`, `body.N.rdbK.convJ`, `conv_body`, `conv_up1/2`, `conv_hr`, `conv_last`) and the original ESRGAN
  names (`model.0`, `model.1.sub.N.RDBK.convJ.0`, ...), which are renamed to BasicSR's. A x2 (x1) model sees its
  input pixel-unshuffled by 2 (4): 12 (48) input channels.
- SRVGGNetCompact (Real-ESRGAN's realesr-animevideov3 and realesr-general-x4v3): `body.N` convolutions and PReLUs,
  the last convolution's channels are 3·scale², pixel-shuffled and added to the input upsampled by nearest.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class UnknownArchitecture(ValueError):
    """A model file whose layout is none of the architectures this module knows: it is not run."""


@dataclass(frozen=True)
class UpscalerSpec:
    arch: str                   # "RRDBNet" or "SRVGGNetCompact"
    scale: int
    features: int
    blocks: int
    grow: int = 32              # RRDBNet's growth channels
    in_channels: int = 3


def _lrelu(x):
    return F.leaky_relu(x, 0.2, inplace=True)


class DenseBlock(nn.Module):
    """Five 3×3 convolutions, each seeing the block's input and every earlier output; scaled residual."""

    def __init__(self, features: int, grow: int):
        super().__init__()
        for j in range(5):
            cout = features if j == 4 else grow
            setattr(self, f"conv{j + 1}", nn.Conv2d(features + j * grow, cout, 3, 1, 1))

    def forward(self, x):
        seen = [x]
        for j in range(1, 5):
            seen.append(_lrelu(getattr(self, f"conv{j}")(torch.cat(seen, 1))))
        return self.conv5(torch.cat(seen, 1)) * 0.2 + x


class RRDB(nn.Module):
    def __init__(self, features: int, grow: int):
        super().__init__()
        self.rdb1, self.rdb2, self.rdb3 = (DenseBlock(features, grow) for _ in range(3))

    def forward(self, x):
        return self.rdb3(self.rdb2(self.rdb1(x))) * 0.2 + x


class RRDBNet(nn.Module):
    def __init__(self, spec: UpscalerSpec):
        super().__init__()
        self.scale = spec.scale
        self.unshuffle = {4: 1, 2: 2, 1: 4}[spec.scale]
        f = spec.features
        self.conv_first = nn.Conv2d(3 * self.unshuffle ** 2, f, 3, 1, 1)
        self.body = nn.Sequential(*[RRDB(f, spec.grow) for _ in range(spec.blocks)])
        self.conv_body = nn.Conv2d(f, f, 3, 1, 1)
        self.conv_up1 = nn.Conv2d(f, f, 3, 1, 1)
        self.conv_up2 = nn.Conv2d(f, f, 3, 1, 1)
        self.conv_hr = nn.Conv2d(f, f, 3, 1, 1)
        self.conv_last = nn.Conv2d(f, 3, 3, 1, 1)

    def forward(self, x):
        if self.unshuffle > 1:
            x = F.pixel_unshuffle(x, self.unshuffle)
        feat = self.conv_first(x)
        feat = feat + self.conv_body(self.body(feat))
        feat = _lrelu(self.conv_up1(F.interpolate(feat, scale_factor=2, mode="nearest")))
        feat = _lrelu(self.conv_up2(F.interpolate(feat, scale_factor=2, mode="nearest")))
        return self.conv_last(_lrelu(self.conv_hr(feat)))


class SRVGGNetCompact(nn.Module):
    def __init__(self, spec: UpscalerSpec):
        super().__init__()
        self.scale = spec.scale
        f = spec.features
        layers: list[nn.Module] = [nn.Conv2d(3, f, 3, 1, 1), nn.PReLU(f)]
        for _ in range(spec.blocks):
            layers += [nn.Conv2d(f, f, 3, 1, 1), nn.PReLU(f)]
        layers.append(nn.Conv2d(f, 3 * spec.scale ** 2, 3, 1, 1))
        self.body = nn.Sequential(*layers)

    def forward(self, x):
        out = F.pixel_shuffle(self.body(x), self.scale)
        return out + F.interpolate(x, scale_factor=self.scale, mode="nearest")


_OLD_TAIL = {"model.3": "conv_up1", "model.6": "conv_up2", "model.8": "conv_hr", "model.10": "conv_last"}


def _from_original_names(state: dict) -> dict:
    """Original ESRGAN names (`model.0`, `model.1.sub.N.RDBK.convJ.0`, `model.1.sub.<last>`, ...) to BasicSR's."""
    subs = sorted({int(m.group(1)) for k in state if (m := re.match(r"model\.1\.sub\.(\d+)\.", k))})
    last = subs[-1] if subs else -1
    out = {}
    for key, value in state.items():
        new = None
        if key.startswith("model.0."):
            new = "conv_first." + key[len("model.0."):]
        elif key.startswith(f"model.1.sub.{last}.") and not re.match(rf"model\.1\.sub\.{last}\.RDB", key):
            new = "conv_body." + key[len(f"model.1.sub.{last}."):]
        elif m := re.match(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0\.(weight|bias)$", key):
            new = f"body.{m.group(1)}.rdb{m.group(2)}.conv{m.group(3)}.{m.group(4)}"
        else:
            head, _, tail = key.rpartition(".")
            if head in _OLD_TAIL:
                new = f"{_OLD_TAIL[head]}.{tail}"
        if new is None:
            raise UnknownArchitecture(f"an ESRGAN-style file with an unknown key {key!r}")
        out[new] = value
    return out


def unwrapped(state: dict) -> dict:
    """A post model file's tensors by name, out of the wrappers training scripts save them in (`params_ema`,
    `params`, `state_dict`, `model`) and without DataParallel's `module.` prefixes; UnknownArchitecture when the file
    holds no named tensors. (Every post model's reader starts here: ESRGAN, GFPGAN, the face detector.)"""
    for wrapper in ("params_ema", "params", "state_dict", "model"):
        if isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not state or not all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items()):
        raise UnknownArchitecture("the file holds no tensors by name (not a model's state dict)")
    return {k.removeprefix("module."): v for k, v in state.items()}


def detect(state: dict) -> tuple[UpscalerSpec, dict]:
    """The architecture of an upscaler state dict, and the state dict under that architecture's names. Raises
    UnknownArchitecture for anything else (nothing is built or run for it)."""
    state = unwrapped(state)
    if "model.0.weight" in state and any(k.startswith("model.1.sub.") for k in state):
        if "model.10.weight" not in state:
            raise UnknownArchitecture("an original-ESRGAN file of a scale other than 4 (its layers differ)")
        state = _from_original_names(state)
    if "conv_first.weight" in state and "body.0.rdb1.conv1.weight" in state:
        first = state["conv_first.weight"]
        scale = {3: 4, 12: 2, 48: 1}.get(int(first.shape[1]))
        blocks = len({k.split(".")[1] for k in state if k.startswith("body.")})
        spec = UpscalerSpec("RRDBNet", scale or 0, int(first.shape[0]), blocks,
                            int(state["body.0.rdb1.conv1.weight"].shape[0]))
        if scale is None:
            raise UnknownArchitecture(f"an RRDBNet with {first.shape[1]} input channels (known: 3, 12, 48)")
        return spec, state
    if "body.0.weight" in state and "body.1.weight" in state and state["body.1.weight"].ndim == 1:
        convs = sorted(int(k.split(".")[1]) for k in state if re.match(r"body\.\d+\.weight$", k)
                       and state[k].ndim == 4)
        last = state[f"body.{convs[-1]}.weight"]
        scale = int(round((last.shape[0] / 3) ** 0.5))
        if 3 * scale * scale != last.shape[0] or state["body.0.weight"].shape[1] != 3:
            raise UnknownArchitecture("a compact VGG-style file with an output that is not 3·scale² channels")
        return UpscalerSpec("SRVGGNetCompact", scale, int(state["body.0.weight"].shape[0]), len(convs) - 2), state
    raise UnknownArchitecture("not an ESRGAN-family file (known: RRDBNet / ESRGAN / Real-ESRGAN, SRVGGNetCompact); "
                              "its architecture is not run")


def build(spec: UpscalerSpec) -> nn.Module:
    return (RRDBNet if spec.arch == "RRDBNet" else SRVGGNetCompact)(spec)


def loaded_strictly(model: nn.Module, state: dict, misfit: str) -> nn.Module:
    """`model` with `state` loaded, in eval mode; UnknownArchitecture ("`misfit`: missing ..., unexpected ...") when
    a key is missing or left over (every post model's reader ends here)."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UnknownArchitecture(f"{misfit}: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.eval()


def upscaler_from_state(state: dict) -> tuple[nn.Module, UpscalerSpec]:
    """The model of a recognised state dict, loaded strictly."""
    spec, state = detect(state)
    return loaded_strictly(build(spec), state, f"a {spec.arch}-like file that does not fit it"), spec


def tiny_upscaler(scale: int, seed: int = 0) -> tuple[nn.Module, UpscalerSpec]:
    """The tiny preset's random twin: an RRDBNet of the same classes, one narrow block."""
    torch.manual_seed(seed)
    spec = UpscalerSpec("RRDBNet", scale, 8, 1, 4)
    return build(spec).eval(), spec


def flop_per_frame(spec: UpscalerSpec, height: int, width: int) -> float:
    """2 × multiply-adds of one frame (the convolutions) at the input's size (benchmarks)."""
    hw, f, g = height * width, spec.features, spec.grow

    def conv(cin, cout, area):
        return 2.0 * cin * cout * 9 * area

    if spec.arch == "SRVGGNetCompact":
        return conv(3, f, hw) + spec.blocks * conv(f, f, hw) + conv(f, 3 * spec.scale ** 2, hw)
    u = {4: 1, 2: 2, 1: 4}[spec.scale]
    low = hw / (u * u)
    dense = sum(conv(f + j * g, f if j == 4 else g, low) for j in range(5))
    total = conv(3 * u * u, f, low) + spec.blocks * 3 * dense + conv(f, f, low)
    return total + conv(f, f, low * 4) + conv(f, f, low * 16) + conv(f, f, low * 16) + conv(f, 3, low * 16)
