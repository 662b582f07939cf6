// Kernel dev harness for the tensor-core attention kernels: checks the forwards
// `attn_fwd_wg_64` (Hopper, wgmma) and `attn_fwd_tc_64` (mma.sync), a warp-specialized
// forward of its own (`attn_fwd_ws`, measured slower, not in the plugin), and the backward
// passes `attn_bwd_{dq,dkv}_{wg,tc}_64`, against a plain f32 reference on a few shapes and masks,
// then times them on the benchmark shape (B8 H16 S1024 D64 causal), and the backward also on
// the grouped-query shape of the SFT step (B8, 14 query and 2 kv heads, S1024 D64 causal).
// The kernels are the plugin's own sources, compiled here with nvcc instead of NVRTC (on the
// GPU machine):
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -DELEM=b16 -DIS_FLOAT=1 -o attention_dev \
//        backend-cuda/scripts/attention_dev.cu && ./attention_dev [fwd|bwd|profile|bwdprofile]
//
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include <cstring>
#include <algorithm>
#include "../src/kernels/common.cuh"
#include "../src/kernels/attention.cu"

// The Hopper forward at another stage count (the plugin's `attn_fwd_wg_64` has WG_STAGES).
template <int S> __global__ void __launch_bounds__(WG_THREADS, 2) wg_stages(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_fwd_wg<S>(a, (T*)smem_raw);
#endif
}
// ---- a warp-specialized forward (measured, not in the plugin) ------------------------------
// FlashAttention-3 / cuDNN's structure on the plugin's pieces: one copying warpgroup (cp.async
// into the same swizzled tiles, completion signalled on mbarriers instead of a block-wide
// barrier per tile), NC consuming warpgroups of 64 query rows each, 128-key tiles, one
// persistent block per SM, optionally the consumers' products issued in turn (named barriers).
// Slower than `attn_fwd_wg_64` on the bench shape (backend-cuda/RESULTS.md).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// mbarriers: a phase completes when `count` arrivals have come; try_wait.parity waits for
// the phase of the given parity.
__device__ __forceinline__ void mb_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// One arrival once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void mb_arrive_copies(u32 bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mb_wait(u32 bar, u32 parity) {
    asm volatile("{\n.reg .pred p;\nWS_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WS_WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void nb_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void nb_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory"); }
template <int R> __device__ __forceinline__ void reg_shrink() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }
template <int R> __device__ __forceinline__ void reg_grow() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }

