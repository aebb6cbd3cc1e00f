"""One job's transformer steps split over the processes of a group (one per GPU): sequence parallelism.

Every process of the group holds the whole transformer and runs the same job with the same inputs; inside each
step the block stack's tokens are split between them. Before the blocks each process keeps its share of the image
tokens (the section's context tokens and the noisy window), of the text/image-prompt tokens and of the rotary
positions (`tensor_split` along the sequence: any token count, shares differ by at most one token); the blocks'
per-token work (norms, projections, MLPs, modulation) runs on that share alone, and attention exchanges the shares
with diffusers' context-parallel attention, Ulysses style: an all-to-all turns (its tokens, all 24 heads) into
(all tokens, 24/N heads), each process attends over every token for its heads, and a second all-to-all turns the
result back (`ContextParallelConfig(ulysses_degree=N, ulysses_anything=True)`, the variant for token counts that
do not divide by N). After the blocks the shares are gathered, so what follows (the output norm and projection, the
sampler, TeaCache/MagCache) sees the whole tensor on every process and the processes stay in step.

Attention needs no mask here: the denoiser cuts the prompt's padding off before the blocks, and every token attends
to every other, so the order of the keys after the exchange (process 0's image and prompt tokens, then process
1's...) changes nothing. diffusers' `_cp_plan` hooks split a model's `forward` inputs; the denoiser runs the blocks
itself (pipeline/denoiser.py), so the split and the gather are two calls there and the engine's attention and
sharder do the rest.

Control: before every prediction process 0 says whether the job goes on (`proceed`); when its job ends for any
reason it says stop (`finish`), and a process waiting for the next prediction raises `SplitEnded`. Small messages go
over the group's CPU (gloo) side, the tokens over its device side (NCCL on GPUs, gloo on the CPU).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from diffusers.hooks.context_parallel import PartitionAnythingSharder
from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
from torch.distributed.device_mesh import init_device_mesh

from common.errors import JobStopped

log = logging.getLogger(__name__)


class SplitEnded(JobStopped):
    """Process 0 of the group ended the job (stopped, failed or done) while this process waited for a step."""


def attention_processors(transformer) -> list:
    """The attention processors of `transformer` that take a parallel config (diffusers' attention modules)."""
    return [m.processor for m in transformer.modules()
            if getattr(m, "processor", None) is not None and hasattr(m.processor, "_parallel_config")]


@dataclass(frozen=True)
class Layout:
    """How one step's tokens are split: each process's count of image and prompt tokens, each share padded to the
    largest (`image_share`, `prompt_share`) so every process exchanges the same number of tokens, and the attention
    mask over the exchanged keys (None when nothing is padded)."""
    image: tuple[int, ...]
    prompt: tuple[int, ...]
    mask: torch.Tensor | None

    @property
    def image_share(self) -> int:
        return max(self.image)

    @property
    def prompt_share(self) -> int:
        return max(self.prompt)


def _shares(n: int, parts: int) -> tuple[int, ...]:
    return tuple(len(c) for c in torch.arange(n).tensor_split(parts))


class SequenceSplit:
    """This process's place in a job's group: the share of the tokens it computes, the attention's parallel config.

    Made after `torch.distributed.init_process_group` (the default group is the job's); `device` is this process's
    GPU (or the CPU). `attach`/`detach` put the config on a transformer's attention processors for the job.

    Shares of equal size (`heads`, the transformer's attention heads, divisible by the group's size): the image and
    prompt shares are padded to the largest, the padding masked out of attention, and diffusers' plain Ulysses
    attention exchanges them (the exchange sizes are known to every process: nothing else is sent). Otherwise its
    Ulysses-anything attention (any share sizes, any head count) exchanges the share sizes first, at every
    attention call (4 small messages per block)."""

    def __init__(self, device: torch.device, heads: int = 24):
        if not dist.is_initialized():
            raise RuntimeError("a split job needs torch.distributed initialised (jobs/split.py does it)")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(device)
        self.padded = heads % self.size == 0
        cp = ContextParallelConfig(ulysses_degree=self.size, ulysses_anything=not self.padded)
        self.config = ParallelConfig(context_parallel_config=cp)
        mesh = init_device_mesh(self.device.type, (1, self.size), mesh_dim_names=cp.mesh_dim_names)
        self.config.setup(self.rank, self.size, self.device, mesh=mesh)
        self._mesh = cp._flattened_mesh
        self.control = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
        self.ended = False
        self._attached: list = []
        self._layouts: dict[tuple[int, int], Layout] = {}

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # ---- the transformer ---------------------------------------------------------------------------------------
    def attach(self, transformer) -> None:
        self._attached = attention_processors(transformer)
        for p in self._attached:
            p._parallel_config = self.config

    def detach(self) -> None:
        for p in self._attached:
            p._parallel_config = None
        self._attached = []

    # ---- tokens ------------------------------------------------------------------------------------------------
    def layout(self, image: int, prompt: int) -> Layout:
        """The split of `image` image tokens and `prompt` prompt tokens over the group (the same on every process)."""
        key = (image, prompt)
        if key not in self._layouts:
            if min(image, prompt) < self.size:
                raise ValueError(f"{image} image and {prompt} prompt tokens cannot be split over {self.size} GPUs")
            a, b = _shares(image, self.size), _shares(prompt, self.size)
            mask = None
            if self.padded and (len(set(a)) > 1 or len(set(b)) > 1):
                keep = []
                for n_a, n_b in zip(a, b):
                    keep += [True] * n_a + [False] * (max(a) - n_a) + [True] * n_b + [False] * (max(b) - n_b)
                mask = torch.tensor(keep, device=self.device).view(1, 1, 1, -1)
            self._layouts[key] = Layout(a, b, mask)
        return self._layouts[key]

    def shard(self, x: torch.Tensor, dim: int = 1, pad_to: int | None = None) -> torch.Tensor:
        """This process's share of `x` along `dim` (the sequence); with `pad_to`, zeros after it up to that size."""
        if x.shape[dim] < self.size:
            raise ValueError(f"{x.shape[dim]} tokens cannot be split over {self.size} GPUs")
        share = PartitionAnythingSharder.shard_anything(x, dim, self._mesh)
        if pad_to is not None and self.padded and share.shape[dim] < pad_to:
            shape = list(share.shape)
            shape[dim] = pad_to - share.shape[dim]
            share = torch.cat([share, share.new_zeros(shape)], dim=dim)
        return share

    def gather(self, x: torch.Tensor, dim: int = 1, sizes: tuple[int, ...] | None = None) -> torch.Tensor:
        """The whole tensor from every process's share (in rank order); `sizes`: the shares' real sizes when they
        were padded (the padding is dropped)."""
        if not (self.padded and sizes is not None):
            return PartitionAnythingSharder.unshard_anything(x, dim, self._mesh)
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim=dim)

    # ---- control -----------------------------------------------------------------------------------------------
    def _say(self, go: int) -> int:
        flag = torch.tensor([go], dtype=torch.int64)
        dist.broadcast(flag, src=0, group=self.control)
        return int(flag.item())

    def proceed(self) -> None:
        """Before each prediction: process 0 says go; another process raises SplitEnded when process 0 has ended."""
        if self.ended:
            raise SplitEnded("the split job has ended")
        if not self._say(1) and not self.leader:
            self.ended = True
            raise SplitEnded("the first GPU's process ended the job")

    def finish(self) -> None:
        """At the job's end, on every process (once): process 0 tells the others it ended; they take the word."""
        if self.ended:
            return
        self.ended = True
        self._say(0)
