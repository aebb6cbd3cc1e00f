"""One convolution call, normalised: explicit symmetric integer padding, tuples everywhere, a batch dimension.

``ConvSpec`` is the hyper-parameters; ``ConvSignature`` adds shapes, dtype and arch and is the key under which the
fallback caches its verdicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property


@dataclass(frozen=True)
class ConvSpec:
    op: str                       # 'conv2d' | 'conv3d'
    stride: tuple[int, ...]
    padding: tuple[int, ...]      # symmetric, per spatial dim
    dilation: tuple[int, ...]
    groups: int

    @property
    def dims(self) -> int:
        return 3 if self.op == "conv3d" else 2


@dataclass(frozen=True)
class ConvSignature:
    op: str                       # 'conv2d' | 'conv3d' | 'conv2d_backward' | 'conv3d_backward'
    input_shape: tuple[int, ...]
    weight_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    dtype: str                    # 'float16'
    device_type: str              # 'cuda' | 'cpu'
    arch: str                     # 'gfx1100' | 'sm_90' | 'cpu'
    bias: bool = True

    @cached_property
    def key(self) -> str:
        def j(t):
            return "x".join(map(str, t))
        return (f"{self.op}|x={j(self.input_shape)}|w={j(self.weight_shape)}|s={j(self.stride)}|"
                f"p={j(self.padding)}|d={j(self.dilation)}|g={self.groups}|{self.dtype}|{self.device_type}|"
                f"{self.arch}")

    @property
    def base_op(self) -> str:
        return self.op.split("_")[0]

    @property
    def direction(self) -> str:
        return "backward" if self.op.endswith("_backward") else "forward"

    @property
    def spec(self) -> ConvSpec:
        return ConvSpec(self.base_op, self.stride, self.padding, self.dilation, self.groups)

    def short(self) -> str:
        return (f"{self.op} in {tuple(self.input_shape)} w {tuple(self.weight_shape)} s{self.stride} "
                f"p{self.padding} d{self.dilation} g{self.groups} {self.dtype}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ConvSignature":
        data = dict(data)
        for k in ("input_shape", "weight_shape", "stride", "padding", "dilation"):
            data[k] = tuple(data[k])
        return cls(**data)


def as_tuple(value, n: int, name: str) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    out = tuple(int(v) for v in value)
    if len(out) == 1:
        return out * n
    if len(out) != n:
        raise ValueError(f"{name} must be an int or {n} ints, got {value!r}")
    return out


def resolve_padding(padding, kernel: tuple[int, ...], stride: tuple[int, ...],
                    dilation: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(left, right) padding per spatial dim for an int, a tuple, 'valid' or 'same' (PyTorch's rule: the odd
    extra element goes to the right)."""
    n = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * n
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            out = []
            for k, d in zip(kernel, dilation):
                total = d * (k - 1)
                out.append((total // 2, total - total // 2))
            return tuple(out)
        raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
    return tuple((p, p) for p in as_tuple(padding, n, "padding"))


def normalize_call(op: str, x, weight, stride, padding, dilation, groups):
    """-> (input with a batch dim and any asymmetric padding applied, ConvSpec, was_unbatched).

    Returns None when the call is malformed (wrong ranks); the caller then runs the plain op so the user sees
    PyTorch's own error message.
    """
    import torch.nn.functional as F

    n = 3 if op == "conv3d" else 2
    if weight.dim() != n + 2 or x.dim() not in (n + 1, n + 2):
        return None
    unbatched = x.dim() == n + 1
    if unbatched:
        x = x.unsqueeze(0)
    stride_t = as_tuple(stride, n, "stride")
    dilation_t = as_tuple(dilation, n, "dilation")
    pads = resolve_padding(padding, tuple(weight.shape[2:]), stride_t, dilation_t)
    if any(left != right for left, right in pads):
        flat = []
        for left, right in reversed(pads):
            flat += [left, right]
        x = F.pad(x, flat)
        pad_t = (0,) * n
    else:
        pad_t = tuple(left for left, _ in pads)
    return x, ConvSpec(op, stride_t, pad_t, dilation_t, int(groups)), unbatched