// Persistent: a block per SM steps through the work items (query tiles, heaviest first)
// blockIdx.x, + gridDim.x, ... Warpgroup 0 copies each item's Q (two buffers) and its K and V
// tiles of BN keys (S stages deep, numbered across items) and signals each on an mbarrier;
// warpgroups 1..NC each take 64 query rows of the item and consume the stages, releasing
// each on a second mbarrier, so that the next item's copies run under this one's last tiles.
// With PING the consumers issue their products in turn.
template <int NC, int BN, int S, bool PING> __device__ void attn_fwd_ws(const AttnArgs& a, T* sm) {
    constexpr int D = 64, BM = 64 * NC, TILE = BN * D, NT = BN / 8, OT = D / 8;
    const int d = (int)a.d, t = (int)a.t;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              c4 = lane & 3;
    const u32 bars = tc_smem_addr(sm);
    auto full = [&](int s) { return bars + 8u * (u32)s; };
    auto empty = [&](int s) { return bars + 8u * (u32)(S + s); };
    auto qfull = [&](int b) { return bars + 8u * (u32)(2 * S + b); };
    auto qempty = [&](int b) { return bars + 8u * (u32)(2 * S + 2 + b); };
    const u32 q0 = (bars + 8u * (2 * S + 4) + 1023u) & ~1023u, kvaddr = q0 + (u32)(2 * BM * D * 2);
    auto qaddr = [&](int b) { return q0 + (u32)(b * BM * D * 2); };
    auto stage = [&](int j) { return kvaddr + (u32)((j % S) * 2 * TILE * 2); };
    const i64 nwork = a.b * a.hq * ((a.s + BM - 1) / BM);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) mb_init(full(s), 128), mb_init(empty(s), 128 * NC);
        for (int b = 0; b < 2; ++b) mb_init(qfull(b), 128), mb_init(qempty(b), 128 * NC);
    }
    __syncthreads();
    if (wg == 0) {
        reg_shrink<NC == 2 ? 40 : 32>();
        const T* q = (const T*)a.p[0];
        int jj = 0, it = 0;
        for (i64 w = blockIdx.x; w < nwork; w += gridDim.x, ++it) {
            const TcTile tl = tc_tile(a, BM, w);
            const int ntiles = (int)((tl.nkeys + BN - 1) / BN), qb = it & 1;
            if (it >= 2) mb_wait(qempty(qb), ((it >> 1) - 1) & 1);
            wg_copy_rows<BM, 128>(qaddr(qb), q + tl.bi * a.st[0][0] + tl.h * a.st[0][1], a.st[0][2], (int)tl.i0,
                                  (int)a.s, d);
            mb_arrive_copies(qfull(qb));
            for (int j = 0; j < ntiles; ++j, ++jj) {
                const int s = jj % S, f = jj / S;
                if (f > 0) mb_wait(empty(s), (f - 1) & 1);
                wg_copy_rows<BN, 128>(stage(jj), tl.k, a.st[1][2], j * BN, t, d);
                wg_copy_rows<BN, 128>(stage(jj) + TILE * 2, tl.v, a.st[2][2], j * BN, t, d);
                mb_arrive_copies(full(s));
            }
        }
        asm volatile("cp.async.wait_all;" ::: "memory");
        return;
    }
    reg_grow<NC == 2 ? 232 : 160>();
    const int c = wg - 1;
    const float sl2 = fmaxf(fabsf((float)(a.scale * 1.4426950408889634)), 1.17549435e-38f);
    auto my_turn = [&]() {
        if (PING) nb_sync(1 + c, 256);
    };
    auto next_turn = [&]() {
        if (PING) nb_arrive(1 + (c + 1) % NC, 256);
    };
    if (PING && c == NC - 1) nb_arrive(1, 256);  // consumer 0 goes first
    int jj = 0, it = 0;
    for (i64 w = blockIdx.x; w < nwork; w += gridDim.x, ++it) {
        const TcTile tl = tc_tile(a, BM, w);
        const int ntiles = (int)((tl.nkeys + BN - 1) / BN), qb = it & 1;
        const int wi0 = (int)tl.i0 + 64 * c + 16 * warp;
        const int vmin = (int)visible(a, wi0);
        const u32 qrows = qaddr(qb) + (u32)(c * 64 * 128);
        mb_wait(qfull(qb), (it >> 1) & 1);
        if (a.scale < 0) {
            T* qs = sm + (qrows - bars) / 2;
            for (int i = threadIdx.x & 127; i < 64 * D / 8; i += 128) {
                uint4* p = (uint4*)(qs + 8 * i);
                uint4 x = *p;
                x.x ^= 0x80008000u, x.y ^= 0x80008000u, x.z ^= 0x80008000u, x.w ^= 0x80008000u;
                *p = x;
            }
            wg_proxy_fence();
            nb_sync(1 + NC + c, 128);
        }
        int vis[1][2];
        vis[0][0] = (int)visible(a, wi0 + g);
        vis[0][1] = (int)visible(a, wi0 + g + 8);
        float m[1][2] = {{NEG_INF, NEG_INF}}, l[1][2] = {{0.f, 0.f}};
        float oacc[1][OT][4], sacc[1][NT][4];
        u32 pa[BN / 16][4];
#pragma unroll
        for (int n = 0; n < OT; ++n) oacc[0][n][0] = oacc[0][n][1] = oacc[0][n][2] = oacc[0][n][3] = 0.f;
        auto scores = [&](int j) {
#pragma unroll
            for (int hh = 0; hh < BN / 64; ++hh) {
                float(&x)[8][4] = *reinterpret_cast<float(*)[8][4]>(&sacc[0][8 * hh]);
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    wg_mma_ss(x, wg_desc(qrows + kk * 32), wg_desc(stage(jj + j) + hh * 8192 + kk * 32), kk);
            }
        };
        auto values = [&](int j) {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) wg_mma_rs(oacc[0], pa[kk], wg_desc(stage(jj + j) + TILE * 2 + kk * 2048));
        };
        auto to_weights = [&](int j, float (&corr)[2]) {
            const int j0 = j * BN;
            return j0 + BN > vmin ? wg_softmax<true, NT>(sacc, m, l, corr, vis, j0 + 2 * c4, sl2)
                                  : wg_softmax<false, NT>(sacc, m, l, corr, vis, j0 + 2 * c4, sl2);
        };
        auto weights_to_a = [&]() {
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) tc_acc_to_a(pa[kk], sacc[0][2 * kk], sacc[0][2 * kk + 1]);
        };
        auto landed = [&](int j) {
            mb_wait(full((jj + j) % S), ((jj + j) / S) & 1);
            wg_proxy_fence();
        };
        if (ntiles > 0) {
            float corr[2] = {1.f, 1.f};
            landed(0);
            my_turn();
            wg_pin<NT>(sacc[0]);
            wg_fence();
            scores(0);
            wg_commit();
            next_turn();
            wg_wait<0>();
            wg_pin<NT>(sacc[0]);
            to_weights(0, corr);
            weights_to_a();
            for (int j = 1; j < ntiles; ++j) {
                landed(j);
                my_turn();
                wg_pin<NT>(sacc[0]);
                wg_pin<OT>(oacc[0]);
                wg_pin<BN / 16>(pa);
                wg_fence();
                scores(j);
                wg_commit();
                values(j - 1);
                wg_commit();
                next_turn();
                wg_wait<1>();
                wg_pin<NT>(sacc[0]);
                const bool grow = to_weights(j, corr);
                wg_wait<0>();
                wg_pin<OT>(oacc[0]);
                wg_pin<BN / 16>(pa);
                mb_arrive(empty((jj + j - 1) % S));
                if (grow) wg_rescale<OT>(oacc, corr);
                weights_to_a();
            }
            my_turn();
            wg_pin<OT>(oacc[0]);
            wg_pin<BN / 16>(pa);
            wg_fence();
            values(ntiles - 1);
            wg_commit();
            next_turn();
            wg_wait<0>();
            wg_pin<OT>(oacc[0]);
            mb_arrive(empty((jj + ntiles - 1) % S));
        } else if (PING) {
            my_turn();  // every consumer takes one turn per item
            next_turn();
        }
        mb_arrive(qempty(qb));
        jj += ntiles;
        tc_store_rows<1, OT>(a, tl, wi0, oacc, m, l, vis);
    }
    if (PING && c == 0) nb_sync(1, 256);  // the last consumer's final turn
}
#endif

