"""``SafeConv2d`` / ``SafeConv3d``: drop-in ``nn.Conv2d`` / ``nn.Conv3d`` that run through a ``ConvFallback`` and
count, per layer, forwards, bypasses (answered by a tier other than 1, the normal path) and the last tier used.
``patch_model`` swaps a model's plain conv layers for them, keeping the same weight ``Parameter`` objects, and
returns the model. A layer may carry its own ``config`` (a ``BypassConfig``, the field notes'
``Conv2dBypassConfig``); without one it follows its fallback's strategy.
"""

from __future__ import annotations

import logging
from collections import Counter

import torch.nn.functional as F
from torch import nn

from rocm.conv_fallback import ConvFallback, new_conv_fallback

logger = logging.getLogger(__name__)


class _SafeConvMixin:
    _op = "conv2d"

    def _init_counters(self, fallback=None, config=None) -> None:
        self.fallback = fallback
        self.config = config
        self.forwards = 0
        self.bypasses = 0
        self.last_tier: int | None = None
        self.tier_counts: Counter = Counter()

    def _get_fallback(self):
        """The fallback given to the layer (patch_model gives one to all the layers it makes), else one of its
        own, made at its first forward."""
        if self.fallback is None:
            self.fallback = new_conv_fallback()
        return self.fallback

    def _conv_forward(self, input, weight, bias):
        fallback = self._get_fallback()
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        else:
            padding = self.padding
        out = fallback.conv(self._op, input, weight, bias, self.stride, padding, self.dilation, self.groups,
                            bypass=self.config)
        tier = fallback.last_tier
        self.forwards += 1
        if tier is not None:
            self.last_tier = tier
            self.tier_counts[tier] += 1
            if tier != 1:
                self.bypasses += 1
                if self.bypasses == 1:
                    config = self.config or fallback.bypass
                    logger.log(logging.INFO if config.verbose else logging.DEBUG,
                               "%s %s: MIOpen/cuDNN bypassed for input %s (tier %d, strategy %s)", self._op,
                               tuple(self.weight.shape), tuple(input.shape), tier, config.strategy.name)
        return out

    def get_bypass_stats(self) -> dict:
        """The field notes' per-layer statistics: forwards, bypasses, bypass rate in percent, strategy; plus the
        last tier and the calls per tier."""
        config = self.config or self._get_fallback().bypass
        return {"total_forwards": self.forwards, "bypass_count": self.bypasses,
                "bypass_rate": 100.0 * self.bypasses / self.forwards if self.forwards else 0.0,
                "strategy": config.strategy.value, "last_tier": self.last_tier, "tiers": dict(self.tier_counts)}

    @classmethod
    def from_conv(cls, conv, fallback=None, config=None):
        """A Safe copy of ``conv`` sharing its weight and bias Parameters (no copy of the data)."""
        safe = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
                   dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                   padding_mode=conv.padding_mode, device="meta", dtype=conv.weight.dtype, fallback=fallback,
                   config=config)
        safe.weight = conv.weight
        safe.bias = conv.bias
        safe.train(conv.training)
        return safe

    def to_plain(self):
        plain_cls = nn.Conv3d if self._op == "conv3d" else nn.Conv2d
        plain = plain_cls(self.in_channels, self.out_channels, self.kernel_size, stride=self.stride,
                          padding=self.padding, dilation=self.dilation, groups=self.groups,
                          bias=self.bias is not None, padding_mode=self.padding_mode, device="meta",
                          dtype=self.weight.dtype)
        plain.weight, plain.bias = self.weight, self.bias
        plain.train(self.training)
        return plain


class SafeConv2d(_SafeConvMixin, nn.Conv2d):
    _op = "conv2d"

    def __init__(self, *args, fallback=None, config=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_counters(fallback, config)


class SafeConv3d(_SafeConvMixin, nn.Conv3d):
    _op = "conv3d"

    def __init__(self, *args, fallback=None, config=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_counters(fallback, config)


def _set_child(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def patch_model(model: nn.Module, config=None, recursive: bool = True, *, fallback=None) -> nn.Module:
    """Replace every plain ``nn.Conv2d`` / ``nn.Conv3d`` (exact class; subclasses with their own forward are
    left alone) with the Safe version, keeping the weights; returns ``model`` (changed in place), as in the field
    notes: ``model = patch_model(model)``. ``config``: a ``BypassConfig`` for the patched layers (default: their
    fallback's); ``recursive=False`` patches only direct children; ``fallback``: a ``ConvFallback`` (default: a
    new one, shared by the layers patched here). ``patched_layers(model)`` lists what was replaced."""
    if isinstance(config, ConvFallback):         # patch_model(model, fallback) of earlier versions
        config, fallback = None, config
    fallback = fallback or new_conv_fallback()
    modules = model.named_modules() if recursive else model.named_children()
    replaced = []
    for name, module in list(modules):
        if type(module) is nn.Conv2d:
            _set_child(model, name, SafeConv2d.from_conv(module, fallback, config))
        elif type(module) is nn.Conv3d:
            _set_child(model, name, SafeConv3d.from_conv(module, fallback, config))
        else:
            continue
        replaced.append(name)
    logger.info("patch_model: %d conv layers routed through the conv fallback", len(replaced))
    return model


def patched_layers(model: nn.Module) -> list[str]:
    """Names of the Safe conv layers in ``model``."""
    return [name for name, m in model.named_modules() if isinstance(m, _SafeConvMixin)]


def unpatch_model(model: nn.Module) -> list[str]:
    """Undo ``patch_model``: Safe layers back to plain ones (same Parameters)."""
    restored = []
    for name, module in list(model.named_modules()):
        if isinstance(module, _SafeConvMixin):
            _set_child(model, name, module.to_plain())
            restored.append(name)
    return restored


def bypass_report(model: nn.Module) -> str:
    """A table of the Safe layers: forwards, bypasses (tier != 1), last tier, calls per tier."""
    rows = [(name, m) for name, m in model.named_modules() if isinstance(m, _SafeConvMixin)]
    if not rows:
        return "bypass report: no SafeConv layers (call patch_model first)"
    width = max(len(name) for name, _ in rows)
    lines = [f"{'layer':<{width}}  forwards  bypasses  tier  per tier",
             f"{'-' * width}  --------  --------  ----  --------"]
    for name, m in rows:
        per = ", ".join(f"{t}:{n}" for t, n in sorted(m.tier_counts.items())) or "-"
        tier = "-" if m.last_tier is None else str(m.last_tier)
        lines.append(f"{name:<{width}}  {m.forwards:>8}  {m.bypasses:>8}  {tier:>4}  {per}")
    total_f = sum(m.forwards for _, m in rows)
    total_b = sum(m.bypasses for _, m in rows)
    lines.append(f"{'total':<{width}}  {total_f:>8}  {total_b:>8}")
    return "\n".join(lines)


def is_safe_conv(module) -> bool:
    return isinstance(module, _SafeConvMixin)


__all__ = ["SafeConv2d", "SafeConv3d", "patch_model", "patched_layers", "unpatch_model", "bypass_report",
           "is_safe_conv"]
