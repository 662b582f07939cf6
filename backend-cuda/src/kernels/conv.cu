// Convolution helpers around cuBLAS (ops/conv.rs runs the products): im2col, the forward
// epilogue (bias, layout, rounding to T), the gather form of col2im, the bias gradient and the
// final store of the f32/f64 weight gradient. Also the module's element typedefs, which
// pool.cu (compiled after this file) uses too.
//
// Column matrices hold one chunk of `nc` samples: row (c, ky, kx) of C·KH·KW rows, column
// (n, oy, ox) of K = nc·OH·OW, so group g's rows are one contiguous block and every group is
// one matrix of a strided-batched product. Products accumulate in the compute type C (f32 for
// f16/bf16, as the CPU reference does) and are rounded to T once, here.

typedef ELEM T;
typedef Ty<T> TT;
typedef typename TT::C C;

// Mirror of `ConvArgs` in ops/conv.rs, shared with pool.cu (a test compares the two layouts).
struct ConvArgs {
    char* p[4];
    i64 xs[4];   // strides of x / dx (n, c, h, w); of dweight (o, c/g, kh, kw) in conv_store
    i64 ys[4];   // strides of y / dy (n, o, oh, ow)
    i64 zs[4];   // strides of a third operand (bias / dbias: [0]; pooling's argmax)
    i64 n0, nc;  // this chunk's first sample and sample count
    i64 C, H, W, O, G, OH, OW, KH, KW;
    i64 sh, sw, ph, pw, dh, dw;
};

// cols[(c, ky, kx), (n, oy, ox)] = x[n0 + n, c, iy, ix], 0 in the padding. p: x, cols (T).
extern "C" __global__ void conv_im2col(const ConvArgs a) {
    const T* x = (const T*)a.p[0];
    T* cols = (T*)a.p[1];
    const i64 L = a.OH * a.OW, K = a.nc * L, total = a.C * a.KH * a.KW * K;
    const T zero = TT::store((C)0);
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        const i64 col = (i64)e % K, row = (i64)e / K;
        const i64 l = col % L, n = col / L, ox = l % a.OW, oy = l / a.OW;
        const i64 kx = row % a.KW, r = row / a.KW, ky = r % a.KH, c = r / a.KH;
        const i64 iy = oy * a.sh + ky * a.dh - a.ph, ix = ox * a.sw + kx * a.dw - a.pw;
        T v = zero;
        if (iy >= 0 && iy < a.H && ix >= 0 && ix < a.W)
            v = x[(a.n0 + n) * a.xs[0] + c * a.xs[1] + iy * a.xs[2] + ix * a.xs[3]];
        cols[e] = v;
    }
}

// y[n0 + n, o, oy, ox] = acc[o, n, (oy, ox)] + bias[o], rounded once. p: acc (C, dense
// (O, nc, L)), bias (T, or null), y.
extern "C" __global__ void conv_out(const ConvArgs a) {
    const C* acc = (const C*)a.p[0];
    const T* bias = (const T*)a.p[1];
    T* y = (T*)a.p[2];
    const i64 L = a.OH * a.OW, total = a.nc * a.O * L;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        const i64 l = (i64)e % L, r = (i64)e / L, o = r % a.O, n = r / a.O;
        C v = acc[(o * a.nc + n) * L + l];
        if (bias) v += TT::load(bias[o * a.zs[0]]);
        y[(a.n0 + n) * a.ys[0] + o * a.ys[1] + (l / a.OW) * a.ys[2] + (l % a.OW) * a.ys[3]] = TT::store(v);
    }
}

// The adjoint of im2col as a gather (no atomics, deterministic): dx[n0 + n, c, iy, ix] sums
// the column entries of every tap that reads it, in (ky, kx) order as the CPU col2im adds
// them. p: cols (C, dense), dx.
extern "C" __global__ void conv_col2im(const ConvArgs a) {
    const C* cols = (const C*)a.p[0];
    T* dx = (T*)a.p[1];
    const i64 L = a.OH * a.OW, K = a.nc * L, total = a.nc * a.C * a.H * a.W;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        const i64 ix = (i64)e % a.W, r1 = (i64)e / a.W, iy = r1 % a.H, r2 = r1 / a.H, c = r2 % a.C, n = r2 / a.C;
        C s = (C)0;
        for (i64 ky = 0; ky < a.KH; ++ky) {
            const i64 ty = iy + a.ph - ky * a.dh;
            if (ty < 0 || ty % a.sh != 0 || ty / a.sh >= a.OH) continue;
            const i64 oy = ty / a.sh;
            for (i64 kx = 0; kx < a.KW; ++kx) {
                const i64 tx = ix + a.pw - kx * a.dw;
                if (tx < 0 || tx % a.sw != 0 || tx / a.sw >= a.OW) continue;
                const i64 ox = tx / a.sw;
                s += cols[((c * a.KH + ky) * a.KW + kx) * K + n * L + oy * a.OW + ox];
            }
        }
        dx[(a.n0 + n) * a.xs[0] + c * a.xs[1] + iy * a.xs[2] + ix * a.xs[3]] = TT::store(s);
    }
}

// dbias[o] = sum over n, oy, ox of dy: a block per channel, a tree in shared memory. p: dy,
// dbias. The launcher passes 256 threads and 256 · sizeof(C) bytes.
extern "C" __global__ void conv_bias_grad(const ConvArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    C* part = (C*)smem_raw;
    const T* dy = (const T*)a.p[0];
    T* db = (T*)a.p[1];
    const i64 L = a.OH * a.OW, per = a.nc * L;
    for (i64 o = blockIdx.x; o < a.O; o += gridDim.x) {
        C s = (C)0;
        for (i64 e = threadIdx.x; e < per; e += blockDim.x) {
            const i64 l = e % L, n = e / L;
            s += TT::load(dy[n * a.ys[0] + o * a.ys[1] + (l / a.OW) * a.ys[2] + (l % a.OW) * a.ys[3]]);
        }
        part[threadIdx.x] = s;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {
            if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
            __syncthreads();
        }
        if (threadIdx.x == 0) db[o * a.zs[0]] = TT::store(part[0]);
        __syncthreads();
    }
}

// dweight[o, ci, ky, kx] (strides xs) = acc[o, ci, ky, kx] (C, dense), rounded once; C here
// is the channels per group. p: acc, dweight.
extern "C" __global__ void conv_store(const ConvArgs a) {
    const C* acc = (const C*)a.p[0];
    T* dw = (T*)a.p[1];
    const i64 total = a.O * a.C * a.KH * a.KW;
    for (u64 e = gtid(); e < (u64)total; e += gstride()) {
        const i64 kx = (i64)e % a.KW, r1 = (i64)e / a.KW, ky = r1 % a.KH, r2 = r1 / a.KH, ci = r2 % a.C, o = r2 / a.C;
        dw[o * a.xs[0] + ci * a.xs[1] + ky * a.xs[2] + kx * a.xs[3]] = TT::store(acc[e]);
    }
}