template <int NC, int BN, int S, bool PING> __global__ void __launch_bounds__(128 * (NC + 1), 1) ws_kernel(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_fwd_ws<NC, BN, S, PING>(a, (T*)smem_raw);
#endif
}
#define WS_SMEM(NC, BN, S) ((2 * 64 * NC * 64 + S * 2 * BN * 64) * 2 + 1024 + 256)
struct Variant {
    const char* name;
    void (*fn)(const AttnArgs);
    int threads, rows, smem;
    bool persistent;  // one block per SM, stepping through the work
};
#define WG_SMEM(S) ((WG_BM * 64 + S * 2 * WG_BN * 64) * 2 + 1024)
static const Variant variants[] = {
    {"attn_fwd_tc_64 (mma.sync)", attn_fwd_tc_64, TC_THREADS, 128, 3 * 2 * 64 * 72 * 2},
    {"attn_fwd_wg_64 (wgmma)", attn_fwd_wg_64, WG_THREADS, WG_BM, WG_SMEM(WG_STAGES)},
    {"attn_fwd_wg, 4 stages", wg_stages<4>, WG_THREADS, WG_BM, WG_SMEM(4)},
    {"attn_fwd_wg, 3 stages", wg_stages<3>, WG_THREADS, WG_BM, WG_SMEM(3)},
    {"ws 2x128 S4", ws_kernel<2, 128, 4, false>, 384, 128, WS_SMEM(2, 128, 4), true},
    {"ws 2x128 S4 ping", ws_kernel<2, 128, 4, true>, 384, 128, WS_SMEM(2, 128, 4), true},
    {"ws 2x64 S8 ping", ws_kernel<2, 64, 8, true>, 384, 128, WS_SMEM(2, 64, 8), true},
    {"ws 3x128 S4 ping", ws_kernel<3, 128, 4, true>, 512, 192, WS_SMEM(3, 128, 4), true},
};
const int NV = sizeof variants / sizeof variants[0];

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e = (x);                                                               \
        if (e != cudaSuccess) {                                                            \
            printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));       \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

// One thread per query row: o and lse in f32 from the same bf16 inputs.
__global__ void reference(const AttnArgs a, float* o, float* lse) {
    const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= a.b * a.hq * a.s) return;
    const i64 i = row % a.s, h = (row / a.s) % a.hq, bi = row / (a.s * a.hq), kh = h / (a.hq / a.hk);
    const b16* q = (const b16*)a.p[0] + bi * a.st[0][0] + h * a.st[0][1] + i * a.st[0][2];
    const b16* k = (const b16*)a.p[1] + bi * a.st[1][0] + kh * a.st[1][1];
    const b16* v = (const b16*)a.p[2] + bi * a.st[2][0] + kh * a.st[2][1];
    const i64 n = visible(a, i);
    float mx = -INFINITY;
    for (i64 j = 0; j < n; ++j) {
        float s = 0;
        for (int c = 0; c < a.d; ++c) s += bf2f(q[c].x) * bf2f(k[j * a.st[1][2] + c].x);
        mx = fmaxf(mx, s * (float)a.scale);
    }
    float acc[128] = {0}, sum = 0;
    for (i64 j = 0; j < n; ++j) {
        float s = 0;
        for (int c = 0; c < a.d; ++c) s += bf2f(q[c].x) * bf2f(k[j * a.st[1][2] + c].x);
        const float p = expf(s * (float)a.scale - mx);
        sum += p;
        for (int c = 0; c < a.d; ++c) acc[c] += p * bf2f(v[j * a.st[2][2] + c].x);
    }
    for (int c = 0; c < a.d; ++c) o[row * a.d + c] = n ? acc[c] / sum : NAN;
    lse[row] = n ? mx + logf(sum) : NAN;
}

