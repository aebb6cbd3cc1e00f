"""A post job: the request checked (the one pre-flight calls `check`), its job folder, and its run, chunk by chunk,
resumable at the last finished chunk.

The job folder holds its own copy of each source (source0.mp4, ...), job.json (settings with `"kind": "post"`, the
steps, the models' files and sha256), chunks/NNNNN.mp4 (each chunk an independent closed H.264 segment, video/mp4.py)
and, when done, final.mp4 (the chunks joined without re-encoding; the source job's settings and the steps in its
metadata) and the export (final.gif, final.webm, final-h265.mp4, frames.zip or frame.png). A segment's bytes depend
only on its frames, so a job stopped and resumed writes the same final.mp4, byte for byte, as one that ran through.
"""
from __future__ import annotations

import functools
import logging
import shutil
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

import rocm
from common.errors import InputError, JobStopped, WeightsNotFound
from common.files import atomic_copy, atomic_write_bytes, file_sha256
from configs.presets import get_preset
from jobfolder.folder import Job, load_job
from pipeline.events import Done, Failed, LogLine, Preview, Progress, Started
from post import export as ex
from post import modelfiles as mf
from post.frames import probe, read
from post.steps import CHUNKS_DIR, PostRequest, chunks, is_post, make_plan, request_from

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PostFolders:
    upscalers: Path
    interpolators: Path
    tiny: bool = False                       # the tiny preset: models built in code, no files


def folders_of(config) -> PostFolders:
    """Where a process's post jobs find their model files (configs.runtime.Config; the tiny preset: built in code)."""
    return PostFolders(Path(config.upscaler_dir), Path(config.interpolator_dir), tiny=get_preset(config.preset).tiny)


@dataclass(frozen=True)
class CheckedPost:
    """A post request the pre-flight passed: its sources probed, its plan, its models' records."""
    request: PostRequest
    infos: tuple
    models: dict                             # step -> {"file": name, "sha256": hex or None (downloaded later)}
    job_dir: Path | None = None              # a job folder to continue (resume)
    source: object = None                    # (what a generation's prepared request calls its input video: none)

    @property
    def out_frames(self) -> int:
        return self.plan.out_frames

    @property
    def plan(self):
        first = self.infos[0]
        return make_plan(self.request, [i.frames for i in self.infos], first.fps, first.width, first.height)


MODEL_KINDS = ("interpolator", "detector", "face", "upscaler")     # the model steps' files, in the order they run


def _model_ref(request: PostRequest, kind: str) -> mf.ModelRef | None:
    step = {"interpolator": request.interpolation, "face": request.faces, "detector": request.faces,
            "upscaler": request.upscale}[kind]
    if step is None:
        return None
    if kind == "detector":                      # the face step's detector: always the default file
        return mf.ModelRef(kind, mf.DEFAULT_DETECTOR)
    default = {"interpolator": mf.DEFAULT_RIFE, "face": mf.DEFAULT_FACE}.get(kind) \
        or mf.DEFAULT_UPSCALER[step.value]
    return mf.ModelRef(kind, step.model or default)


def check(request: PostRequest, folders: PostFolders, job_dir: Path | None = None) -> CheckedPost:
    """Everything known before any model loads: the sources readable, the plan possible, each model file there
    and of a known architecture (InputError naming the field)."""
    infos = tuple(probe(p) for p in request.sources)
    models = {}
    for kind in MODEL_KINDS:
        ref = _model_ref(request, kind)
        if ref is None:
            continue
        if folders.tiny:
            models[kind] = {"file": None, "sha256": None, "built": "tiny random twin (pipeline preset tiny)"}
            continue
        sha = mf.check_file(ref, ref.folder(folders.upscalers, folders.interpolators))
        models[kind] = {"file": ref.name, "sha256": sha}
    checked = CheckedPost(request, infos, models, job_dir)
    plan = checked.plan
    if request.upscale is not None and plan.out_width * plan.out_height > 8192 * 8192:
        raise InputError("steps", f"upscaling makes {plan.out_width}×{plan.out_height} frames; upscale less")
    return checked


def prepare(values: dict, folders: PostFolders) -> CheckedPost:
    return check(request_from(values), folders)


def is_post_folder(job_dir: Path) -> bool:
    try:
        return is_post(load_job(job_dir).get("settings"))
    except (OSError, ValueError):
        return False


def is_done(job_dir: Path) -> bool:
    """The post job of the folder is complete (its record says done and its final.mp4 is there)."""
    try:
        return load_job(job_dir).get("status") == "done" and (Path(job_dir) / "final.mp4").is_file()
    except (OSError, ValueError):
        return False


