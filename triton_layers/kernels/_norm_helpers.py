"""@triton.jit helpers of the norm kernels (kernels/layer_norm.py): each formula of the
forward and of the three backward kernels written once (the in-register and the split
backward kernels shared their prologue, dx formula, stores and weight/bias updates verbatim,
and numeric fixes had to be applied to each copy)."""
import triton
import triton.language as tl

# Smallest divisor used for stable mode, so an all-zero row normalizes to zeros (not NaN).
# A tl.constexpr: real (non-interpreted) Triton only reads constexpr globals.
STABLE_MIN_SCALE = tl.constexpr(1e-30)


@triton.jit
def div(row_sums, N):
    """Per-row sums / N, correctly rounded (the GPU's default fp32 division, div.full.f32,
    may be 2 ulp off; these means feed every element of the row)."""
    return tl.div_rn(row_sums, tl.zeros_like(row_sums) + N)


@triton.jit
def rounded_product(a, b, mask):
    """a * b rounded to fp32 before any later use (0 outside ``mask``). Behind the select,
    the compiler cannot fuse the product into a following ``- mean`` as an FMA, which
    would subtract a mean of rounded products from an unrounded one: on rows of one
    element, where dx, xhat and dweight are exactly 0, that left ~1e-6 times
    rstd = 1/sqrt(eps) in them on the GPU (w * dy before mean(w * dy); x / max|x| before
    its mean in stable mode)."""
    return tl.where(mask, a * b, 0.0)


@triton.jit
def stat_rows(Stats, M, IS_RMS: tl.constexpr):
    """Pointers to the mean, rstd and 1/max|z| rows of the stats tensor (RMSNorm keeps no
    mean row: its Mean pointer is never read)."""
    Rstd = Stats + M
    if IS_RMS:
        Rstd = Stats
    return Stats, Rstd, Rstd + M


