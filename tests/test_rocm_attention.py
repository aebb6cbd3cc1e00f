"""Flash attention on RDNA3/RDNA4: the AOTriton gate is named where it matters, and the log line says it."""

from __future__ import annotations

import pytest
import rocm_helpers  # noqa: F401  (puts the repo on sys.path)
import torch
import torch.nn.functional as F

from rocm.attention import attention_check
from rocm.sdpa import AttentionGuard, aotriton_note

VAR = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"


@pytest.mark.parametrize("backend,arch,env,expect", [
    ("rocm", "gfx1100", {}, "is unset"),
    ("rocm", "gfx1151", {VAR: "true"}, "is 'true'"),        # PyTorch reads only 0/1: 'true' leaves it off
    ("rocm", "gfx1201", {VAR: "0"}, "is '0'"),
    ("rocm", "gfx1100", {VAR: "1"}, None),
    ("rocm", "gfx1030", {}, None),                           # not gated: nothing reads the variable
    ("rocm", "gfx942", {}, None),
    ("cuda", "sm_90", {}, None),
])
def test_aotriton_note(backend, arch, env, expect):
    note = aotriton_note(backend, arch, env)
    if expect is None:
        assert note is None
    else:
        assert note and expect in note and arch in note and VAR in note


def test_the_stage_log_line_says_why_attention_is_chunked(caplog):
    q = torch.randn(1, 2, 64, 16)
    note = aotriton_note("rocm", "gfx1100", {})
    with caplog.at_level("INFO", logger="rocm.sdpa"):
        with AttentionGuard("cpu", chunk_budget_bytes=4096, force_chunked=True, label="transformer",
                            gate_note=note) as guard:
            out = F.scaled_dot_product_attention(q, q, q)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q), atol=1e-5, rtol=1e-4)
    (text,) = guard.choices.values()
    assert "math in chunks" in text and VAR in text
    assert f"attention in transformer (float32, head dim 16, no mask): {text}" in caplog.text


def test_attention_check_times_every_backend_and_the_apps_path():
    lines = []
    rep = attention_check("cpu", tokens=64, heads=2, head_dim=128, dtype="bfloat16", reps=1, warmup=0,
                          progress=lines.append)
    assert rep["shape"] == {"batch": 1, "heads": 2, "tokens": 64, "head_dim": 128, "dtype": "bfloat16"}
    assert [c["masked"] for c in rep["cases"]] == [False, True]
    for case in rep["cases"]:
        math = case["backends"]["math"]
        assert math["ran"] and math["ms"] >= 0
        assert not case["backends"]["cudnn"]["ran"] and case["backends"]["cudnn"]["reason"]   # no cuDNN on CPU
        assert case["app"]["uses"].startswith("PyTorch's own SDPA dispatch")
    assert lines[:4] == ["attention no mask: flash", "attention no mask: memory-efficient", "attention no mask: cudnn",
                         "attention no mask: math"]