static unsigned short to_bf(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf(unsigned short b) {
    unsigned u = (unsigned)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int sm_count() {
    int n;
    CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
}

struct Case {
    int b, hq, hk, s, t, d;
    bool causal;
    double scale;
};

// Best ms per launch over 5 rounds of 30 (after 3 warm-up launches each).
static float time_kernel(const Variant& var, int blocks, const AttnArgs& a) {
    cudaEvent_t x, y;
    CK(cudaEventCreate(&x));
    CK(cudaEventCreate(&y));
    float best = 1e9;
    for (int round = 0; round < 5; ++round) {
        for (int i = 0; i < 3; ++i) var.fn<<<blocks, var.threads, var.smem>>>(a);
        const int n = 30;
        CK(cudaEventRecord(x));
        for (int i = 0; i < n; ++i) var.fn<<<blocks, var.threads, var.smem>>>(a);
        CK(cudaEventRecord(y));
        CK(cudaEventSynchronize(y));
        float ms;
        CK(cudaEventElapsedTime(&ms, x, y));
        best = fminf(best, ms / n);
    }
    return best;
}

// Dense (b, h, s, d) operands; each variant's worst |o - ref| and |lse - ref| (the reference
// in f32 without rounding P), and on the timing case ms per launch.
static void run_case(const Case& c, bool time_it) {
    const size_t nq = (size_t)c.b * c.hq * c.s * c.d, nk = (size_t)c.b * c.hk * c.t * c.d;
    const size_t rows = (size_t)c.b * c.hq * c.s;
    std::vector<unsigned short> hq(nq), hk(nk), hv(nk), ho(nq);
    srand(1);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
    for (auto& x : hq) x = to_bf(rnd() * 2.f);
    for (auto& x : hk) x = to_bf(rnd() * 2.f);
    for (auto& x : hv) x = to_bf(rnd());
    b16 *q, *k, *v, *o;
    float *lse, *ro, *rl;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nk * 2));
    CK(cudaMalloc(&v, nk * 2));
    CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&lse, rows * 4));
    CK(cudaMalloc(&ro, nq * 4));
    CK(cudaMalloc(&rl, rows * 4));
    CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    AttnArgs a;
    memset(&a, 0, sizeof a);
    a.p[0] = (char*)q, a.p[1] = (char*)k, a.p[2] = (char*)v, a.p[3] = (char*)o, a.p[4] = (char*)lse;
    const i64 qs[4] = {(i64)c.hq * c.s * c.d, (i64)c.s * c.d, c.d, 1}, ks[4] = {(i64)c.hk * c.t * c.d, (i64)c.t * c.d, c.d, 1};
    for (int e = 0; e < 4; ++e) a.st[0][e] = a.st[3][e] = qs[e], a.st[1][e] = a.st[2][e] = ks[e];
    a.st[4][0] = (i64)c.hq * c.s, a.st[4][1] = c.s, a.st[4][2] = 1;
    a.b = c.b, a.hq = c.hq, a.hk = c.hk, a.s = c.s, a.t = c.t, a.d = c.d, a.scale = c.scale, a.causal = c.causal;
    reference<<<(rows + 127) / 128, 128>>>(a, ro, rl);
    CK(cudaGetLastError());
    std::vector<float> hr(nq), hl(rows), lr(rows);
    CK(cudaMemcpy(hr.data(), ro, nq * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lr.data(), rl, rows * 4, cudaMemcpyDeviceToHost));
    printf("b%d hq%d hk%d s%d t%d d%d causal%d scale%+.3f\n", c.b, c.hq, c.hk, c.s, c.t, c.d, c.causal, c.scale);
    for (int vi = 0; vi < NV; ++vi) {
        const Variant& var = variants[vi];
        CK(cudaFuncSetAttribute(var.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, var.smem));
        int blocks = c.b * c.hq * ((c.s + var.rows - 1) / var.rows);
        if (var.persistent) blocks = std::min(blocks, sm_count());
        CK(cudaMemset(o, 0xff, nq * 2));
        var.fn<<<blocks, var.threads, var.smem>>>(a);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hl.data(), lse, rows * 4, cudaMemcpyDeviceToHost));
        double eo = 0, el = 0;
        long nan_bad = 0;
        for (size_t i = 0; i < nq; ++i) {
            const float r = hr[i], x = from_bf(ho[i]);
            if (std::isnan(r) != std::isnan(x)) ++nan_bad;
            if (!std::isnan(r)) eo = fmax(eo, fabs(x - r));
        }
        for (size_t i = 0; i < rows; ++i) {
            if (std::isnan(lr[i]) != std::isnan(hl[i])) ++nan_bad;
            if (!std::isnan(lr[i])) el = fmax(el, fabs(hl[i] - lr[i]));
        }
        const bool ok = eo < 8e-3 && el < 1e-4 && nan_bad == 0;
        printf("  %-28s o err %.2e  lse err %.2e  nan mismatches %ld  %s", var.name, eo, el, nan_bad, ok ? "ok" : "MISMATCH");
        if (time_it) {
            const float best = time_kernel(var, blocks, a);
            const double flops = 4.0 * c.b * c.hq * (double)c.s * c.t * c.d / (c.causal ? 2 : 1);
            printf("  %.4f ms  %.0f TFLOP/s", best, flops / (best * 1e-3) / 1e12);
        }
        printf("\n");
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(ro), cudaFree(rl);
}

