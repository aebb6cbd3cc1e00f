"""The Triton kernels of rocm/fp8_qkv.py (its docstring says what and why). Imported only where Triton is: `fp8_qkv`
imports it when it is prepared. The plain functions are compiled by `triton.jit` below (or, with TRITON_INTERPRET=1
set before Triton is imported, run by Triton's interpreter: the tests on the CPU)."""
import triton
import triton.language as tl


@triton.jit
def round_bf16(x):
    """float32 → the nearest bfloat16 value (ties to even), still float32: written out in integers, so the GPU and
    Triton's interpreter (which truncates in its conversions) give the same bits."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load(a_ptr, b_ptr, a_sb, a_st, b_sb, b_st, b, t, col, n_a, valid):
    """Rows t of a token sequence held as two pieces (the first n_a tokens in a, the rest in b), columns col
    ([rows, cols] of float32; 0 where not valid)."""
    in_a = t < n_a
    xa = tl.load(a_ptr + b * a_sb + t[:, None] * a_st + col, mask=(valid & in_a)[:, None], other=0.0)
    xb = tl.load(b_ptr + b * b_sb + (t - n_a)[:, None] * b_st + col, mask=(valid & ~in_a)[:, None], other=0.0)
    return tl.where(in_a[:, None], xa, xb).to(tl.float32)


@triton.jit
def _normed(x, w, r):
    """diffusers' RMSNorm of bf16 values x with its bf16 weight w, given r = rsqrt(mean(x²) + eps) per row:
    bf16(bf16(x · r) · w)."""
    return round_bf16(round_bf16(x * r[:, None]) * w)


@triton.jit
def _qk(a_ptr, b_ptr, a_sb, a_st, b_sb, b_st, wa_ptr, wb_ptr, cos_ptr, sin_ptr, cs_st, b, h, t, n_a, valid, eps,
        D: tl.constexpr):
    """q or k of head h for rows t: RMSNorm over the head's D channels (the first piece's weight wa, the second's wb),
    then the rotary embedding on the first piece's rows (diffusers' `apply_rotary_emb`, pairs of channels
    (2i, 2i+1): x·cos + (−x₂ᵢ₊₁, x₂ᵢ)·sin in float32, rounded to bf16); float32 values of bf16."""
    d = tl.arange(0, D)
    col = h * D + d[None, :]
    partner = h * D + (d ^ 1)[None, :]
    x = _load(a_ptr, b_ptr, a_sb, a_st, b_sb, b_st, b, t, col, n_a, valid)
    xp = _load(a_ptr, b_ptr, a_sb, a_st, b_sb, b_st, b, t, partner, n_a, valid)
    r = tl.div_rn(1.0, tl.sqrt_rn(tl.sum(x * x, axis=1) * (1.0 / D) + eps))
    in_a = (t < n_a)[:, None]
    w = tl.where(in_a, tl.load(wa_ptr + d).to(tl.float32)[None, :], tl.load(wb_ptr + d).to(tl.float32)[None, :])
    wp = tl.where(in_a, tl.load(wa_ptr + (d ^ 1)).to(tl.float32)[None, :],
                  tl.load(wb_ptr + (d ^ 1)).to(tl.float32)[None, :])
    n = _normed(x, w, r)
    rot = _normed(xp, wp, r)
    rot = tl.where((d % 2 == 0)[None, :], -rot, rot)
    rope = valid[:, None] & in_a
    c = tl.load(cos_ptr + t[:, None] * cs_st + d[None, :], mask=rope, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + t[:, None] * cs_st + d[None, :], mask=rope, other=0.0).to(tl.float32)
    return tl.where(in_a, round_bf16(n * c + rot * s), n)


def qkv_stats(q_a, q_b, k_a, k_b, v_a, v_b, q_sb, q_st, qb_sb, qb_st, k_sb, k_st, kb_sb, kb_st, v_sb, v_st, vb_sb,
              vb_st, wq_a, wq_b, wk_a, wk_b, cos, sin, cs_st, part, n, n_a, H, chunks, eps,
              ROWS: tl.constexpr, BT: tl.constexpr, D: tl.constexpr):
    """Pass 1, one program per (chunk of ROWS tokens, batch × head): q and k as the attention sees them (`_qk`) and
    v; writes the chunk's partial statistics to part[batch × head, chunk]: max |q| (one value), then for k and for v
    the sum, the maximum and the minimum of each channel over the chunk's tokens (row layout: 1 + 6·D floats)."""
    chunk = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    d = tl.arange(0, D)
    qmax = tl.zeros((BT, D), dtype=tl.float32)
    k_sum = tl.zeros((D,), dtype=tl.float32)
    v_sum = tl.zeros((D,), dtype=tl.float32)
    k_hi = tl.full((D,), float("-inf"), tl.float32)
    v_hi = tl.full((D,), float("-inf"), tl.float32)
    k_lo = tl.full((D,), float("inf"), tl.float32)
    v_lo = tl.full((D,), float("inf"), tl.float32)
    for i in range(0, ROWS, BT):
        t = (chunk * ROWS + i + tl.arange(0, BT)).to(tl.int64)
        valid = t < n
        q = _qk(q_a, q_b, q_sb, q_st, qb_sb, qb_st, wq_a, wq_b, cos, sin, cs_st, b, h, t, n_a, valid, eps, D)
        qmax = tl.maximum(qmax, tl.abs(q))
        k = _qk(k_a, k_b, k_sb, k_st, kb_sb, kb_st, wk_a, wk_b, cos, sin, cs_st, b, h, t, n_a, valid, eps, D)
        v = _load(v_a, v_b, v_sb, v_st, vb_sb, vb_st, b, t, h * D + d[None, :], n_a, valid)
        k_sum += tl.sum(k, axis=0)
        v_sum += tl.sum(v, axis=0)
        k_hi = tl.maximum(k_hi, tl.max(tl.where(valid[:, None], k, float("-inf")), axis=0))
        v_hi = tl.maximum(v_hi, tl.max(tl.where(valid[:, None], v, float("-inf")), axis=0))
        k_lo = tl.minimum(k_lo, tl.min(tl.where(valid[:, None], k, float("inf")), axis=0))
        v_lo = tl.minimum(v_lo, tl.min(tl.where(valid[:, None], v, float("inf")), axis=0))
    row = part + (bh * chunks + chunk).to(tl.int64) * (1 + 6 * D)
    tl.store(row, tl.max(tl.max(qmax, axis=1), axis=0))
    tl.store(row + 1 + d, k_sum)
    tl.store(row + 1 + D + d, k_hi)
    tl.store(row + 1 + 2 * D + d, k_lo)
    tl.store(row + 1 + 3 * D + d, v_sum)
    tl.store(row + 1 + 4 * D + d, v_hi)
    tl.store(row + 1 + 5 * D + d, v_lo)


