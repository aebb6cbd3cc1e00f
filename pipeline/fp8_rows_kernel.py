"""The Triton kernel of pipeline/fp8_rows.py (its docstring says what and why). Imported only where Triton is:
`fp8_rows` imports it at its first use. `gelu_rows_fp8` is the plain function: `jitted` compiles it for the GPU (or,
with TRITON_INTERPRET=1 set before Triton is imported, for Triton's interpreter: the tests on the CPU)."""
import triton
import triton.language as tl


@triton.jit
def _gelu_bf16(x):
    """gelu_tanh(x) (block_forms: x · sigmoid(2u), u = √(2/π)(x + 0.044715x³); 1.5957691216057308 = 2√(2/π)) in
    float32, rounded to bfloat16 to nearest even as gelu_tanh's output is: written out in integers (the same bits
    as the GPU's conversion; Triton's interpreter, which the tests run, truncates instead)."""
    cube = 0.044715 * x * x * x
    g = x * (1.0 / (1.0 + tl.exp(-(1.5957691216057308 * (x + cube)))))
    bits = g.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store(q_row, start, values, cols, mask, inv):
    """q_row[start + cols] = e4m3(clamp(values · inv, ±448)), in q's dtype (the tests: float32, before rounding)."""
    q = tl.clamp(values * inv, -448.0, 448.0)
    tl.store(q_row + start + cols, q.to(q_row.dtype.element_ty), mask=mask)


def gelu_rows_fp8(a_ptr, b_ptr, h_ptr, q_ptr, s_ptr, n, n_a, a_sb, a_st, b_sb, b_st, h_s, K1, K2,
                  F0: tl.constexpr, F1: tl.constexpr, H0: tl.constexpr, H1: tl.constexpr):
    """One program per row: q[row] = clamp(cat([first[row], gelu(h[row])]) / s, ±448) in q's dtype, s[row] = the
    row's largest |value| · (1/448) (1 for a row of zeros; the product PyTorch's CUDA division by 448 makes), the
    division made as a product with 1/s. The first part's rows come from a (the first n_a tokens of each batch) or
    b (the rest); h's and q's rows run over batch × n. Each part is held as two tiles of powers of two (F0 + F1
    columns of the first, H0 + H1 of h: 2,048 + 1,024 and 8,192 + 4,096 at full size, no padding), read once."""
    row = tl.program_id(0).to(tl.int64)
    h_row = h_ptr + row * h_s
    c0 = tl.arange(0, H0)
    m0 = c0 < K2
    g0 = _gelu_bf16(tl.load(h_row + c0, mask=m0, other=0.0).to(tl.float32))
    amax = tl.max(tl.abs(g0), axis=0)
    if H1 > 0:
        c1 = H0 + tl.arange(0, H1)
        m1 = c1 < K2
        g1 = _gelu_bf16(tl.load(h_row + c1, mask=m1, other=0.0).to(tl.float32))
        amax = tl.maximum(amax, tl.max(tl.abs(g1), axis=0))
    if F0 > 0:
        batch = row // n
        t = row % n
        if t < n_a:
            f_row = a_ptr + batch * a_sb + t * a_st
        else:
            f_row = b_ptr + batch * b_sb + (t - n_a) * b_st
        d0 = tl.arange(0, F0)
        l0 = d0 < K1
        f0 = tl.load(f_row + d0, mask=l0, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(f0), axis=0))
        if F1 > 0:
            d1 = F0 + tl.arange(0, F1)
            l1 = d1 < K1
            f1 = tl.load(f_row + d1, mask=l1, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(f1), axis=0))
    s = amax * 0.002232142857142857                 # 1/448 in float32
    s = tl.where(s > 0.0, s, 1.0)
    inv = tl.div_rn(1.0, s)
    q_row = q_ptr + row * (K1 + K2)
    if F0 > 0:
        _store(q_row, 0, f0, d0, l0, inv)
        if F1 > 0:
            _store(q_row, 0, f1, d1, l1, inv)
    _store(q_row, K1, g0, c0, m0, inv)
    if H1 > 0:
        _store(q_row, K1, g1, c1, m1, inv)
    tl.store(s_ptr + row, s)


jitted = triton.jit(gelu_rows_fp8)
