// Host cost of one cuLaunchKernel of a tiny kernel: the floor under the "small-op overhead"
// row of cuda_bench. On the GPU machine: nvcc -O2 -o launch launch_floor.cu -lcuda && ./launch
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <vector>
#include <algorithm>
__global__ void add16(const float* a, const float* b, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i];
}
int main() {
    float *a, *y;
    cudaMalloc(&a, 64); cudaMalloc(&y, 64);
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    CUfunction f; cudaGetFuncBySymbol((cudaFunction_t*)&f, (const void*)add16);
    int n = 16;
    void* args[] = {&a, &a, &y, &n};
    for (int i = 0; i < 200; ++i) cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, args, nullptr);
    cudaStreamSynchronize(s);
    for (int batch : {100, 1000, 5000}) {
        std::vector<double> v;
        for (int r = 0; r < 7; ++r) {
            auto t = std::chrono::steady_clock::now();
            for (int i = 0; i < batch; ++i) cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, args, nullptr);
            double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / batch;
            cudaStreamSynchronize(s);
            v.push_back(us);
        }
        std::sort(v.begin(), v.end());
        // GPU side: time of the batch to drain.
        auto t = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; ++i) cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, args, nullptr);
        cudaStreamSynchronize(s);
        double all = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / batch;
        printf("cuLaunchKernel, %d back-to-back: host %.2f us per launch (median of 7); launch+drain %.2f us per kernel\n", batch, v[3], all);
    }
    return 0;
}
