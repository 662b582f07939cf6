// Kernel dev harness for the tensor-core attention forwards: checks `attn_fwd_wg_64` (Hopper,
// wgmma) and `attn_fwd_tc_64` (mma.sync) against a plain f32 reference on a few shapes and
// masks, then times them on the benchmark shape (B8 H16 S1024 D64 causal). The kernels are
// the plugin's own sources, compiled here with nvcc instead of NVRTC (on the GPU machine):
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -DELEM=b16 -DIS_FLOAT=1 -o attention_dev \
//        backend-cuda/scripts/attention_dev.cu && ./attention_dev
//
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include "../src/kernels/common.cuh"
#include "../src/kernels/attention.cu"

// The Hopper forward at another stage count (the plugin's `attn_fwd_wg_64` has WG_STAGES).
template <int S> __global__ void __launch_bounds__(WG_THREADS, 2) wg_stages(const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    ASMEM;
    attn_fwd_wg<S>(a, (T*)smem_raw);
#endif
}
struct Variant {
    const char* name;
    void (*fn)(const AttnArgs);
    int threads, rows, smem;
};
#define WG_SMEM(S) ((WG_BM * 64 + S * 2 * WG_BN * 64) * 2 + 1024)
static const Variant variants[] = {
    {"attn_fwd_tc_64 (mma.sync)", attn_fwd_tc_64, TC_THREADS, 128, 3 * 2 * 64 * 72 * 2},
    {"attn_fwd_wg_64 (wgmma)", attn_fwd_wg_64, WG_THREADS, WG_BM, WG_SMEM(WG_STAGES)},
    {"attn_fwd_wg, 4 stages", wg_stages<4>, WG_THREADS, WG_BM, WG_SMEM(4)},
    {"attn_fwd_wg, 3 stages", wg_stages<3>, WG_THREADS, WG_BM, WG_SMEM(3)},
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

struct Case {
    int b, hq, hk, s, t, d;
    bool causal;
    double scale;
};

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
        const int blocks = c.b * c.hq * ((c.s + var.rows - 1) / var.rows);
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
            cudaEvent_t x, y;
            CK(cudaEventCreate(&x));
            CK(cudaEventCreate(&y));
            float best = 1e9;
            for (int round = 0; round < 5; ++round) {
                for (int i = 0; i < 5; ++i) var.fn<<<blocks, var.threads, var.smem>>>(a);
                const int n = 50;
                CK(cudaEventRecord(x));
                for (int i = 0; i < n; ++i) var.fn<<<blocks, var.threads, var.smem>>>(a);
                CK(cudaEventRecord(y));
                CK(cudaEventSynchronize(y));
                float ms;
                CK(cudaEventElapsedTime(&ms, x, y));
                best = fminf(best, ms / n);
            }
            const double flops = 4.0 * c.b * c.hq * (double)c.s * c.t * c.d / (c.causal ? 2 : 1);
            printf("  %.4f ms  %.0f TFLOP/s", best, flops / (best * 1e-3) / 1e12);
        }
        printf("\n");
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(lse), cudaFree(ro), cudaFree(rl);
}

// `attention_dev profile`: the timing case alone, each variant launched once (for ncu).
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
    if (argc > 1) {
        run_case(cases[n - 1], false);
        return 0;
    }
    for (size_t i = 0; i < n; ++i) run_case(cases[i], i + 1 == n);
    return 0;
}