@triton.jit
def load_weight(W, cols, col_mask, HAS_WEIGHT: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """The factor the normalized rows are multiplied by, fp32: weight, 1 + weight, or ones."""
    w = tl.full(cols.shape, 1.0, dtype=tl.float32)
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
        if UNIT_OFFSET:
            w = 1.0 + w
    return w


@triton.jit
def load_input(X, R, H, rows, x_rows, cols, mask, stride_r_row, stride_h_row,
                HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr):
    """A tile of the normalized input z in fp32 (0 outside ``mask``): x, or h = x + residual
    in H's dtype (each cast to it, their sum rounded to it), written to H when STORE_H.
    ``x_rows``: the rows' offsets in X (``rows * stride_x_row``, or :func:`head_rows`')."""
    z = tl.load(X + x_rows[:, None] + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        h_dtype = H.dtype.element_ty
        r = tl.load(R + rows[:, None] * stride_r_row + cols[None, :], mask=mask, other=0.0)
        z = (z.to(h_dtype).to(tl.float32) + r.to(h_dtype).to(tl.float32)).to(h_dtype)
        if STORE_H:
            tl.store(H + rows[:, None] * stride_h_row + cols[None, :], z, mask=mask)
    return z.to(tl.float32)


@triton.jit
def load_chunk(X, R, H, rows, x_rows, cols, mask, stride_r_row, stride_h_row,
                HAS_RESIDUAL: tl.constexpr, FIRST_PASS: tl.constexpr):
    """A chunk of z in fp32 on the forward's long-row path, which passes over each row two or
    three times: the first pass reads x (and the residual, writing h); a later one reads x
    again, or h alone (one tensor where x and the residual are two: 5 M*D bytes moved
    instead of 6). A later pass must follow a ``tl.debug_barrier()`` after the first:
    another thread of the program may have written the h it reads."""
    if HAS_RESIDUAL and not FIRST_PASS:
        return tl.load(H + rows[:, None] * stride_h_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return load_input(X, R, H, rows, x_rows, cols, mask, stride_r_row, stride_h_row, HAS_RESIDUAL, FIRST_PASS)


@triton.jit
def head_rows(rows, stride_x_row, x_heads, stride_x_head):
    """The offsets of ``rows`` in a tensor of heads (tokens, x_heads, N) with strides
    (stride_x_row, stride_x_head, 1): row r is head r % x_heads of token r // x_heads. For rows
    with one stride, x_heads is 1 (Triton specializes an argument equal to 1: the division and
    remainder fold away) and the offsets are rows * stride_x_row."""
    return (rows // x_heads) * stride_x_row + (rows % x_heads) * stride_x_head


@triton.jit
def shifted_stats(s1, s2, shift, N, eps, IS_RMS: tl.constexpr):
    """(mean, rstd) of rows from their sums of d = z - shift and of d * d (RMSNorm: shift 0)."""
    if IS_RMS:
        mean = shift
        var = div(s2, N)
    else:
        mean = shift + div(s1, N)
        # Clamp rounding below zero, but let a NaN variance (a row holding inf) through,
        # as torch does: fmax(NaN, 0) would give 0 and a finite rstd.
        var = tl.maximum(div(s2 - div(s1 * s1, N), N), 0.0, propagate_nan=tl.PropagateNan.ALL)
    return mean, 1.0 / tl.sqrt(var + eps)


@triton.jit
def load_affine(W, B, cols, col_mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, UNIT_OFFSET: tl.constexpr):
    """The columns' weight factor (load_weight) and bias, fp32 (zeros without a bias)."""
    b = tl.zeros(cols.shape, dtype=tl.float32)
    if HAS_BIAS:
        b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    return load_weight(W, cols, col_mask, HAS_WEIGHT, UNIT_OFFSET), b


@triton.jit
def scale_shift(zhat, Z, w, b, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr):
    """y in fp32: zhat (rounded to Z's dtype first with CAST_BEFORE_WEIGHT) * w + b, w and b
    the columns' factors (load_affine)."""
    if CAST_BEFORE_WEIGHT:
        zhat = zhat.to(Z.dtype.element_ty).to(tl.float32)
    if HAS_WEIGHT:
        zhat = zhat * w[None, :]
    if HAS_BIAS:
        zhat = zhat + b[None, :]
    return zhat


@triton.jit
def affine(zhat, Z, W, B, cols, col_mask, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
            UNIT_OFFSET: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr):
    """y in fp32 (scale_shift), the weight and bias loaded for these columns."""
    w, b = load_affine(W, B, cols, col_mask, HAS_WEIGHT, HAS_BIAS, UNIT_OFFSET)
    return scale_shift(zhat, Z, w, b, HAS_WEIGHT, HAS_BIAS, CAST_BEFORE_WEIGHT)


# --- backward -------------------------------------------------------------------------------


@triton.jit
def load_bwd_tile(
    Z, DY, Mean, Rstd, InvScale, rows, row_mask, cols, mask, stride_z_row, stride_dy_row,
    IS_RMS: tl.constexpr, STABLE: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """dy and zhat (fp32, 0 outside ``mask``) of a tile, and the rows' rstd / max|z|."""
    z = tl.load(Z + rows[:, None] * stride_z_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    inv_scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    if STABLE:
        inv_scale = tl.load(InvScale + rows, mask=row_mask, other=1.0)
    mean = tl.zeros([BLOCK_M], dtype=tl.float32)
    if not IS_RMS:
        mean = tl.load(Mean + rows, mask=row_mask, other=0.0)
    rstd = tl.load(Rstd + rows, mask=row_mask, other=0.0)
    zhat = tl.where(mask, (rounded_product(z, inv_scale[:, None], mask) - mean[:, None]) * rstd[:, None], 0.0)
    return dy, zhat, rstd * inv_scale


@triton.jit
def dz_coefficients(sum_gz, sum_g, N, IS_RMS: tl.constexpr):
    """c1 = mean(g * zhat) and c2 = mean(g) (0 for RMSNorm) of each row, from its sums."""
    c2 = div(sum_g, N)
    if IS_RMS:
        c2 = tl.zeros_like(sum_gz)
    return div(sum_gz, N), c2


@triton.jit
def store_dz(DX, DR, DH, rows, cols, mask, g, zhat, c1, c2, scale, stride_dx_row, stride_dr_row, stride_dh_row,
              HAS_DH: tl.constexpr, STORE_DR: tl.constexpr):
    """dz = (g - zhat * c1 - c2) * rstd / max|z| (+ h's own gradient), stored as dx (and as
    dresidual, when it has another dtype)."""
    dz = (g - (zhat * c1[:, None] + c2[:, None])) * scale[:, None]
    if HAS_DH:
        dz += tl.load(DH + rows[:, None] * stride_dh_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + rows[:, None] * stride_dx_row + cols[None, :], dz.to(DX.dtype.element_ty), mask=mask)
    if STORE_DR:
        tl.store(DR + rows[:, None] * stride_dr_row + cols[None, :], dz.to(DR.dtype.element_ty), mask=mask)


@triton.jit
def param_grads(dy, zhat, dw_acc, db_acc, Z, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr,
                 CAST_BEFORE_WEIGHT: tl.constexpr):
    """Add the tile's column sums of dy * zhat and of dy to the weight/bias accumulators."""
    if COMPUTE_DW:
        if CAST_BEFORE_WEIGHT:  # the weight multiplied zhat rounded to z's dtype
            zhat = zhat.to(Z.dtype.element_ty).to(tl.float32)
        dw_acc += tl.sum(dy * zhat, axis=0)
    if COMPUTE_DB:
        db_acc += tl.sum(dy, axis=0)
    return dw_acc, db_acc


@triton.jit
def partial_rows(Partials, program, n_programs, N, COMPUTE_DW: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows of weight and bias partials in ``Partials`` ((weight's if asked,
    then bias's if asked) x n_programs x N), and zeroed accumulators for them.

    Takes no other pointer than ``Partials`` on purpose: torch.compile's analysis of which
    tensors a kernel writes takes every pointer a helper returns as derived from every
    pointer it was given, so a helper also given W made the stores to the partials count
    as writes to the weight (a Parameter: functionalization then fails)."""
    DW_partial = Partials + program * N
    DB_partial = DW_partial
    if COMPUTE_DW:
        DB_partial += n_programs.to(tl.int64) * N
    dw_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    return DW_partial, DB_partial, dw_acc, db_acc


@triton.jit
def store_partials(DW_partial, DB_partial, cols, col_mask, dw_acc, db_acc, COMPUTE_DW: tl.constexpr,
                    COMPUTE_DB: tl.constexpr):
    if COMPUTE_DW:
        tl.store(DW_partial + cols, dw_acc, mask=col_mask)
    if COMPUTE_DB:
        tl.store(DB_partial + cols, db_acc, mask=col_mask)


@triton.jit
def publish(mine, sum_a, sum_b, mask, counter):
    """The one-pass long-row kernels' handoff (forward and backward): store a chunk's two row
    sums at ``mine`` and ``mine + 1`` and count the program's arrival at ``counter``, released
    after every thread's stores, so that a program that acquires the count sees the sums
    (:func:`wait_arrivals`)."""
    tl.store(mine, sum_a, mask=mask)
    tl.store(mine + 1, sum_b, mask=mask)
    tl.debug_barrier()
    tl.atomic_add(counter, 1, sem="release", scope="gpu")


@triton.jit
def publish_sums(Sums, Arrivals, rows, row_mask, first, chunk, n_chunks, zhat, g):
    """The long-row backward's one pass: this chunk's share of the tile's row sums
    (sum(zhat * g), sum(g)), published at the tile's counter."""
    publish(Sums + (rows * n_chunks + chunk) * 2, tl.sum(zhat * g, axis=1), tl.sum(g, axis=1), row_mask,
            Arrivals + 1 + first)


@triton.jit
def wait_arrivals(counter, n_chunks, MAX_POLLS: tl.constexpr):
    """Spin until ``n_chunks`` programs have published at ``counter`` (acquire: their sums
    are visible after), or, with MAX_POLLS > 0, until that many polls; whether all arrived."""
    if MAX_POLLS == 0:
        while tl.atomic_add(counter, 0, sem="acquire", scope="gpu") < n_chunks:
            pass
        arrived = True
    else:
        arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu") >= n_chunks
        polls = 1
        while (not arrived) and polls < MAX_POLLS:
            arrived = tl.atomic_add(counter, 0, sem="acquire", scope="gpu") >= n_chunks
            polls += 1
    return arrived
