"""The block Linears' matrix products at the full-size step's shapes: bf16 against fp8 with each scaling (issue 46).

    python3 benchmarks/products.py --out products.json          # GPU; ~30 s on an H100 or H200

One step at 608×640, window 9 multiplies these, per block (the tokens: 17,500 of the image stream, 985 of the
prompt's; the single-stream blocks run both together, 18,485): the double-stream blocks' q/k/v and output
(3,072 → 3,072) and MLP (3,072 → 12,288 → 3,072), the single-stream blocks' fused input product (3,072 → 21,504)
and their output (15,360 → 3,072). Each shape is timed (CUDA events, median of `--reps` after warm-ups) as:

- bf16 `addmm` (the compiled blocks' product);
- fp8 row-wise: the activation's scale per token, the weight's per output row (`torch._scaled_mm`, the app's
  `--fp8-compute` recipe, pipeline/compiled.py `fp8_linear`), bf16 out with the bias;
- fp8 tensor-wise: one scale each (the same call with scalar scales), bf16 out with the bias;

the quantization of the activation left out (inside the compiled blocks it is fused into the kernel before).
Beside each: TFLOP/s and its share of the GPU's dense peak (989 bf16, 1,979 fp8 TFLOP/s on an H100/H200), so
the products' gap to the step's floor is put to the library's kernels or to the scaling.
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

log = logging.getLogger("benchmarks.products")
PEAKS = {"bf16": 989e12, "fp8": 1979e12}
SHAPES = (   # (what, tokens, in, out, how many a step)
    ("double: q/k/v, output (image)", 17_500, 3072, 3072, 20 * 4),
    ("double: MLP in (image)", 17_500, 3072, 12288, 20),
    ("double: MLP out (image)", 17_500, 12288, 3072, 20),
    ("single: input (q/k/v + MLP)", 18_485, 3072, 21504, 40),
    ("single: output", 18_485, 15360, 3072, 40),
)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    dev = torch.device("cuda")
    fp8 = torch.float8_e4m3fn
    rows, step = [], {"bf16": 0.0, "fp8 row-wise": 0.0, "fp8 tensor-wise": 0.0}
    for what, m, k, n, count in SHAPES:
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g) / k ** 0.5
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
        xs = x.abs().amax(dim=1).float() / 448
        ws = w.abs().amax(dim=1).float() / 448
        xq, wq = (x.float() / xs[:, None]).to(fp8), (w.float() / ws[:, None]).to(fp8)
        xs1, ws1 = x.abs().amax().float() / 448, w.abs().amax().float() / 448
        xq1, wq1 = (x.float() / xs1).to(fp8), (w.float() / ws1).to(fp8)
        flop = 2 * m * k * n
        kinds = {
            "bf16": lambda: torch.addmm(bias, x, w.t()),
            "fp8 row-wise": lambda: torch._scaled_mm(xq, wq.t(), scale_a=xs[:, None], scale_b=ws[None, :],
                                                     bias=bias, out_dtype=torch.bfloat16, use_fast_accum=True),
            "fp8 tensor-wise": lambda: torch._scaled_mm(xq1, wq1.t(), scale_a=xs1, scale_b=ws1, bias=bias,
                                                        out_dtype=torch.bfloat16, use_fast_accum=True),
        }
        ref = kinds["bf16"]().float()
        for kind, fn in kinds.items():
            ms = timed(fn, args.reps)
            out = fn().float()
            err = ((out - ref).norm() / ref.norm()).item()
            peak = PEAKS["fp8" if kind.startswith("fp8") else "bf16"]
            row = {"shape": what, "m": m, "k": k, "n": n, "per_step": count, "kind": kind, "ms": ms,
                   "tflops": flop / ms / 1e9, "share_of_peak": flop / ms / 1e-3 / peak, "rel_err_vs_bf16": err}
            rows.append(row)
            step[kind] += ms * count
            log.info("%-32s %-16s %7.3f ms  %6.0f TFLOP/s  %4.0f %% of peak  rel. err %.2e", what, kind, ms,
                     row["tflops"], 100 * row["share_of_peak"], err)
    total_flop = sum(2 * m * k * n * c for _, m, k, n, c in SHAPES)
    floors = {k: total_flop / PEAKS["fp8" if k.startswith("fp8") else "bf16"] * 1e3 for k in step}
    for kind, ms in step.items():
        log.info("a step's block products, %-16s %7.1f ms (floor %.1f ms, %.0f %%)", kind, ms, floors[kind],
                 100 * floors[kind] / ms)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                                    "rows": rows, "step_ms": step, "floor_ms": floors}, indent=1))


if __name__ == "__main__":
    main()
