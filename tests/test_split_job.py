"""benchmarks/split_job.py's readings (the end-to-end split benchmark): the models' loading time of every process
from the command line's log (the first process's lines and a helper's, in their real formats), and the comparison
of two job folders (latents and final.mp4's frames)."""
from __future__ import annotations

import io
import logging

import numpy as np
import torch


def _log_of(formatter: logging.Formatter, loading_s: float) -> str:
    """What ComponentCache.get logs when it loads, through `formatter` (its clock stepped to `loading_s`)."""
    from unittest import mock

    from jobs.models import ComponentCache

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("jobs.models")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with mock.patch("jobs.models.time.perf_counter", side_effect=[100.0, 100.0 + loading_s]):
            ComponentCache("tiny", loader=lambda preset, mode, model_dir: object()).get("original")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    return stream.getvalue()


def test_loading_times_read_the_first_process_and_each_helper():
    from benchmarks.split_job import loading_times
    from cli.log import LOG_FORMAT
    from jobs.split import helper_log_format

    main = logging.Formatter(LOG_FORMAT, "%H:%M:%S")
    text = "".join([
        "starting: 0step [00:00, ?step/s]" + _log_of(main, 1.04),      # after a progress bar on the same line
        _log_of(logging.Formatter(helper_log_format("cuda:1"), "%H:%M:%S"), 21.96),
        _log_of(logging.Formatter(helper_log_format("cuda:2"), "%H:%M:%S"), 3.0),
        # memory/hostram.py's line, as it is written there
        main.format(logging.LogRecord("memory.hostram", logging.INFO, "", 0, "host plan: %.2f GB read from the "
                                      "weight files into RAM in %.1f s", (37.65, 34.31), None)) + "\n"])
    assert loading_times(text) == {"main": {"models_s": 1.0, "host_read_s": 34.3, "host_read_gb": 37.65},
                                   "cuda:1": {"models_s": 22.0}, "cuda:2": {"models_s": 3.0}}


def test_compare_reads_latents_and_frames(tmp_path):
    import av
    from safetensors.torch import save_file

    from benchmarks.split_job import compare

    frames = (np.arange(4 * 32 * 32 * 3) % 251).astype(np.uint8).reshape(4, 32, 32, 3)
    for name, shift in (("one", 0.0), ("two", 0.25)):
        folder = tmp_path / name
        folder.mkdir()
        latents = torch.zeros(1, 16, 3, 4, 4)
        latents[0, 0, 0, 0, 0] = shift
        save_file({"history": latents}, str(folder / "latents.safetensors"))
        with av.open(str(folder / "final.mp4"), "w") as out:
            stream = out.add_stream("libx264rgb", rate=30, options={"crf": "0"})
            stream.width = stream.height = 32
            stream.pix_fmt = "rgb24"
            for f in frames:
                out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
            out.mux(stream.encode())
    got = compare(tmp_path / "one", tmp_path / "two")
    assert got["latents_max_abs"] == 0.25
    assert abs(got["latents_mean_abs"] - 0.25 / (16 * 3 * 4 * 4)) < 1e-9
    assert got["frames"] == 4 and got["frames_max_abs"] == 0 and got["frames_mean_abs"] == 0.0
