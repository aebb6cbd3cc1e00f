"""How fast weight files come off this machine's disk: 1-16 reader threads, through the page cache or O_DIRECT.

The files a job reads under a host-RAM budget (the Llama once per job, part of the transformer per section) are
read with `WeightFile.read_into` in staging-sized pieces. One thread waits for each of the kernel's small requests
in turn; several keep the disk's queue full. For each thread count the file is first evicted from the page cache
(`posix_fadvise(DONTNEED)`; clean pages only, no root needed), then read whole, piece by piece, into one pinned (on a
GPU machine) or plain buffer, as the staging ring does, with `read_into` (buffered) and with `read_direct` (O_DIRECT,
memory/weightfiles.py). Reports GiB/s per way and thread count and the ratio to one buffered thread.

    python3 benchmarks/read_speed.py --make-gb 8 --dir /tmp --out read_speed.json     # makes and removes a file
    python3 benchmarks/read_speed.py --file /path/model-00001-of-00004.safetensors --out read_speed.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

if not __package__:          # `python3 benchmarks/<this>.py`: run again as a module (benchmarks/_script.py)
    import _script

    _script.as_module(__file__)

from common.units import GIB, MIB  # noqa: E402
from memory.weightfiles import DIRECT_ALIGN, WeightFile  # noqa: E402


def make_file(folder: Path, nbytes: int) -> Path:
    """A safetensors file of one uint8 tensor of `nbytes` random-looking bytes, written to the disk (fsync)."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    block = torch.randint(0, 256, (64 * MIB,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    fd, name = tempfile.mkstemp(suffix=".safetensors", dir=folder)
    with os.fdopen(fd, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        left = nbytes
        while left:
            n = min(left, block.numel())
            f.write(block[:n].numpy().tobytes())
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return Path(name)


def read_all(wf: WeightFile, buf: torch.Tensor, threads: int, direct: bool) -> float | None:
    """Seconds to read every tensor byte of `wf` into `buf`, piece by piece, the file evicted from the cache first
    (None: O_DIRECT refused here)."""
    os.posix_fadvise(wf.fd, 0, wf.size, os.POSIX_FADV_DONTNEED)
    start = min(s.offset for s in wf.tensors.values())
    room = buf.numel() - 2 * DIRECT_ALIGN
    t0 = time.perf_counter()
    pos = start
    while pos < wf.size:
        n = min(room, wf.size - pos)
        if direct:
            if wf.read_direct(buf, pos, n, threads=threads) is None:
                return None
        else:
            wf.read_into(buf[:n], pos, threads=threads)
        pos += n
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--file", type=Path, help="an existing safetensors file to read")
    ap.add_argument("--make-gb", type=float, default=4.0, help="else: make a file of this size")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--piece-mb", type=int, default=64, help="bytes per read_into call (the staging slot)")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--pressure-gb", type=float, default=0.0,
                    help="hold this much touched anonymous memory while reading (run it inside a memory cgroup to "
                         "see buffered reads pay for reclaim)")
    args = ap.parse_args(argv)
    made = None if args.file else make_file(args.dir, int(args.make_gb * GIB))
    ballast = torch.ones(int(args.pressure_gb * GIB), dtype=torch.uint8) if args.pressure_gb else None
    path = args.file or made
    try:
        wf = WeightFile(path)
        buf = torch.empty(args.piece_mb * MIB + DIRECT_ALIGN, dtype=torch.uint8)
        if torch.cuda.is_available():
            buf = buf.pin_memory()
        skip = -buf.data_ptr() % DIRECT_ALIGN
        buf = buf[skip:skip + args.piece_mb * MIB]
        rows = []
        for direct in (False, True):
            for threads in (int(t) for t in args.threads.split(",")):
                s = read_all(wf, buf, threads, direct)
                if s is not None:
                    rows.append({"way": "O_DIRECT" if direct else "buffered", "threads": threads, "s": s,
                                 "gb_per_s": (wf.size / GIB) / s})
        for r in rows:
            r["x_one_thread"] = rows[0]["s"] / r["s"]
        result = {"file_gb": wf.size / GIB, "pressure_gb": args.pressure_gb, "piece_mb": args.piece_mb, "pinned": bool(torch.cuda.is_available()),
                  "date": time.strftime("%Y-%m-%d"), "rows": rows}
        args.out.write_text(json.dumps(result, indent=1))
        print(f"file {result['file_gb']:.2f} GiB, {args.piece_mb} MiB per call\n| way | threads | s | GiB/s | speed-up |"
              "\n|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['way']} | {r['threads']} | {r['s']:.2f} | {r['gb_per_s']:.2f} | {r['x_one_thread']:.2f}× |")
    finally:
        del ballast
        if made is not None:
            made.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
