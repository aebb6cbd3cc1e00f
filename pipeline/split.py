"""One job's transformer steps split over the processes of a group (one per GPU): sequence parallelism.

Every process of the group holds the whole transformer and runs the same job with the same inputs; inside each
step the block stack's tokens are split between them. Before the blocks each process keeps its share of the image
tokens (the section's context tokens and the noisy window), of the text/image-prompt tokens and of the rotary
positions (any token count; see `SequenceSplit.layout`); the blocks'
per-token work (norms, projections, MLPs, modulation) runs on that share alone, and attention exchanges the shares
with diffusers' context-parallel attention, Ulysses style: an all-to-all turns (its tokens, all 24 heads) into
(all tokens, 24/N heads), each process attends over every token for its heads, and a second all-to-all turns the
result back (`ContextParallelConfig(ulysses_degree=N)`; its `ulysses_anything` variant where the shares differ in
size, see `SequenceSplit`). After the blocks each process runs the output norm and the float32 output projection on
the noisy-window tokens of its own share, and the projected shares (64 values a token instead of 3,072) are gathered
once, so the sampler sees the whole velocity on every process and the processes stay in step (pipeline/denoiser.py).

Attention needs no mask here: the denoiser cuts the prompt's padding off before the blocks, and every token attends
to every other, so the order of the keys after the exchange (process 0's image and prompt tokens, then process
1's...) changes nothing. diffusers' `_cp_plan` hooks split a model's `forward` inputs; the denoiser runs the blocks
itself (pipeline/denoiser.py), so the split and the gather are two calls there and the engine's attention does the
exchange.

Control: before every prediction process 0 says whether the job goes on (`proceed`); when its job ends for any
reason it says stop (`finish`), and a process waiting for the next prediction raises `SplitEnded`. Small messages go
over the group's CPU (gloo) side, the tokens over its device side (NCCL on GPUs, gloo on the CPU).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
from diffusers.models import attention_dispatch
from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
from torch.distributed.device_mesh import init_device_mesh

from common import patches
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
    """How one step's tokens are split: each process's count of image and prompt tokens. `equal`: every process
    holds as many tokens in all (image + prompt), so diffusers' plain Ulysses exchange runs with sizes every
    process knows; otherwise its Ulysses-anything exchange, with the sizes from here (`SequenceSplit.exchange`)."""
    image: tuple[int, ...]
    prompt: tuple[int, ...]
    equal: bool

    @property
    def totals(self) -> tuple[int, ...]:
        """Each process's tokens in the blocks (image + prompt): the sizes its attention exchanges."""
        return tuple(i + p for i, p in zip(self.image, self.prompt))

    def window(self, window: int) -> tuple[int, ...]:
        """Each process's count of the last `window` image tokens (the noisy window: the tail of every share that
        reaches it; a share of context tokens alone has none)."""
        start = sum(self.image) - window
        out, at = [], 0
        for n in self.image:
            out.append(max(0, at + n - max(at, start)))
            at += n
        return tuple(out)


def _shares(n: int, parts: int) -> tuple[int, ...]:
    return tuple(len(c) for c in torch.arange(n).tensor_split(parts))


