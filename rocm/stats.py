"""Per-job statistics of the convolution fallback: calls per tier, shapes that fell back, probe results."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from rocm.signature import ConvSignature
from rocm.tiers import TIER_NAMES


@dataclass(frozen=True)
class FallbackEvent:
    signature: str            # ConvSignature.short()
    tier: int | None          # the tier that answered (None: all failed)
    failed: dict[int, str]    # tier -> reason, this call or from a verdict
    count: int = 1


@dataclass(frozen=True)
class FallbackStats:
    """A snapshot; ``calls_per_tier`` counts forward and backward calls."""

    calls_per_tier: dict[int, int]
    calls_per_op: dict[str, dict[int, int]]
    fell_back: list[FallbackEvent]
    probes: list[dict]
    exhausted: int
    attempts_per_tier: dict[int, int] = field(default_factory=dict)    # tiers tried, whether they answered or not

    @property
    def total_calls(self) -> int:
        return sum(self.calls_per_tier.values())

    def delta(self, earlier: "FallbackStats") -> dict[int, int]:
        """Calls per tier since ``earlier``."""
        return {t: n - earlier.calls_per_tier.get(t, 0) for t, n in self.calls_per_tier.items()
                if n - earlier.calls_per_tier.get(t, 0)}

    def report(self) -> str:
        lines = [f"conv fallback: {self.total_calls} calls"
                 + (f", {self.exhausted} failed in every tier" if self.exhausted else "")]
        for tier in sorted(self.calls_per_tier):
            lines.append(f"  tier {tier} ({TIER_NAMES[tier]}): {self.calls_per_tier[tier]}")
        for op, per in sorted(self.calls_per_op.items()):
            lines.append(f"  {op}: " + ", ".join(f"tier {t}: {n}" for t, n in sorted(per.items())))
        if self.fell_back:
            lines.append(f"  shapes that fell back ({len(self.fell_back)}):")
            for ev in self.fell_back:
                why = "; ".join(f"tier {t}: {r[:90]}" for t, r in sorted(ev.failed.items()))
                lines.append(f"    {ev.signature} -> tier {ev.tier} x{ev.count} ({why})")
        for probe in self.probes:
            lines.append(f"  probe: {probe['signature']} tier {probe['tier']}: {probe['outcome']} "
                         f"({probe['elapsed_s']:.1f} s) {probe.get('message', '')[:90]}")
        return "\n".join(lines)


class StatsCollector:
    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._tiers: Counter = Counter()
            self._ops: dict[str, Counter] = {}
            self._fell: dict[str, FallbackEvent] = {}
            self._probes: list[dict] = []
            self._exhausted = 0
            self._attempts: Counter = Counter()

    def record(self, sig: ConvSignature, tier: int | None, failed: dict[int, str], tried=()) -> None:
        with self._lock:
            self._attempts.update(tried)
            if tier is not None:
                self._tiers[tier] += 1
                self._ops.setdefault(sig.op, Counter())[tier] += 1
            else:
                self._exhausted += 1
            if failed:
                old = self._fell.get(sig.key)
                merged = {**(old.failed if old else {}), **failed}
                self._fell[sig.key] = FallbackEvent(sig.short(), tier, merged, (old.count + 1) if old else 1)

    def record_probe(self, result: dict) -> None:
        with self._lock:
            self._probes.append(dict(result))

    def snapshot(self) -> FallbackStats:
        with self._lock:
            return FallbackStats(dict(self._tiers), {k: dict(v) for k, v in self._ops.items()},
                                 list(self._fell.values()), list(self._probes), self._exhausted, dict(self._attempts))
