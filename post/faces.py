"""Face restoration (the GFPGAN family): GFPGAN v1.3 / v1.4's network ("GFPGANv1Clean": a U-Net over the face whose
features modulate a StyleGAN2 decoder), recognised from a file's keys and shapes, built and loaded strictly; any
other layout is refused (UnknownArchitecture) and never executed.

Why not spandrel, which loads GFPGAN and RestoreFormer files in its core (MIT; CodeFormer is in
spandrel_extra_arches, under CodeFormer's non-commercial S-Lab licence): its wheel requires torchvision, which this
project must not install (it pins its own torch), and `import spandrel` imports every architecture of its registry,
RestoreFormer's and LaMa's among them, which import torchvision at module level (spandrel 0.4.2,
libs/spandrel/spandrel/__helpers/main_registry.py) — so not even `pip install --no-deps spandrel` can load a face
file here (post/esrgan.py says the same for the upscalers). The network is therefore written once here from its
published description (GFPGAN, TencentARC, Apache-2.0: arXiv 2101.04061 and the v1.3/v1.4 release notes), with the
parameter names of the published files so they load as they are:

- the U-Net: `conv_body_first` (1×1), `conv_body_down.N` / `conv_body_up.N` residual blocks (two 3×3 convolutions
  around a bilinear ×½ or ×2, a bias-free 1×1 `skip`), `final_conv`, `final_linear` (the style codes, one per
  decoder layer), `toRGB.N` (training-only outputs, loaded and unused), `condition_scale.N` / `condition_shift.N`
  (the SFT scale and shift for each resolution);
- the decoder `stylegan_decoder.*`: StyleGAN2's `style_mlp` (unused: the codes are already latents),
  `constant_input`, `style_conv1`, `to_rgb1`, `style_convs.N`, `to_rgbs.N` (modulated convolutions with
  demodulation, bilinear upsampling), the per-layer `noises.noiseN` buffers; the SFT modulates half of the channels.

The stored noise buffers are used, never fresh noise, so the same frames give the same bytes every run (GFPGAN's own
inference draws new noise each call). RestoreFormer / CodeFormer files are recognised only to be refused by name.

Faces are found by RetinaFace (post/facedetect.py), aligned by their five landmarks to GFPGAN's template at the
model's 512×512 size, restored, and pasted back through the inverse transform under a feathered mask, as GFPGAN's own
helper does (post/process.py `restore_faces`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from post.esrgan import UnknownArchitecture, loaded_strictly, unwrapped

SLOPE = 0.2


@dataclass(frozen=True)
class FaceSpec:
    """GFPGANv1Clean's hyper-parameters (v1.3 / v1.4: 512, 512, 8, 2, 1)."""
    size: int = 512                 # the face crop's side (the model's input and output)
    style: int = 512                # style features per latent
    mlp: int = 8                    # the decoder's style MLP layers
    multiplier: int = 2             # StyleGAN2's channel multiplier (the resolutions from 64 up)
    narrow: float = 1.0             # all channels times this

    @property
    def log_size(self) -> int:
        return int(math.log2(self.size))

    def channels(self, resolution: int, unet: bool = False) -> int:
        """The decoder's channels at a resolution (the U-Net has half)."""
        base = 512 if resolution <= 32 else (2 ** 14 // resolution) * self.multiplier
        return int(base * self.narrow * (0.5 if unet else 1.0))


class _Resample(nn.Module):
    """A residual block that halves ("down") or doubles ("up") the size: conv, resample, conv; plus a 1×1 skip."""

    def __init__(self, cin: int, cout: int, factor: float):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cin, 3, 1, 1)
        self.conv2 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.skip = nn.Conv2d(cin, cout, 1, bias=False)
        self.factor = factor

    def forward(self, x):
        def resample(t):
            return F.interpolate(t, scale_factor=self.factor, mode="bilinear", align_corners=False)

        y = F.leaky_relu(self.conv1(x), SLOPE)
        y = F.leaky_relu(self.conv2(resample(y)), SLOPE)
        return y + self.skip(resample(x))


