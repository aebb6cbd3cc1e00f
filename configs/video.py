"""From latents to files: how the VAE decode may trade exactness for speed, and how videos are encoded."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class VaeDecodeSpeed:
    # Both change which convolution kernels run, so pixels may differ from the default decode by rounding (a test
    # bounds it; benchmarks/vae_decode.py measures speed and difference on a GPU). Off by default.
    # NVIDIA only (ignored on ROCm, where MIOpen's search is a known hang risk, and on the CPU): let cuDNN time its
    # convolution algorithms for each new shape (the first decode of each tile shape pays for the search).
    cudnn_benchmark: bool = False
    # Run the decoder on channels-last (NDHWC) activations, the layout of the tensor-core convolution kernels.
    channels_last: bool = False
    # NVIDIA: GB of the cap kept free beside the VAE tiles for cuDNN's workspace (memory/vae.py). Measured on an H100
    # (benchmarks/vae_repeat.py, full-size VAE, 20 GB cap): with 2 GB free the fastest kernels did not get their
    # workspace (the middle sections' decode took 8.6 s instead of 4.9 s and its frames changed by 1 level), with
    # 4.4-5.4 GB they did. 4 GB keeps the middle sections at 256 px tiles (est. 14.9 GB, 14.1 measured). 0: off.
    cudnn_workspace_gb: float = 4.0
    # The decoder's replicate padding made by copies (pipeline/vae_ops.py): the same values bit for bit, faster on
    # the GPU (PyTorch's replicate-pad kernel took 17 % of the decode's GPU time). On wherever diffusers' decoder runs.
    fast_pad: bool = True
    # The decoder's GroupNorm statistics from PyTorch's parallel reductions instead of its one-block-per-group
    # kernel (the largest single cost of the decode on the GPU). The same formula, other rounding of the statistics:
    # pixels within the tolerance in tests/test_vae_ops.py. GPUs only (CUDA and ROCm); the CPU keeps PyTorch's.
    fast_group_norm: bool = True
    # GPUs: decode with the streamed decoder (memory/vae_stream.py): the same layers a few frames at a time, so a
    # tile needs about a quarter of the memory and the decode under the cap needs 1–2 tiles instead of 9–25
    # (memory/vae_grid.py). Its pixels differ from the tiled decode's where the tiles' seams were: they are closer
    # to a decode of the whole frame (tests/test_vae_stream.py, BENCHMARKS.md). The two switches above and
    # `channels_last` apply to diffusers' decoder, used when this is off and on the CPU.
    streamed: bool = True
    # MB of one convolution's padded input in the streamed decoder (larger: fewer calls, more memory beside the tile)
    stream_chunk_mb: int = 1024
    # NVIDIA: the streamed decoder's activations channels-last (cuDNN's layout: 0.89× the time on an H100). Not on
    # ROCm, where MIOpen's 3-D convolutions are not known to take it.
    stream_channels_last: bool = True


@dataclass(frozen=True)
class VideoEncoding:
    # libx264 settings of every file. Each mp4 is a sequence of closed segments (one per settled part of the video,
    # encoded once and reused by every later section file), so the work per section does not grow with the video.
    preset: str = "medium"
    # x264 frame threads per segment. The bytes depend on this number (frame threads limit the vertical motion
    # search range), so it is fixed here rather than taken from the CPU count: the same frames give the same file
    # on every machine. Slice threading (PyAV's default, one slice per thread) is never used.
    x264_threads: int = 4
    # Segments encoded at once (0: as many as the CPU count allows, cores // x264_threads); does not change bytes.
    parallel_segments: int = 0
    # Niceness of the writer's threads (Linux): encoding yields the CPU to the thread that drives the GPU. Only on a
    # GPU (`for_device`): on a CPU run there is no such thread, and a niced writer only starved behind any other busy
    # process (with one core busy its files waited 2-3x longer than a section took, and the ETA undercounted).
    writer_nice: int = 10
    # x264's own parameters for every segment. `stitchable`: stream headers that do not depend on the content, so
    # segments join into one stream. `cpu-independent`: x264's macroblock-tree propagation in its portable C code
    # instead of the SIMD routine the CPU would select. The AVX-512 routine (libx264 as bundled with PyAV 18, on
    # CPUs with AVX-512: Intel Skylake-X and later, AMD Zen 4 and later) reads memory it never wrote, so the same
    # frames gave different bytes from run to run, more often under load (tests/test_video.py shows it with
    # glibc's MALLOC_PERTURB_ patterns). With it, the bytes depend only on the frames and these settings, on every
    # CPU; the C routine costs no measurable encode time (BENCHMARKS.md, "The same video every run").
    x264_params: str = "stitchable=1:cpu-independent=1"

    def for_device(self, device_type: str) -> "VideoEncoding":
        """These settings for a job on `device_type`: the writer niced only where a GPU is fed (the bytes do not
        depend on it)."""
        return self if device_type == "cuda" else replace(self, writer_nice=0)


DECODE_SPEED = VaeDecodeSpeed()
ENCODING = VideoEncoding()
