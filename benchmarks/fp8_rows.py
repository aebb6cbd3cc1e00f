"""The MLP output products' input under fp8 compute: GELU + per-token fp8 quantization, Inductor's kernel against
pipeline/fp8_rows.py's Triton kernel, at the full-size step's shapes (issue 46).

    python3 benchmarks/fp8_rows.py --out fp8_rows.json          # GPU; ~30 s on an H100 or H200

For each shape (the single-stream blocks: the attention's output, 17,500 video + 985 prompt tokens × 3,072, and
the MLP's 18,485 × 12,288 before its GELU; the double-stream blocks' MLP, 17,500 × 12,288), timed with CUDA events
(median of `--reps` after warm-ups):
- `inductor`: `fp8_rows.reference` (the concatenation, `gelu_tanh`, `quantize_rows`) compiled by torch.compile, the
  compiled blocks' form before the kernel;
- `kernel`: `fp8_rows.quantize_gelu_rows` (the Triton kernel), and each `--warps` setting of it.
Beside each: GB/s and the floor at the GPU's memory bandwidth (`--bandwidth`, 4.8 TB/s on an H200: the bytes read
once and written once); and the kernel's values and scales against the compiled form's and eager PyTorch's, as the
count of fp8 values that differ (the GPU's exponential rounds differently from one compiler to the other).
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

import torch  # noqa: E402

from benchmarks.attention import timed  # noqa: E402
from pipeline import fp8_rows  # noqa: E402

log = logging.getLogger("benchmarks.fp8_rows")
SHAPES = (   # (what, video tokens, prompt tokens, attention width (0: none), MLP width, blocks a step)
    ("single: [attention, gelu(mlp)]", 17_500, 985, 3072, 12288, 40),
    ("double: gelu(mlp), video", 17_500, 0, 0, 12288, 20),
    ("double: gelu(mlp), prompt", 985, 0, 0, 12288, 20),
)


def _differ(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> dict:
    return {"values": int((a[0].view(torch.uint8) != b[0].view(torch.uint8)).sum()),
            "scales": int((a[1] != b[1]).sum()),
            "largest value difference": float((a[0].float() * a[1][:, None] - b[0].float() * b[1][:, None]).abs().max())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bandwidth", type=float, default=4.8e12)
    ap.add_argument("--warps", default="4,8,16,32")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    dev = torch.device("cuda")
    compiled_reference = torch.compile(fp8_rows.reference, dynamic=False)
    assert fp8_rows.prepare(), "Triton does not import here"
    kernels = fp8_rows._READY["kernels"]
    rows, step = [], {"inductor": 0.0, "kernel": 0.0}
    for what, video, text, k1, k2, count in SHAPES:
        g = torch.Generator(device=dev).manual_seed(0)
        n = video + text
        h = torch.randn(1, n, k2, device=dev, dtype=torch.bfloat16, generator=g) * 2
        first: list[torch.Tensor] = []
        if k1:
            attn = torch.randn(1, n, k1, device=dev, dtype=torch.bfloat16, generator=g)
            first = [attn[:, :video], attn[:, video:]]
        assert fp8_rows._usable(first, h)
        eager = fp8_rows.reference(first, h)
        inductor = compiled_reference(first, h)
        kernel = fp8_rows.quantize_gelu_rows(first, h)
        again = fp8_rows.quantize_gelu_rows(first, h)
        nbytes = n * (k1 + k2) * 2 + n * (k1 + k2) + n * 4
        row = {"what": what, "rows": n, "width": k1 + k2, "blocks a step": count, "bytes": nbytes,
               "floor ms": round(nbytes / args.bandwidth * 1e3, 4),
               "kernel vs inductor": _differ(kernel, inductor), "kernel vs eager": _differ(kernel, eager),
               "inductor vs eager": _differ(inductor, eager),
               "kernel twice the same": torch.equal(kernel[0].view(torch.uint8), again[0].view(torch.uint8))
               and torch.equal(kernel[1], again[1])}
        row["inductor ms"] = round(timed(lambda: compiled_reference(first, h), args.reps), 4)
        row["kernel ms"] = round(timed(lambda: fp8_rows.quantize_gelu_rows(first, h), args.reps), 4)
        q = torch.empty_like(kernel[0])
        s = torch.empty_like(kernel[1])
        row["kernel ms by warps"] = {w: round(timed(lambda w=w: fp8_rows.launch(kernels.jitted, first, h, q, s,
                                                                                 num_warps=int(w)), args.reps), 4)
                                     for w in args.warps.split(",")}
        for key in ("inductor", "kernel"):
            row[f"{key} GB/s"] = round(nbytes / row[f"{key} ms"] / 1e6, 1)
            step[key] += row[f"{key} ms"] * count
        rows.append(row)
        log.info("%s", json.dumps(row))
    result = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "shapes": rows,
              "a step ms": {k: round(v, 2) for k, v in step.items()}}
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{'shape':34} {'rows':>6} {'inductor ms':>12} {'kernel ms':>10} {'floor ms':>9} {'kernel GB/s':>12}")
    for r in rows:
        print(f"{r['what']:34} {r['rows']:>6} {r['inductor ms']:>12.4f} {r['kernel ms']:>10.4f} "
              f"{r['floor ms']:>9.4f} {r['kernel GB/s']:>12.1f}  warps {r['kernel ms by warps']}  "
              f"differ vs inductor {r['kernel vs inductor']['values']}, vs eager {r['kernel vs eager']['values']}")
    print("a step (ms):", result["a step ms"])


if __name__ == "__main__":
    main()