// ---- backward ----------------------------------------------------------------------------

// One thread per query row: D = rowsum(dO ∘ o) and dq in f32 from the reference o and lse.
__global__ void reference_dq(const AttnArgs a, const float* ro, const float* rl, float* dq, float* dd) {
    const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= a.b * a.hq * a.s) return;
    const i64 i = row % a.s, h = (row / a.s) % a.hq, bi = row / (a.s * a.hq), kh = h / (a.hq / a.hk);
    const b16* q = (const b16*)a.p[0] + bi * a.st[0][0] + h * a.st[0][1] + i * a.st[0][2];
    const b16* k = (const b16*)a.p[1] + bi * a.st[1][0] + kh * a.st[1][1];
    const b16* v = (const b16*)a.p[2] + bi * a.st[2][0] + kh * a.st[2][1];
    const b16* g = (const b16*)a.p[5] + bi * a.st[5][0] + h * a.st[5][1] + i * a.st[5][2];
    const i64 n = visible(a, i);
    float dsum = 0;
    for (int c = 0; c < a.d; ++c) dsum += bf2f(g[c].x) * ro[row * a.d + c];
    if (n == 0) dsum = 0;
    float acc[128] = {0};
    for (i64 j = 0; j < n; ++j) {
        float s = 0, dp = 0;
        for (int c = 0; c < a.d; ++c) {
            s += bf2f(q[c].x) * bf2f(k[j * a.st[1][2] + c].x);
            dp += bf2f(g[c].x) * bf2f(v[j * a.st[2][2] + c].x);
        }
        const float p = expf(s * (float)a.scale - rl[row]), ds = p * (dp - dsum);
        for (int c = 0; c < a.d; ++c) acc[c] += ds * bf2f(k[j * a.st[1][2] + c].x);
    }
    for (int c = 0; c < a.d; ++c) dq[row * a.d + c] = acc[c] * (float)a.scale;
    dd[row] = dsum;
}

// One thread per key row: dk and dv in f32 over every query of the group that sees the key.
__global__ void reference_dkv(const AttnArgs a, const float* rl, const float* dd, float* dk, float* dv) {
    const i64 row = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= a.b * a.hk * a.t) return;
    const i64 j = row % a.t, kh = (row / a.t) % a.hk, bi = row / (a.t * a.hk), group = a.hq / a.hk;
    const b16* k = (const b16*)a.p[1] + bi * a.st[1][0] + kh * a.st[1][1] + j * a.st[1][2];
    const b16* v = (const b16*)a.p[2] + bi * a.st[2][0] + kh * a.st[2][1] + j * a.st[2][2];
    float ak[128] = {0}, av[128] = {0};
    for (i64 h = kh * group; h < (kh + 1) * group; ++h) {
        for (i64 i = 0; i < a.s; ++i) {
            if (j >= visible(a, i)) continue;
            const b16* q = (const b16*)a.p[0] + bi * a.st[0][0] + h * a.st[0][1] + i * a.st[0][2];
            const b16* g = (const b16*)a.p[5] + bi * a.st[5][0] + h * a.st[5][1] + i * a.st[5][2];
            const i64 qrow = (bi * a.hq + h) * a.s + i;
            float s = 0, dp = 0;
            for (int c = 0; c < a.d; ++c) {
                s += bf2f(q[c].x) * bf2f(k[c].x);
                dp += bf2f(g[c].x) * bf2f(v[c].x);
            }
            const float p = expf(s * (float)a.scale - rl[qrow]), ds = p * (dp - dd[qrow]);
            for (int c = 0; c < a.d; ++c) {
                ak[c] += ds * bf2f(q[c].x);
                av[c] += p * bf2f(g[c].x);
            }
        }
    }
    for (int c = 0; c < a.d; ++c) dk[row * a.d + c] = ak[c] * (float)a.scale, dv[row * a.d + c] = av[c];
}

