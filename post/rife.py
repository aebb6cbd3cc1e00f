"""RIFE 4.25's flow network (IFNet), written once here from the published architecture (Practical-RIFE, MIT): no
maintained pip package loads RIFE 4.x weights (the packages that do wrap their own copies of the network), so the
network is defined in this file and its published weights (`flownet.pkl`, a plain state dict) are read safely
(`torch.load(..., weights_only=True)` or safetensors, post/modelfiles.py).

What the network does, in short: a small convolutional head encodes both frames into 4 feature channels; five
blocks then estimate the two flows (to frame 0 and to frame 1), a blend mask and 8 context channels, coarse to
fine (the frames scaled by 1/16, 1/8, 1/4, 1/2, 1), each block refining the previous estimate from the frames and
features warped by it. The middle frame is the two warped frames blended by the mask. The timestep is an input
channel, so one pass gives any time between the two frames (4.x models).

Parameter names follow the published files (`encode.cnn0`, `block0.conv0.0.0`, `block0.convblock.3.beta`, ...) so
they load as they are; `widths` and `depth` make the tiny preset's random twin of the same classes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTHS = (192, 128, 96, 64, 32)        # the five blocks' channels (RIFE 4.25)
DEPTH = 8                              # residual convolutions per block
SCALES = (16, 8, 4, 2, 1)              # each block works on the frames scaled down by this much
HEAD_CHANNELS = 4                      # features per frame from the head
CONTEXT = 8                            # context channels a block hands to the next
ALIGN = 64                             # frames are padded to a multiple of this (the coarsest block's grid)


def _act() -> nn.Module:
    return nn.LeakyReLU(0.2, inplace=True)


class Head(nn.Module):
    """The frame encoder: 3 → HEAD_CHANNELS features at the frame's size."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.cnn0 = nn.Conv2d(3, width, 3, 2, 1)
        self.cnn1 = nn.Conv2d(width, width, 3, 1, 1)
        self.cnn2 = nn.Conv2d(width, width, 3, 1, 1)
        self.cnn3 = nn.ConvTranspose2d(width, HEAD_CHANNELS, 4, 2, 1)
        self.relu = _act()

    def forward(self, x):
        x = self.relu(self.cnn0(x))
        x = self.relu(self.cnn1(x))
        x = self.relu(self.cnn2(x))
        return self.cnn3(x)