class SequenceSplit:
    """This process's place in a job's group: the share of the tokens it computes, the attention's parallel config.

    Made after `torch.distributed.init_process_group` (the default group is the job's); `device` is this process's
    GPU (or the CPU); `heads`: the transformer's attention heads. `attach`/`detach` put the config on a
    transformer's attention processors for the job.

    The image tokens are split as evenly as can be; the prompt tokens so that every process holds the same count in
    all where the total divides by the group's size (and the heads do too): then diffusers' plain Ulysses attention
    exchanges them. Otherwise each gets its even share of the prompt and its Ulysses-anything attention exchanges
    them. That exchange asks every process for its share's size at each all-to-all (diffusers'
    `gather_size_by_comm`: 4 small gloo messages per block, 240 per step), but every process knows every share's
    size from the layout (the token counts and N): inside `exchange` those sizes are answered from the layout, so
    no size message is sent. (diffusers has no setting for known sizes; the one function is replaced through the
    patch registry, common/patches.py, for the blocks only.) Padding the shares to equal size instead needs a mask
    in attention, and the masked attention kernel made the step slower than the size messages (BENCHMARKS.md)."""

    def __init__(self, device: torch.device, heads: int = 24):
        if not dist.is_initialized():
            raise RuntimeError("a split job needs torch.distributed initialised (jobs/split.py does it)")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.device = torch.device(device)
        self.heads_divide = heads % self.size == 0
        self._cp = ContextParallelConfig(ulysses_degree=self.size, ulysses_anything=True)
        self.config = ParallelConfig(context_parallel_config=self._cp)
        mesh = init_device_mesh(self.device.type, (1, self.size), mesh_dim_names=self._cp.mesh_dim_names)
        self.config.setup(self.rank, self.size, self.device, mesh=mesh)
        self.control = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
        self.ended = False
        self._attached: list = []
        self._layouts: dict[tuple[int, int], Layout] = {}
        self._layout: Layout | None = None
        self._sizes = self._known_sizes          # one function object for every step (compiled blocks guard on it)
        self.sizes_known = True      # False: diffusers' exchange asks for the sizes itself (benchmarks/split.py)

    def for_job(self, heads: int) -> None:
        """Ready for the next job of the group (the group outlives a job: jobs/split.py SplitPool), whose transformer
        has `heads` attention heads."""
        self.heads_divide = heads % self.size == 0
        self.ended = False
        self._layouts.clear()
        self._layout = None

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
            a = _shares(image, self.size)
            each, rest = divmod(image + prompt, self.size)
            if self.heads_divide and rest == 0 and each - max(a) >= 1:
                self._layouts[key] = Layout(a, tuple(each - n for n in a), True)
            else:
                self._layouts[key] = Layout(a, _shares(prompt, self.size), False)
        return self._layouts[key]

    def use(self, layout: Layout) -> None:
        """The exchange for this layout's shares (for the blocks that follow)."""
        self._cp.ulysses_anything = not layout.equal
        self._layout = layout

    @contextlib.contextmanager
    def exchange(self) -> Iterator[None]:
        """The blocks of one prediction (after `use`): where the shares differ in size, the Ulysses-anything
        exchange takes every share's size from the layout instead of asking the other processes for it."""
        if self._layout is None or self._layout.equal or not self.sizes_known:
            yield
            return
        with patches.patched(attention_dispatch, "gather_size_by_comm", self._sizes, "pipeline.SequenceSplit"):
            yield

    def _known_sizes(self, size: int, group=None) -> list[int]:
        """diffusers' `gather_size_by_comm(size, group)` for this layout: every process's share size, no message."""
        sizes = self._layout.totals if self._layout is not None else ()
        if len(sizes) != self.size or sizes[self.rank] != size:
            raise RuntimeError(f"the split's attention got {size} tokens on process {self.rank}, the layout says "
                               f"{sizes}: the shares and the exchange disagree")
        return list(sizes)

    def shard(self, x: torch.Tensor, sizes: tuple[int, ...], dim: int = 1) -> torch.Tensor:
        """This process's share of `x` along `dim` (the sequence), of the shares `sizes`."""
        return x.split(list(sizes), dim=dim)[self.rank]

    def gather(self, x: torch.Tensor, sizes: tuple[int, ...], dim: int = 1) -> torch.Tensor:
        """The whole tensor from every process's share of `sizes` (in rank order): the shares padded to the largest
        for one all-gather of equal parts, the padding dropped."""
        largest = max(sizes)
        if x.shape[dim] < largest:
            shape = list(x.shape)
            shape[dim] = largest - x.shape[dim]
            x = torch.cat([x, x.new_zeros(shape)], dim=dim)
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
