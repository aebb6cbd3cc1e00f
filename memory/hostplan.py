"""The host plan: which chunks of which model stay in host RAM between stages and which are read from the weight
files when a stage needs them, under a host-RAM budget. Pure arithmetic, like the residency plan (plan.py).

At every stage of a job the process holds: its own overhead (Python, torch, the CUDA context, the video so far:
measured when the plan is made, see hostbudget.py) + every chunk kept in RAM (the persistent part) + what the
stage needs on top for chunks whose home is the files (transient: a streamed chunk must sit in pinned RAM while
its stage runs; on a CPU run the mapped file pages of the chunks in use). A reserve stays free for the page cache
that reading the files needs. The plan is feasible when, at every stage, overhead + persistent + transient +
reserve ≤ budget.

Chunks of models without weight files (the tiny preset) are always in RAM. With everything else read from the
files, the smallest budget that can work is overhead + reserve + those + the largest stage's transient (for the
real models under a 20 GB cap: the transformer's streamed blocks, 10 GB in bf16, 5 GB in fp8); a smaller budget is
refused with that minimum. Above it, chunks are kept in RAM greedily, the most often read first: the transformer
and VAE (every section) before the text and image encoders (once per job), streamed blocks before resident ones.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common.units import GIB

PER_JOB, PER_SECTION = "job", "section"


@dataclass(frozen=True)
class StageUse:
    """A stage of a job and the models it loads; `per`: runs once per job or once per section."""
    name: str
    models: tuple[str, ...]
    per: str = PER_JOB


# The stages of a FramePack job in the order pipeline/orchestrator.py runs them (it hands this declaration to
# MemoryManager.arrange_host; the UI hint and the CLI's up-front check plan with it too).
FRAMEPACK_STAGES = (
    StageUse("text encoders", ("text_encoder", "text_encoder_2"), PER_JOB),
    StageUse("VAE encode", ("vae",), PER_JOB),
    StageUse("image encoder", ("image_encoder",), PER_JOB),
    StageUse("transformer", ("transformer",), PER_SECTION),
    StageUse("VAE decode", ("vae",), PER_SECTION),
)


@dataclass(frozen=True)
class ModelHost:
    name: str
    chunk_bytes: tuple[int, ...]              # host bytes of each chunk as stored (fp8: about half of bf16)
    file_bytes: tuple[int, ...] | None        # bytes read from the files to load each chunk; None: no files
    transient_bytes: tuple[int, ...] = ()     # host bytes a file-homed chunk takes while its stage runs
    streamed: frozenset[int] = frozenset()    # chunks streamed from host RAM in the model's stage

    @property
    def file_backed(self) -> bool:
        return self.file_bytes is not None

    @property
    def nbytes(self) -> int:
        return sum(self.chunk_bytes)

    def transient(self, i: int) -> int:
        return self.transient_bytes[i] if self.transient_bytes else 0


class HostBudgetError(ValueError):
    """The budget cannot hold any plan; the message names the minimum and what to change."""

    def __init__(self, message: str, minimum: int):
        super().__init__(message)
        self.minimum = minimum


@dataclass(frozen=True)
class HostPlan:
    budget: int
    overhead: int
    reserve: int
    models: tuple[ModelHost, ...]
    stages: tuple[StageUse, ...]
    sections: int
    ram: frozenset[tuple[str, int]]           # (model, chunk) kept in RAM between stages
    pinned: bool                              # RAM chunks are pinned (GPU runs) or pageable
    minimum: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def model(self, name: str) -> ModelHost:
        return next(m for m in self.models if m.name == name)

    def homes(self, name: str) -> tuple[str, ...]:
        m = self.model(name)
        return tuple("ram" if (name, i) in self.ram else "file" for i in range(len(m.chunk_bytes)))

    def ram_bytes(self, name: str | None = None) -> int:
        return sum(m.chunk_bytes[i] for m in self.models for i in range(len(m.chunk_bytes))
                   if (m.name, i) in self.ram and name in (None, m.name))

    @property
    def persistent_bytes(self) -> int:
        return self.ram_bytes()

    @property
    def streamed_ram_bytes(self) -> int:
        return sum(m.chunk_bytes[i] for m in self.models for i in m.streamed if (m.name, i) in self.ram)

    def transient_bytes(self, stage: StageUse) -> int:
        return _transient(self.models, self.ram, stage)

    def stage_peak(self, stage: StageUse) -> int:
        """What the process holds during `stage` (the reserve not included)."""
        return self.overhead + self.persistent_bytes + self.transient_bytes(stage)

    @property
    def peak_stage(self) -> StageUse | None:
        return max(self.stages, key=self.stage_peak, default=None)

    @property
    def peak(self) -> int:
        return max((self.stage_peak(s) for s in self.stages), default=self.overhead + self.persistent_bytes)

    def uses(self, name: str) -> int:
        return _uses(self.stages, self.sections, name)

    def file_reads(self, name: str) -> tuple[int, int]:
        """(bytes read from the files per job, of which per section) for one model."""
        m = self.model(name)
        file_bytes = m.file_bytes
        if file_bytes is None:                          # not file-backed
            return 0, 0
        once = sum(file_bytes[i] for i in range(len(m.chunk_bytes)) if (name, i) not in self.ram)
        per_section = sum(1 for s in self.stages if name in s.models and s.per == PER_SECTION)
        return once * self.uses(name), once * per_section

    @property
    def file_reads_per_job(self) -> int:
        return sum(self.file_reads(m.name)[0] for m in self.models)

    def short(self) -> str:
        return f"host: {self.peak / GIB:.1f} of {self.budget / GIB:.1f} GB"

    def describe(self) -> str:
        kind = "pinned" if self.pinned else "pageable"
        held = [f"{m.name} {self.ram_bytes(m.name) / GIB:.1f}" for m in self.models if self.ram_bytes(m.name)]
        files = []
        for m in self.models:
            per_job, per_section = self.file_reads(m.name)
            if per_section:
                files.append(f"{m.name} {per_section / GIB:.1f} GB per section")
            elif per_job:
                files.append(f"{m.name} {per_job / GIB:.1f} GB per job")
        worst = self.peak_stage
        where = f"at the peak ({worst.name})" if worst and self.transient_bytes(worst) else "at every stage"
        text = (f"{self.short()} {where}: "
                f"{self.persistent_bytes / GIB:.1f} GB kept in RAM ({kind}: {', '.join(held) or 'nothing'}); "
                f"read from the weight files when needed: {', '.join(files) or 'nothing'}; the app itself "
                f"≈ {self.overhead / GIB:.1f} GB; {self.reserve / GIB:.1f} GB kept free for the page cache")
        return text + "".join(f". {n}" for n in self.notes)

    def as_dict(self) -> dict:
        return {"budget": self.budget, "overhead": self.overhead, "reserve": self.reserve, "peak": self.peak,
                "minimum": self.minimum, "persistent": self.persistent_bytes, "pinned": self.pinned,
                "streamed_in_ram": self.streamed_ram_bytes, "file_reads_per_job": self.file_reads_per_job,
                "homes": {m.name: "".join("r" if h == "ram" else "f" for h in self.homes(m.name))
                          for m in self.models},
                "text": self.describe()}


def _uses(stages, sections: int, name: str) -> int:
    return sum(sections if s.per == PER_SECTION else 1 for s in stages if name in s.models)


def _transient(models, ram, stage: StageUse) -> int:
    total = 0
    for m in models:
        if m.name in stage.models:
            total += sum(m.transient(i) for i in range(len(m.chunk_bytes)) if (m.name, i) not in ram)
    return total


def minimum_budget(models, stages, overhead: int, reserve: int) -> int:
    """The smallest budget any plan fits: everything that can be read from the files is."""
    forced = frozenset((m.name, i) for m in models if not m.file_backed for i in range(len(m.chunk_bytes)))
    fixed = sum(m.chunk_bytes[i] for m in models for i in range(len(m.chunk_bytes)) if (m.name, i) in forced)
    worst = max((_transient(models, forced, s) for s in stages), default=0)
    return overhead + reserve + fixed + worst


def plan_host(models: list[ModelHost] | tuple[ModelHost, ...], stages: list[StageUse] | tuple[StageUse, ...],
              sections: int, budget: int, overhead: int, reserve: int, pinned: bool = True,
              gpu: bool = True) -> HostPlan:
    """The plan for `budget`, or HostBudgetError naming the minimum. `gpu`: whether the job runs on a GPU (the
    refusal's advice differs: without one nothing is streamed, so only more RAM or a smaller model helps)."""
    models, stages = tuple(models), tuple(stages)
    minimum = minimum_budget(models, stages, overhead, reserve)
    if budget < minimum:
        raise HostBudgetError(_refusal(models, stages, budget, minimum, overhead, reserve, gpu), minimum)
    ram = {(m.name, i) for m in models if not m.file_backed for i in range(len(m.chunk_bytes))}
    order = {m.name: k for k, m in enumerate(models)}
    candidates = sorted(((m, i) for m in models if m.file_backed for i in range(len(m.chunk_bytes))),
                        key=lambda mi: (-_uses(stages, sections, mi[0].name), mi[1] not in mi[0].streamed,
                                        order[mi[0].name], mi[1]))
    persistent = sum(m.chunk_bytes[i] for m in models for i in range(len(m.chunk_bytes)) if (m.name, i) in ram)
    checks = stages + (StageUse("between stages", ()),)
    transient = [_transient(models, ram, s) for s in checks]
    for m, i in candidates:
        size = m.chunk_bytes[i]
        trial = [t - (m.transient(i) if m.name in s.models else 0) for t, s in zip(transient, checks)]
        if all(overhead + persistent + size + t + reserve <= budget for t in trial):
            ram.add((m.name, i))
            persistent += size
            transient = trial
    return HostPlan(budget, overhead, reserve, models, stages, sections, frozenset(ram), pinned, minimum)


def _refusal(models, stages, budget: int, minimum: int, overhead: int, reserve: int, gpu: bool = True) -> str:
    worst = max(stages, key=lambda s: _transient(models, frozenset(), s), default=None)
    need = _transient(models, frozenset(), worst) if worst else 0
    fixed = sum(m.nbytes for m in models if not m.file_backed)
    parts = [f"the app itself ≈ {overhead / GIB:.1f} GB", f"{reserve / GIB:.1f} GB kept free for the page cache"]
    if need and worst is not None:
        parts.insert(0, f"{need / GIB:.1f} GB of {worst.name} weights that must sit in RAM while it runs"
                        + (" (the blocks streamed to the GPU every step)" if gpu else " (no GPU: it runs from RAM)"))
    if fixed:
        parts.insert(0, f"{fixed / GIB:.1f} GB of models that have no weight files")
    head = (f"host RAM budget {budget / GIB:.1f} GB is too small: this job needs at least {minimum / GIB:.1f} GB "
            f"({'; '.join(parts)}).")
    if not gpu:     # nothing is streamed or stored in fp8 on the CPU: the cap, preserved memory and --fp8 change nothing
        return (f"{head} Without a GPU only more RAM helps: raise --host-ram-gb if this computer has it (a CPU run "
                f"of the real model is also very slow), or use --preset tiny (tiny random models, to try things out).")
    return (f"{head} Raise --host-ram-gb, or stream less (lower the preserved memory or raise the VRAM cap: fewer "
            f"blocks streamed), or store the weights in fp8 (--fp8, half the bytes).")