template <int S, int WGS, int BLOCKS> __global__ void __launch_bounds__(128 * WGS, BLOCKS) dkv_wg_var(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_bwd_dkv_wg<S, WGS>(a, (T*)smem_raw);
#endif
}
template <int S, int WGS, int BLOCKS> __global__ void __launch_bounds__(128 * WGS, BLOCKS) dq_wg_var(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_bwd_dq_wg<S, WGS>(a, (T*)smem_raw);
#endif
}
#define DQ_WG_SMEM(S, W) (1024 + 2 * 64 * (W) * 64 * 2 + (S) * 2 * WG_BN * 64 * 2 + 2 * 64 * (W) * 4)
#define DKV_WG_SMEM(S, W) (1024 + 2 * 64 * (W) * 64 * 2 + (S) * (2 * WG_BN * 64 * 2 + 2 * WG_BN * 4))
// rows: queries (dq) or keys (dkv) per block.
static const Variant dq_variants[] = {
    {"attn_bwd_dq_tc_64 (mma.sync)", attn_bwd_dq_tc_64, TC_THREADS, 64, (2 * 64 + 3 * 2 * 64) * 72 * 2},
    {"dq_wg, 2 WGs, 1 block/SM, S4", dq_wg_var<4, 2, 1>, 256, 128, DQ_WG_SMEM(4, 2)},
    {"attn_bwd_dq_wg_64 (wgmma)", attn_bwd_dq_wg_64, WG_BWD_THREADS, 64, DQ_WG_SMEM(WG_DQ_STAGES, 1)},
};
static const Variant dkv_variants[] = {
    {"attn_bwd_dkv_tc_64 (mma.sync)", attn_bwd_dkv_tc_64, TC_THREADS, 64, (2 * 64 + 2 * 2 * 64) * 72 * 2 + 2 * 2 * 64 * 4},
    {"dkv_wg, 2 WGs, 1 block/SM, S5", dkv_wg_var<5, 2, 1>, 256, 128, DKV_WG_SMEM(5, 2)},
    {"dkv_wg, 1 WG, 2 blocks/SM, S5", dkv_wg_var<5, 1, 2>, 128, 64, DKV_WG_SMEM(5, 1)},
    {"attn_bwd_dkv_wg_64 (wgmma)", attn_bwd_dkv_wg_64, WG_BWD_THREADS, 64, DKV_WG_SMEM(WG_DKV_STAGES, 1)},
};


// Worst |x - ref| over the finite reference values, relative to the largest |ref|; NaN in x
// where the reference is finite counts as a mismatch.
static double rel_err(const std::vector<unsigned short>& x, const std::vector<float>& ref, long* bad) {
    double e = 0, top = 1e-30;
    for (size_t i = 0; i < ref.size(); ++i) top = fmax(top, fabs(ref[i]));
    for (size_t i = 0; i < ref.size(); ++i) {
        const float v = from_bf(x[i]);
        if (std::isnan(v)) ++*bad;
        else e = fmax(e, fabs(v - ref[i]));
    }
    return e / top;
}

