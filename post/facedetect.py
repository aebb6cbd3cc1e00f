"""Finding faces for the face step: RetinaFace (MobileNet-0.25 backbone, the small detector GFPGAN's helper library
facexlib ships, MIT) gives each face's box and five landmarks (eyes, nose, mouth corners); post/process.py aligns each
face to GFPGAN's template from them, restores it and pastes it back.

Why written here: facexlib's detector imports torchvision (its backbone wrapper and its NMS), which this project must
not install, so the network (a MobileNetV1 at 0.25 width, a three-level FPN, SSH context modules and 1×1 heads over
two anchors per position) is written from its published description (RetinaFace, arXiv 1905.00641; the
Pytorch_Retinaface configuration facexlib uses) with the parameter names of facexlib's published file
`detection_mobilenet0.25_Final.pth` (`body.stageN.*`, `fpn.*`, `sshN.*`, `ClassHead.N`, `BboxHead.N`,
`LandmarkHead.N`), so it loads as it is (strictly), and the anchor decoding and non-maximum suppression are done here
in a few lines of torch. The network is small (0.4 M parameters): the tiny preset's twin is the same network with
seeded random weights (it finds arbitrary "faces", which is all a test of the plumbing needs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from post.esrgan import UnknownArchitecture, loaded_strictly, unwrapped

MEAN_BGR = (104.0, 117.0, 123.0)        # subtracted from the BGR pixels (0-255), as the network was trained
ANCHORS = ((16, 32), (64, 128), (256, 512))     # anchor sides (pixels) at strides 8, 16, 32
STRIDES = (8, 16, 32)
VARIANCE = (0.1, 0.2)
THRESHOLD = 0.97                        # GFPGAN's helper keeps faces scored above this
NMS_IOU = 0.4


def _conv_bn(cin: int, cout: int, stride: int = 1, kernel: int = 3, leaky: float | None = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]
    if leaky is not None:
        layers.append(nn.LeakyReLU(leaky))
    return nn.Sequential(*layers)


def _conv_dw(cin: int, cout: int, stride: int) -> nn.Sequential:
    """A depthwise 3×3 then a pointwise 1×1, each with batch norm and a leaky ReLU (0.1)."""
    return nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                         nn.LeakyReLU(0.1), nn.Conv2d(cin, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout),
                         nn.LeakyReLU(0.1))


class _Body(nn.Module):
    """MobileNetV1 ×0.25: three stages, strides 8, 16, 32, of 64, 128, 256 channels."""

    def __init__(self):
        super().__init__()
        self.stage1 = nn.Sequential(_conv_bn(3, 8, 2, leaky=0.1), _conv_dw(8, 16, 1), _conv_dw(16, 32, 2),
                                    _conv_dw(32, 32, 1), _conv_dw(32, 64, 2), _conv_dw(64, 64, 1))
        self.stage2 = nn.Sequential(_conv_dw(64, 128, 2), *[_conv_dw(128, 128, 1) for _ in range(5)])
        self.stage3 = nn.Sequential(_conv_dw(128, 256, 2), _conv_dw(256, 256, 1))

    def forward(self, x):
        a = self.stage1(x)
        b = self.stage2(a)
        return a, b, self.stage3(b)


class _FPN(nn.Module):
    def __init__(self, channels=(64, 128, 256), out: int = 64):
        super().__init__()
        for i, cin in enumerate(channels):
            setattr(self, f"output{i + 1}", _conv_bn(cin, out, kernel=1, leaky=0.1))
        self.merge1 = _conv_bn(out, out, leaky=0.1)
        self.merge2 = _conv_bn(out, out, leaky=0.1)

    def forward(self, feats):
        o1, o2, o3 = self.output1(feats[0]), self.output2(feats[1]), self.output3(feats[2])
        o2 = self.merge2(o2 + F.interpolate(o3, size=o2.shape[-2:], mode="nearest"))
        o1 = self.merge1(o1 + F.interpolate(o2, size=o1.shape[-2:], mode="nearest"))
        return o1, o2, o3


class _SSH(nn.Module):
    """Context module: a 3×3 branch (half the channels) and two stacked 3×3 branches (5×5, 7×7 fields)."""

    def __init__(self, channels: int = 64):
        super().__init__()
        self.conv3X3 = _conv_bn(channels, channels // 2, leaky=None)
        self.conv5X5_1 = _conv_bn(channels, channels // 4, leaky=0.1)
        self.conv5X5_2 = _conv_bn(channels // 4, channels // 4, leaky=None)
        self.conv7X7_2 = _conv_bn(channels // 4, channels // 4, leaky=0.1)
        self.conv7x7_3 = _conv_bn(channels // 4, channels // 4, leaky=None)

    def forward(self, x):
        mid = self.conv5X5_1(x)
        return F.relu(torch.cat((self.conv3X3(x), self.conv5X5_2(mid), self.conv7x7_3(self.conv7X7_2(mid))), 1))


class _Head(nn.Module):
    def __init__(self, channels: int, per_anchor: int, anchors: int = 2):
        super().__init__()
        self.conv1x1 = nn.Conv2d(channels, anchors * per_anchor, 1)
        self.per_anchor = per_anchor

    def forward(self, x):
        return self.conv1x1(x).permute(0, 2, 3, 1).reshape(x.shape[0], -1, self.per_anchor)


class RetinaFace(nn.Module):
    """`forward(x)`: BGR frames minus MEAN_BGR, N×3×H×W → (box offsets N×A×4, scores N×A×2 (softmax), landmark
    offsets N×A×10) over the A anchors of the frame."""

    def __init__(self):
        super().__init__()
        self.body = _Body()
        self.fpn = _FPN()
        self.ssh1, self.ssh2, self.ssh3 = _SSH(), _SSH(), _SSH()
        self.ClassHead = nn.ModuleList(_Head(64, 2) for _ in range(3))
        self.BboxHead = nn.ModuleList(_Head(64, 4) for _ in range(3))
        self.LandmarkHead = nn.ModuleList(_Head(64, 10) for _ in range(3))

    def forward(self, x):
        feats = [ssh(f) for ssh, f in zip((self.ssh1, self.ssh2, self.ssh3), self.fpn(self.body(x)))]
        boxes = torch.cat([h(f) for h, f in zip(self.BboxHead, feats)], 1)
        scores = torch.cat([h(f) for h, f in zip(self.ClassHead, feats)], 1).softmax(-1)
        marks = torch.cat([h(f) for h, f in zip(self.LandmarkHead, feats)], 1)
        return boxes, scores, marks


def anchors(height: int, width: int, device=None) -> torch.Tensor:
    """(A, 4): each anchor's centre and size (cx, cy, w, h) as fractions of the frame, in the heads' order (level,
    row, column, anchor)."""
    out = []
    for sides, stride in zip(ANCHORS, STRIDES):
        rows, cols = math.ceil(height / stride), math.ceil(width / stride)
        cy, cx = torch.meshgrid((torch.arange(rows, dtype=torch.float32) + 0.5) * stride / height,
                                (torch.arange(cols, dtype=torch.float32) + 0.5) * stride / width, indexing="ij")
        for_level = [torch.stack((cx, cy, torch.full_like(cx, s / width), torch.full_like(cy, s / height)), -1)
                     for s in sides]
        out.append(torch.stack(for_level, 2).reshape(-1, 4))
    return torch.cat(out).to(device)


@dataclass(frozen=True)
class Face:
    score: float
    box: tuple[float, float, float, float]      # x0, y0, x1, y1 (pixels)
    landmarks: np.ndarray                       # (5, 2) pixels: left eye, right eye, nose, mouth left, mouth right


def _nms(boxes: torch.Tensor, iou: float) -> list[int]:
    """Greedy non-maximum suppression over boxes sorted by score (highest first): the indices kept."""
    keep: list[int] = []
    area = (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    for i in range(len(boxes)):
        if suppressed[i]:
            continue
        keep.append(i)
        lt = torch.maximum(boxes[i, :2], boxes[:, :2])
        rb = torch.minimum(boxes[i, 2:], boxes[:, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        suppressed |= inter / (area[i] + area - inter + 1e-9) > iou
    return keep


@torch.inference_mode()
def detect(net: RetinaFace, frame: np.ndarray, device, threshold: float = THRESHOLD, limit: int = 8) -> list[Face]:
    """The faces of one RGB uint8 frame, best first (at most `limit`), at the frame's own size."""
    h, w = frame.shape[:2]
    x = torch.from_numpy(np.ascontiguousarray(frame[:, :, ::-1])).to(device).permute(2, 0, 1)[None].float()
    x = x - torch.tensor(MEAN_BGR, device=device).view(1, 3, 1, 1)
    dtype = next(net.parameters()).dtype
    loc, conf, marks = (t[0].float() for t in net(x.to(dtype)))
    prior = anchors(h, w, loc.device)
    score = conf[:, 1]
    chosen = torch.nonzero(score > threshold).flatten()
    if chosen.numel() == 0:
        return []
    chosen = chosen[score[chosen].argsort(descending=True, stable=True)][:200]
    p, lo, mk = prior[chosen], loc[chosen], marks[chosen]
    centre = p[:, :2] + lo[:, :2] * VARIANCE[0] * p[:, 2:]
    size = p[:, 2:] * torch.exp(lo[:, 2:] * VARIANCE[1])
    scale = torch.tensor([w, h], dtype=torch.float32, device=loc.device)
    boxes = torch.cat((centre - size / 2, centre + size / 2), 1) * scale.repeat(2)
    points = (p[:, None, :2] + mk.view(-1, 5, 2) * VARIANCE[0] * p[:, None, 2:]) * scale
    keep = _nms(boxes.cpu(), NMS_IOU)[:limit]
    return [Face(float(score[chosen[i]]), tuple(float(v) for v in boxes[i].tolist()),  # type: ignore[arg-type]
                 points[i].cpu().numpy()) for i in keep]


