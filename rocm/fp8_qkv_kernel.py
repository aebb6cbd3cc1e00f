"""The Triton kernels of rocm/fp8_qkv.py (its docstring says what and why). Imported only where Triton is: `fp8_qkv`
imports it when it is prepared. The plain functions are compiled by `triton.jit` below (or, with TRITON_INTERPRET=1
set before Triton is imported, run by Triton's interpreter: the tests on the CPU).

Each launch covers one piece of the token sequence (the video's tokens, with the rotary embedding: ROPE; or the
prompt's), so a program reads one tensor with one stride and branches on nothing per value. A program takes HG
neighbouring heads of its tokens at once, [tokens, HG, channels] in registers: a token's HG·128 values are one
contiguous load, and the rotary tables' rows (float32, 1 KB a token: more bytes than a head's q, k and v together)
are read once for the HG heads instead of once per head. A head's 128 channels are held as their 64 pairs (even,
odd), the rotary embedding's unit, split from that load."""
import triton
import triton.language as tl


@triton.jit
def _bf16(x, INTERPRETED: tl.constexpr):
    """float32 → the nearest bfloat16 value (ties to even), as float32. On the GPU the hardware's conversion; in
    Triton's interpreter (which truncates in its conversions) the same rounding written out in integers."""
    if INTERPRETED:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _pairs(ptr, D: tl.constexpr):
    """A vector of D values at ptr as (even, odd) channels, float32."""
    return tl.split(tl.reshape(tl.load(ptr + tl.arange(0, D)).to(tl.float32), (D // 2, 2)))


@triton.jit
def _tile(base, t, st, valid, BT: tl.constexpr, D: tl.constexpr):
    """Rows t ([BT]) of D channels from base (row stride st) as (even, odd) [BT, D/2] float32; 0 where not valid."""
    x = tl.load(base + t[:, None] * st + tl.arange(0, D)[None, :], mask=valid[:, None], other=0.0)
    return tl.split(tl.reshape(x.to(tl.float32), (BT, D // 2, 2)))


@triton.jit
def _heads(base, t, st, valid, BT: tl.constexpr, HG: tl.constexpr, D: tl.constexpr):
    """Rows t ([BT]) of HG heads of D channels from base (row stride st; the heads' channels one after another) as
    (even, odd) [BT, HG, D/2] float32; 0 where not valid."""
    x = tl.load(base + t[:, None] * st + tl.arange(0, HG * D)[None, :], mask=valid[:, None], other=0.0)
    return tl.split(tl.reshape(x.to(tl.float32), (BT, HG, D // 2, 2)))


@triton.jit
def _qk(base, t, st, valid, we, wo, ce, co, se, so, eps, ROPE: tl.constexpr, BT: tl.constexpr, HG: tl.constexpr,
        D: tl.constexpr, INTERPRETED: tl.constexpr):
    """q or k of HG heads for rows t, as the attention sees them: diffusers' RMSNorm over each head's D channels,
    bf16(bf16(x · rsqrt(mean(x²) + eps)) · w), then with ROPE its `apply_rotary_emb` on the pairs:
    bf16(x₂ᵢ·cos − x₂ᵢ₊₁·sin), bf16(x₂ᵢ₊₁·cos + x₂ᵢ·sin) in float32. (even, odd) [BT, HG, D/2] float32; the
    weights [D/2], the rotary tables [BT, D/2]."""
    e, o = _heads(base, t, st, valid, BT, HG, D)
    r = tl.div_rn(1.0, tl.sqrt_rn((tl.sum(e * e, axis=2) + tl.sum(o * o, axis=2)) * (1.0 / D) + eps))[:, :, None]
    ne = _bf16(_bf16(e * r, INTERPRETED) * we[None, None, :], INTERPRETED)
    no = _bf16(_bf16(o * r, INTERPRETED) * wo[None, None, :], INTERPRETED)
    if ROPE:
        ce, co, se, so = ce[:, None, :], co[:, None, :], se[:, None, :], so[:, None, :]
        return _bf16(ne * ce - no * se, INTERPRETED), _bf16(no * co + ne * so, INTERPRETED)
    else:
        return ne, no


@triton.jit
def _rotary(cos, sin, t, cs_st, valid, ROPE: tl.constexpr, BT: tl.constexpr, D: tl.constexpr):
    """The rotary tables' rows t as (cos even, cos odd, sin even, sin odd), or four zeros without ROPE."""
    if ROPE:
        ce, co = _tile(cos, t, cs_st, valid, BT, D)
        se, so = _tile(sin, t, cs_st, valid, BT, D)
    else:
        ce = tl.zeros((BT, D // 2), dtype=tl.float32)
        co = ce
        se = ce
        so = ce
    return ce, co, se, so


@triton.jit
def _eps32(eps):
    """eps as float32 whether the caller passes 32 or 64 bits (Inductor passes Python floats as fp64)."""
    return (tl.zeros((1,), tl.float64) + eps).to(tl.float32)


@triton.jit
def _ids(HEADS_FIRST: tl.constexpr):
    """(the program's block of tokens, its group of heads) from its two ids: with HEADS_FIRST the head groups of one
    block of tokens are neighbouring programs, so they run together and read the same rotary rows and the same
    token rows of q, k and v (one row of every head is one contiguous stretch)."""
    if HEADS_FIRST:
        return tl.program_id(1), tl.program_id(0)
    else:
        return tl.program_id(0), tl.program_id(1)


@triton.jit
def _gather(q, k, v, q_st, k_st, v_st, we, wo, ke_w, ko_w, cos, sin, cs_st, n, t0, eps,
            q_hi, k_se, k_so, k_he, k_ho, k_le, k_lo, v_s, v_h, v_l,
            ROWS: tl.constexpr, BT: tl.constexpr, HG: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
            MASKED: tl.constexpr, STAGES: tl.constexpr, INTERPRETED: tl.constexpr):
    """The statistics of rows t0 … t0 + ROWS of HG heads (q, k, v: the first head's first channel) added to the
    accumulators (each keeps a value per (row of BT, head, channel)). MASKED: rows from n on are left out; without it
    every row is there and the compiler drops the masks (a constant all-true mask), the chunks but each piece's
    last."""
    for i in tl.range(0, ROWS, BT, num_stages=STAGES):
        t = (t0 + i + tl.arange(0, BT)).to(tl.int64)
        if MASKED:
            valid = t < n
        else:
            valid = tl.full((BT,), 1, tl.int1)
        ce, co, se, so = _rotary(cos, sin, t, cs_st, valid, ROPE, BT, D)
        a, c = _qk(q, t, q_st, valid, we, wo, ce, co, se, so, eps, ROPE, BT, HG, D, INTERPRETED)
        q_hi = tl.maximum(q_hi, tl.maximum(tl.abs(a), tl.abs(c)))
        a, c = _qk(k, t, k_st, valid, ke_w, ko_w, ce, co, se, so, eps, ROPE, BT, HG, D, INTERPRETED)
        k_se += a
        k_so += c
        m = valid[:, None, None]
        k_he = tl.maximum(k_he, tl.where(m, a, float("-inf")))
        k_ho = tl.maximum(k_ho, tl.where(m, c, float("-inf")))
        k_le = tl.minimum(k_le, tl.where(m, a, float("inf")))
        k_lo = tl.minimum(k_lo, tl.where(m, c, float("inf")))
        x = tl.load(v + t[:, None] * v_st + tl.arange(0, HG * D)[None, :], mask=valid[:, None], other=0.0)
        x = tl.reshape(x.to(tl.float32), (BT, HG, D))
        v_s += x
        v_h = tl.maximum(v_h, tl.where(m, x, float("-inf")))
        v_l = tl.minimum(v_l, tl.where(m, x, float("inf")))
    return q_hi, k_se, k_so, k_he, k_ho, k_le, k_lo, v_s, v_h, v_l


def qkv_stats(q, k, v, q_sb, q_st, k_sb, k_st, v_sb, v_st, wq, wk, cos, sin, cs_st, part, n, chunk0, chunks, H,
              eps, ROWS: tl.constexpr, BT: tl.constexpr, HG: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
              HEADS_FIRST: tl.constexpr, STAGES: tl.constexpr, INTERPRETED: tl.constexpr):
    """Pass 1 over one piece of n tokens, one program per (chunk of ROWS tokens, group of HG heads of one batch
    entry): q and k as the attention sees them (`_qk`) and v, gathered per value across the chunk in registers and
    reduced once at its end; writes part[batch × head, chunk0 + chunk] = max |q|, then for k and for v each
    channel's sum, maximum and minimum over the chunk's tokens (1 + 6·D floats), for each of the HG heads. Only a
    piece's last chunk masks its rows (`_gather`)."""
    chunk, g = _ids(HEADS_FIRST)
    bh0 = g * HG
    b = (bh0 // H).to(tl.int64)
    h0 = bh0 % H
    eps = _eps32(eps)
    we, wo = _pairs(wq, D)
    ke_w, ko_w = _pairs(wk, D)
    zero = tl.zeros((BT, HG, D // 2), dtype=tl.float32)
    low = tl.full((BT, HG, D // 2), float("-inf"), tl.float32)
    high = tl.full((BT, HG, D // 2), float("inf"), tl.float32)
    v_s = tl.zeros((BT, HG, D), dtype=tl.float32)
    v_h = tl.full((BT, HG, D), float("-inf"), tl.float32)
    v_l = tl.full((BT, HG, D), float("inf"), tl.float32)
    qb, kb, vb = q + b * q_sb + h0 * D, k + b * k_sb + h0 * D, v + b * v_sb + h0 * D
    t0 = chunk * ROWS
    if t0 + ROWS <= n:
        q_hi, k_se, k_so, k_he, k_ho, k_le, k_lo, v_s, v_h, v_l = _gather(
            qb, kb, vb, q_st, k_st, v_st, we, wo, ke_w, ko_w, cos, sin, cs_st, n, t0, eps,
            zero, zero, zero, low, low, high, high, v_s, v_h, v_l, ROWS, BT, HG, D, ROPE, False, STAGES, INTERPRETED)
    else:
        q_hi, k_se, k_so, k_he, k_ho, k_le, k_lo, v_s, v_h, v_l = _gather(
            qb, kb, vb, q_st, k_st, v_st, we, wo, ke_w, ko_w, cos, sin, cs_st, n, t0, eps,
            zero, zero, zero, low, low, high, high, v_s, v_h, v_l, ROWS, BT, HG, D, ROPE, True, STAGES, INTERPRETED)
    d = tl.arange(0, D)
    rows = part + ((bh0 + tl.arange(0, HG)) * chunks + chunk0 + chunk).to(tl.int64)[:, None] * (1 + 6 * D)
    tl.store(rows + tl.arange(0, 1)[None, :], tl.max(tl.max(q_hi, axis=2), axis=0)[:, None])
    pairs = tl.arange(0, D // 2)[None, :] * 2
    tl.store(rows + 1 + pairs, tl.sum(k_se, axis=0))
    tl.store(rows + 2 + pairs, tl.sum(k_so, axis=0))
    tl.store(rows + 1 + D + pairs, tl.max(k_he, axis=0))
    tl.store(rows + 2 + D + pairs, tl.max(k_ho, axis=0))
    tl.store(rows + 1 + 2 * D + pairs, tl.min(k_le, axis=0))
    tl.store(rows + 2 + 2 * D + pairs, tl.min(k_lo, axis=0))
    tl.store(rows + 1 + 3 * D + d[None, :], tl.sum(v_s, axis=0))
    tl.store(rows + 1 + 4 * D + d[None, :], tl.max(v_h, axis=0))
    tl.store(rows + 1 + 5 * D + d[None, :], tl.min(v_l, axis=0))


@triton.jit
def _centered(total, hi, lo, n):
    """(the mean, max |x − mean| over the channels) from the sums, maxima and minima of each channel over n tokens
    (the mean as PyTorch's: the sum × (1/n) in float32)."""
    inv_n = tl.div_rn(tl.full((1,), 1.0, tl.float32), (tl.zeros((1,), tl.int32) + n).to(tl.float32))
    mean = total * inv_n
    return mean, tl.max(tl.maximum(hi - mean, mean - lo), axis=0)


def qkv_scales(part, scales, means, n, chunks, D: tl.constexpr, CB: tl.constexpr):
    """Pass 2, one program per batch × head: the chunks' statistics gathered CB chunks at a time (each accumulator
    keeps its chunk's row; one program walking the chunks one by one took 2.7 ms of a step, waiting on each load)
    and reduced once at the end, in a fixed order (the same bits every run); scales[bh] = (descale q, k, v, then
    their inverses) with descale = largest |x| (K and V centred) × (1/448), at least float32's smallest normal;
    means[bh] = (k's mean, v's mean) over the n tokens."""
    bh = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    one = tl.arange(0, 1)
    q_hi = tl.zeros((CB,), dtype=tl.float32)
    k_sum = tl.zeros((CB, D), dtype=tl.float32)
    v_sum = tl.zeros((CB, D), dtype=tl.float32)
    k_hi = tl.full((CB, D), float("-inf"), tl.float32)
    v_hi = tl.full((CB, D), float("-inf"), tl.float32)
    k_lo = tl.full((CB, D), float("inf"), tl.float32)
    v_lo = tl.full((CB, D), float("inf"), tl.float32)
    for c0 in range(0, chunks, CB):
        c = c0 + tl.arange(0, CB)
        live = c < chunks
        rows = part + (bh * chunks + c) * (1 + 6 * D)
        q_hi = tl.maximum(q_hi, tl.load(rows, mask=live, other=0.0))
        at = rows[:, None] + 1 + d[None, :]
        m = live[:, None]
        k_sum += tl.load(at, mask=m, other=0.0)
        k_hi = tl.maximum(k_hi, tl.load(at + D, mask=m, other=float("-inf")))
        k_lo = tl.minimum(k_lo, tl.load(at + 2 * D, mask=m, other=float("inf")))
        v_sum += tl.load(at + 3 * D, mask=m, other=0.0)
        v_hi = tl.maximum(v_hi, tl.load(at + 4 * D, mask=m, other=float("-inf")))
        v_lo = tl.minimum(v_lo, tl.load(at + 5 * D, mask=m, other=float("inf")))
    qmax = tl.zeros((1,), dtype=tl.float32) + tl.max(q_hi, axis=0)
    k_sum, k_hi, k_lo = tl.sum(k_sum, axis=0), tl.max(k_hi, axis=0), tl.min(k_lo, axis=0)
    v_sum, v_hi, v_lo = tl.sum(v_sum, axis=0), tl.max(v_hi, axis=0), tl.min(v_lo, axis=0)
    k_mean, k_amax = _centered(k_sum, k_hi, k_lo, n)
    v_mean, v_amax = _centered(v_sum, v_hi, v_lo, n)
    tiny = 1.1754943508222875e-38
    dq = tl.maximum(qmax * 0.002232142857142857, tiny)           # × (1/448) in float32
    dk = tl.zeros((1,), dtype=tl.float32) + tl.maximum(k_amax * 0.002232142857142857, tiny)
    dv = tl.zeros((1,), dtype=tl.float32) + tl.maximum(v_amax * 0.002232142857142857, tiny)
    at = scales + bh * 6 + one
    tl.store(at, dq)
    tl.store(at + 1, dk)
    tl.store(at + 2, dv)
    tl.store(at + 3, tl.div_rn(tl.full((1,), 1.0, tl.float32), dq))
    tl.store(at + 4, tl.div_rn(tl.full((1,), 1.0, tl.float32), dk))
    tl.store(at + 5, tl.div_rn(tl.full((1,), 1.0, tl.float32), dv))
    tl.store(means + bh * 2 * D + d, k_mean)
    tl.store(means + bh * 2 * D + D + d, v_mean)


@triton.jit
def _put(out, x, inv, valid, BT: tl.constexpr, HG: tl.constexpr, D: tl.constexpr):
    """out rows (pointers of row starts, [BT]) = e4m3(clamp(x · inv, ±448)) of x ([BT, HG, D]; inv [HG], a head's
    inverse descale), in out's dtype (the tests: float32, before rounding)."""
    x = tl.clamp(x * inv[None, :, None], -448.0, 448.0)
    x = tl.reshape(x, (BT, HG * D))
    tl.store(out[:, None] + tl.arange(0, HG * D)[None, :], x.to(out.dtype.element_ty), mask=valid[:, None])


@triton.jit
def _head_pairs(ptr, stride, HG: tl.constexpr, D: tl.constexpr):
    """HG vectors of D values (the first at ptr, the next `stride` on) as (even, odd) [HG, D/2] float32."""
    x = tl.load(ptr + tl.arange(0, HG)[:, None] * stride + tl.arange(0, D)[None, :])
    return tl.split(tl.reshape(x, (HG, D // 2, 2)))


def qkv_quantize(q, k, v, q_sb, q_st, k_sb, k_st, v_sb, v_st, wq, wk, cos, sin, cs_st, scales, means, q8, k8, v8,
                 n, tok0, n_all, H, eps, BT: tl.constexpr, HG: tl.constexpr, D: tl.constexpr, ROPE: tl.constexpr,
                 HEADS_FIRST: tl.constexpr, INTERPRETED: tl.constexpr):
    """Pass 3 over one piece of n tokens (tokens tok0… of the n_all of q8/k8/v8), one program per (BT tokens, group
    of HG heads of one batch entry): q, k and v again as in pass 1 (the same bits), K and V less their means, each
    times its head's inverse descale, rounded to e4m3 into (batch, tokens, heads, D)."""
    block, g = _ids(HEADS_FIRST)
    bh0 = g * HG
    b = (bh0 // H).to(tl.int64)
    h0 = bh0 % H
    heads = (bh0 + tl.arange(0, HG)).to(tl.int64)
    eps = _eps32(eps)
    t = (block * BT + tl.arange(0, BT)).to(tl.int64)
    valid = t < n
    ce, co, se, so = _rotary(cos, sin, t, cs_st, valid, ROPE, BT, D)
    out = ((b * n_all + tok0 + t) * H + h0) * D
    we, wo = _pairs(wq, D)
    a, c = _qk(q + b * q_sb + h0 * D, t, q_st, valid, we, wo, ce, co, se, so, eps, ROPE, BT, HG, D, INTERPRETED)
    _put(q8 + out, tl.reshape(tl.join(a, c), (BT, HG, D)), tl.load(scales + heads * 6 + 3), valid, BT, HG, D)
    we, wo = _pairs(wk, D)
    me, mo = _head_pairs(means + bh0.to(tl.int64) * 2 * D, 2 * D, HG, D)
    a, c = _qk(k + b * k_sb + h0 * D, t, k_st, valid, we, wo, ce, co, se, so, eps, ROPE, BT, HG, D, INTERPRETED)
    x = tl.reshape(tl.join(a - me[None, :, :], c - mo[None, :, :]), (BT, HG, D))
    _put(k8 + out, x, tl.load(scales + heads * 6 + 4), valid, BT, HG, D)
    x = tl.load(v + b * v_sb + h0 * D + t[:, None] * v_st + tl.arange(0, HG * D)[None, :], mask=valid[:, None],
                other=0.0)
    mv = tl.load(means + heads[:, None] * 2 * D + D + tl.arange(0, D)[None, :])
    x = tl.reshape(x.to(tl.float32), (BT, HG, D)) - mv[None, :, :]
    _put(v8 + out, x, tl.load(scales + heads * 6 + 5), valid, BT, HG, D)


stats_jit = triton.jit(qkv_stats)
scales_jit = triton.jit(qkv_scales)
quantize_jit = triton.jit(qkv_quantize)
