"""The orchestrator: runs one job's stages in order and yields events a UI can stream.

    1. check the request (before any model loads)          5. per section: transformer (sampling)
    2. text encoders                                        6.              VAE decode → (writer thread: blend,
    3. VAE encode (start image, end image)                                  section video, while the next samples)
    4. image encoder (SigLIP)                               7. wait for the last video; final video, job.json

Each model stage runs inside `memory.stage(...)`: exactly one stage's models are on the GPU at a time. Random
numbers come from one CPU generator seeded with the request's seed and drawn in a fixed order (VAE posterior of
the start image, of the end image, then each section's noise), so the same seed gives the same video on any device.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import time
import traceback
from pathlib import Path
from typing import Callable, Generator, Iterator, TypeVar

import torch

import rocm
from common.errors import InputError, JobStopped
from common.files import file_sha256
from common.units import MIB
from configs.video import DECODE_SPEED, ENCODING
from jobfolder.checkpoint import save_checkpoint
from jobfolder.folder import Job
from memory.hostplan import FRAMEPACK_STAGES, HostBudgetError
from memory.manager import MemoryManager
from memory.snapshot import host_rss_bytes
from pipeline import compiled, keyframes, lora, text_to_video, timeline
from pipeline import sections as sec
from pipeline.cancel import CancelToken
from pipeline.components import Components
from pipeline.decode_speed import decode_speed
from pipeline.denoiser import FramepackDenoiser
from pipeline.eta import FINISHING, Remaining
from pipeline.events import Done, Event, Failed, LogLine, Preview, Progress, SectionVideo, Started
from pipeline.images import to_model_tensor
from pipeline.logcapture import capture_logs
from pipeline.preview import preview_image
from pipeline.prompt_cache import cache_key, default_cache
from pipeline.request import PreparedRequest
from pipeline.sampling import sample_section
from pipeline.strategy import Strategy, first_strategy
from pipeline.text import encode_prompt
from pipeline.timeline_text import SectionTexts, encode_texts
from rocm.sdpa import fp8_attention
from video.loop import SEAM_FRAMES, seam_blend
from video.mp4 import encode_segment, write_segments
from video.section_writer import SectionWriter, WrittenSection

log = logging.getLogger(__name__)
T = TypeVar("T")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)                 # a job's write that fails for want of space: it resumes
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def oom_advice(records, memory: MemoryManager, kept_video: bool) -> str:
    """What to tell a user whose job ran out of GPU memory: where, and what to change."""
    stage = records[-1].name if records else "a stage"
    kept = " The video made so far is kept." if kept_video else ""
    return (f"Out of GPU memory in {stage} (cap {memory.cap_gb:g} GB, {memory.preserved_gb:g} GB preserved)."
            f"{kept} Try: more preserved memory (more of the transformer is streamed), a lower resolution or a "
            f"shorter video; if your card has more memory than the cap, raise the VRAM cap; close other programs "
            f"that use the GPU.")


def generate(prepared: PreparedRequest, components: Components, memory: MemoryManager | None = None, *,
             cancel: CancelToken | None = None, outputs: str | Path = "outputs",
             lora_dir: str | Path | None = None, owner: str | None = None, compile: str = "auto",
             on_open: Callable[[Job], None] | None = None, split=None) -> Generator[Event, None, None]:
    """Run one job. Always ends with exactly one Done or Failed event.

    `prepared` comes from `pipeline.request.prepare(request, components.preset.default_resolution)`, which the caller (UI,
    API, CLI) runs once to refuse bad input before anything loads: the request is checked and its images decoded
    there, never again here. `owner`: the app's user who started it (job.json's "owner"; the app shows a job to
    its owner only when it has several users). `compile`: "auto" (compiled transformer blocks where the device
    can and the job's "compile" setting is on; pipeline/compiled.py), "off" (--no-compile), "force" (also on the
    CPU: tests). `on_open(job)`: called with the job folder as soon as it is open (a farm worker notes itself in
    job.json there). `split`: this process's part of a job split over several GPUs
    (pipeline/split.py; None: all of it here)."""
    if not isinstance(prepared, PreparedRequest):
        raise TypeError(f"generate() takes a PreparedRequest (from pipeline.prepare), not {type(prepared).__name__}")
    if prepared.request.mode != components.mode:
        yield Failed(f"mode: the loaded models are for mode '{components.mode}', not '{prepared.request.mode}'")
        return
    if prepared.source is not None and prepared.source.problem(components):     # extending (pipeline/extend.py)
        yield Failed(prepared.source.problem(components))
        return
    run = JobRun(prepared, components, memory or MemoryManager(), cancel or CancelToken(), Path(outputs),
                 first_strategy(prepared, owner), lora_dir=lora_dir, compile=compile, on_open=on_open, split=split)
    yield from run.events()


class JobRun:
    """State of one running job; `events()` drives the stages. The stages share the run's context: `progress()`
    (the event with the ETA), `timing(stage)` (the job's timings), `drained()` (the log lines captured meanwhile, as
    events), `stage(name, work)` (the three in one, for a stage that is one piece of work) and the cancel token's
    `check()` (End stops at the next step). What differs between a new job, an extension and a resumed one (the
    plan, the folder, the starting state, the sections decoded again, what a section sees) is its `strategy`'s
    (pipeline/strategy.py; default: a new job, or an extension when the request has an input)."""

    def __init__(self, prepared: PreparedRequest, components: Components, memory: MemoryManager,
                 cancel: CancelToken, outputs: Path, strategy: Strategy | None = None,
                 lora_dir: str | Path | None = None, compile: str = "auto",
                 on_open: Callable[[Job], None] | None = None, split=None):
        self.prepared, self.models, self.memory, self.cancel, self.outputs = (prepared, components, memory, cancel,
                                                                              outputs)
        self.strategy: Strategy = strategy if strategy is not None else first_strategy(prepared)
        self.request = prepared.request
        self.lora_dir = lora_dir                # where LoRA names are looked up (pipeline/lora.py)
        self.compile = compile                  # "auto", "off" or "force" (generate())
        self.on_open = on_open                  # called with the job folder once it is open (generate())
        self.split = split                      # pipeline.split.SequenceSplit: one job on several GPUs
        self.loras = lora.LoraSet()
        # (extending: the input stands for the plan's first sections)
        self.plan = self.strategy.plan(sec.make_plan(self.request.mode, self.request.seconds,
                                                     self.request.latent_window, self.request.fps))
        self.device = memory.device
        memory.set_workload(prepared.height, prepared.width, self.request.latent_window,
                            split.size if split is not None else 1)
        self.generator = torch.Generator("cpu").manual_seed(self.request.seed)
        self.timings: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.remaining = Remaining.for_plan(self.plan, self.request.steps, warm=components.warm,
                                            pixels=prepared.height * prepared.width)   # the ETA (pipeline/eta.py)
        self._job: Job | None = None                # the job folder, once open (`job`)
        self.keyframe_latents: tuple = ()           # VAE-encoded (or from the checkpoint) with the start latent
        self.governing = keyframes.governing_keyframes([k.time for k, _ in prepared.keyframes], self.plan.mode,
                                                       self.plan.window, self.plan.count, self.request.fps)
        self._writer: SectionWriter | None = None   # started with the job (events(), `writer`)
        self._logs: list[LogLine] = []              # captured log lines not yet yielded (`drained`)
        self.last_video: Path | None = None
        self._last_section = 0                 # the section whose video last_video is (the newest one)
        rocm.apply_torch_settings()                     # cudnn.benchmark off on ROCm (no-op elsewhere)
        self.fallback = memory.conv_fallback            # tiered convolutions for every conv of every stage (rocm/)
        self.fallback.reset_stats()
        self.fallback.forget_transient()

    @property
    def job(self) -> Job:
        """The job's folder (jobfolder/folder.py), open from the job's start (`_open_job`) on."""
        if self._job is None:
            raise RuntimeError("the job folder is not open yet")
        return self._job

    @property
    def writer(self) -> SectionWriter:
        """The background writer of the section videos (video/section_writer.py), from `events()` on."""
        if self._writer is None:
            raise RuntimeError("the section writer is not started yet")
        return self._writer

    # ---- events -------------------------------------------------------------------------------------------------
    def progress(self, stage: str, section: int = 0, step: int = 0, message: str = "") -> Progress:
        elapsed = time.monotonic() - self.t0
        eta = self.remaining.update(stage, section, step, elapsed)
        return Progress(stage, section, self.plan.count, step, self.request.steps, elapsed, eta, message or stage,
                        self.remaining.note)

    def _timed(self, name: str, seconds: float) -> None:
        self.timings[name] = self.timings.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        """The time the block takes, added to the stage `name`'s timing when it ends normally (a stage that fails
        or stops is not timed)."""
        t = time.monotonic()
        yield
        self._timed(name, time.monotonic() - t)

    def stage(self, name: str, work: Callable[[], T]) -> Generator[Event, None, T]:
        """A stage in the run's context: its progress event, its work timed as `name`, then the log lines it wrote
        (as events); returns what the work returned (`x = yield from run.stage(...)`)."""
        yield self.progress(name)
        with self.timing(name):
            result = work()
        yield from self.drained()
        return result

    def drained(self) -> Iterator[LogLine]:
        """The log lines captured since the last call (the job's LogLine events), in order: every stage yields
        them after its work (`yield from run.drained()`)."""
        while self._logs:
            yield self._logs.pop(0)

    def events(self) -> Iterator[Event]:
        r = self.request
        meta = {"comment": f"prompt: {r.prompt} | seed: {r.seed}", "title": r.prompt[:200], "description": r.prompt}
        self._writer = SectionWriter(r.mode, sec.overlap_frames(r.latent_window), fps=r.fps, crf=r.crf, metadata=meta,
                                     encoding=ENCODING.for_device(self.device.type))
        try:
            yield from self._events()
        finally:
            self.writer.close()
            lora.detach(self.models.transformer)       # the next job loads the plain weights again

    def _events(self) -> Iterator[Event]:
        with capture_logs() as logs:
            self._logs = logs
            error, detail = None, ""
            # every trim of the job scans only what it made, and its end gives the heap back (rocm/allocator.py)
            with rocm.job_heap():
                try:
                    # LoRA files read and checked against the transformer before the job folder and any stage
                    self.loras = lora.load_set(self.request.loras, self.lora_dir, self.models.transformer)
                    self._open_job()
                    self.job.owner = self.cancel.may_write      # a runner that lost the queue's lease writes no more
                    if self.on_open is not None:
                        self.on_open(self.job)
                    yield Started(self.job.dir, resumed=self.strategy.resumed)
                    for w in self.prepared.warnings:
                        yield LogLine("warning", w)
                    r = self.request
                    log.info("job %s: %d section(s) of %d latent frames at %dx%d, %s mode, %s sampler, seed %d",
                             self.job.id, self.plan.count, self.plan.window, self.prepared.width, self.prepared.height,
                             r.mode, r.sampler, r.seed)
                    yield from self.drained()
                    # on ROCm the hang probe's child starts now, while the GPU is empty, and stays warm for the job's
                    # VAE decodes
                    with self.fallback.warm_probe(self.device):
                        yield from self._run()
                    status = "done"
                except JobStopped:
                    status = "stopped"
                    if self.cancel.lost and self._job is not None:     # another process runs it now: no more writes
                        self.job.detach()
                except Exception as e:  # the job fails; the process (and the server around it) keeps going
                    log.error("job failed: %s", e, exc_info=True, extra={"terminal": False})     # the command says it
                    status, error, detail = "failed", e, traceback.format_exc()
                if status == "done":
                    yield self.progress(FINISHING, self.plan.count, self.request.steps, "writing the last video file")
                try:
                    yield from self._written(wait=True)   # the section files still being written
                except Exception as e:
                    log.error("writing the video failed: %s", e, exc_info=True, extra={"terminal": False})
                    if error is None:
                        status, error, detail = "failed", e, traceback.format_exc()
                if status == "done" and self._job is not None and not self._job.writable():
                    status = "stopped"                     # the lease went while the job ended: the taker finishes it
                ending = self._fail(error, detail) if error is not None else self._finish(status)
                error = None                               # (its traceback holds the failed stage's tensors)
                self.memory.release_parked("the job ended")
                rocm.trim("after the job", host=True)      # now that a failure's traceback (and what it held) is gone
                log.info("host RSS after the job: %.1f MiB (freed memory given back)", host_rss_bytes() / MIB)
            yield from self.drained()
            if status == "done":      # what this job measured, for the next one's ETA (pipeline/eta.py)
                self.remaining.keep(self.models.warm, self.prepared.height * self.prepared.width,
                                    time.monotonic() - self.t0)
            yield ending

    def _run(self) -> Iterator[Event]:
        c, r = self.models, self.request
        self.memory.apply_cap()              # the VRAM cap (a process-wide device limit) holds from here on
        # where the weights live on the host this job (RAM or read from the files); refuses a budget that cannot work
        self.memory.arrange_host(c.models(), FRAMEPACK_STAGES, self.plan.count, self.plan.frame_counts()[-1])
        lora.attach(c.transformer, self.loras)       # merged into each device copy of a weight (memory/deltas.py)
        yield from self.drained()
        texts = yield from self.stage("text encoders", self._encode_text)
        self.cancel.check()
        start_latent, end_latent, history, done = yield from self.strategy.starting_point(self)
        self.cancel.check()
        image_embeds = yield from self.stage("image encoder", self._encode_image)
        if done:
            yield from self.strategy.decode_again(self, done)

        # split over several GPUs, an out-of-memory fails the job: a retried step would leave the others' exchange
        denoiser = FramepackDenoiser(c.transformer, r.teacache, r.steps,
                                     on_oom=self.memory.stream_more if self.split is None else None,
                                     magcache_threshold=r.magcache, mode=r.mode, split=self.split)
        blocks = compiled.for_job(c.transformer, self.device, process=self.compile != "off", job=r.compile,
                                  force=self.compile == "force")
        _, _, _, lh, lw = start_latent.shape
        for section in self.plan.sections[done:]:
            n = section.index + 1
            self.cancel.check()
            noise = torch.randn((1, c.transformer.config.in_channels, self.plan.window, lh, lw),
                                generator=self.generator, dtype=torch.float32)
            ctx, indices = self.strategy.section_inputs(self, section, history, start_latent, end_latent)
            yield self.progress("sampling", n, 0, f"section {n}/{self.plan.count}: loading the transformer")
            with self.timing("transformer"), self.memory.stage("transformer", transformer=c.transformer), \
                    self.fallback.guarded("transformer"), fp8_attention(r.fp8_attention == "on"):
                yield from self.drained()
                section_texts = texts.for_section(section.index)
                lengths = tuple(sorted((b, int(t.mask.sum())) for b, t in section_texts.items()))
                kernels = compiled.KernelTimer(blocks, (r.mode, self.plan.window, lh, lw, lengths,
                                                        len(indices.clean)))    # an extension's prefix: more
                if kernels.active:      # the first step compiles: say so instead of a progress bar that stalls
                    yield self.progress("sampling", n, 0, f"section {n}/{self.plan.count}: {compiled.PREPARING}")
                denoiser.begin_section(ctx, indices, (self.plan.window, lh, lw),
                                       image_embeds, section_texts, r.gs)
                sampler = sample_section(denoiser, noise.to(self.device), sampler=r.sampler, steps=r.steps,
                                         cfg=r.cfg, rescale=r.rescale, check_stop=self.cancel.check)
                generated = yield from self._stream_steps(sampler, n, kernels)
                denoiser.end_section()
            if denoiser.teacache:
                log.info("TeaCache skipped %d of %d steps", denoiser.teacache["cond"].skipped, r.steps)
            if denoiser.magcache:
                log.info("MagCache skipped %d of %d steps", denoiser.magcache["cond"].skipped, r.steps)
            history, real = sec.append_section(self.plan, section, history, generated.cpu(), start_latent)
            save_checkpoint(self.job, section, history, real, start_latent, end_latent, self.generator,
                            self.keyframe_latents)
            yield from self.drained()
            # the previous section's video first (the page shows it now, not after this decode: the writer usually
            # finished it during this section's sampling, so this rarely waits)
            yield from self._written(wait=True)
            yield self.progress("VAE decode", n, r.steps, f"section {n}/{self.plan.count}: decoding")
            pixels = self._decode(sec.latents_to_decode(self.plan, section, real))
            self._submit(section, pixels, self.job.path(f"section_{n:02d}.mp4"))   # written while the next samples
            del pixels                                  # the writer's now (video/section_writer.py)
            yield from self.drained()
            yield from self._written()

    def _submit(self, section: sec.Section, pixels: torch.Tensor, path: Path | None = None) -> None:
        """Hand a decoded section to the writer (with `path`, its file is written). An extension toward an end
        frame puts the input video's frames before its last section (pipeline/extend.py)."""
        if path is not None and not self.job.writable():
            raise JobStopped()                         # the queue's lease was lost: the taker writes this section
        lead = self.strategy.lead_frames(section)
        if lead is not None:
            self.writer.submit(pixels)
            pixels = lead
        self.writer.submit(pixels, section.index + 1 if path is not None else None, path)

    def _stream_steps(self, sampler, section: int, kernels: compiled.KernelTimer | None = None
                      ) -> Generator[Event, None, torch.Tensor]:
        """Drive the sampling generator, turning each step into progress and preview events; returns the section's
        latents (the sampler's result)."""
        try:
            while True:
                step, steps, estimate = next(sampler)
                if kernels is not None and kernels.active:
                    kernels.first_step_done()
                    self._timed("preparing kernels", kernels.seconds)
                self.memory.snapshot(f"sampling {section}.{step}")     # the memory timeline, per step
                yield self.progress("sampling", section, step, f"Sampling {step}/{steps}")
                yield Preview(preview_image(estimate), section, step)
                yield from self._written()          # the previous section's video, when the writer is done
        except StopIteration as done:
            return done.value

    # ---- the job's start: its strategy (pipeline/strategy.py) decides; these are the stages it calls ----------
    def _open_job(self) -> None:
        """The job folder, as the strategy opens it (a new one, or the interrupted job's own)."""
        self._job = self.strategy.open_folder(self)
        self.strategy.begin(self.job)

    def encode_start(self) -> Generator[Event, None, tuple]:
        """A new job's starting point: (start latent, end latent, an empty latent history, 0 sections done), its
        images VAE-encoded."""
        yield self.progress("VAE encode")
        start_latent, end_latent = self._encode_latents()
        if self.request.loop == "on" and self.plan.mode == "original" and end_latent is None:
            end_latent = start_latent.clone()       # a loop: the start image is also the end frame
        self.keyframe_latents = self._encode_keyframes()
        yield from self.drained()
        return start_latent, end_latent, sec.empty_history(self.plan, start_latent), 0

    def start_slot(self, section: sec.Section, start_latent: torch.Tensor) -> torch.Tensor:
        """The latent at the section's RoPE index 0 (FramePack's clean_latents_pre): the start latent, or the
        keyframe that governs the section blended in by its strength (pipeline/keyframes.py)."""
        if not self.keyframe_latents:
            return start_latent
        which = self.governing[section.index]
        if which is None:
            return start_latent
        strength = self.prepared.keyframes[which][0].strength
        return sec.blend_latents(start_latent, self.keyframe_latents[which], strength)

    @torch.no_grad()
    def _encode_keyframes(self) -> tuple:
        """The keyframes' VAE latents, drawn after the start (and end) image's from the job's generator."""
        if not self.prepared.keyframes:
            return ()
        vae = self.models.vae
        with self.timing("VAE encode"), self.memory.stage("VAE encode", vae=vae), \
                self.fallback.guarded("VAE encode"):
            out = []
            for _, image in self.prepared.keyframes:
                x = to_model_tensor(image).unsqueeze(2).to(self.device, vae.dtype)
                dist = vae.encode(x).latent_dist
                out.append((dist.sample(generator=self.generator) * vae.config.scaling_factor).float().cpu())
        return tuple(out)

    def decode_again(self, first: int, done: int, real_now: torch.Tensor,
                     write: Callable[[str, int], bool] | None = None) -> Iterator[Event]:
        """Decode the sections `first` … `done` − 1 again from the latents `real_now` (resume, extending a job), so
        the blends match an uninterrupted run exactly. `write(name, n)`: whether section n's file is written (a
        resumed job whose process died before the video of a finished section was written, or whose file is
        damaged, writes it now: the same file an uninterrupted run writes); None: no file is written."""
        for section in self.plan.sections[first:done]:
            n = section.index + 1
            yield self.progress("VAE decode", n, self.request.steps, f"resuming: decoding section {n}/{done} again")
            real = sec.real_latents_after(self.plan, section, real_now, done)
            pixels = self._decode(sec.latents_to_decode(self.plan, section, real))
            name = f"section_{n:02d}.mp4"
            if write is not None and write(name, n):
                self._submit(section, pixels, self.job.path(name))
            else:
                self._submit(section, pixels)
            del pixels
            yield from self.drained()
            yield from self._written()
        if self.job.info["videos"] and self._last_section < done:     # (a rewritten older one is not the last)
            self.last_video, self._last_section = self.job.path(self.job.info["videos"][-1]), done

    # ---- stages -------------------------------------------------------------------------------------------------
    def _encode_text(self) -> SectionTexts:
        """Each distinct prompt of the (timed) prompt, encoded once, the text encoders loaded once for all of them
        (pipeline/timeline_text.py); the sections' embeddings by generation index."""
        c, r = self.models, self.request

        def encode_all(prompts):
            with self.memory.stage("text encoders", text_encoder=c.text_encoder, text_encoder_2=c.text_encoder_2):
                neg = (encode_prompt(c.tokenizer, c.text_encoder, c.tokenizer_2, c.text_encoder_2,
                                     r.negative_prompt, c.crop_start, self.device) if r.cfg > 1.0 else None)
                out = []
                for prompt in prompts:
                    pos = encode_prompt(c.tokenizer, c.text_encoder, c.tokenizer_2, c.text_encoder_2, prompt,
                                        c.crop_start, self.device)
                    out.append({"cond": pos.to("cpu", torch.float32),
                                "uncond": (neg if neg is not None else pos.zeros_like()).to("cpu", torch.float32)})
            return out

        def key_of(prompt):
            return cache_key(prompt, r.negative_prompt if r.cfg > 1.0 else None, c.revisions,
                             self.memory.weight_storage, c.crop_start)

        schedule = timeline.schedule(r.prompt, self.plan.mode, self.plan.window, self.plan.count, r.fps,
                                     r.prompt_blend)
        if schedule.timeline.timed:
            log.info("prompt timeline, by section in video order:\n  %s", "\n  ".join(schedule.describe()))
        encoded, hits = encode_texts(schedule.texts, key_of, default_cache(), encode_all)
        if hits == len(schedule.texts):
            log.info("prompt embeddings from the cache: the text encoders were not loaded")
        return SectionTexts(schedule, encoded, negative_used=r.cfg > 1.0)

    @torch.no_grad()
    def _encode_latents(self):
        vae = self.models.vae
        with self.timing("VAE encode"):
            if self.request.start_from == "noise":      # text-to-video: no VAE encode (pipeline/text_to_video.py)
                scale = getattr(vae, "spatial_compression_ratio", 8)
                start = text_to_video.noise_latent(self.generator, vae.config.latent_channels,
                                                   self.prepared.height // scale, self.prepared.width // scale)
                return start, None
            with self.memory.stage("VAE encode", vae=vae), self.fallback.guarded("VAE encode"):
                def encode(img):
                    x = to_model_tensor(img).unsqueeze(2).to(self.device, vae.dtype)
                    dist = vae.encode(x).latent_dist
                    return (dist.sample(generator=self.generator) * vae.config.scaling_factor).float().cpu()

                start = encode(self.prepared.image)
                end = encode(self.prepared.end_image) if self.prepared.end_image is not None else None
            return start, end

    @torch.no_grad()
    def _encode_image(self) -> torch.Tensor:
        """SigLIP embedding of the start image (text-to-video: of its stand-in, a plain colour; for noise a black
        image, as FramePack-Studio does: see pipeline/text_to_video.py).
        With an end image, the conditioning is the blend
        (1 − a)·start + a·end with a = request.end_embed_weight (default 0.5, FramePack's end-frame PR #167 idea).
        diffusers' pipeline computes that blend and then ignores it (a = 0); a = 0 reproduces it exactly."""
        c = self.models
        with self.memory.stage("image encoder", image_encoder=c.image_encoder), \
                self.fallback.guarded("image encoder"):
            def embed(img):
                pixels = (to_model_tensor(img) + 1.0) / 2.0
                inputs = c.feature_extractor(images=pixels, return_tensors="pt", do_rescale=False)
                inputs = inputs.to(device=self.device, dtype=c.image_encoder.dtype)
                return c.image_encoder(**inputs).last_hidden_state.float().cpu()

            embeds = embed(self.prepared.image)
            a = self.request.end_embed_weight
            if self.prepared.end_image is not None and a > 0:
                embeds = (1.0 - a) * embeds + a * embed(self.prepared.end_image)
        return embeds

    @torch.no_grad()
    def _decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Pixels (1, 3, T, H, W) in [-1, 1] on the CPU, in the VAE's dtype (the writer blends them in float32)."""
        vae = self.models.vae
        with self.timing("VAE decode"), self.memory.stage("VAE decode", vae=vae, beside_parked=True):  # parking.py
            z = latents.to(self.device, vae.dtype) / vae.config.scaling_factor
            with rocm.vae_decode_log(vae, z, fallback=self.fallback,
                                     memory_status=lambda: self.memory.snapshot("VAE decode").status_line()), \
                    decode_speed(vae, self.device, DECODE_SPEED):
                pixels = self.memory.decode_vae(vae, z)
            pixels = pixels.cpu()
        return pixels

    def _written(self, wait: bool = False) -> Iterator[SectionVideo]:
        """Record the section files the writer has finished (with `wait`, after waiting for all of them)."""
        t = time.monotonic()
        for written in (self.writer.finish() if wait else self.writer.poll()):
            yield self._record(written)
        if wait:
            self._timed("video writing", time.monotonic() - t)       # the part of writing the job waits for

    def _record(self, written: WrittenSection) -> SectionVideo:
        if written.section >= self._last_section:
            self.last_video, self._last_section = written.path, written.section
        self.remaining.written(written.seconds)          # the ETA's wait for the last file (pipeline/eta.py)
        info = self.job.info
        if written.path.name not in info["videos"]:       # (a resume writes a missing or damaged one again)
            info["videos"].append(written.path.name)
        # The hash of the raw frames (before encoding) lets a resumed job be compared with an uninterrupted one;
        # the file's, that the file is still the one written (jobfolder/folder.py damaged_sections).
        info["sections"] = [s for s in info["sections"] if s.get("section") != written.section] + [
            {"section": written.section, "frames": written.frames, "frames_sha256": written.frames_sha256,
             "video_sha256": file_sha256(written.path), "elapsed_s": round(time.monotonic() - self.t0, 3)}]
        info["sections"].sort(key=lambda s: s.get("section", 0))
        self.job.update(timings=self._timings(), memory=self.memory.summary())
        return SectionVideo(written.path, written.frames, written.frames / self.request.fps, written.section,
                            self.plan.count)

    # ---- endings ------------------------------------------------------------------------------------------------
    def _timings(self) -> dict:
        out = {k: round(v, 4) for k, v in self.timings.items()}
        if self._writer is not None:
            out["video writing, background"] = round(self.writer.busy_s, 4)
        out["total"] = round(time.monotonic() - self.t0, 4)
        return out

    def model_info(self) -> dict:
        c = self.models
        return {"preset": c.preset.name, "mode": c.mode,
                "repos": {role: src.repo + (f"/{src.subfolder}" if src.subfolder else "")
                          for role, src in c.preset.sources(c.mode).items()},
                "revisions": c.revisions}

    def _finish(self, status: str) -> Done:
        log.info("convolution fallback this job: %s", self.fallback.report())
        frames = len(self.writer) if self.last_video else 0
        if status == "done" and self.last_video and self.request.loop == "on":
            self.last_video = self._looped()
        self.job.finish(status, self.last_video, timings=self._timings(), memory=self.memory.summary(),
                        frames=frames)
        final = self.job.path("final.mp4") if self.last_video else None
        log.info("job %s %s: %d frames in %.1f s", self.job.id, status, frames, time.monotonic() - self.t0)
        return Done(self.job.dir, final, frames, status == "stopped", self._timings())

    def _looped(self) -> Path:
        """The loop switch: the whole video with its seam blended (video/loop.py), as the job's final video; the
        section videos stay as sampled. Recorded in job.json's "loop"."""
        frames = seam_blend(self.writer.buffer.frames(), SEAM_FRAMES)
        path = self.job.path("final.mp4")
        write_segments([encode_segment(frames, fps=self.request.fps, crf=self.request.crf)], path,
                       fps=self.request.fps, metadata=self.writer.metadata)
        self.job.info["loop"] = {"seam_frames": SEAM_FRAMES,
                                 "end_frame": "start image" if self.plan.mode == "original" else None}
        return path

    def _fail(self, error: Exception, detail: str) -> Failed:
        log.info("convolution fallback this job: %s", self.fallback.report())
        message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        if isinstance(error, (HostBudgetError, InputError)):
            message = str(error)
        elif isinstance(error, OSError) and error.errno in DISK_FULL + READ_ONLY:
            where = self._job.dir if self._job is not None else self.outputs
            what = "the disk is full" if error.errno in DISK_FULL else f"it cannot be written ({error.strerror})"
            message = (f"{where}: {what}; the job stopped after its last finished section: "
                       f"{'free some space' if error.errno in DISK_FULL else 'make it writable'}, then resume it "
                       f"(python -m cli resume {where})")
        elif rocm.classify_error(error) == "oom":
            message = oom_advice(self.memory.records, self.memory, self.last_video is not None)
        if self._job is not None:
            self.job.finish("failed", None, error=message, timings=self._timings(), memory=self.memory.summary())
        return Failed(message, detail, self._job.dir if self._job else None, self.last_video)
