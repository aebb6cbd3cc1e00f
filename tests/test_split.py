"""One job split over several processes (`--gpus-per-job`, jobs/split.py, pipeline/split.py), on the CPU with gloo:
the same latents as one process; a helper killed mid-job fails the job with a message and the resume finishes it."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp

from tests.conftest import make_image


def _section(rank: int, size: int, port: int, out: str) -> None:
    """One section of the tiny transformer sampled (2 UniPC steps) by `size` processes: with 16 image-prompt
    tokens (184 + 272 tokens: equal totals per process, diffusers' plain Ulysses exchange), with 15 (455 tokens:
    uneven, its Ulysses-anything exchange), and with 16 and no exchange (each process attends over its own share
    only); process 0 saves the latents and, per run, the element count of every `all_gather` (the size messages
    of the exchange would be small ones; the velocity's gather is the projected window's share)."""
    import torch.distributed as dist

    from benchmarks.transformer_step import section_inputs
    from common import patches
    from pipeline.components import load_components
    from pipeline.denoiser import FramepackDenoiser
    from pipeline.sampling import sample_section

    tr = load_components("tiny", "original").transformer
    split = None
    if size > 1:
        from jobs.split import _join_group

        split = _join_group(rank, size, port, torch.device("cpu"), tr.config.num_attention_heads)
    runs = {"equal": (16, True), "anything": (15, True), "no exchange": (16, False)}
    if size == 1:
        runs = {"equal": (16, False), "anything": (15, False)}
    results = {}
    for name, (image_tokens, exchange) in runs.items():
        if split is not None and exchange:
            split.attach(tr)
        ctx, idx, shape, image, texts, noise = section_inputs(tr, 64, 64, 9, image_tokens)
        den = FramepackDenoiser(tr, 0.0, 2, split=split)
        den.begin_section(ctx, idx, shape, image, texts, 10.0)
        run = sample_section(den, noise, sampler="unipc", steps=2)
        gathered: list[int] = []
        real = dist.all_gather

        def counting(parts, tensor, *a, **k):
            gathered.append(tensor.numel())
            return real(parts, tensor, *a, **k)

        with patches.patched(dist, "all_gather", counting, "tests.test_split"):
            try:
                while True:
                    next(run)
            except StopIteration as done:
                results[name] = done.value
        results[f"{name} gathers"] = gathered
        if split is not None:
            results[f"{name} layout"] = split.layout(184, 256 + image_tokens).equal
            window = shape[0] * shape[1] * shape[2] // 4          # the noisy window's tokens (patch 1×2×2)
            results["window share"] = max(split.layout(184, 256 + image_tokens).window(window)) \
                * tr.proj_out.out_features
            split.detach()
    if split is not None:
        from jobs.split import _leave_group

        split.finish()
        _leave_group()          # as a helper does (jobs/split.py): no gloo thread alive at the process's exit
    if rank == 0:
        torch.save(results, out)
    if split is not None:
        os._exit(0)             # as jobs/split.helper_main ends: no interpreter teardown of gloo's threads (it aborted)


def test_two_gloo_processes_give_the_latents_of_one(tmp_path):
    from jobs.split import _free_port

    _section(0, 1, 0, str(tmp_path / "one.pt"))
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=_section, args=(r, 2, port, str(tmp_path / "two.pt"))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["equal"].shape == (1, 16, 9, 8, 8)
    assert two["equal layout"] and not two["anything layout"]        # both exchanges ran
    for name in ("equal", "anything"):
        assert (two[name] - one[name]).abs().max() <= 1e-5, name
    # no size messages: the uneven shares' exchange gathers no more than the equal one (the sizes come from the
    # layout), and each prediction gathers once, the projected window tokens of each share (not all hidden tokens)
    assert two["anything gathers"] == two["equal gathers"] == [two["window share"]] * len(two["equal gathers"])
    assert 1 <= len(two["equal gathers"]) <= 4
    # the exchange is what makes them equal: attending over a share of the tokens alone gives other latents
    assert (two["no exchange"] - one["equal"]).abs().max() > 1e-2


def test_refusals_name_the_option():
    from jobs.split import SplitUnavailable, split_devices

    with pytest.raises(SplitUnavailable, match="--gpus-per-job 1: a split job needs at least 2"):
        split_devices(1, "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(SplitUnavailable, match="--gpus-per-job 2: needs 2 GPUs"):
            split_devices(2, "cuda")
    assert [str(d) for d in split_devices(2, "cpu")] == ["cpu", "cpu"]


def test_option_reaches_the_executor(tmp_path):
    from cli.commands import build_parser
    from configs.options import config_from
    from farm.executor import queue_executor
    from jobs.models import ComponentCache
    from jobs.split import SplitExecutor

    parser = build_parser()
    args = parser.parse_args(["generate", "--preset", "tiny", "--gpus-per-job", "2", "--device", "cpu",
                              "--out", str(tmp_path), "--prompt", "x", "--image", "x.png"])
    config = config_from(parser, args)
    assert config.gpus_per_job == 2
    executor = queue_executor(config, ComponentCache("tiny"), torch.device("cpu"))
    assert isinstance(executor, SplitExecutor) and len(executor.devices) == 2


def _events_until(events, predicate):
    for event in events:
        yield event
        if predicate(event):
            return


def test_killed_helper_fails_the_job_and_the_resume_finishes_it(tmp_path, monkeypatch):
    import jobs.split as split_mod
    from configs.runtime import Config
    from jobfolder.checkpoint import load_checkpoint
    from jobs.local import Work
    from jobs.models import ComponentCache
    from jobs.split import SplitExecutor
    from pipeline.cancel import CancelToken
    from pipeline.events import Done, Failed, LogLine, Progress
    from pipeline.request import Request, prepare
    from pipeline.resume import prepare_resume

    config = Config(preset="tiny", outputs=tmp_path, device="cpu", gpus_per_job=2, compile=False)
    models = ComponentCache("tiny")
    executor = SplitExecutor(config, models, torch.device("cpu"), 2)
    request = Request(image=make_image(96, 80, seed=3), prompt="a boat", seconds=2.4, steps=3, seed=5,
                      mode="original")
    prepared = prepare(request, models.preset.default_resolution)

    events = executor.run(Work("e1", prepared=prepared), CancelToken())
    killed = None
    ending = None
    for event in events:
        # the first section done (its checkpoint written), the second sampling: the helper dies
        if killed is None and isinstance(event, Progress) and event.stage == "sampling" and event.section == 2 \
                and event.step >= 1:
            killed_pid = executor.helpers.procs[0].pid
            os.kill(killed_pid, signal.SIGKILL)
            killed = time.monotonic()
        if isinstance(event, (Done, Failed)):
            ending = event
    assert killed is not None, "the job never reached its second section"
    assert isinstance(ending, Failed), ending
    assert "the process on cpu ended mid-job" in ending.message and "resume" in ending.message
    assert time.monotonic() - killed < 60            # failed promptly, not at the group's timeout
    job_dir = ending.job_dir
    assert load_checkpoint(job_dir)[1]["sections_done"] >= 1
    assert json.loads((job_dir / "job.json").read_text())["status"] == "failed"

    # the resume starts new helpers; they stay after it (their models loaded) and run the next job too: nothing is
    # left or waited for between jobs (before, every job started its helpers and read their weights: about 65 s of
    # each job on 2 H200s)
    order: list[str] = []
    leave, end = split_mod._leave_group, split_mod._Helpers.end
    monkeypatch.setattr(split_mod, "_leave_group", lambda abort=False: (order.append(f"leave abort={abort}"),
                                                                        leave(abort))[1])
    monkeypatch.setattr(split_mod._Helpers, "end", lambda self, wait_s: (order.append("wait for the helpers"),
                                                                          end(self, wait_s))[1])
    resumed = list(executor.run(Work("e1", resuming=prepare_resume(job_dir)), CancelToken()))
    assert isinstance(resumed[-1], Done) and not resumed[-1].stopped, resumed[-1]
    info = json.loads((job_dir / "job.json").read_text())
    assert info["status"] == "done" and (job_dir / "final.mp4").is_file()
    helper = executor.helpers.procs[0]
    assert helper.pid != killed_pid and helper.is_alive() and order == []

    again = Request(image=make_image(96, 80, seed=4), prompt="a boat", seconds=1.2, steps=2, seed=6, mode="original")
    events = list(executor.run(Work("e2", prepared=prepare(again, models.preset.default_resolution)), CancelToken()))
    assert isinstance(events[-1], Done) and not events[-1].stopped, events[-1]
    assert any(isinstance(e, LogLine) and "helpers already running" in e.message for e in events)
    assert executor.helpers.procs[0] is helper and helper.is_alive() and order == []

    # the executor's end lets them go politely: this process leaves the group before it waits for their exit
    # (NCCL's destroy is collective: a helper waits in its own for this one's; the other order held each end 60 s)
    executor.close()
    assert order[:2] == ["leave abort=False", "wait for the helpers"], order
    assert helper.exitcode == 0 and executor.helpers is None


def test_a_farm_worker_of_two_splits_its_jobs(tmp_path):
    """--gpus-per-job 2 on the farm: a worker (farm/workers.py, here in this process: the class Ray makes an actor)
    that owns two devices runs each job split over them."""
    import argparse

    from configs.options import add_process_options, config_from
    from farm.workers import JobWorker, WorkerConfig
    from pipeline.events import Done, LogLine
    from pipeline.request import Request, prepare

    p = argparse.ArgumentParser()
    add_process_options(p)
    config = config_from(p, p.parse_args(["--preset", "tiny", "--cpu-workers", "1", "--gpus-per-job", "2",
                                          "--outputs", str(tmp_path.resolve())]))
    worker = JobWorker("worker-1", WorkerConfig(config, use_gpu=False, share=1))
    assert [str(d) for d in worker.split_devices] == ["cpu", "cpu"]
    request = Request(image=make_image(96, 80, seed=4), prompt="a boat", seconds=1.2, steps=2, seed=6,
                      mode="original")
    try:
        events = list(worker.run("k1", prepare(request, worker.models.preset.default_resolution)))
        assert isinstance(events[-1], Done) and events[-1].video is not None, events[-1]
        assert any(isinstance(e, LogLine) and e.message.startswith("job split over 2 devices") for e in events)
        assert worker.split_pool.running          # its helper stays for the worker's next job
    finally:
        worker.split_pool.close()
    assert not worker.split_pool.running


def test_farm_gpus_must_make_whole_workers():
    import argparse

    from configs.options import add_process_options, config_from
    from farm.dispatch import Farm
    from farm.workers import WorkerConfig

    p = argparse.ArgumentParser()
    add_process_options(p)
    config = config_from(p, p.parse_args(["--gpus", "0,1,2", "--gpus-per-job", "2"]))
    with pytest.raises(RuntimeError, match="3 GPUs do not make workers of 2"):
        Farm.start(config.farm, WorkerConfig(config))