def prepare_resume(job_dir: Path, folders: PostFolders) -> CheckedPost:
    """The post job of a folder, to continue it (InputError when it is complete or its record is unusable)."""
    info = load_job(job_dir)
    if info.get("status") == "done":
        raise InputError("job folder", f"job {Path(job_dir).name} is already complete")
    settings = dict(info.get("settings") or {})
    copies = info.get("post", {}).get("sources") or []
    settings["sources"] = [str(Path(job_dir) / name) for name in copies]
    return check(request_from(settings), folders, Path(job_dir))


def _load_models(checked: CheckedPost, folders: PostFolders):
    """({kind: model} of the request's model steps, the models' records with the sha256 of downloaded files)."""
    from post import esrgan, facedetect, faces, rife

    records = {k: dict(v) for k, v in checked.models.items()}
    loaded = {}
    request = checked.request
    upscale_by = request.upscale.value if request.upscale is not None else None     # (an upscaler: its step's)
    for kind in records:
        if folders.tiny:
            tiny: dict[str, Callable[[], Any]] = {
                "interpolator": rife.tiny_ifnet, "face": faces.tiny_face_model, "detector": facedetect.tiny_detector,
                "upscaler": lambda: esrgan.tiny_upscaler(upscale_by)[0]}
            loaded[kind] = tiny[kind]()
            continue
        ref = _model_ref(request, kind)
        assert ref is not None                          # (the model of one of the request's steps)
        path = mf.fetch(ref, ref.folder(folders.upscalers, folders.interpolators))
        sha = file_sha256(path)
        if records[kind]["sha256"] not in (None, sha):
            raise InputError(mf.model_field(kind), f"{{file}} changed since the job was queued (sha256 {sha[:12]}… "
                                                   f"instead of {records[kind]['sha256'][:12]}…)", path=path)
        records[kind]["sha256"] = sha
        if kind == "upscaler":
            loaded[kind], spec = mf.load_upscaler(path)
            if spec.scale != upscale_by:
                raise InputError("upscaler", f"{{file}} upscales ×{spec.scale}, not ×{upscale_by}; choose "
                                             f"upscale={spec.scale} or another file", path=path)
        else:
            loaded[kind] = mf.LOADERS[kind](path)
    return loaded, records


def _new_job(checked: CheckedPost, outputs: Path, owner: str | None) -> Job:
    request = checked.request

    def fill(job: Job) -> None:
        names = []
        for n, src in enumerate(request.sources):
            name = f"source{n}{src.suffix.lower() or '.mp4'}"
            atomic_copy(src, job.path(name))
            names.append(name)
        job.info["post"] = {"sources": names, "source_sha256": [file_sha256(job.path(n)) for n in names],
                            "chunks_done": 0}
        if owner:
            job.info["owner"] = owner

    fps = checked.plan.out_fps
    settings = {**request.settings(), "sources": [p.name for p in request.sources],
                "fps": int(fps) if fps.denominator == 1 else float(fps)}     # Past jobs: the length shown
    return Job.create(outputs, settings, checked.models, fill)


CARRIED = ("title", "description", "comment")      # the keys an MP4 keeps (the job's prompt and seed are there)


def _metadata(source: Path, request: PostRequest) -> dict:
    """The source's settings (its title, description and comment: the generating job's prompt and seed) with the
    post steps added to the comment."""
    from video.mp4 import read_metadata

    try:
        found = read_metadata(source)
    except Exception:  # noqa: BLE001 — a source without readable metadata carries none
        found = {}
    meta = {k: found[k] for k in CARRIED if k in found}
    steps = " ".join(s.text() for s in request.steps) or "none"
    meta["comment"] = " | ".join(filter(None, [meta.get("comment"), f"SteadyFrame post: {steps}"]))
    return meta


