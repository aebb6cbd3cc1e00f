"""Time estimates: how long the rest of a running job takes (a whole job's, before it starts: jobs/line.py).

`Remaining` follows one job's progress (stage, section, step, elapsed: what every Progress event carries) and
estimates the time left from everything that is still to run: the sampling steps of this and the later sections,
and the VAE decode of every section not yet decoded, at the decode time per latent frame measured in this job.

A step's time is measured between two steps of a section: the time from a section's start to its first step also
holds loading the transformer, preparing compiled kernels (the first section) and the first use of each kernel, so
it is kept apart (`start_times`); a later section is expected to cost that much more than its steps only once a
later section's start has been measured (the first one's is mostly one-time work).

Once a section has been measured whole (from its start to the next section's start: its steps, its saving, the
wait for the previous section's file, its decode), the estimate is at least what the sections still to run take at
that measured time (`section_s`): the parts above are each measured alone and miss what runs beside them, above all
the video writer of the previous section, which shares the CPU with every section after the first (with one core
busy, section 1 ran 1.5-3x faster than the later ones, and the parts alone said 'ETA 3 s' with 10.5 s left). Section
1's time is taken less the one-time work in it (its start beyond a later section's, the first decode's extra as an
earlier job of this process measured it). Section 1 itself runs without a writer beside it, so until section 2 has
been measured a machine with no core to spare for the writer is still undercounted (adding the writer's time to
section 1's overcounted the quiet machine's later sections 1.5-1.8x instead).

Until the first decode of the job has finished, the decode time per frame is the one measured on an earlier job
(`decode_prior`, when the caller has one), else a latent frame's decode is assumed to take `DECODE_PRIOR` sampling
steps (BENCHMARKS.md, the 3-section job on an H100: 0.29–0.36 s a latent frame at 1.3 s a step; assuming instead a
section's decode as long as its sampling put section 1's estimate ~70 % too high, issue 33) and each section's
decode at least as long as this job's VAE encode stage (the same model loaded for one frame): assumptions, replaced
by the measurement as soon as there is one.

A job that has not started is estimated in jobs/line.py (`JobRates`: a finished job's speeds), beside the queue
that waits on it; this module is the running job's own estimate, which its `JobRun` updates at every progress.
"""
from __future__ import annotations

from dataclasses import dataclass, field

DECODE_PRIOR = 0.25     # before any decode is measured: a latent frame's decode ≈ this many sampling steps


def decode_frames(plan) -> list[int]:
    """Latent frames decoded after each section of a pipeline.sections.SectionPlan."""
    return [plan.decode_frames(s) for s in plan.sections]


FINISHING = "finishing"      # the stage after the last decode: the last file written, the job's memory given back