@triton.jit
def _centered(total, hi, lo, n):
    """(the mean, max |x − mean| over the channels) from the sums, maxima and minima of each channel (the mean as
    PyTorch's: the sum × (1/n))."""
    mean = total * tl.div_rn(1.0, n.to(tl.float32))
    return mean, tl.max(tl.maximum(hi - mean, mean - lo), axis=0)


def qkv_scales(part, scales, means, n, chunks, D: tl.constexpr):
    """Pass 2, one program per batch × head: the chunks' statistics summed in chunk order (the same bits every run);
    scales[bh] = (descale q, k, v, then their inverses) with descale = largest |x| (K and V centred) × (1/448),
    at least float32's smallest normal; means[bh] = (k's mean, v's mean) over the tokens."""
    bh = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    one = tl.arange(0, 1)
    qmax = tl.zeros((1,), dtype=tl.float32)
    k_sum = tl.zeros((D,), dtype=tl.float32)
    v_sum = tl.zeros((D,), dtype=tl.float32)
    k_hi = tl.full((D,), float("-inf"), tl.float32)
    v_hi = tl.full((D,), float("-inf"), tl.float32)
    k_lo = tl.full((D,), float("inf"), tl.float32)
    v_lo = tl.full((D,), float("inf"), tl.float32)
    for c in range(0, chunks):
        row = part + (bh * chunks + c) * (1 + 6 * D)
        qmax = tl.maximum(qmax, tl.load(row + one))
        k_sum += tl.load(row + 1 + d)
        k_hi = tl.maximum(k_hi, tl.load(row + 1 + D + d))
        k_lo = tl.minimum(k_lo, tl.load(row + 1 + 2 * D + d))
        v_sum += tl.load(row + 1 + 3 * D + d)
        v_hi = tl.maximum(v_hi, tl.load(row + 1 + 4 * D + d))
        v_lo = tl.minimum(v_lo, tl.load(row + 1 + 5 * D + d))
    k_mean, k_amax = _centered(k_sum, k_hi, k_lo, n)
    v_mean, v_amax = _centered(v_sum, v_hi, v_lo, n)
    tiny = 1.1754943508222875e-38
    dq = tl.maximum(qmax * 0.002232142857142857, tiny)           # × (1/448) in float32
    dk = tl.maximum(k_amax * 0.002232142857142857, tiny)
    dv = tl.maximum(v_amax * 0.002232142857142857, tiny)
    dk = tl.zeros((1,), dtype=tl.float32) + dk
    dv = tl.zeros((1,), dtype=tl.float32) + dv
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
def _put(out, b, t, h, H, n, x, inv, valid, D: tl.constexpr):
    """out[b, t, h, :] = e4m3(clamp(x · inv, ±448)) in out's dtype ((batch, tokens, heads, D) contiguous; the tests:
    float32, before rounding)."""
    d = tl.arange(0, D)
    at = out + ((b * n + t[:, None]) * H + h) * D + d[None, :]
    tl.store(at, tl.clamp(x * inv, -448.0, 448.0).to(out.dtype.element_ty), mask=valid[:, None])