static void run_backward(const Case& c, bool time_it, bool once) {
    const size_t nq = (size_t)c.b * c.hq * c.s * c.d, nk = (size_t)c.b * c.hk * c.t * c.d;
    const size_t rows = (size_t)c.b * c.hq * c.s, krows = (size_t)c.b * c.hk * c.t;
    std::vector<unsigned short> hq(nq), hk(nk), hv(nk), hg(nq), out(nq > nk ? nq : nk);
    srand(2);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
    for (auto& x : hq) x = to_bf(rnd() * 2.f);
    for (auto& x : hk) x = to_bf(rnd() * 2.f);
    for (auto& x : hv) x = to_bf(rnd());
    for (auto& x : hg) x = to_bf(rnd());
    b16 *q, *k, *v, *o, *g, *dq, *dk, *dv;
    float *lse, *ro, *rl, *rdq, *rdk, *rdv, *rdd, *delta;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&k, nk * 2));
    CK(cudaMalloc(&v, nk * 2));
    CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&g, nq * 2));
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, nk * 2));
    CK(cudaMalloc(&dv, nk * 2));
    CK(cudaMalloc(&lse, rows * 4));
    CK(cudaMalloc(&ro, nq * 4));
    CK(cudaMalloc(&rl, rows * 4));
    CK(cudaMalloc(&rdq, nq * 4));
    CK(cudaMalloc(&rdk, nk * 4));
    CK(cudaMalloc(&rdv, nk * 4));
    CK(cudaMalloc(&rdd, rows * 4));
    CK(cudaMalloc(&delta, rows * 8));
    CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(g, hg.data(), nq * 2, cudaMemcpyHostToDevice));
    AttnArgs a;
    memset(&a, 0, sizeof a);
    char* ptrs[9] = {(char*)q, (char*)k, (char*)v, (char*)o, (char*)lse, (char*)g, (char*)dq, (char*)dk, (char*)dv};
    for (int i = 0; i < 9; ++i) a.p[i] = ptrs[i];
    a.delta = (char*)delta;
    const i64 qs[4] = {(i64)c.hq * c.s * c.d, (i64)c.s * c.d, c.d, 1}, ks[4] = {(i64)c.hk * c.t * c.d, (i64)c.t * c.d, c.d, 1};
    for (int e = 0; e < 4; ++e) {
        a.st[0][e] = a.st[3][e] = a.st[5][e] = a.st[6][e] = qs[e];
        a.st[1][e] = a.st[2][e] = a.st[7][e] = a.st[8][e] = ks[e];
    }
    a.st[4][0] = (i64)c.hq * c.s, a.st[4][1] = c.s, a.st[4][2] = 1;
    a.b = c.b, a.hq = c.hq, a.hk = c.hk, a.s = c.s, a.t = c.t, a.d = c.d, a.scale = c.scale, a.causal = c.causal;
    // The kernels' o and lse from the mma.sync forward; the reference's from the reference.
    const int fsmem = 3 * 2 * 64 * 72 * 2;
    CK(cudaFuncSetAttribute(attn_fwd_tc_64, cudaFuncAttributeMaxDynamicSharedMemorySize, fsmem));
    attn_fwd_tc_64<<<c.b * c.hq * ((c.s + 127) / 128), TC_THREADS, fsmem>>>(a);
    reference<<<(rows + 127) / 128, 128>>>(a, ro, rl);
    if (!once) {
        reference_dq<<<(rows + 127) / 128, 128>>>(a, ro, rl, rdq, rdd);
        reference_dkv<<<(krows + 127) / 128, 128>>>(a, rl, rdd, rdk, rdv);
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> rq(nq), rk(nk), rv(nk), rd(rows), rlh(rows), hd(2 * rows);
    CK(cudaMemcpy(rq.data(), rdq, nq * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rk.data(), rdk, nk * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rv.data(), rdv, nk * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rd.data(), rdd, rows * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(rlh.data(), rl, rows * 4, cudaMemcpyDeviceToHost));
    printf("backward b%d hq%d hk%d s%d t%d d%d causal%d scale%+.3f\n", c.b, c.hq, c.hk, c.s, c.t, c.d, c.causal, c.scale);
    std::vector<unsigned short> ho(nq), hk2(nk);
    for (const Variant& var : dq_variants) {
        CK(cudaFuncSetAttribute(var.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, var.smem));
        const int blocks = c.b * c.hq * ((c.s + var.rows - 1) / var.rows);
        CK(cudaMemset(dq, 0xff, nq * 2));
        CK(cudaMemset(delta, 0xff, rows * 8));
        var.fn<<<blocks, var.threads, var.smem>>>(a);
        CK(cudaDeviceSynchronize());
        if (once) continue;
        CK(cudaMemcpy(ho.data(), dq, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hd.data(), delta, rows * 8, cudaMemcpyDeviceToHost));
        long bad = 0;
        const double e = rel_err(ho, rq, &bad);
        // D against the reference's (o in bf16 against f32: 1e-2 of D's scale), lse·log2 e.
        double ed = 0, el = 0;
        for (size_t r = 0; r < rows; ++r) {
            ed = fmax(ed, fabs(hd[r] - rd[r]));
            const float l2 = std::isnan(rlh[r]) ? 0.f : rlh[r] * 1.4426950408889634f;
            el = fmax(el, fabs(hd[rows + r] - l2));
        }
        const bool ok = e < 1e-2 && bad == 0 && ed < 2e-2 && el < 1e-3;
        printf("  %-30s dq rel err %.2e  D err %.2e  lse2 err %.2e  NaN %ld  %s", var.name, e, ed, el, bad, ok ? "ok" : "MISMATCH");
        if (time_it) printf("  %.4f ms", time_kernel(var, blocks, a));
        printf("\n");
    }
    // The dK/dV passes read D and lse·log2 e as the last dq pass (the wgmma one) wrote them.
    for (const Variant& var : dkv_variants) {
        CK(cudaFuncSetAttribute(var.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, var.smem));
        const int blocks = c.b * c.hk * ((c.t + var.rows - 1) / var.rows);
        CK(cudaMemset(dk, 0xff, nk * 2));
        CK(cudaMemset(dv, 0xff, nk * 2));
        var.fn<<<blocks, var.threads, var.smem>>>(a);
        CK(cudaDeviceSynchronize());
        if (once) continue;
        long bad = 0;
        CK(cudaMemcpy(hk2.data(), dk, nk * 2, cudaMemcpyDeviceToHost));
        const double ek = rel_err(hk2, rk, &bad);
        CK(cudaMemcpy(hk2.data(), dv, nk * 2, cudaMemcpyDeviceToHost));
        const double ev = rel_err(hk2, rv, &bad);
        const bool ok = ek < 1e-2 && ev < 1e-2 && bad == 0;
        printf("  %-30s dk rel err %.2e  dv rel err %.2e  NaN %ld  %s", var.name, ek, ev, bad, ok ? "ok" : "MISMATCH");
        if (time_it) printf("  %.4f ms", time_kernel(var, blocks, a));
        printf("\n");
    }
    // Grouped queries: the dK/dV pass with the query heads shared out among `split` blocks per
    // key tile (2, 4, ... and the group size, where that many parts are not empty), then the
    // sum of the parts.
    for (int split = 2; c.hq != c.hk && split <= c.hq / c.hk; split = split == c.hq / c.hk ? split + 1 : min(2 * split, c.hq / c.hk)) {
        const int group = c.hq / c.hk, per = (group + split - 1) / split, parts = (group + per - 1) / per;
        if (parts != split) continue;
        float* part;
        CK(cudaMalloc(&part, (size_t)split * 2 * krows * 64 * 4));
        AttnArgs sa = a;
        sa.split = split, sa.partial = (char*)part;
        const Variant pass = {"attn_bwd_dkv_wg_64 + sum", attn_bwd_dkv_wg_64, WG_BWD_THREADS, 64,
                              DKV_WG_SMEM(WG_DKV_STAGES, 1)};
        const Variant sum = {"attn_bwd_dkv_sum", attn_bwd_dkv_sum, 256, 0, 0};
        const int blocks = c.b * c.hk * ((c.t + 63) / 64) * split, sblocks = (int)((krows * 32 + 255) / 256);
        CK(cudaMemset(dk, 0xff, nk * 2));
        CK(cudaMemset(dv, 0xff, nk * 2));
        pass.fn<<<blocks, pass.threads, pass.smem>>>(sa);
        sum.fn<<<sblocks, 256>>>(sa);
        CK(cudaDeviceSynchronize());
        if (!once) {
            long bad = 0;
            CK(cudaMemcpy(hk2.data(), dk, nk * 2, cudaMemcpyDeviceToHost));
            const double ek = rel_err(hk2, rk, &bad);
            CK(cudaMemcpy(hk2.data(), dv, nk * 2, cudaMemcpyDeviceToHost));
            const double ev = rel_err(hk2, rv, &bad);
            const bool ok = ek < 1e-2 && ev < 1e-2 && bad == 0;
            printf("  %-24s in %d parts dk rel err %.2e  dv rel err %.2e  NaN %ld  %s", pass.name, split, ek, ev, bad,
                   ok ? "ok" : "MISMATCH");
            if (time_it) printf("  %.4f + %.4f ms", time_kernel(pass, blocks, sa), time_kernel(sum, sblocks, sa));
            printf("\n");
        }
        cudaFree(part);
    }
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)g, (void*)dq, (void*)dk, (void*)dv, (void*)lse,
                    (void*)ro, (void*)rl, (void*)rdq, (void*)rdk, (void*)rdv, (void*)rdd, (void*)delta})
        cudaFree(p);
}