@dataclass
class Remaining:
    sections: int
    steps: int
    frames: list[int]                      # latent frames decoded after each section (decode_frames(plan))
    step_times: list[float] = field(default_factory=list)
    start_times: list[tuple[int, float]] = field(default_factory=list)   # (section, its start to its first step)
    decode_s: float = 0.0                  # decode time measured so far (after the job's first), and its frames
    decoded_frames: int = 0
    first_decode: tuple[float, int] | None = None     # the job's first decode (seconds, frames): one-time work too
    decode_prior: float | None = None      # seconds per decoded latent frame known before this job's (`for_plan`)
    first_extra: float = 0.0               # what the job's first decode costs more than the others (earlier jobs)
    finish_prior: float = 0.0              # the finishing stage of an earlier job of this process
    encode_s: float = 0.0                  # this job's VAE encode stage
    gap_times: list[float] = field(default_factory=list)   # a section's last step to its decode (checkpoint, files)
    write_s: float = 0.0                   # the writer's time on the latest section file
    note: str = ""                         # why the estimate went up (while it holds), else ""
    finishing_at: float | None = None      # when the finishing stage began (elapsed)
    section_starts: dict[int, float] = field(default_factory=dict)    # section -> elapsed at its first progress
    _now: float = 0.0                      # elapsed at the latest update
    _last: tuple | None = None             # (stage, section, step, elapsed) of the previous update
    _shown: tuple | None = None            # (estimate, elapsed, rates) of the last one that counted down
    _note_section: int = 0                 # the section in which `note` was set

    @classmethod
    def for_plan(cls, plan, steps: int, decode_prior: float | None = None, *, warm: dict | None = None,
                 pixels: int = 0) -> "Remaining":
        """`warm`: what earlier jobs of this process measured (`keep`), for frames of `pixels` (height × width);
        `decode_prior`: seconds per decoded latent frame from elsewhere (used when `warm` has none)."""
        warm = warm or {}
        per_pixel = warm.get("decode per frame and pixel")
        if per_pixel and pixels > 0:
            decode_prior = per_pixel * pixels
        return cls(plan.count, steps, decode_frames(plan), decode_prior=decode_prior,
                   first_extra=float(warm.get("first decode extra per pixel", 0.0)) * max(pixels, 0),
                   finish_prior=float(warm.get("finishing", 0.0)))

    def keep(self, warm: dict, pixels: int, elapsed_s: float) -> None:
        """The job ended at `elapsed_s`: keep its steady decode speed (per latent frame and pixel, on the decodes
        after its first), what its first decode cost more, and its finishing stage in `warm`, for the next job of
        this process (its ETA then knows them from its start)."""
        if self.decoded_frames and pixels > 0:
            per_frame = self.decode_s / self.decoded_frames
            warm["decode per frame and pixel"] = per_frame / pixels
            if self.first_decode is not None:
                extra = self.first_decode[0] - self.first_decode[1] * per_frame
                warm["first decode extra per pixel"] = max(extra, 0.0) / pixels
        if self.finishing_at is not None:
            warm["finishing"] = max(elapsed_s - self.finishing_at, 0.0)

    def update(self, stage: str, section: int, step: int, elapsed_s: float) -> float | None:
        """Record a progress point and return the estimated seconds left (None before sampling has timed a step).
        When the estimate is higher than the last one that counted down, less the time since, by more than RAISE_S
        or RAISE_PART of it, `note` says why (until the next section)."""
        last = self._last
        if last is not None:
            l_stage, l_section, l_step, l_elapsed = last
            spent = max(elapsed_s - l_elapsed, 0.0)
            if stage == "sampling" and l_stage == "sampling" and step > l_step and section == l_section:
                if l_step == 0:          # the section's start: loading, kernels, then its first step(s)
                    self.start_times.append((section, spent - (step - 1) * (self.per_step or 0.0)))
                else:
                    self.step_times.append(spent / (step - l_step))
            elif l_stage == "VAE decode" and (stage, section, step) != (l_stage, l_section, l_step):
                frames = self.frames[min(max(l_section, 1), self.sections) - 1]
                if self.first_decode is None:
                    self.first_decode = (spent, frames)
                else:
                    self.decode_s += spent
                    self.decoded_frames += frames
            elif l_stage == "sampling" and stage == "VAE decode" and section == l_section and l_step >= self.steps:
                self.gap_times.append(spent)
            elif l_stage == "VAE encode" and stage != l_stage:
                self.encode_s += spent
        if stage == FINISHING and self.finishing_at is None:
            self.finishing_at = elapsed_s
        if stage == "sampling" and section >= 1:
            self.section_starts.setdefault(section, elapsed_s)
        self._last, self._now = (stage, section, step, elapsed_s), elapsed_s
        rates = self.rates()
        if rates is None:
            return None
        left = sum((self.parts(stage, section, step, rates) or {}).values())
        if self.note and section > self._note_section:
            self.note = ""
        if self._shown is None:
            self._shown = (left, elapsed_s, rates)
        else:                   # small rises add up against the last estimate that counted down (or was explained)
            before, at, before_rates = self._shown
            expected = max(before - (elapsed_s - at), 0.0)
            if left > expected + max(RAISE_S, RAISE_PART * expected):
                self.note, self._note_section = self._why(before_rates, stage, section, step), section
                self._shown = (left, elapsed_s, rates)
            elif left <= expected:
                self._shown = (left, elapsed_s, rates)
        return left

    def written(self, seconds: float) -> None:
        """A section's file was written in `seconds` (video/section_writer.py): at its end the job waits about
        that long for its last file (when no earlier job of this process timed its finishing stage)."""
        self.write_s = max(float(seconds), 0.0)

    @property
    def per_step(self) -> float | None:
        recent = self.step_times[-self.steps:]
        if recent:
            return sum(recent) / len(recent)
        if self.steps == 1 and self.start_times:          # one step a section: its start is all there is
            return self.start_times[-1][1]
        return None

    def start_extra(self) -> float:
        """What a section's start costs more than a step (loading the transformer), from the latest section after
        the first (the first's start holds one-time work: compiling, the first use of every kernel); 0 before."""
        later = [t for section, t in self.start_times if section > 1]
        per_step = self.per_step or 0.0
        return max(later[-1] - per_step, 0.0) if later else 0.0

    def gap(self) -> float:
        """From a section's last step to its decode (its checkpoint saved, the previous section's file waited
        for): the mean of the latest three sections, 0 before the first."""
        recent = self.gap_times[-3:]
        return sum(recent) / len(recent) if recent else 0.0

    def decode_per_frame(self) -> float | None:
        """Seconds per decoded latent frame: measured on this job's decodes after its first (the first also
        allocates the decode's memory and starts the video's writer), else an earlier job's steady speed, else the
        first decode's, else a prior."""
        if self.decoded_frames:
            return self.decode_s / self.decoded_frames
        if self.decode_prior is not None:
            return self.decode_prior
        if self.first_decode is not None and self.first_decode[1]:
            return self.first_decode[0] / self.first_decode[1]
        per_step = self.per_step
        if per_step is None:
            return None
        # a section's decode is at least this job's VAE encode stage (the same model, one frame): where decoding is
        # slow next to a step (the CPU, the tiny preset) that bound, not the GPU's ratio, is what holds
        return max(DECODE_PRIOR * per_step, self.encode_s / max(min(self.frames), 1))

    def section_s(self) -> float:
        """A whole section's time as measured in this job: the latest section from its start to the next one's (0
        before one is measured). The job's first sampled section is taken less its one-time work (its start beyond
        a later section's and the first decode's extra, as an earlier job measured it)."""
        starts = self.section_starts
        whole = [n for n in sorted(starts) if n + 1 in starts]
        if not whole:
            return 0.0
        n = whole[-1]
        seconds = starts[n + 1] - starts[n]
        if n == min(starts):
            start = next((t for section, t in self.start_times if section == n), 0.0)
            one_time = max(start - (self.per_step or 0.0) - self.start_extra(), 0.0) + self.first_extra
            seconds = max(seconds - one_time, 0.0)
        return seconds

    @property
    def decode_measured(self) -> bool:
        return self.first_decode is not None

    def rates(self) -> dict[str, float] | None:
        """What the estimate is made of: seconds per step, per decoded latent frame, a later section's start, a
        section's saving, the finishing stage, the first decode's extra (None before sampling has timed a step)."""
        per_step, per_frame = self.per_step, self.decode_per_frame()
        if per_step is None or per_frame is None:
            return None
        return {"steps": per_step, "decodes": per_frame, "starts": self.start_extra(), "saving": self.gap(),
                "finishing": max(self.finish_prior, self.write_s),
                "first decode": self.first_extra if self.first_decode is None else 0.0,
                "sections": self.section_s()}

    def parts(self, stage: str, section: int, step: int, rates: dict | None = None) -> dict[str, float] | None:
        """The time left in its parts: "steps", "starts" (of the later sections), "decodes", "saving" (a section's
        last step to its decode), "finishing" (after the last decode) and "sections" (what the sections left take
        at the measured time of a whole section, `section_s`, more than the other parts say), at `rates` (default:
        `rates()`); None before sampling has timed a step."""
        rates = rates or self.rates()
        if rates is None:
            return None
        if stage == FINISHING:
            return {"steps": 0.0, "starts": 0.0, "decodes": 0.0, "saving": 0.0, "finishing": rates["finishing"],
                    "sections": 0.0}
        n = min(max(section, 1), self.sections)
        if stage == "sampling":
            steps_left = (self.steps - step) + (self.sections - n) * self.steps
            starts_left = self.sections - n + (step == 0)    # at step 0 this section's start is still running
            first_undecoded = n                        # this section's decode is still to come
            gaps_left = self.sections - n + 1
        else:                                          # "VAE decode" of section n (or a stage after sampling)
            steps_left = (self.sections - n) * self.steps
            starts_left = self.sections - n
            first_undecoded = n if stage == "VAE decode" else n + 1
            gaps_left = self.sections - n
        frames_left = sum(self.frames[first_undecoded - 1:])
        out = {"steps": steps_left * rates["steps"], "starts": starts_left * rates["starts"],
               "decodes": frames_left * rates["decodes"] + (rates["first decode"] if frames_left else 0.0),
               "saving": gaps_left * rates["saving"], "finishing": rates["finishing"], "sections": 0.0}
        whole, began = rates.get("sections", 0.0), self.section_starts.get(n)
        if whole > 0 and began is not None and (stage, first_undecoded) in {("sampling", n), ("VAE decode", n)}:
            by_sections = max(whole - (self._now - began), 0.0) + (self.sections - n) * whole + rates["finishing"]
            out["sections"] = max(by_sections - sum(out.values()), 0.0)
        return out

    def estimate(self, stage: str, section: int, step: int) -> float | None:
        parts = self.parts(stage, section, step)
        return None if parts is None else sum(parts.values())

    def _why(self, before: dict, stage: str, section: int, step: int) -> str:
        """Which measured rate raised the estimate most since `before` (the rates then), in words: the one whose
        earlier value would take most off the estimate now."""
        now = self.rates() or {}
        left = sum((self.parts(stage, section, step, now) or {}).values())
        cut = {k: left - sum((self.parts(stage, section, step, {**now, k: before[k]}) or {}).values()) for k in now}
        grew = max(cut, key=lambda k: cut[k])
        done = max(section - 1, 1)
        return {"steps": "up: the steps got slower",
                "starts": "up: a section's start (loading the transformer) was timed",
                "decodes": f"up: section {done}'s decode was timed" if grew != "decodes" or not self.decoded_frames
                else "up: the decodes got slower",
                "saving": "up: a section's saving and video file were timed",
                "finishing": "up: the last video file was timed",
                "first decode": "up: the first decode was timed",
                "sections": self._section_note()}[grew]

    def _section_note(self) -> str:
        """Why the measured time of a whole section raised the estimate."""
        whole = [n for n in sorted(self.section_starts) if n + 1 in self.section_starts]
        if len(whole) <= 1:
            return "up: a whole section (its decode and file too) was timed"
        return f"up: section {whole[-1]} took longer than section {whole[-2]}"


RAISE_S = 1.0          # an estimate this much (or RAISE_PART of it) above the previous one, less the time since: a
RAISE_PART = 0.15      # raise, whose reason the note says
