"""How a run starts: one `JobRun` (pipeline/orchestrator.py) runs every job, and one of these strategies decides
what differs between a new job, an extension and a resumed job of either kind:

- the section plan (an extension's starts with the sections its input stands for: `plan`);
- the job folder (a new one with its prepared images, or the interrupted job's own: `open_folder`, `begin`);
- the starting state: start and end latents, the latent history, the sections done and the random generator's
  state (`starting_point`): a new job VAE-encodes its images, an extension takes its input's latents
  (pipeline/extend.py `starting_point`), a resumed job its checkpoint (jobfolder/checkpoint.py `SavedSections`);
- the finished sections decoded again before sampling goes on, so the blends match an uninterrupted run
  (`decode_again`), and an input video's frames put before or after the new ones (`put_input`, `lead_frames`);
- what of the history each section sees (`section_inputs`: an extension's input, limited to its context frames).

`Resumed` wraps the strategy its job first started with (`NewJob` or `Extension`): without a checkpoint it starts
again as that one did, in its own folder; its plan, its sections' inputs and its input video are that one's.
The run's stages (VAE encode, decode, the writer) stay the JobRun's; a strategy calls them on the run it is given.
"""
from __future__ import annotations

import logging
from typing import Any, Generator, Iterator

import numpy as np
import torch

from jobfolder.checkpoint import SavedSections
from jobfolder.folder import Job
from pipeline import extend, extend_resume
from pipeline import sections as sec
from pipeline.events import Event

log = logging.getLogger(__name__)

# (start latent, end latent, latent history, sections done)
StartingPoint = tuple[torch.Tensor, "torch.Tensor | None", torch.Tensor, int]


class NewJob:
    """A new job: a folder of its own (its prepared images kept), its images VAE-encoded, nothing done before.
    `owner`: the app's user who started it (job.json's "owner")."""
    resumed = False

    def __init__(self, owner: str | None = None):
        self.owner = owner

    def plan(self, plan: sec.SectionPlan) -> sec.SectionPlan:
        return plan

    @property
    def input_sections(self) -> int:
        """Sections of the plan an input stands for (never written by this job)."""
        return 0

    def open_folder(self, run: Any) -> Job:
        """A new folder with the prepared images (job.json written last, jobfolder/folder.py)."""
        return Job.create(run.outputs, run.request.settings(), run.model_info(), lambda job: self.fill(run, job))

    def fill(self, run: Any, job: Job) -> None:
        """What a new job's folder holds before its job.json is written."""
        if self.owner is not None:
            job.info["owner"] = self.owner
        if run.loras:
            job.info["loras"] = run.loras.record()                  # file, sha256, strength of each
        job.save_image("input.png", run.prepared.image)
        job.keep_upload("upload", run.request.image)                # the user's file, for reuse
        if run.prepared.end_image is not None:
            job.save_image("end.png", run.prepared.end_image)
            job.keep_upload("upload_end", run.request.end_image)
        if run.prepared.keyframes:                  # kept prepared (resume reads these copies)
            job.info["keyframes"] = []
            for i, (k, image) in enumerate(run.prepared.keyframes, 1):
                job.save_image(f"keyframe_{i}.png", image)
                job.info["keyframes"].append({"time": k.time, "file": f"keyframe_{i}.png", "strength": k.strength})

    def begin(self, job: Job) -> None:
        """The folder is open: a new job has nothing more to record."""

    def starting_point(self, run: Any) -> Generator[Event, None, StartingPoint]:
        """The job's images VAE-encoded (JobRun.encode_start); nothing done."""
        return (yield from run.encode_start())

    def put_input(self, run: Any) -> int:
        """An input video's frames into the writer as they are, before the sections decoded again; the sections
        of the plan they stand for (0: none)."""
        return 0

    def decode_again(self, run: Any, done: int) -> Iterator[Event]:
        """The `done` sections the job starts with, decoded again (a new job starts with none)."""
        return iter(())

    def section_inputs(self, run: Any, section: sec.Section, history: torch.Tensor, start_latent: torch.Tensor,
                       end_latent: torch.Tensor | None) -> tuple[sec.SectionContext, sec.SectionIndices]:
        """The clean latents and RoPE indices of `section`: the history, the start slot (the start latent or the
        keyframe that governs the section: JobRun.start_slot) and the end latent."""
        return (sec.section_context(run.plan, section, history, run.start_slot(section, start_latent), end_latent),
                run.plan.indices(section))

    def lead_frames(self, section: sec.Section) -> np.ndarray | None:
        """Frames that go before `section`'s once it is decoded (an extension toward an end frame), or None."""
        return None