class _ModConv(nn.Module):
    """StyleGAN2's modulated convolution: the weight scaled per input channel by the style (and demodulated), one
    grouped convolution for the batch; optionally the input upsampled ×2 first."""

    def __init__(self, cin: int, cout: int, kernel: int, style: int, demodulate: bool = True, up: bool = False):
        super().__init__()
        self.modulation = nn.Linear(style, cin)
        self.weight = nn.Parameter(torch.randn(1, cout, cin, kernel, kernel) / math.sqrt(cin * kernel * kernel))
        self.demodulate, self.up, self.cout = demodulate, up, cout

    def forward(self, x, style):
        b, cin = x.shape[:2]
        w = self.weight * self.modulation(style).view(b, 1, cin, 1, 1)
        if self.demodulate:
            w = w * torch.rsqrt(w.pow(2).sum((2, 3, 4), keepdim=True) + 1e-8)
        if self.up:
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        h, wd = x.shape[-2:]
        k = w.shape[-1]
        y = F.conv2d(x.reshape(1, b * cin, h, wd), w.reshape(b * self.cout, cin, k, k), padding=k // 2, groups=b)
        return y.view(b, self.cout, *y.shape[-2:])


class _StyleConv(nn.Module):
    def __init__(self, cin: int, cout: int, style: int, up: bool = False):
        super().__init__()
        self.modulated_conv = _ModConv(cin, cout, 3, style, up=up)
        self.weight = nn.Parameter(torch.zeros(1))                  # the noise's strength
        self.bias = nn.Parameter(torch.zeros(1, cout, 1, 1))

    def forward(self, x, style, noise):
        y = self.modulated_conv(x, style) * math.sqrt(2.0) + self.weight * noise + self.bias
        return F.leaky_relu(y, SLOPE)


class _ToRGB(nn.Module):
    def __init__(self, cin: int, style: int):
        super().__init__()
        self.modulated_conv = _ModConv(cin, 3, 1, style, demodulate=False)
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))

    def forward(self, x, style, skip=None):
        y = self.modulated_conv(x, style) + self.bias
        if skip is not None:
            y = y + F.interpolate(skip, scale_factor=2, mode="bilinear", align_corners=False)
        return y


class _ConstantInput(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(1, channels, 4, 4))


class _Decoder(nn.Module):
    """StyleGAN2's synthesis network with SFT: half of each upsampled layer's channels are scaled and shifted by
    the U-Net's conditions."""

    def __init__(self, spec: FaceSpec):
        super().__init__()
        layers: list[nn.Module] = [nn.Identity()]                    # (the style normalisation: no parameters)
        for _ in range(spec.mlp):
            layers += [nn.Linear(spec.style, spec.style), nn.LeakyReLU(SLOPE)]
        self.style_mlp = nn.Sequential(*layers)                      # loaded, unused: the codes are latents
        c4 = spec.channels(4)
        self.constant_input = _ConstantInput(c4)
        self.style_conv1 = _StyleConv(c4, c4, spec.style)
        self.to_rgb1 = _ToRGB(c4, spec.style)
        self.style_convs, self.to_rgbs = nn.ModuleList(), nn.ModuleList()
        cin = c4
        for i in range(3, spec.log_size + 1):
            cout = spec.channels(2 ** i)
            self.style_convs.append(_StyleConv(cin, cout, spec.style, up=True))
            self.style_convs.append(_StyleConv(cout, cout, spec.style))
            self.to_rgbs.append(_ToRGB(cout, spec.style))
            cin = cout
        self.noises = nn.Module()
        for n in range(2 * (spec.log_size - 2) + 1):
            side = 2 ** ((n + 5) // 2)
            self.noises.register_buffer(f"noise{n}", torch.randn(1, 1, side, side))

    def forward(self, latent, conditions):
        noise = [getattr(self.noises, f"noise{n}") for n in range(2 * len(self.to_rgbs) + 1)]
        x = self.constant_input.weight.expand(latent.shape[0], -1, -1, -1)
        x = self.style_conv1(x, latent[:, 0], noise[0])
        rgb = self.to_rgb1(x, latent[:, 1])
        for k, to_rgb in enumerate(self.to_rgbs):
            i = 2 * k + 1
            x = self.style_convs[2 * k](x, latent[:, i], noise[i])
            if 2 * k + 1 < len(conditions):
                same, sft = x.chunk(2, dim=1)
                x = torch.cat((same, sft * conditions[2 * k] + conditions[2 * k + 1]), 1)
            x = self.style_convs[2 * k + 1](x, latent[:, i + 1], noise[i + 1])
            rgb = to_rgb(x, latent[:, i + 2], rgb)
        return rgb


def _sft(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1), nn.LeakyReLU(SLOPE),
                         nn.Conv2d(channels, channels, 3, 1, 1))


