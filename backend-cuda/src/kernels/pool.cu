// 2-D max and average pooling and their backward ops, a thread per output (forward) or per
// input element (backward, as gathers: deterministic, no atomics, and the contributions are
// added in the CPU reference's order, output rows then columns). Uses conv.cu's typedefs and
// `ConvArgs` (KH, KW: the pooling window; C: channels; nc: batch; n0 = 0).

// Output position e (in (n, c, oy, ox) order) as (plane offset parts).
#define POOL_SPLIT_OUT(e)                                                                  \
    const i64 ox = (i64)(e) % a.OW, r1_ = (i64)(e) / a.OW, oy = r1_ % a.OH, r2_ = r1_ / a.OH; \
    const i64 c = r2_ % a.C, n = r2_ / a.C
#define POOL_SPLIT_IN(e)                                                                   \
    const i64 ix = (i64)(e) % a.W, r1_ = (i64)(e) / a.W, iy = r1_ % a.H, r2_ = r1_ / a.H;     \
    const i64 c = r2_ % a.C, n = r2_ / a.C

// Index arithmetic of the max-pooling kernels runs in I: int when every index of the call
// fits (a 32-bit division costs a fraction of a 64-bit one, and these kernels are bound by
// their divisions), i64 when not. Addresses are always formed in i64.
__device__ __forceinline__ bool pool_fits_int(const ConvArgs& a) {
    const i64 limit = 0x7fffffffLL;
    return a.nc * a.C * a.H * a.W < limit && a.nc * a.C * a.OH * a.OW < limit;
}

// y and argmax (the flat index iy·W + ix in the plane) of each window. PyTorch's rule: the
// index starts at the first in-bounds tap and the value at -inf; a strictly larger value
// replaces it (the first of equal maxima wins), and so does the first NaN, after which
// nothing does. p: x, y, argmax (i64, strides zs).
template <typename I>
__device__ __forceinline__ void max_pool2d_t(const ConvArgs& a) {
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    i64* arg = (i64*)a.p[2];
    const I OW = (I)a.OW, OH = (I)a.OH, CH = (I)a.C, H = (I)a.H, W = (I)a.W;
    const I sh = (I)a.sh, sw = (I)a.sw, ph = (I)a.ph, pw = (I)a.pw, dh = (I)a.dh, dw = (I)a.dw;
    const u64 total = (u64)(a.nc * a.C * a.OH * a.OW);
    for (u64 e = gtid(); e < total; e += gstride()) {
        const I ei = (I)e, ox = ei % OW, r1 = ei / OW, oy = r1 % OH, r2 = r1 / OH, c = r2 % CH, n = r2 / CH;
        const T* plane = x + (i64)n * a.xs[0] + (i64)c * a.xs[1];
        C best = (C)__int_as_float(0xff800000u);
        i64 at = -1;
        for (I ky = 0; ky < (I)a.KH; ++ky) {
            const I iy = oy * sh + ky * dh - ph;
            if (iy < 0 || iy >= H) continue;
            for (I kx = 0; kx < (I)a.KW; ++kx) {
                const I ix = ox * sw + kx * dw - pw;
                if (ix < 0 || ix >= W) continue;
                const C v = TT::load(plane[(i64)iy * a.xs[2] + (i64)ix * a.xs[3]]);
                const i64 flat = (i64)iy * a.W + ix;
                if (at < 0) at = flat;
                if (best == best && (v > best || v != v)) {
                    best = v;
                    at = flat;
                }
            }
        }
        y[(i64)n * a.ys[0] + (i64)c * a.ys[1] + (i64)oy * a.ys[2] + (i64)ox * a.ys[3]] = TT::store(best);
        arg[(i64)n * a.zs[0] + (i64)c * a.zs[1] + (i64)oy * a.zs[2] + (i64)ox * a.zs[3]] = at;
    }
}

extern "C" __global__ void max_pool2d(const ConvArgs a) {
    if (pool_fits_int(a)) max_pool2d_t<int>(a);
    else max_pool2d_t<i64>(a);
}

// The outputs [lo, hi) on one axis whose window (span (k-1)·d + 1) covers input coordinate i;
// with dilation some of them skip i, which the argmax comparison then rules out.
template <typename I>
__device__ __forceinline__ void covering(I i, I k, I s, I p, I d, I out, I& lo, I& hi) {
    const I span = (k - 1) * d + 1;
    lo = i + p < span ? 0 : (i + p - span) / s + 1;
    hi = (i + p) / s + 1 < out ? (i + p) / s + 1 : out;
}

