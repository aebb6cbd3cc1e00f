"""The HunyuanVideo VAE decoder run frame-chunk by frame-chunk: the same function as `decoder(z)`, in a quarter of
its memory, so the decode under the cap needs far fewer (and larger) tiles.

Run as diffusers writes it, the decoder holds about 13.5 full-resolution activations of its first block's width at
its peak (memory/vae.py, ACT_FACTOR): each layer's input, its GroupNorm output, SiLU output, padded copy, cuDNN's
channels-last copies of input and output, the output, all of the whole tile at once. That is what forces 256 px
tiles on a 608×640 frame under a 20 GB cap, and the tiles' overlap makes the GPU decode 1.64× the frame.

Every layer of this decoder is either a causal 3×3×3 convolution (output frame t reads input frames t−2…t), an
operation on single frames (SiLU, residual adds, nearest upsampling, the 1×1×1 shortcut), or a GroupNorm, whose
statistics span the whole tensor. So each layer is run here as: statistics of its whole input (two reductions), then
for a few frames at a time: normalise + SiLU straight into a padded buffer (its borders copied from the edge, the
first frame's history copied from the last chunk's), convolve, add the residual, store. Only the layer's input and
its output are ever whole; the rest is a chunk of `chunk_bytes`. The peak is about 3 full-resolution activations
(the last block's first resnet: a 2×-wide input and its output; STREAM_FACTOR in memory/vae.py).

The mid-block's attention (frame-causal: a token sees the tokens of its own and earlier frames) is computed one
query frame at a time over the keys of frames ≤ it, instead of through diffusers' dense mask, whose
(tokens × tokens) size made whole frames impossible (7 bytes per pair: 28 GB for half a 608×640 frame).

What changes against `decoder(z)`: the GroupNorm statistics come from PyTorch's general reductions (as
pipeline/vae_ops.group_norm's, float32) and the convolutions see smaller inputs, so cuDNN may pick other kernels:
rounding only. tests/test_vae_stream.py compares the two on the tiny VAE (float32) and benchmarks/vae_decode.py on
the full-size one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_BYTES = 1 << 30             # the padded input chunk of one convolution (configs/video.py stream_chunk_mb)


def group_stats(x: torch.Tensor, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and 1/std per (sample, group) of a contiguous x, in float32, from PyTorch's parallel reductions."""
    rows = x.reshape(x.shape[0], groups, -1)
    mean = torch.mean(rows, dim=-1, dtype=torch.float32)
    var = torch.empty_like(mean)
    torch.var(rows, dim=-1, correction=0, out=var)
    return mean, torch.rsqrt(var.clamp_min_(0) + eps)