def qkv_quantize(q_a, q_b, k_a, k_b, v_a, v_b, q_sb, q_st, qb_sb, qb_st, k_sb, k_st, kb_sb, kb_st, v_sb, v_st, vb_sb,
                 vb_st, wq_a, wq_b, wk_a, wk_b, cos, sin, cs_st, scales, means, q8, k8, v8, n, n_a, H, eps,
                 BT: tl.constexpr, D: tl.constexpr):
    """Pass 3, one program per (BT tokens, batch × head): q, k and v again as in pass 1 (the same bits), K and V less
    their means, each times its head's inverse descale, rounded to e4m3 into (batch, tokens, heads, D)."""
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    t = (tl.program_id(0) * BT + tl.arange(0, BT)).to(tl.int64)
    valid = t < n
    d = tl.arange(0, D)
    sc = scales + bh.to(tl.int64) * 6
    mk = tl.load(means + bh.to(tl.int64) * 2 * D + d)[None, :]
    mv = tl.load(means + bh.to(tl.int64) * 2 * D + D + d)[None, :]
    q = _qk(q_a, q_b, q_sb, q_st, qb_sb, qb_st, wq_a, wq_b, cos, sin, cs_st, b, h, t, n_a, valid, eps, D)
    _put(q8, b, t, h, H, n, q, tl.load(sc + 3), valid, D)
    k = _qk(k_a, k_b, k_sb, k_st, kb_sb, kb_st, wk_a, wk_b, cos, sin, cs_st, b, h, t, n_a, valid, eps, D)
    _put(k8, b, t, h, H, n, k - mk, tl.load(sc + 4), valid, D)
    v = _load(v_a, v_b, v_sb, v_st, vb_sb, vb_st, b, t, h * D + d[None, :], n_a, valid)
    _put(v8, b, t, h, H, n, v - mv, tl.load(sc + 5), valid, D)


stats_jit = triton.jit(qkv_stats)
scales_jit = triton.jit(qkv_scales)
quantize_jit = triton.jit(qkv_quantize)