// dx[i] = sum of dy over the outputs whose argmax is i. Only windows that cover i can pick
// it, so the gather visits those, in ascending output order (the CPU reference's). p: dy,
// argmax (strides zs), dx.
template <typename I>
__device__ __forceinline__ void max_pool2d_backward_t(const ConvArgs& a) {
    const T* dy = (const T*)a.p[0];
    const i64* arg = (const i64*)a.p[1];
    T* dx = (T*)a.p[2];
    const I OW = (I)a.OW, OH = (I)a.OH, CH = (I)a.C, H = (I)a.H, W = (I)a.W;
    const u64 total = (u64)(a.nc * a.C * a.H * a.W);
    for (u64 e = gtid(); e < total; e += gstride()) {
        const I ei = (I)e, ix = ei % W, r1 = ei / W, iy = r1 % H, r2 = r1 / H, c = r2 % CH, n = r2 / CH;
        const i64 flat = (i64)iy * a.W + ix;
        I oy0, oy1, ox0, ox1;
        covering<I>(iy, (I)a.KH, (I)a.sh, (I)a.ph, (I)a.dh, OH, oy0, oy1);
        covering<I>(ix, (I)a.KW, (I)a.sw, (I)a.pw, (I)a.dw, OW, ox0, ox1);
        const i64 at = (i64)n * a.zs[0] + (i64)c * a.zs[1], from = (i64)n * a.ys[0] + (i64)c * a.ys[1];
        C s = (C)0;
        for (I oy = oy0; oy < oy1; ++oy) {
            for (I ox = ox0; ox < ox1; ++ox) {
                if (arg[at + (i64)oy * a.zs[2] + (i64)ox * a.zs[3]] == flat)
                    s += TT::load(dy[from + (i64)oy * a.ys[2] + (i64)ox * a.ys[3]]);
            }
        }
        dx[(i64)n * a.xs[0] + (i64)c * a.xs[1] + (i64)iy * a.xs[2] + (i64)ix * a.xs[3]] = TT::store(s);
    }
}

extern "C" __global__ void max_pool2d_backward(const ConvArgs a) {
    if (pool_fits_int(a)) max_pool2d_backward_t<int>(a);
    else max_pool2d_backward_t<i64>(a);
}

// The output rows (or columns) whose window puts tap k on input coordinate i: o = (i + p -
// k·d)/s when that divides exactly and lies in [0, out). Returns -1 otherwise.
__device__ __forceinline__ i64 window_of(i64 i, i64 k, i64 s, i64 p, i64 d, i64 out) {
    const i64 t = i + p - k * d;
    if (t < 0 || t % s != 0 || t / s >= out) return -1;
    return t / s;
}

// The divisor of output o on one axis with padding counted in (count_include_pad): the
// window's extent clipped to the padded input, as in PyTorch.
__device__ __forceinline__ i64 avg_extent(i64 o, i64 s, i64 k, i64 in, i64 p) {
    const i64 start = o * s, end = start + k < in + 2 * p ? start + k : in + 2 * p;
    return end - start;
}

// y = sum of the window's in-bounds taps / its padded area. p: x, y.
extern "C" __global__ void avg_pool2d(const ConvArgs a) {
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    const i64 total = a.nc * a.C * a.OH * a.OW;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        POOL_SPLIT_OUT(e);
        const T* plane = x + n * a.xs[0] + c * a.xs[1];
        C s = (C)0;
        for (i64 ky = 0; ky < a.KH; ++ky) {
            const i64 iy = oy * a.sh + ky - a.ph;
            if (iy < 0 || iy >= a.H) continue;
            for (i64 kx = 0; kx < a.KW; ++kx) {
                const i64 ix = ox * a.sw + kx - a.pw;
                if (ix >= 0 && ix < a.W) s += TT::load(plane[iy * a.xs[2] + ix * a.xs[3]]);
            }
        }
        const C div = (C)(avg_extent(oy, a.sh, a.KH, a.H, a.ph) * avg_extent(ox, a.sw, a.KW, a.W, a.pw));
        y[n * a.ys[0] + c * a.ys[1] + oy * a.ys[2] + ox * a.ys[3]] = TT::store(s / div);
    }
}

// dx[i] = sum of dy / divisor over the windows that contain i. p: dy, dx.
extern "C" __global__ void avg_pool2d_backward(const ConvArgs a) {
    const T* dy = (const T*)a.p[0];
    T* dx = (T*)a.p[1];
    const i64 total = a.nc * a.C * a.H * a.W;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        POOL_SPLIT_IN(e);
        C s = (C)0;
        for (i64 ky = a.KH - 1; ky >= 0; --ky) {
            const i64 oy = window_of(iy, ky, a.sh, a.ph, 1, a.OH);
            if (oy < 0) continue;
            const i64 ry = avg_extent(oy, a.sh, a.KH, a.H, a.ph);
            for (i64 kx = a.KW - 1; kx >= 0; --kx) {
                const i64 ox = window_of(ix, kx, a.sw, a.pw, 1, a.OW);
                if (ox < 0) continue;
                const C div = (C)(ry * avg_extent(ox, a.sw, a.KW, a.W, a.pw));
                s += TT::load(dy[n * a.ys[0] + c * a.ys[1] + oy * a.ys[2] + ox * a.ys[3]]) / div;
            }
        }
        dx[n * a.xs[0] + c * a.xs[1] + iy * a.xs[2] + ix * a.xs[3]] = TT::store(s);
    }
}