class ResConv(nn.Module):
    """A 3×3 convolution added to its input with a learned per-channel scale (`beta`)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 1, 1)
        self.beta = nn.Parameter(torch.ones(1, channels, 1, 1))
        self.relu = _act()

    def forward(self, x):
        return self.relu(self.conv(x) * self.beta + x)


def _conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 2, 1), _act())


class IFBlock(nn.Module):
    """One scale: from its inputs (and the flow so far) to a flow update, a mask and context channels."""

    def __init__(self, in_channels: int, width: int, depth: int = DEPTH):
        super().__init__()
        self.conv0 = nn.Sequential(_conv(in_channels, width // 2), _conv(width // 2, width))
        self.convblock = nn.Sequential(*[ResConv(width) for _ in range(depth)])
        out = 4 + 1 + CONTEXT                       # two flows (x, y each), the mask, the context
        self.lastconv = nn.Sequential(nn.ConvTranspose2d(width, 4 * out, 4, 2, 1), nn.PixelShuffle(2))

    def forward(self, x, flow, scale: float):
        x = F.interpolate(x, scale_factor=1.0 / scale, mode="bilinear")
        if flow is not None:
            x = torch.cat((x, F.interpolate(flow, scale_factor=1.0 / scale, mode="bilinear") / scale), 1)
        y = self.lastconv(self.convblock(self.conv0(x)))
        y = F.interpolate(y, scale_factor=scale, mode="bilinear")
        return y[:, :4] * scale, y[:, 4:5], y[:, 5:]


def _warp(image, flow, base):
    """Sample `image` at each pixel moved by `flow` (pixels), as the published model does (bilinear, border)."""
    h, w = image.shape[-2:]
    norm = torch.cat((flow[:, :1] * (2.0 / (w - 1)), flow[:, 1:2] * (2.0 / (h - 1))), 1)
    grid = (base + norm).permute(0, 2, 3, 1)
    return F.grid_sample(image, grid, mode="bilinear", padding_mode="border", align_corners=True)


def _base_grid(n: int, h: int, w: int, like: torch.Tensor) -> torch.Tensor:
    xs = torch.linspace(-1.0, 1.0, w, device=like.device, dtype=like.dtype).view(1, 1, 1, w).expand(n, 1, h, w)
    ys = torch.linspace(-1.0, 1.0, h, device=like.device, dtype=like.dtype).view(1, 1, h, 1).expand(n, 1, h, w)
    return torch.cat((xs, ys), 1)


class IFNet(nn.Module):
    """RIFE 4.25's IFNet. `forward(img0, img1, t)`: frames N×3×H×W in [0, 1] (H, W multiples of ALIGN), `t` N×1×1×1
    (or a float) in (0, 1): the frame at time t between them."""

    def __init__(self, widths: tuple[int, ...] = WIDTHS, depth: int = DEPTH, head_width: int = 16):
        super().__init__()
        self.encode = Head(head_width)
        first = 3 + 3 + 2 * HEAD_CHANNELS + 1                          # both frames, both features, the time
        later = 3 + 3 + 2 * HEAD_CHANNELS + 1 + 1 + CONTEXT + 4        # ... warped, the mask, context, the flow
        for i, width in enumerate(widths):
            self.add_module(f"block{i}", IFBlock(first if i == 0 else later, width, depth))
        self.scales = SCALES[-len(widths):] if len(widths) <= len(SCALES) else SCALES
        self.widths, self.depth = tuple(widths), depth

    @property
    def blocks(self) -> list[IFBlock]:
        return [getattr(self, f"block{i}") for i in range(len(self.widths))]

    def forward(self, img0, img1, t):
        n, _, h, w = img0.shape
        if not torch.is_tensor(t):
            t = torch.full((n, 1, 1, 1), float(t), device=img0.device, dtype=img0.dtype)
        time = t.to(img0.dtype).expand(n, 1, h, w)
        base = _base_grid(n, h, w, img0)
        f0, f1 = self.encode(img0), self.encode(img1)
        flow = mask = context = None
        warped0, warped1 = img0, img1
        for block, scale in zip(self.blocks, self.scales):
            if flow is None:
                flow, mask, context = block(torch.cat((img0, img1, f0, f1, time), 1), None, scale)
            else:
                wf0, wf1 = _warp(f0, flow[:, :2], base), _warp(f1, flow[:, 2:4], base)
                delta, mask, context = block(torch.cat((warped0, warped1, wf0, wf1, time, mask, context), 1),
                                             flow, scale)
                flow = flow + delta
            warped0, warped1 = _warp(img0, flow[:, :2], base), _warp(img1, flow[:, 2:4], base)
        m = torch.sigmoid(mask)
        return warped0 * m + warped1 * (1 - m)


def tiny_ifnet(seed: int = 0) -> IFNet:
    """The tiny preset's random twin: the same classes, two narrow, shallow blocks."""
    torch.manual_seed(seed)
    return IFNet(widths=(16, 8), depth=1, head_width=4).eval()


def ifnet_from_state(state: dict) -> IFNet:
    """An IFNet shaped like the state dict (RIFE 4.25, or a narrower twin), its weights loaded strictly (a file of
    another layout fails here, naming the keys). Raises ValueError for a file that is not an IFNet of this kind."""
    state = {k.removeprefix("module."): v for k, v in state.items()}
    widths, i = [], 0
    while f"block{i}.conv0.1.0.weight" in state:
        widths.append(int(state[f"block{i}.conv0.1.0.weight"].shape[0]))
        i += 1
    if not widths or "encode.cnn0.weight" not in state:
        raise ValueError("not a RIFE 4.x flow network (no encode.cnn0 / block0.conv0 weights)")
    depth = len({k.split(".")[2] for k in state if k.startswith("block0.convblock.")})
    head = int(state["encode.cnn0.weight"].shape[0])
    net = IFNet(tuple(widths), depth, head)
    missing, unexpected = net.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"not a RIFE 4.25 flow network: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return net.eval()


def flop_per_frame(net: IFNet, height: int, width: int) -> float:
    """Multiply-adds × 2 of one interpolated frame (the convolutions; warps and interpolations are memory-bound and
    left out): the arithmetic floor's numerator (benchmarks)."""
    total = 0.0
    h, w = -(-height // ALIGN) * ALIGN, -(-width // ALIGN) * ALIGN

    def conv(cin, cout, k, hw):
        return 2.0 * cin * cout * k * k * hw

    hw = h * w
    head = net.encode.cnn0.out_channels
    total += 2 * (conv(3, head, 3, hw / 4) + 2 * conv(head, head, 3, hw / 4) + conv(head, HEAD_CHANNELS, 4, hw / 4))
    for block, scale in zip(net.blocks, net.scales):
        c = block.conv0[1][0].out_channels
        cin = block.conv0[0][0].in_channels
        s = hw / (scale * scale)
        total += conv(cin, c // 2, 3, s / 4) + conv(c // 2, c, 3, s / 16)
        total += net.depth * conv(c, c, 3, s / 16) + conv(c, 4 * (5 + CONTEXT), 4, s / 16)
    return total