def run_post(checked: CheckedPost, memory, *, cancel=None, outputs: Path, folders: PostFolders,
             owner: str | None = None) -> Iterator:
    """The job's events: Started, Progress and Preview per chunk, then Done (or Failed)."""
    from post.facedetect import find_faces
    from post.process import dtype_for, interpolate, restore_faces, upscale
    from video.mp4 import encode_segment, write_segments

    t0 = time.monotonic()
    job = None
    try:
        if checked.job_dir is not None:
            job = Job(Path(checked.job_dir), load_job(checked.job_dir))
            job.update(status="running", error=None)
        else:
            job = _new_job(checked, outputs, owner)
        yield Started(job.dir, resumed=checked.job_dir is not None)
        request, plan = checked.request, checked.plan
        parts = chunks(plan)
        (job.dir / CHUNKS_DIR).mkdir(exist_ok=True)
        yield Progress("loading post models", 0, len(parts), 0, 1, 0.0, None, "post-processing: loading models")
        loaded, records = _load_models(checked, folders)
        job.update(models=records)
        memory.apply_cap()
        device = memory.device
        dtype = dtype_for(device)
        fps = int(plan.out_fps) if plan.out_fps.denominator == 1 else plan.out_fps
        scale = request.upscale.value if request.upscale else 1
        face_strength = request.faces.value if request.faces is not None else None     # (a face model: its step's)
        models = {k: m.to(dtype_for(device, k)) for k, m in loaded.items()}
        interp, detector, face, upscaler = (models.get(k) for k in MODEL_KINDS)
        done, ran, t_first = 0, 0, time.monotonic()
        with rocm.job_heap(), memory.stage("post", **models):      # its trim scans only what the job made
            for n, (start, end) in enumerate(parts):
                path = job.dir / CHUNKS_DIR / f"{n:05d}.mp4"
                if path.is_file():
                    done += 1
                    continue
                if cancel is not None:
                    cancel.check()
                times = list(plan.times[start:end])
                first = int(times[0])
                last = min(int(times[-1]) + (0 if times[-1] == int(times[-1]) else 1), len(plan.order) - 1)
                wanted = list(plan.order[first:last + 1])
                source = read(list(checked.infos), wanted)
                frames = [source[p] for p in wanted]
                if interp is not None:
                    frames = interpolate(interp, frames, times, first, device, dtype)
                if face is not None:
                    frames = restore_faces(face, frames, face_strength, device, dtype_for(device, "face"),
                                           functools.partial(find_faces, detector, device=device))
                if upscaler is not None:
                    free = _free_bytes(memory)
                    frames = upscale(upscaler, scale, frames, device, dtype, free)
                atomic_write_bytes(path, encode_segment(np.stack(frames), fps=fps, crf=request.crf))
                done += 1
                job.info["post"]["chunks_done"] = done
                job.info["sections"] = [{"chunk": n, "frames": end}]        # frames made so far (Past jobs)
                job.save()
                ran += 1
                elapsed = time.monotonic() - t0
                eta = (time.monotonic() - t_first) / ran * (len(parts) - n - 1)      # at this run's pace so far
                yield Progress("post-processing", n + 1, len(parts), 1, 1, elapsed, eta,
                               f"chunk {n + 1} of {len(parts)}: frames {start}–{end - 1} of {plan.out_frames}")
                yield Preview(frames[-1], n + 1, 1)
        segments = [(job.dir / CHUNKS_DIR / f"{n:05d}.mp4").read_bytes() for n in range(len(parts))]
        meta = _metadata(job.path((job.info.get("post") or {}).get("sources", ["source0.mp4"])[0]), request)
        final = write_segments(segments, job.path("final.mp4"), fps=fps, metadata=meta)
        exported = None
        if request.export != "mp4":
            yield Progress("export", len(parts), len(parts), 1, 1, time.monotonic() - t0, None,
                           f"exporting {ex.NAME[request.export]}")
            exported = ex.export(final, request.export, job.dir, metadata=meta, frame=request.frame,
                                 crf=request.crf)
        job.info["post"]["export"] = exported.name if exported else None
        job.finish("done", final, timings={"total_s": round(time.monotonic() - t0, 3)})
        shutil.rmtree(job.dir / CHUNKS_DIR, ignore_errors=True)
        yield Done(job.dir, final, plan.out_frames, False, {"total_s": time.monotonic() - t0})
    except JobStopped:
        if job is not None:
            job.finish("stopped", None, error=None)
        yield LogLine("info", "post-processing stopped; Resume continues at the next chunk")
        yield Done(job.dir if job else None, None, 0, True)
    except (InputError, WeightsNotFound) as e:
        if job is not None:
            job.finish("failed", None, error=str(e))
        yield Failed(str(e), "", job.dir if job else None)
    except Exception as e:  # noqa: BLE001 — every failure ends the job with its record written
        log.error("post job failed: %s", e, exc_info=True)
        if job is not None:
            job.finish("failed", None, error=f"{type(e).__name__}: {e}"[:500])
        yield Failed(f"{type(e).__name__}: {e}"[:300], traceback.format_exc(), job.dir if job else None)


def _free_bytes(memory) -> int | None:
    """Bytes left under the cap for a batch's activations (None on the CPU: no cap)."""
    cap = memory.cap_bytes
    if cap is None:
        return None
    import torch

    return max(cap - torch.cuda.memory_allocated(memory.device), 0)