def channel_affine(mean: torch.Tensor, rstd: torch.Tensor, channels: int, weight: torch.Tensor | None,
                   bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """GroupNorm as y = x·a + b per (sample, channel): a = rstd·γ, b = β − mean·a (float32, shape
    (n, c, 1, 1, 1))."""
    per = channels // mean.shape[1]
    a = rstd.repeat_interleave(per, dim=1)
    if weight is not None:
        a = a * weight.float()
    b = -mean.repeat_interleave(per, dim=1) * a
    if bias is not None:
        b = b + bias.float()
    shape = (mean.shape[0], channels, 1, 1, 1)
    return a.view(shape), b.view(shape)


def _norm(x: torch.Tensor, norm: torch.nn.GroupNorm):
    """A fill function writing GroupNorm(x) of frames [a, b) into a destination view (SiLU follows in place, on the
    whole new part of the buffer: see StreamedDecoder.conv_chunks)."""
    a, b = channel_affine(*layer_stats(x, norm.num_groups, norm.eps), x.shape[1], norm.weight, norm.bias)

    def fill(dst: torch.Tensor, start: int, stop: int) -> None:
        torch.addcmul(b, x[:, :, start:stop], a, out=dst)       # float32, rounded once into dst's dtype
    return fill


def layer_stats(x: torch.Tensor, groups: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """group_stats for a decoder activation in either layout. Channels-last: per-channel mean and variance (a
    reduction over positions, the channels contiguous), combined into the groups' (equal counts per channel: the
    group's variance is the mean of its channels' variances plus the variance of their means)."""
    if x.is_contiguous():
        return group_stats(x, groups, eps)
    n, c = x.shape[:2]
    x = x.contiguous(memory_format=torch.channels_last_3d)
    rows = x.permute(0, 2, 3, 4, 1).reshape(n, -1, c)                # a view of a channels-last x
    mean_c = torch.mean(rows, dim=1, dtype=torch.float32)
    var_c = torch.empty_like(mean_c)
    torch.var(rows, dim=1, correction=0, out=var_c)
    mean_c, var_c = mean_c.view(n, groups, -1), var_c.view(n, groups, -1)
    mean = mean_c.mean(-1)
    var = (var_c + (mean_c - mean[..., None]).square()).mean(-1)
    return mean, torch.rsqrt(var.clamp_min_(0) + eps)


def _copy(x: torch.Tensor):
    def fill(dst: torch.Tensor, start: int, stop: int) -> None:
        dst.copy_(x[:, :, start:stop])
    return fill


def _upsampled(x: torch.Tensor, factor: tuple[int, ...]):
    """Frames of nearest upsampling as HunyuanVideoUpsampleCausal3D makes it: the first frame in space only, the
    others in time and space; output frame j > 0 repeats input frame (j − 1) // ft + 1."""
    ft, fh, fw = factor

    def fill(dst: torch.Tensor, start: int, stop: int) -> None:
        j = torch.arange(start, stop, device=x.device)          # made on the device: no wait for the GPU's queue
        src = torch.where(j == 0, 0, (j - 1).div(ft, rounding_mode="floor") + 1)
        frames = x.index_select(2, src)
        n, c, k, h, w = frames.shape
        view = dst.unflatten(3, (h, fh)).unflatten(5, (w, fw))           # (n, c, k, h, fh, w, fw)
        view.copy_(frames[:, :, :, :, None, :, None].expand(n, c, k, h, fh, w, fw))
    return fill


def replicate_borders(buf: torch.Tensor, pad: tuple[int, int, int, int]) -> None:
    """Fill the spatial border of `buf` (pad = (left, right, top, bottom) pixels around its interior) with copies
    of the interior's edge rows and columns, in place: F.pad(mode="replicate")'s values, corners included."""
    wl, wr, ht, hb = pad
    height, width = buf.shape[-2] - ht - hb, buf.shape[-1] - wl - wr
    rows = buf[..., ht:ht + height, :]
    if wl:
        rows[..., :wl].copy_(rows[..., wl:wl + 1].expand(*rows.shape[:-1], wl))
    if wr:
        rows[..., wl + width:].copy_(rows[..., wl + width - 1:wl + width].expand(*rows.shape[:-1], wr))
    if ht:
        buf[..., :ht, :].copy_(buf[..., ht:ht + 1, :].expand(*buf.shape[:-2], ht, buf.shape[-1]))
    if hb:
        buf[..., ht + height:, :].copy_(buf[..., ht + height - 1:ht + height, :].expand(*buf.shape[:-2], hb,
                                                                                          buf.shape[-1]))


class StreamedDecoder:
    """Runs a HunyuanVideoDecoder3D chunk by chunk. `chunk_bytes`: the padded input of one convolution call;
    `channels_last`: every activation in NDHWC, the layout cuDNN's convolution kernels work in (no conversion
    around each call); `scratch_limit`: fewer frames per call where MIOpen's im2col scratch (27 × input channels ×
    output positions) would pass it."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES, channels_last: bool = False, scratch_limit: int | None = None):
        self.chunk_bytes = chunk_bytes
        self.scratch_limit = scratch_limit        # ROCm: MIOpen's im2col scratch of one call (memory/vae.py)
        self.fmt = torch.channels_last_3d if channels_last else torch.contiguous_format

    def empty(self, shape, ref: torch.Tensor) -> torch.Tensor:
        return torch.empty(shape, dtype=ref.dtype, device=ref.device, memory_format=self.fmt)

    def conv_chunks(self, cc, shape: tuple[int, ...], fill, act: bool = False):
        """Run a HunyuanVideoCausalConv3d over an input of `shape` (n, c, frames, height, width), `fill(dst, a, b)`
        writing its input frames [a, b) into the padded buffer's interior (its one-pixel border then copied from
        the edge, as F.pad(mode="replicate") makes it; `act`: SiLU after, in place, on the new frames with their
        borders); yields (a, b, output frames [a, b)). The causal history of each chunk (the frames before a) is
        copied from the previous chunk's buffer, so `fill` is called once per frame and its source may be
        overwritten as soon as a chunk is yielded. (Tried: an unpadded, contiguous buffer, zero padding in the
        convolution and its output's border ring corrected: no faster on the H100, 1.51 s against 1.48 s.)"""
        conv = cc.conv
        wl, wr, ht, hb, tf, tb = cc.time_causal_padding
        if tb or tuple(conv.stride) != (1, 1, 1) or tuple(conv.dilation) != (1, 1, 1) or conv.groups != 1 \
                or cc.pad_mode != "replicate" or any(conv.padding) or (wl, ht) != (wr, hb) or max(wl, ht) > 1:
            raise ValueError(f"not a causal stride-1 convolution of kernel ≤ 3: {cc}")
        n, _, frames, height, width = shape
        cin = conv.in_channels
        hp, wp = height + ht + hb, width + wl + wr
        per_frame = n * cin * hp * wp * conv.weight.element_size()
        k = max(1, self.chunk_bytes // per_frame - tf)
        if self.scratch_limit is not None:
            k = min(k, max(1, self.scratch_limit // (27 * cin * height * width * conv.weight.element_size())))
        halo = None
        for a in range(0, frames, k):
            b = min(frames, a + k)
            buf = self.empty((n, cin, tf + b - a, hp, wp), conv.weight)
            new = buf[:, :, tf:]
            fill(new[:, :, :, ht:ht + height, wl:wl + width], a, b)
            replicate_borders(new, (wl, wr, ht, hb))
            if act:
                F.silu(new, inplace=True)
            if tf:
                buf[:, :, :tf].copy_(new[:, :, :1].expand(-1, -1, tf, -1, -1) if halo is None else halo)
                halo = buf[:, :, -tf:].clone(memory_format=self.fmt)
            del new
            y = conv(buf)
            del buf
            yield a, b, y
            del y

    def conv_layer(self, cc, x_shape, fill, out: torch.Tensor | None = None, residual=None, act: bool = False) \
            -> torch.Tensor:
        """The whole output of a causal convolution, chunk by chunk into `out` (allocated if None); `residual(a, b)`:
        what is added to output frames [a, b) as they are stored (one pass)."""
        n, _, frames, height, width = x_shape
        if out is None:
            out = self.empty((n, cc.conv.out_channels, frames, height, width), cc.conv.weight)
        for a, b, y in self.conv_chunks(cc, x_shape, fill, act):
            if residual is not None:
                torch.add(y, residual(a, b), out=out[:, :, a:b])
            else:
                out[:, :, a:b].copy_(y)
            del y
        return out

    def resnet(self, block, x: torch.Tensor) -> torch.Tensor:
        """HunyuanVideoResnetBlockCausal3D(x) (dropout is inactive in a decode)."""
        x = x.contiguous(memory_format=self.fmt)
        h = self.conv_layer(block.conv1, x.shape, _norm(x, block.norm1), act=True)
        shortcut = block.conv_shortcut

        def residual(a: int, b: int) -> torch.Tensor:
            r = x[:, :, a:b]
            return shortcut.conv(r.contiguous(memory_format=self.fmt)) if shortcut is not None else r

        # conv2 reads norm2(h) and writes back into h: each chunk's causal history is kept by conv_chunks.
        return self.conv_layer(block.conv2, h.shape, _norm(h, block.norm2), out=h, residual=residual, act=True)

    def upsample(self, up, x: torch.Tensor) -> torch.Tensor:
        """HunyuanVideoUpsampleCausal3D(x): nearest upsampling made chunk by chunk in the convolution's buffer."""
        factor = tuple(int(f) for f in up.upsample_factor)
        if any(f != up_f for f, up_f in zip(factor, up.upsample_factor)):
            raise ValueError(f"non-integer upsampling {up.upsample_factor}")
        n, c, frames, h, w = x.shape
        out_frames = 1 + (frames - 1) * factor[0]
        return self.conv_layer(up.conv, (n, c, out_frames, h * factor[1], w * factor[2]), _upsampled(x, factor))

    def __call__(self, decoder, z: torch.Tensor) -> torch.Tensor:
        """HunyuanVideoDecoder3D(z), chunked (z: the latents after the VAE's post_quant_conv)."""
        x = self.conv_layer(decoder.conv_in, z.shape, _copy(z))
        mid = decoder.mid_block
        x = self.resnet(mid.resnets[0], x)
        for attn, block in zip(mid.attentions, mid.resnets[1:]):
            if attn is not None:
                x = attention(attn, x.contiguous())
            x = self.resnet(block, x)
        for up_block in decoder.up_blocks:
            for block in up_block.resnets:
                x = self.resnet(block, x)
            for up in up_block.upsamplers or ():
                x = self.upsample(up, x)
        x = self.conv_layer(decoder.conv_out, x.shape, _norm(x, decoder.conv_norm_out), act=True)
        return x.contiguous()


def attention(attn, x: torch.Tensor, score_bytes: int = 512 << 20) -> torch.Tensor:
    """The mid-block's frame-causal self-attention (diffusers' Attention with a GroupNorm, residual connection):
    each query frame over the keys of frames ≤ it, as two matmuls and a float32 softmax, queries in slices of at
    most `score_bytes` of scores (the fused attention kernels have no head of 512 or run it slowly)."""
    n, c, frames, h, w = x.shape
    gn = attn.group_norm
    a, b = channel_affine(*group_stats(x.contiguous(), gn.num_groups, gn.eps), c, gn.weight, gn.bias)
    normed = torch.addcmul(b, x, a).to(x.dtype)
    tokens = normed.flatten(2).transpose(1, 2)                          # (n, frames·h·w, c), frames outermost
    del normed
    q, k, v = attn.to_q(tokens), attn.to_k(tokens), attn.to_v(tokens)
    heads = attn.heads

    def split(t):                                                       # (n, heads, tokens, dim)
        return t.unflatten(-1, (heads, -1)).transpose(1, 2)

    q, k, v = split(q), split(k), split(v)
    q = q * q.shape[-1] ** -0.5
    per = h * w
    o = torch.empty_like(q)
    for t in range(frames):
        keys = (t + 1) * per
        kt, vt = k[:, :, :keys].transpose(-1, -2), v[:, :, :keys]
        rows = max(1, score_bytes // (8 * n * heads * keys))
        for r in range(t * per, keys, rows):
            s = torch.matmul(q[:, :, r:min(r + rows, keys)], kt)
            o[:, :, r:r + s.shape[2]] = torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(v.dtype), vt)
            del s
    o = o.transpose(1, 2).flatten(2)
    o = attn.to_out[1](attn.to_out[0](o))
    o = o.transpose(1, 2).reshape(n, c, frames, h, w)
    if attn.residual_connection:
        o = o + x
    return o / attn.rescale_output_factor


def decode(decoder, z: torch.Tensor, chunk_bytes: int = CHUNK_BYTES, channels_last: bool = False) -> torch.Tensor:
    """HunyuanVideoDecoder3D(z), chunked (z: the latents after the VAE's post_quant_conv)."""
    return StreamedDecoder(chunk_bytes, channels_last)(decoder, z)
