"""--device (issue 40): one device for the ROCm profile and the jobs, in the app, the CLI and the farm's workers,
checked before any model loads (an unknown or unavailable one: exit 2 with one line naming what is there). On a
machine with two GPUs, `--device cuda:1` runs the app's job on GPU 1 and leaves GPU 0 untouched."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.errors import InputError
from memory.device import available_devices, chosen_device

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, words", [("mps", "Apple's GPU"), ("npu", "not a device name"),
                                         ("cuda:99", "GPU" if not torch.cuda.is_available() else "only"),
                                         ("meta", "does not run on")])
def test_an_unknown_or_unavailable_device_is_refused_naming_what_is_there(name, words):
    with pytest.raises(InputError) as caught:
        chosen_device(name)
    message = str(caught.value)
    assert message.startswith("--device: ") and repr(name) in message and words in message
    assert "this machine has: cpu" in message and "\n" not in message
    assert chosen_device("cpu") == torch.device("cpu")
    assert chosen_device(None) == (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                                   else torch.device("cpu"))
    assert available_devices()[0] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU (here: a CUDA/ROCm GPU is "
                                                      "visible, so --device cuda is valid)")
def test_the_app_and_the_cli_exit_2_at_once_on_a_device_this_machine_lacks(tmp_path):
    """`python app.py --device mps` and `python -m cli generate --device cuda` on this CPU machine: exit 2 with one
    error line naming what is there, before any model loads: torch is the only heavy import (no diffusers,
    transformers or Gradio: read from -X importtime), so it takes about the time torch takes to import (under 3 s
    on an idle machine; the bound here is relative to that import, with room for a loaded test machine)."""
    def run(*args):
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, capture_output=True, text=True,
                           timeout=180, stdin=subprocess.DEVNULL)
        return r, time.monotonic() - started

    _, torch_import = run("-c", "import torch")
    app, app_s = run("app.py", "--preset", "tiny", "--device", "mps", "--outputs", str(tmp_path))
    cli, cli_s = run("-m", "cli", "generate", "--preset", "tiny", "--device", "cuda", "--image", "missing.png",
                     "--outputs", str(tmp_path))
    for r, seconds, name in ((app, app_s, "'mps'"), (cli, cli_s, "'cuda'")):
        imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
        out = "\n".join(line for line in (r.stdout + r.stderr).splitlines() if not line.startswith("import time:"))
        errors = [line for line in out.splitlines() if "ERROR" in line or line.startswith("error:")]
        assert r.returncode == 2, out
        assert len(errors) == 1 and name in errors[0] and "this machine has: cpu" in errors[0], out
        assert "loading" not in out and "missing.png" not in out         # nothing loaded, nothing else checked
        assert "torch" in imported and not imported & {"diffusers", "transformers", "gradio", "av"}, imported
        assert seconds < max(3.0, 5 * torch_import + 5), (seconds, torch_import)
    assert not any(tmp_path.iterdir())                                   # no job folder, no queue


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: --device cuda:1 is checked on the GPU "
                                                          f"machine (this one has {torch.cuda.device_count()})")
def test_the_apps_device_cuda_1_runs_the_job_on_gpu_1(tmp_path):
    """`python app.py --preset tiny --device cuda:1`: the app's own runner (app.app_runner on the device main()
    checks) runs a tiny job; every CUDA tensor any module sees is on GPU 1, and GPU 0 holds nothing."""
    from app import app_runner
    from pipeline.events import Done
    from pipeline.request import Request
    from tests.conftest import make_image
    from ui.launch import parse_args

    config = parse_args(["--preset", "tiny", "--device", "cuda:1", "--outputs", str(tmp_path), "--no-compile"])
    device = chosen_device(config.device)
    assert device == torch.device("cuda", 1) and torch.cuda.current_device() == 1
    seen: set[torch.device] = set()

    def record(module, args):
        seen.update(a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda)

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    runner, _ = app_runner(config, device)
    try:
        from ui.sessions import Sessions

        sessions = Sessions(runner.start())
        job = sessions.submit(Request(image=make_image(), prompt="a cat walks", seconds=1.0, steps=2, seed=3),
                              session="s")
        events = [e for batch in sessions.stream(job) for e in batch]
    finally:
        hook.remove()
        runner.close(timeout=60)
    assert isinstance(events[-1], Done), events[-1]
    assert seen == {torch.device("cuda", 1)}, seen
    assert torch.cuda.max_memory_allocated(0) == 0 and torch.cuda.max_memory_allocated(1) > 0
