"""``ConvFallback``: conv2d/conv3d, forward and backward, tried tier by tier until one works.

Tiers (``rocm.tiers``): 1 native (MIOpen/cuDNN), 2 PyTorch's GPU kernels with MIOpen/cuDNN off for that call,
3 exact decomposition on the GPU, 4 the same with MIOpen/cuDNN off (a conv3d's last GPU tier), 5 CPU fp32. An error of the MIOpen/HIP kind or out-of-memory moves to the next
tier (any other error propagates unchanged). Verdicts are cached per (op, shapes, dtype, arch) in memory and in a
file per arch + torch + HIP + driver build (``rocm.verdicts``), so a bad shape goes straight to its working tier
next time. Inside ``probing()`` (on ROCm by default) the first use of a signature runs in a child process with a
timeout first; a probe that cannot decide raises ``ProbeUndecided`` instead of running the tier in-process.

It is an object, not a global: ``active()`` patches ``torch.nn.functional.conv2d/conv3d`` (which ``nn.Conv2d``
/ ``nn.Conv3d`` call) for a block, through the one patch registry (``common.patches``); the app uses only that,
inside a stage's scope. ``install()`` / ``uninstall()`` (the field-notes API, rocm.api) hold the patch until undone. The blocks are
counted: the patch comes off when the last ``active()`` block (in any thread) has ended and no ``install()``
holds it, so one thread leaving its block cannot pull the patch from under another.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from common import patches
from rocm import tiers as tier_ops
from rocm.arch import Runtime, detect_runtime
from rocm.conv_plan import conv_plan
from rocm.env import apply_torch_settings
from rocm.errors import ConvFallbackExhausted, GpuFault, ProbeUndecided, classify_error, last_line
from rocm.faults import FaultPlan
from rocm.paths import cache_dir as default_cache_dir
from rocm.policy import BypassConfig
from rocm.probe import HangProbe, ProbeJob
from rocm.signature import ConvSignature, ConvSpec, normalize_call
from rocm.stats import FallbackStats, StatsCollector
from rocm.verdicts import VerdictStore, build_of, verdict_path

logger = logging.getLogger(__name__)
_NATIVE = {"conv2d": torch.conv2d, "conv3d": torch.conv3d}


@dataclass
class _DeviceContext:
    runtime: Runtime
    store: VerdictStore
    tiers: tuple[int, ...]
    conv3d_first_tier: int
    vendor_in_decomposition: bool


class _TieredConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, fallback, spec, bypass):
        ctx.fallback, ctx.spec, ctx.bypass = fallback, spec, bypass
        ctx.save_for_backward(x, weight, bias)
        return fallback._run("forward", spec, x, weight, bias, bypass=bypass)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, weight, bias = ctx.saved_tensors
        mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2])
        gx, gw, gb = ctx.fallback._run("backward", ctx.spec, x, weight, bias, grad_out=grad_out.contiguous(),
                                       mask=mask, bypass=ctx.bypass)
        return gx, gw, gb, None, None, None


class ConvFallback:
    """Tiered convolution with verdict cache, statistics and an optional hang probe.

    Arguments (all optional; defaults come from the arch profile in ``configs/rocm_profiles.py``):
    ``tiers`` the allowed tiers in order (e.g. ``(3,)`` forces tier 3); ``conv3d_first_tier``;
    ``vendor_in_decomposition`` (whether tier 3's inner conv2d may use MIOpen/cuDNN); ``bypass`` a
    ``BypassConfig``; ``cache_dir`` for the verdict file; ``persist=False`` keeps verdicts in memory;
    ``fault_plan`` the test seam; ``probe``: a ``HangProbe``, ``"auto"`` (a default one) or None;
    ``runtime_for``: device -> ``rocm.arch.Runtime`` (default ``detect_runtime``; tests pass simulated GPUs).
    """

    def __init__(self, *, tiers=None, conv3d_first_tier: int | None = None,
                 vendor_in_decomposition: bool | None = None, bypass: BypassConfig | None = None,
                 cache_dir: Path | str | None = None, persist: bool = True, fault_plan: FaultPlan | None = None,
                 probe: HangProbe | str | None = "auto", runtime_for=None):
        self.tiers = tuple(tiers) if tiers is not None else None
        if self.tiers is not None and (not self.tiers or any(t not in tier_ops.TIERS for t in self.tiers)):
            raise ValueError(f"tiers must be a non-empty subset of {tier_ops.TIERS}, got {tiers!r}")
        self.conv3d_first_tier = conv3d_first_tier
        self.vendor_in_decomposition = vendor_in_decomposition
        self.bypass = bypass or BypassConfig()
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.persist = persist
        self.fault_plan = fault_plan
        self.probe: HangProbe | None = HangProbe() if probe == "auto" else probe if not isinstance(probe, str) else None
        self.runtime_for = runtime_for or detect_runtime
        self._contexts: dict[str, _DeviceContext] = {}
        self._stats = StatsCollector()
        self._lock = threading.RLock()
        self._local = threading.local()
        self._probe_depth = 0
        self._probe_forced = False
        self._saved: tuple | None = None
        self._active_blocks = 0         # active() blocks running now, all threads
        self._pinned = False            # install() called: stays until uninstall()
        self.current: ConvSignature | None = None   # the conv running now (read by the stall watchdog)
        self.stage: str | None = None               # the pipeline stage running convolutions now (`guarded`)
        self._entries = {"conv2d": self._make_entry("conv2d"), "conv3d": self._make_entry("conv3d")}

    # ----- public API -------------------------------------------------------------------------------------
    def conv2d(self, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return self.conv("conv2d", input, weight, bias, stride, padding, dilation, groups)

    def conv3d(self, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        return self.conv("conv3d", input, weight, bias, stride, padding, dilation, groups)

    def conv(self, op, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
             bypass: BypassConfig | None = None):
        """``torch.nn.functional.<op>`` with the tiered fallback. Sets ``last_tier`` for this thread.
        ``bypass``: this call's strategy (a SafeConv layer's own config), default the fallback's."""
        native = _NATIVE[op]
        self._local.last_tier = None
        if (not isinstance(input, torch.Tensor) or input.device.type not in ("cuda", "cpu")
                or not input.is_floating_point() or torch.compiler.is_compiling()):
            return native(input, weight, bias, stride, padding, dilation, groups)
        norm = normalize_call(op, input, weight, stride, padding, dilation, groups)
        if norm is None:   # malformed call: let PyTorch raise its own message
            return native(input, weight, bias, stride, padding, dilation, groups)
        x, spec, unbatched = norm
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, weight, bias))
        if needs_grad:
            out = _TieredConv.apply(x, weight, bias, self, spec, bypass)
        else:
            out = self._run("forward", spec, x, weight, bias, bypass=bypass)
        return out.squeeze(0) if unbatched else out

    @property
    def last_tier(self) -> int | None:
        """The tier that answered this thread's last forward call."""
        return getattr(self._local, "last_tier", None)

    def install(self) -> "ConvFallback":
        """Patch F.conv2d/F.conv3d until ``uninstall()``."""
        with self._lock:
            self._pinned = True
            self._patch()
        return self

    def uninstall(self) -> None:
        """Drop ``install()``'s hold; the patch comes off now, or when the last running ``active()`` block ends."""
        with self._lock:
            self._pinned = False
            if self._active_blocks == 0:
                self._unpatch()

    def _patch(self) -> None:
        if self._saved is None:
            self._saved = tuple(patches.patch(F, op, self._entries[op], "rocm.ConvFallback")
                                for op in ("conv2d", "conv3d"))

            apply_torch_settings()
            logger.debug("conv fallback installed")

    def _unpatch(self) -> None:
        if self._saved is None:
            return
        for p in reversed(self._saved):
            patches.restore(p)
        self._saved = None
        self.flush()

    @property
    def installed(self) -> bool:
        return self._saved is not None

    @contextlib.contextmanager
    def active(self):
        """The patch is on for the block (reference-counted across threads and nested blocks)."""
        with self._lock:
            self._active_blocks += 1
            self._patch()
        try:
            yield self
        finally:
            with self._lock:
                self._active_blocks -= 1
                if self._active_blocks == 0 and not self._pinned:
                    self._unpatch()

    @contextlib.contextmanager
    def guarded(self, stage: str):
        """A stage that runs convolutions (VAE encode and decode, the image encoder, the transformer's patch
        embedding): the patch on and, on ROCm, the hang probe around each new signature (`probing`); `stage` names
        it while it runs (the stall watchdog and a fault's message say where)."""
        previous, self.stage = self.stage, stage
        try:
            with self.active(), self.probing():
                yield self
        finally:
            self.stage = previous

    @contextlib.contextmanager
    def injecting(self, plan: FaultPlan):
        """The test seam for a block: ``plan``'s faults fire in this fallback's tiers, then the old plan returns."""
        previous, self.fault_plan = self.fault_plan, plan
        try:
            yield self
        finally:
            self.fault_plan = previous

    @contextlib.contextmanager
    def passing_oom(self):
        """Within the block (this thread), out-of-memory propagates to the caller instead of moving to the next
        tier, and leaves no verdict: the caller has a cheaper remedy first (memory/'s VAE decode retries with
        smaller tiles and only then lets the tiers handle it). MIOpen/HIP errors still move tiers."""
        previous = getattr(self._local, "pass_oom", False)
        self._local.pass_oom = True
        try:
            yield self
        finally:
            self._local.pass_oom = previous

    @contextlib.contextmanager
    def probing(self, enabled: bool | None = None):
        """Within the block, the first use of a conv signature with no verdict is probed in a child process.
        ``enabled=None``: only on ROCm; True: also on CUDA/CPU (tests); False: no-op."""
        if enabled is False or self.probe is None:
            yield self
            return
        with self._lock:
            self._probe_depth += 1
            previous, self._probe_forced = self._probe_forced, bool(enabled) or self._probe_forced
        try:
            with self.probe.session():      # one warm child for the whole block
                yield self
        finally:
            with self._lock:
                self._probe_depth -= 1
                self._probe_forced = previous

    @contextlib.contextmanager
    def warm_probe(self, device, enabled: bool | None = None):
        """For a whole job: where the probe will run on ``device`` (ROCm; ``enabled=True`` anywhere, for tests),
        start its child now, while the GPU is still empty, and keep it warm until the block ends. Started lazily in
        the first VAE decode, beside parked blocks and tiles that fill the cap, its HIP context may not fit."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())     # the name the decode's tensors carry
        wanted = enabled if enabled is not None else self._context(device).runtime.backend == "rocm"
        if not wanted or self.probe is None:
            yield self
            return
        with self.probe.session():
            problem = self.probe.prestart(str(device))
            if problem:
                logger.warning("hang probe: the child did not start before the job (%s); it starts again at the "
                               "first new convolution", last_line(problem))
            yield self

    def stats(self) -> FallbackStats:
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats.reset()

    def report(self) -> str:
        return self.stats().report()

    def forget_transient(self) -> None:
        """Forget out-of-memory verdicts (kept in memory only): they said more about what else was on the GPU
        then than about the shape. Called at the start of each job."""
        for ctx in list(self._contexts.values()):
            ctx.store.flush()
            ctx.store.forget_transient()

    def flush(self) -> None:
        """Write pending verdicts to disk."""
        for ctx in list(self._contexts.values()):
            ctx.store.flush()

    def verdict(self, sig: ConvSignature):
        """The cached verdict for ``sig`` (None if none), from the device context of its arch."""
        for ctx in list(self._contexts.values()):
            if ctx.runtime.arch == sig.arch:
                return ctx.store.get(sig.key)
        return None

    def signature(self, op: str, x, weight, spec: ConvSpec, bias=None) -> ConvSignature:
        ctx = self._context(x.device)
        return ConvSignature(op, tuple(x.shape), tuple(weight.shape), spec.stride, spec.padding, spec.dilation,
                             spec.groups, str(x.dtype).replace("torch.", ""), x.device.type, ctx.runtime.arch,
                             bias is not None)

    # ----- internals --------------------------------------------------------------------------------------
    def _make_entry(self, op: str):
        def entry(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
            return self.conv(op, input, weight, bias, stride, padding, dilation, groups)

        entry.__name__ = op
        entry.__qualname__ = f"ConvFallback.{op}"
        entry.__doc__ = f"torch.nn.functional.{op} routed through rocm.ConvFallback."
        marked: Any = entry                              # (an attribute a function does not declare)
        marked.__steadyframe_fallback__ = self
        return entry

    def _context(self, device) -> _DeviceContext:
        key = str(device) if device.type != "cuda" or device.index is not None else "cuda"
        ctx = self._contexts.get(key)
        if ctx is not None:
            return ctx
        with self._lock:
            runtime = self.runtime_for(device)
            plan = conv_plan(runtime)
            path = verdict_path(self.cache_dir or default_cache_dir(), runtime) if self.persist else None
            ctx = _DeviceContext(
                runtime=runtime, store=VerdictStore(path, build=build_of(runtime)),
                tiers=self.tiers or plan.tiers,
                conv3d_first_tier=(self.conv3d_first_tier if self.conv3d_first_tier is not None
                                   else plan.conv3d_first_tier),
                vendor_in_decomposition=(self.vendor_in_decomposition if self.vendor_in_decomposition is not None
                                         else plan.vendor_in_decomposition))
            self._contexts[key] = ctx
            logger.info("conv fallback on %s (%s %s, arch from %s): tiers %s, conv3d from tier %d, verdicts %s",
                        key, runtime.backend, runtime.arch, runtime.arch_source, ctx.tiers, ctx.conv3d_first_tier,
                        path)
            return ctx

    def _probing_on(self, ctx: _DeviceContext, sig: ConvSignature) -> bool:
        return (self._probe_depth > 0 and self.probe is not None and sig.direction == "forward"
                and (self._probe_forced or ctx.runtime.backend == "rocm"))

    def _plan(self, ctx: _DeviceContext, sig: ConvSignature, bypass: BypassConfig) -> list[int]:
        start = bypass.start_tier(sig)
        if sig.base_op == "conv3d":
            start = max(start, ctx.conv3d_first_tier)
        tiers = [t for t in ctx.tiers if t >= start and bypass.allows(t)]
        tiers = [t for t in tiers if not (t - 1 in tiers and tier_ops.same_as_previous(
            t, sig.base_op, ctx.vendor_in_decomposition))] or [ctx.tiers[-1]]
        verdict = ctx.store.get(sig.key) if bypass.cache_decisions else None
        if verdict is not None:
            # a timeout from an earlier run is probed once more before it is trusted (only where the probe runs)
            retry = ctx.store.retry_tiers(sig.key) if self._probing_on(ctx, sig) else set()
            tiers = [t for t in tiers if t not in verdict.failed or t in retry] or [tiers[-1]]
        return tiers

    def _should_probe(self, ctx: _DeviceContext, sig: ConvSignature, tiers: list[int]) -> bool:
        if not self._probing_on(ctx, sig):
            return False
        verdict = ctx.store.get(sig.key)
        if verdict is None or verdict.ok_tier not in tiers:
            return True
        return bool(ctx.store.retry_tiers(sig.key) & set(tiers[:tiers.index(verdict.ok_tier)]))

    def _probe_tiers(self, ctx: _DeviceContext, sig: ConvSignature, tiers: list[int], device) -> list[int]:
        probe = self.probe
        assert probe is not None                        # (asked only when `_should_probe`: a probe runs)
        for i, tier in enumerate(tiers):
            known = ctx.store.get(sig.key)
            if known is not None and known.ok_tier == tier:     # known to work: no need to probe it again
                return tiers[i:]
            job = ProbeJob(sig, tier, ctx.vendor_in_decomposition)
            result = probe.run([job], device=str(device))[0]
            self._stats.record_probe(result.to_dict())
            if result.outcome == "ok":
                ctx.store.record_success(sig.key, tier, persist=self.persist)
                ctx.store.flush()      # a probe is expensive: keep its result even if we crash later
                return tiers[i:]
            if result.outcome == "fault":       # the probe child's GPU faulted: fail the job, save nothing
                raise _fault(last_line(result.message), tier, sig, self.stage)
            if result.outcome == "inconclusive":
                raise ProbeUndecided(      # the advice first: the app shows the first 300 characters
                    f"The GPU did not answer the hang probe: SteadyFrame will not run this convolution inside the "
                    f"app, where a hung GPU call would freeze it. The GPU may be wedged: close programs using it, "
                    f"reboot if it stays stuck, then run `python -m rocm doctor`. ({last_line(result.message)[:200]};"
                    f" tier {tier}, {sig.short()})")
            if not result.is_verdict:   # oom (the parent may hold the memory) / rejected: in-process from here
                return tiers[i:]
            ctx.store.record_failure(sig.key, tier, f"probe {result.outcome}: {result.message}",
                                     persist=self.persist, timeout=result.outcome in ("timeout", "crash"))
        return tiers[-1:]

    def _run(self, direction, spec: ConvSpec, x, weight, bias, *, grad_out=None, mask=None, bypass=None):
        op = spec.op if direction == "forward" else f"{spec.op}_backward"
        ctx = self._context(x.device)
        sig = self.signature(op, x, weight, spec, bias)
        self.current = sig
        tiers = self._plan(ctx, sig, bypass or self.bypass)
        if self._should_probe(ctx, sig, tiers):
            try:
                tiers = self._probe_tiers(ctx, sig, tiers, x.device)
            except (ProbeUndecided, GpuFault):
                self.current = None
                raise
        known = ctx.store.get(sig.key)
        failed = dict(known.failed) if known else {}
        last_exc = None
        tried = []
        for tier in tiers:
            tried.append(tier)
            try:
                if self.fault_plan:
                    self.fault_plan.check(tier, spec.op, direction, tuple(x.shape))
                if direction == "forward":
                    out = tier_ops.forward(tier, spec, x, weight, bias,
                                           vendor_in_decomposition=ctx.vendor_in_decomposition)
                else:
                    out = tier_ops.backward(tier, spec, x, weight, bias, grad_out, mask,
                                            vendor_in_decomposition=ctx.vendor_in_decomposition)
            except Exception as exc:  # classified: anything that is not the GPU's fault is re-raised
                kind = classify_error(exc)
                if kind is None or (kind == "oom" and getattr(self._local, "pass_oom", False)):
                    self.current = None
                    raise
                if kind == "fault":             # not a verdict: the job fails, the next one tries again
                    self.current = None
                    raise _fault(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}", tier,
                                 sig, self.stage) from exc
                message = f"{kind}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                failed[tier] = message
                # only the algorithm search's verdicts (and a tier declining the call) are kept for later runs;
                # OOM and other library errors hold for this process only
                ctx.store.record_failure(sig.key, tier, message,
                                         persist=self.persist and kind in ("vendor", "declined"))
                logger.warning("conv tier %d failed for %s (%s); trying the next tier", tier, sig.short(), message)
                if exc.__traceback__ is not None:
                    traceback.clear_frames(exc.__traceback__)   # drop references to big intermediates
                last_exc = exc
                if kind == "oom" and x.is_cuda:
                    torch.cuda.empty_cache()
                continue
            ctx.store.record_success(sig.key, tier, persist=self.persist)
            skipped = {t: r for t, r in failed.items() if t < tier}
            self._stats.record(sig, tier, skipped, tried)
            if direction == "forward":
                self._local.last_tier = tier
            self.current = None
            return out
        self._stats.record(sig, None, failed, tried)
        self.current = None
        raise ConvFallbackExhausted(f"every tier {tiers} failed for {sig.short()}: {failed}") from last_exc


def _fault(text: str, tier: int, sig: ConvSignature, stage: str | None = None) -> GpuFault:
    """The advice first (a job's failure shows the first 300 characters), then what faulted."""
    where = f" in {stage}" if stage else ""
    return GpuFault(f"the GPU faulted while running a convolution{where}: the job stops here, nothing was recorded, "
                    "so the next job tries this convolution again; if it happens again, check the GPU's driver and "
                    f"run `python -m rocm doctor` ({text[:200]}; tier {tier}, {sig.short()})")


def new_conv_fallback() -> ConvFallback:
    """A fallback with the arch profile's defaults; its fault plan (the test seam) from STEADYFRAME_CONV_FAULTS."""
    return ConvFallback(fault_plan=FaultPlan.from_env())