class GFPGAN(nn.Module):
    """GFPGANv1Clean. `forward(x)`: faces N×3×S×S in [-1, 1] (S = spec.size) → restored faces, the same range."""

    def __init__(self, spec: FaceSpec = FaceSpec()):
        super().__init__()
        self.spec = spec
        top = spec.log_size
        self.conv_body_first = nn.Conv2d(3, spec.channels(spec.size, True), 1)
        self.conv_body_down = nn.ModuleList(
            _Resample(spec.channels(2 ** i, True), spec.channels(2 ** (i - 1), True), 0.5) for i in range(top, 2, -1))
        c4 = spec.channels(4, True)
        self.final_conv = nn.Conv2d(c4, c4, 3, 1, 1)
        self.conv_body_up = nn.ModuleList(
            _Resample(spec.channels(2 ** (i - 1), True), spec.channels(2 ** i, True), 2.0) for i in range(3, top + 1))
        self.toRGB = nn.ModuleList(nn.Conv2d(spec.channels(2 ** i, True), 3, 1) for i in range(3, top + 1))
        self.final_linear = nn.Linear(c4 * 16, (2 * top - 2) * spec.style)
        self.stylegan_decoder = _Decoder(spec)
        self.condition_scale = nn.ModuleList(_sft(spec.channels(2 ** i, True)) for i in range(3, top + 1))
        self.condition_shift = nn.ModuleList(_sft(spec.channels(2 ** i, True)) for i in range(3, top + 1))

    def forward(self, x):
        feat = F.leaky_relu(self.conv_body_first(x), SLOPE)
        skips = []
        for block in self.conv_body_down:
            feat = block(feat)
            skips.append(feat)
        feat = F.leaky_relu(self.final_conv(feat), SLOPE)
        latent = self.final_linear(feat.flatten(1)).view(x.shape[0], -1, self.spec.style)
        conditions = []
        for block, scale, shift, skip in zip(self.conv_body_up, self.condition_scale, self.condition_shift,
                                             reversed(skips)):
            feat = block(feat + skip)
            conditions += [scale(feat), shift(feat)]
        return self.stylegan_decoder(latent, conditions)


_OTHERS = {"quantize.embedding.weight": "a VQ face model (RestoreFormer / CodeFormer)"}


def detect(state: dict) -> tuple[FaceSpec, dict]:
    """The face network of a state dict and the dict to load (unwrapped); UnknownArchitecture for anything else."""
    state = unwrapped(state)
    if "toRGB.0.weight" not in state or "stylegan_decoder.constant_input.weight" not in state \
            or "final_linear.weight" not in state:
        for key, what in _OTHERS.items():
            if any(k.startswith(key) for k in state):
                raise UnknownArchitecture(f"{what} is not supported; use a GFPGAN v1.3 / v1.4 file")
        raise UnknownArchitecture("not a GFPGAN face model (known: GFPGAN v1.3 / v1.4, GFPGANv1Clean); its "
                                  "architecture is not run")
    levels = len({k.split(".")[1] for k in state if k.startswith("toRGB.")})
    style = int(state["stylegan_decoder.style_conv1.modulated_conv.modulation.weight"].shape[1]) \
        if "stylegan_decoder.style_conv1.modulated_conv.modulation.weight" in state else 0
    mlp = sum(1 for k in state if k.startswith("stylegan_decoder.style_mlp.") and k.endswith(".weight"))
    narrow = int(state["stylegan_decoder.constant_input.weight"].shape[1]) / 512
    multiplier = 2
    if levels + 2 >= 6:                                              # a 64×64 layer: its width tells the multiplier
        width64 = int(state["toRGB.3.weight"].shape[1])
        multiplier = max(1, round(width64 / (256 * narrow * 0.5)))
    spec = FaceSpec(2 ** (levels + 2), style, mlp, multiplier, narrow)
    if style < 1 or spec.size < 8:
        raise UnknownArchitecture("a GFPGAN-like file without its decoder's style layers")
    return spec, state


def face_model_from_state(state: dict) -> GFPGAN:
    """The face model of a recognised state dict, loaded strictly."""
    spec, state = detect(state)
    return loaded_strictly(GFPGAN(spec), state, "a GFPGAN-like file that does not fit GFPGAN v1.3/v1.4")


TINY = FaceSpec(size=32, style=16, mlp=2, multiplier=2, narrow=1 / 32)


def tiny_face_model(seed: int = 0) -> GFPGAN:
    """The tiny preset's random twin: the same classes, a 32×32 face, 16 channels."""
    torch.manual_seed(seed)
    return GFPGAN(TINY).eval()


def flop_per_face(spec: FaceSpec) -> float:
    """2 × multiply-adds of one face (the convolutions; benchmarks' arithmetic floor)."""
    total = 0.0

    def conv(cin, cout, k, side):
        return 2.0 * cin * cout * k * k * side * side

    s = spec.size
    total += conv(3, spec.channels(s, True), 1, s)
    for i in range(spec.log_size, 2, -1):
        cin, cout = spec.channels(2 ** i, True), spec.channels(2 ** (i - 1), True)
        total += conv(cin, cin, 3, 2 ** i) + conv(cin, cout, 3, 2 ** (i - 1)) + conv(cin, cout, 1, 2 ** (i - 1))
    for i in range(3, spec.log_size + 1):
        cin, cout = spec.channels(2 ** (i - 1), True), spec.channels(2 ** i, True)
        total += conv(cin, cin, 3, 2 ** (i - 1)) + conv(cin, cout, 3, 2 ** i) + conv(cin, cout, 1, 2 ** i)
        total += 4 * conv(cout, cout, 3, 2 ** i)                                        # SFT scale and shift
        d_in, d_out = spec.channels(2 ** (i - 1)), spec.channels(2 ** i)
        total += conv(d_in, d_out, 3, 2 ** i) + conv(d_out, d_out, 3, 2 ** i) + conv(d_out, 3, 1, 2 ** i)
    return total
