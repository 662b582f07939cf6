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

// y and argmax (the flat index iy·W + ix in the plane) of each window. PyTorch's rule: the
// index starts at the first in-bounds tap and the value at -inf; a strictly larger value
// replaces it (the first of equal maxima wins), and so does the first NaN, after which
// nothing does. p: x, y, argmax (i64, strides zs).
extern "C" __global__ void max_pool2d(const ConvArgs a) {
    const T* x = (const T*)a.p[0];
    T* y = (T*)a.p[1];
    i64* arg = (i64*)a.p[2];
    const i64 total = a.nc * a.C * a.OH * a.OW;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        POOL_SPLIT_OUT(e);
        const T* plane = x + n * a.xs[0] + c * a.xs[1];
        C best = (C)__int_as_float(0xff800000u);
        i64 at = -1;
        for (i64 ky = 0; ky < a.KH; ++ky) {
            const i64 iy = oy * a.sh + ky * a.dh - a.ph;
            if (iy < 0 || iy >= a.H) continue;
            for (i64 kx = 0; kx < a.KW; ++kx) {
                const i64 ix = ox * a.sw + kx * a.dw - a.pw;
                if (ix < 0 || ix >= a.W) continue;
                const C v = TT::load(plane[iy * a.xs[2] + ix * a.xs[3]]);
                if (at < 0) at = iy * a.W + ix;
                if (best == best && (v > best || v != v)) {
                    best = v;
                    at = iy * a.W + ix;
                }
            }
        }
        y[n * a.ys[0] + c * a.ys[1] + oy * a.ys[2] + ox * a.ys[3]] = TT::store(best);
        arg[n * a.zs[0] + c * a.zs[1] + oy * a.zs[2] + ox * a.zs[3]] = at;
    }
}

// The output rows (or columns) whose window puts tap k on input coordinate i: o = (i + p -
// k·d)/s when that divides exactly and lies in [0, out). Returns -1 otherwise.
__device__ __forceinline__ i64 window_of(i64 i, i64 k, i64 s, i64 p, i64 d, i64 out) {
    const i64 t = i + p - k * d;
    if (t < 0 || t % s != 0 || t / s >= out) return -1;
    return t / s;
}

// dx[i] = sum of dy over the outputs whose argmax is i. Only windows that contain i can pick
// it, so the gather visits those (taps in reverse order: ascending outputs). p: dy, argmax
// (strides zs), dx.
extern "C" __global__ void max_pool2d_backward(const ConvArgs a) {
    const T* dy = (const T*)a.p[0];
    const i64* arg = (const i64*)a.p[1];
    T* dx = (T*)a.p[2];
    const i64 total = a.nc * a.C * a.H * a.W;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        POOL_SPLIT_IN(e);
        const i64 flat = iy * a.W + ix;
        C s = (C)0;
        for (i64 ky = a.KH - 1; ky >= 0; --ky) {
            const i64 oy = window_of(iy, ky, a.sh, a.ph, a.dh, a.OH);
            if (oy < 0) continue;
            for (i64 kx = a.KW - 1; kx >= 0; --kx) {
                const i64 ox = window_of(ix, kx, a.sw, a.pw, a.dw, a.OW);
                if (ox < 0) continue;
                if (arg[n * a.zs[0] + c * a.zs[1] + oy * a.zs[2] + ox * a.zs[3]] == flat)
                    s += TT::load(dy[n * a.ys[0] + c * a.ys[1] + oy * a.ys[2] + ox * a.ys[3]]);
            }
        }
        dx[n * a.xs[0] + c * a.xs[1] + iy * a.xs[2] + ix * a.xs[3]] = TT::store(s);
    }
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