EYES_MIN_PX = 5.0                       # a face whose eyes are closer than this is too small to restore (GFPGAN's)


def find_faces(net: RetinaFace, frame: np.ndarray, device) -> list[np.ndarray]:
    """The five landmarks of each face of a frame large enough to restore (what post/process.py restore_faces asks
    for)."""
    return [f.landmarks for f in detect(net, frame, device)
            if float(np.linalg.norm(f.landmarks[0] - f.landmarks[1])) >= EYES_MIN_PX]


def detector_from_state(state: dict) -> RetinaFace:
    """The detector of a state dict in facexlib's layout (`module.` prefixes dropped), loaded strictly;
    UnknownArchitecture for anything else."""
    state = unwrapped(state)
    if "body.stage1.0.0.weight" not in state or "LandmarkHead.0.conv1x1.weight" not in state:
        raise UnknownArchitecture("not RetinaFace's MobileNet-0.25 face detector (facexlib's "
                                  "detection_mobilenet0.25_Final.pth)")
    return loaded_strictly(RetinaFace(), state, "a RetinaFace-like file that does not fit MobileNet-0.25")


# GFPGAN's five points, relative to a face's centre, in face widths (post/process.py FACE_TEMPLATE / 512 - 0.5)
_TINY_POINTS = ((-0.123, -0.031), (0.123, -0.031), (0.001, 0.113), (-0.107, 0.225), (0.111, 0.225))


def tiny_detector(seed: int = 0) -> RetinaFace:
    """The tiny preset's twin: the same (small) network, seeded random weights, except that its heads are set to
    see a face of the anchor's size, eyes, nose and mouth where GFPGAN's template has them, at every anchor (a random
    detector finds nothing above the threshold, or faces whose five points coincide): so the whole face path runs
    in tests, with no real face needed."""
    torch.manual_seed(seed)
    net = RetinaFace().eval()
    points = torch.tensor(_TINY_POINTS).flatten() / VARIANCE[0]
    with torch.no_grad():
        for cls, box, mark in zip(net.ClassHead, net.BboxHead, net.LandmarkHead):
            for head in (cls, box, mark):
                head.conv1x1.weight.zero_()
            cls.conv1x1.bias.copy_(torch.tensor([0.0, 6.0]).repeat(2))
            box.conv1x1.bias.zero_()
            mark.conv1x1.bias.copy_(points.repeat(2))
    return net
