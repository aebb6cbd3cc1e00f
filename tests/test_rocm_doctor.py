"""`python -m rocm doctor` on a machine without GPU: runs quickly, says "no GPU", JSON parses, warnings show."""

from __future__ import annotations

import json
import time

import torch

from rocm_helpers import run_python

DOCTOR = "import sys; from rocm.__main__ import main; sys.exit(main(sys.argv[1:]))"


def _doctor(*args, env=None):
    code = f"import sys; sys.argv = ['rocm'] + {list(args)!r}; " + DOCTOR
    started = time.monotonic()
    result = run_python(code, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout, time.monotonic() - started


GPU = torch.cuda.is_available()


def test_text_report():
    # on CPU the default skips the probe table; on a GPU we skip it explicitly to stay quick
    args = ("doctor", "--no-probe") if GPU else ("doctor",)
    out, seconds = _doctor(*args, env={"MIOPEN_FIND_TIME_LIMIT": "5", "MIOPEN_FIND_MODE": "1"})
    assert "MIOPEN_FIND_TIME_LIMIT=5: does not exist" in out and "1 is NORMAL" in out
    assert "recommendations" in out and "verdicts:" in out
    if GPU:
        assert "backend      cuda" in out or "backend      rocm" in out
        assert "probe table  skipped: disabled" in out
    else:
        assert "backend      cpu  (no GPU)" in out and "No GPU visible" in out
        assert "probe table  skipped: no GPU" in out
    assert seconds < 30


def test_json_report_with_small_probe():
    out, _ = _doctor("doctor", "--json", "--probe", "--small", "--probe-timeout", "20")
    rep = json.loads(out)
    if not GPU:
        assert rep["backend"] == "cpu" and rep["gpu"]["arch"] == "cpu" and rep["environment"]["profile"] is None
    probe = rep["probe"]
    assert probe["ran"] and probe["small_shapes"] and probe["device"] == rep["backend"]
    assert {(r["tier"], r["outcome"]) for r in probe["rows"]} == {(1, "ok"), (2, "ok"), (3, "ok")}
    assert rep["conv_plan"]["tiers"] == [1, 2, 3, 4]


def test_rdna1_recommendation_explains_tiers():
    from rocm.doctor import _recommendations

    rep = {"backend": "rocm", "kfd_arch": "gfx1010", "gpu": {"family": "rdna1", "arch": "gfx1010",
           "wheel_has_arch": False, "wheel_arches": ["gfx1030", "gfx1100"], "total_memory_gib": 8.0},
           "environment": {"warnings": []}, "torch_settings": {"cudnn_benchmark": False},
           "attention": {"sdpa_mem_efficient_enabled": True}, "probe": {"ran": False}}
    text = "\n".join(_recommendations(rep))
    assert "tiers 2-3" in text and "MIOpen off" in text and "aperture" in text
    assert "no kernels for gfx1010" in text
