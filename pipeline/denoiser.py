"""One denoising step of the FramePack transformer, with per-section constants computed once and TeaCache or
MagCache.

The transformer's own forward recomputes the clean-latent embeddings and all rotary embeddings at every step; here
they are computed when a section begins (they depend only on the section's context), and each step runs only what
changes: the noisy window's patch embedding, the time/guidance embedding, the text refiner and the block stack.
The arithmetic is the same as diffusers' `HunyuanVideoFramepackTransformer3DModel.forward` (the parity test checks),
except that the output projection runs in float32, as in FramePack's app.
The blocks run through their modules' `__call__`, so memory/ hooks (streaming, offload) apply unchanged.
With a `split` (pipeline/split.py: one job on several GPUs) each process runs the blocks, the output norm and the
float32 output projection on its share of the tokens and gathers the projected window once (64 values a token).
The embeddings and the text refiner before the blocks are computed whole on every process: together about 0.1 TFLOP
a step against the blocks' ~500 (the patch embedding is one small matrix product, the refiner attends over ≤ 256
text tokens), so splitting them would save less than the exchange it needs.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

import torch

import rocm
from pipeline.magcache import MagCache
from pipeline.sections import SectionContext, SectionIndices
from pipeline.split import SequenceSplit
from pipeline.teacache import TeaCache
from pipeline.text import TextEmbeddings

log = logging.getLogger(__name__)


@dataclass
class _SectionConstants:
    context_tokens: torch.Tensor          # packed 4x | 2x | clean tokens, (1, N_ctx, D)
    rope: tuple[torch.Tensor, torch.Tensor]   # (cos, sin) of the context and window tokens
    image_tokens: torch.Tensor            # projected SigLIP tokens, (1, 729, D)
    latent_shape: tuple[int, int, int]    # (T, H, W) of the noisy window


class FramepackDenoiser:
    """Callable `(latents, timestep, branch) -> velocity` for one section at a time."""

    def __init__(self, transformer, teacache_threshold: float = 0.0, steps: int = 0,
                 on_oom: Callable[[], bool] | None = None, *, magcache_threshold: float = 0.0,
                 mode: str = "original", split: SequenceSplit | None = None):
        """`on_oom`: called after an out-of-memory in a step; True means memory was freed (e.g. more weights
        streamed) and the step is worth retrying. At most one of the two caches is on (a threshold > 0); `mode`
        picks MagCache's calibrated ratios (original or f1). `split`: this process's part of a job split over
        several GPUs (None: the whole job here)."""
        if teacache_threshold > 0 and magcache_threshold > 0:
            raise ValueError("TeaCache and MagCache cannot both be on")
        self.transformer = transformer
        self.on_oom = on_oom
        self.split = split
        self.dtype = transformer.dtype
        self.teacache = {b: TeaCache(teacache_threshold, steps) for b in ("cond", "uncond")} \
            if teacache_threshold > 0 else None
        self.magcache = {b: MagCache(magcache_threshold, steps, mode) for b in ("cond", "uncond")} \
            if magcache_threshold > 0 else None
        self._const: _SectionConstants | None = None
        self._text: dict[str, TextEmbeddings] = {}
        self._effective: dict[str, int] = {}
        self._guidance: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.transformer.x_embedder.proj.weight.device

    @torch.no_grad()
    def begin_section(self, ctx: SectionContext, indices: SectionIndices, latent_shape: tuple[int, int, int],
                      image_embeds: torch.Tensor, texts: dict[str, TextEmbeddings], guidance: float) -> None:
        tr, dev, dt = self.transformer, self.device, self.dtype
        t, h, w = latent_shape
        p = tr.config.patch_size
        idx = {k: torch.tensor(v, dtype=torch.long) for k, v in vars(indices).items()}
        rope_latents = tr.rope(frame_indices=idx["latents"], height=h, width=w, device=dev)
        clean, two, four = tr.clean_x_embedder(ctx.clean.to(dev, dt), ctx.history_2x.to(dev, dt),
                                               ctx.history_4x.to(dev, dt))
        rope_clean = tr.rope(frame_indices=idx["clean"], height=h, width=w, device=dev)
        rope_2x = tr.rope(frame_indices=idx["history_2x"], height=h, width=w, device=dev)
        rope_4x = tr.rope(frame_indices=idx["history_4x"], height=h, width=w, device=dev)
        empty = clean[:, :0]
        context_tokens, rope = tr._pack_history_states(empty, clean, two, four, rope_latents, rope_clean, rope_2x,
                                                       rope_4x, h // p, w // p)
        image_tokens = tr.image_projection(image_embeds.to(dev, dt))
        self._const = _SectionConstants(context_tokens, rope, image_tokens, latent_shape)
        self._text = {k: v.to(dev, dt) for k, v in texts.items()}
        # The prompt's tokens that attend (the image tokens, then the text up to its mask's end): fixed for the
        # section, so read once here, not at every step (reading a device tensor's value waits for the GPU).
        self._effective = {k: image_tokens.shape[1] + int(v.mask[0].sum(dtype=torch.int)) for k, v in texts.items()}
        self._guidance = torch.tensor([guidance * 1000.0], dtype=dt, device=dev)
        for cache in (self.teacache or self.magcache or {}).values():
            cache.reset()

    def end_section(self) -> None:
        self._const = None
        self._text = {}
        self._effective = {}

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, timestep: torch.Tensor, branch: str = "cond") -> torch.Tensor:
        """One prediction; after an out-of-memory, retried as long as `on_oom` frees something."""
        cache = self._cache(branch)
        if self.split is not None:
            self.split.proceed()            # the group's first process says whether the job goes on
        while True:
            saved = cache.state() if cache is not None else None
            try:
                return self._predict(latents, timestep, branch)
            except Exception as e:
                if rocm.classify_error(e) != "oom" or self.on_oom is None:
                    raise
                reason = str(e).splitlines()[0][:200]
            # Out of the except block, the failed step's activations (held by the traceback) are released.
            if cache is not None and saved is not None:         # (saved with it above)
                cache.restore(saved)
            if not self.on_oom():
                raise torch.OutOfMemoryError(f"out of memory in the transformer with every block streamed ({reason})")
            log.warning("retrying the step after out-of-memory")

    def _cache(self, branch: str) -> TeaCache | MagCache | None:
        caches = self.teacache or self.magcache
        return caches[branch] if caches else None

    def _predict(self, latents: torch.Tensor, timestep: torch.Tensor, branch: str) -> torch.Tensor:
        tr, c = self.transformer, self._const
        if c is None:
            raise RuntimeError("begin_section() must be called before denoising")
        text = self._text[branch]
        b, _, t, h, w = latents.shape
        p, p_t = tr.config.patch_size, tr.config.patch_size_t
        pt, ph, pw = t // p_t, h // p, w // p
        timestep = timestep.expand(b).to(self.device)

        hidden = tr.x_embedder(latents.to(self.device, self.dtype))
        hidden = torch.cat([c.context_tokens, hidden], dim=1)
        temb, _ = tr.time_text_embed(timestep, text.pooled, self._guidance)
        encoder = tr.context_embedder(text.llama, timestep, text.mask)
        # Image tokens go before the text tokens (the text mask cuts padding off the end).
        encoder = torch.cat([c.image_tokens, encoder], dim=1)
        encoder = encoder[:, :self._effective[branch]]

        cache = self._cache(branch)
        if isinstance(cache, TeaCache):     # TeaCache reads block 0's modulated input; MagCache reads no tensor
            skip = cache.should_skip(tr.transformer_blocks[0].norm1(hidden, emb=temb)[0])
        else:
            skip = cache is not None and cache.should_skip()
        window = pt * ph * pw
        rope, lay = c.rope, None
        if self.split is not None:        # this process's share of the tokens (pipeline/split.py)
            lay = self.split.layout(hidden.shape[1], encoder.shape[1])
            self.split.use(lay)
            hidden, encoder = self.split.shard(hidden, lay.image), self.split.shard(encoder, lay.prompt)
            rope = tuple(self.split.shard(r, lay.image, dim=0) for r in rope)
        # The caches keep this process's share of the residual (a split's shares stay the same within a section).
        if skip and cache is not None:
            hidden = cache.apply(hidden)
        else:
            before = hidden
            with self.split.exchange() if self.split is not None else contextlib.nullcontext():
                for block in tr.transformer_blocks:
                    hidden, encoder = block(hidden, encoder, temb, None, rope)
                for block in tr.single_transformer_blocks:
                    hidden, encoder = block(hidden, encoder, temb, None, rope)
            if cache is not None:
                cache.store(hidden - before)

        if self.split is not None and lay is not None:      # the window tokens of this share, projected, gathered
            counts = lay.window(window)
            out = self._project(hidden[:, hidden.shape[1] - counts[self.split.rank]:], temb)
            out = self.split.gather(out, counts)
        else:
            out = self._project(hidden[:, -window:], temb)
        out = out.reshape(b, pt, ph, pw, -1, p_t, p, p)
        out = out.permute(0, 4, 1, 5, 2, 6, 3, 7)
        return out.flatten(6, 7).flatten(4, 5).flatten(2, 3)

    def _project(self, hidden: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        """The output norm and projection of window tokens, in float32 as FramePack's app runs it
        (`high_quality_fp32_output_for_inference`): the velocity is not rounded to bf16 (a no-op for a float32
        model)."""
        tr = self.transformer
        hidden = tr.norm_out(hidden, temb)
        proj = tr.proj_out
        return torch.nn.functional.linear(hidden.float(), proj.weight.float(),
                                          None if proj.bias is None else proj.bias.float())