class Extension(NewJob):
    """A new job that continues an input (pipeline/extend.py: a video or a finished job folder): a new folder
    that records the input ("source"; an input video copied in: pipeline/extend_resume.py), the plan's first
    sections the input's, its starting state from the input."""

    def __init__(self, source: extend.ExtendSource, owner: str | None = None):
        super().__init__(owner)
        self.source = source

    def plan(self, plan: sec.SectionPlan) -> sec.SectionPlan:
        return extend.extended_plan(plan, self.source)

    @property
    def input_sections(self) -> int:
        return self.source.sections_done

    def fill(self, run: Any, job: Job) -> None:
        super().fill(run, job)
        job.info["source"] = extend_resume.kept_record(job, self.source)    # resume needs the input video kept

    def starting_point(self, run: Any) -> Generator[Event, None, StartingPoint]:
        return (yield from extend.starting_point(run))

    def put_input(self, run: Any) -> int:
        """An input video's frames start the video (toward an end frame they go before its last section:
        `lead_frames`)."""
        if self.source.frames is None or self.source.direction == extend.TO_END:
            return 0
        run.writer.submit(self.source.frames)
        return self.source.sections_done

    def decode_again(self, run: Any, done: int) -> Iterator[Event]:
        """A video's frames as they are; a job folder's sections decoded again from its checkpoint, so the seam
        blends as the longer job's would (none of their files is written: they are the input job's)."""
        if self.put_input(run):
            return
        yield from run.decode_again(0, done, self.source.real)

    def section_inputs(self, run: Any, section: sec.Section, history: torch.Tensor, start_latent: torch.Tensor,
                       end_latent: torch.Tensor | None) -> tuple[sec.SectionContext, sec.SectionIndices]:
        """What of the input the section sees (pipeline/extend.py `section_inputs`)."""
        return extend.section_inputs(run.plan, section, history, start_latent, end_latent, self.source,
                                     run.request.context_frames)

    def lead_frames(self, section: sec.Section) -> np.ndarray | None:
        return extend.lead_frames(self.source, section)


class Resumed:
    """An interrupted job, going on in its own folder (pipeline/resume.py): from its checkpoint's sections
    (`saved`), or, stopped before its first section was finished (`saved` None), started again as `first` (the
    strategy it started with) started it. `rewrite`: recorded section videos found missing or damaged, written
    again from the checkpoint."""
    resumed = True

    def __init__(self, job: Job, saved: SavedSections | None, first: NewJob,
                 rewrite: frozenset[str] = frozenset()):
        self.job, self.saved, self.first, self.rewrite = job, saved, first, rewrite

    def plan(self, plan: sec.SectionPlan) -> sec.SectionPlan:
        return self.first.plan(plan)

    @property
    def input_sections(self) -> int:
        return self.first.input_sections

    def open_folder(self, run: Any) -> Job:
        return self.job

    def begin(self, job: Job) -> None:
        """job.json says it runs again, and how many times it was resumed."""
        job.update(status="running", resumed=job.info.get("resumed", 0) + 1)
        log.info("resuming after section %d" % self.saved.sections_done if self.saved else
                 "starting again: no section was finished before it stopped")

    def starting_point(self, run: Any) -> Generator[Event, None, StartingPoint]:
        """The checkpoint's latents and random state; without one, the first strategy's starting point."""
        saved = self.saved
        if saved is None:
            return (yield from self.first.starting_point(run))
        run.generator.set_state(saved.rng_state)
        run.keyframe_latents = saved.keyframe_latents
        return saved.start_latent, saved.end_latent, saved.history, saved.sections_done

    def put_input(self, run: Any) -> int:
        return self.first.put_input(run)

    def decode_again(self, run: Any, done: int) -> Iterator[Event]:
        """The finished sections decoded again from the checkpoint; the video of one that the stopped process had
        not written (or that is damaged) is written now: the same file an uninterrupted run writes."""
        saved = self.saved
        if saved is None:
            yield from self.first.decode_again(run, done)
            return
        first = self.put_input(run)
        recorded = set(run.job.info["videos"])
        inherited = self.input_sections                 # an extended job's: never written here

        def write(name: str, n: int) -> bool:
            return (name not in recorded or name in self.rewrite) and n > inherited

        yield from run.decode_again(first, done, saved.real, write)

    def section_inputs(self, run: Any, section: sec.Section, history: torch.Tensor, start_latent: torch.Tensor,
                       end_latent: torch.Tensor | None) -> tuple[sec.SectionContext, sec.SectionIndices]:
        return self.first.section_inputs(run, section, history, start_latent, end_latent)

    def lead_frames(self, section: sec.Section) -> np.ndarray | None:
        return self.first.lead_frames(section)


Strategy = NewJob | Resumed


def first_strategy(prepared: Any, owner: str | None = None) -> NewJob:
    """The strategy a job with this prepared request starts with: an extension when it has an input."""
    return Extension(prepared.source, owner) if prepared.source is not None else NewJob(owner)