// `profile` / `bwdprofile`: the timing case alone, each variant launched once (for ncu);
// `fwd` / `bwd`: the checks of one direction.
int main(int argc, char** argv) {
    const Case cases[] = {
        {1, 2, 2, 128, 128, 64, false, 0.125},
        {1, 2, 2, 128, 128, 64, true, 0.125},
        {2, 4, 2, 200, 200, 64, true, 0.125},
        {1, 2, 1, 77, 300, 64, true, 0.125},
        {1, 2, 1, 300, 77, 64, true, 0.125},
        {1, 2, 2, 190, 130, 40, false, -0.2},
        {2, 14, 2, 333, 333, 64, true, 0.125},
        {8, 16, 16, 1024, 1024, 64, true, 0.125},
    };
    const size_t n = sizeof cases / sizeof cases[0];
    // The grouped-query shape of the SFT step (Qwen2.5-0.5B at batch 8 × 1024), backward only.
    const Case step = {8, 14, 2, 1024, 1024, 64, true, 0.125};
    const char* mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "profile")) run_case(cases[n - 1], false);
    if (!strcmp(mode, "bwdprofile")) run_backward(cases[n - 1], false, true);
    if (!*mode || !strcmp(mode, "fwd")) {
        for (size_t i = 0; i < n; ++i) run_case(cases[i], i + 1 == n);
    }
    if (!*mode || !strcmp(mode, "bwd")) {
        for (size_t i = 0; i < n; ++i) run_backward(cases[i], i + 1 == n, false);
        run_backward(step, true, false);
    }
    return 0;
}
