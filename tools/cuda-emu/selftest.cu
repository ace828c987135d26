/* selftest.cu: the CPU emulator's own checks (built by make CUDA_EMU=1,
 * run by its check-cuda). Each catch the
 * emulator claims (tools/cuda-emu/emu.h) is a kernel here that must be
 * caught, so a change that quietly stops catching it fails this program:
 *   - warp shuffles and a block reduction give the right sums;
 *   - a read of shared memory another thread writes without a barrier
 *     between sees the old value for some thread (the random order);
 *   - blocks do not run in index order;
 *   - __syncthreads inside `if (lane == 0)`, the other lanes at a shuffle,
 *     is a launch failure, not a hang;
 *   - a launch of 2048 threads, or 64 KiB of dynamic shared memory, is
 *     refused; a captured graph replays its launches and memsets.
 * Prints one line per check and "N passed, M failed"; exit 1 on a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

static int passed, failed;
static void check(bool ok, const char *what) {
    printf("%s  %s\n", ok ? "ok  " : "FAIL", what);
    if (ok) passed++;
    else failed++;
}

__global__ void k_reduce(const float *x, float *out, int n) {
    __shared__ float part[32];
    float v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) *out = v;
    }
}

/* thread t reads what thread t+1 writes, with no barrier between */
__global__ void k_race(int *out) {
    __shared__ int s[64];
    s[threadIdx.x] = (int)threadIdx.x + 1;
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

/* the order blocks start in */
__global__ void k_order(int *counter, int *order) {
    if (threadIdx.x == 0) order[blockIdx.x] = atomicAdd(counter, 1);
}

/* lane 0 of each warp waits at __syncthreads, the other lanes at a shuffle
 * that needs lane 0: on a GPU, a hang */
__global__ void k_divergent_barrier(float *x) {
    if (threadIdx.x % 32 == 0) __syncthreads();
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

__global__ void k_fill(float *x, float v, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += v;
}

__global__ void k_dyn_smem(float *x) {
    extern __shared__ float dyn[];
    dyn[threadIdx.x] = 1.0f;
    x[threadIdx.x] = dyn[threadIdx.x];
}

int main(void) {
    float *x, *out;
    int *iv, *cnt;
    cudaMalloc((void **)&x, 4096 * sizeof(float));
    cudaMalloc((void **)&out, sizeof(float));
    cudaMalloc((void **)&iv, 256 * sizeof(int));
    cudaMalloc((void **)&cnt, sizeof(int));

    for (int i = 0; i < 1000; i++) x[i] = (float)(i % 7);
    double want = 0;
    for (int i = 0; i < 1000; i++) want += i % 7;
    k_reduce<<<1, 256>>>(x, out, 1000);
    check(cudaGetLastError() == cudaSuccess && *out == (float)want, "shuffles and a block reduction sum 1000 values");

    bool raced = false;
    for (int rep = 0; rep < 8 && !raced; rep++) {
        memset(iv, 0, 64 * sizeof(int));
        k_race<<<1, 64>>>(iv);
        for (int t = 0; t < 64; t++) raced |= iv[t] != (t + 1) % 64 + 1;
    }
    check(raced, "a shared-memory read with no barrier after the write sees the old value");

    *cnt = 0;
    k_order<<<200, 32>>>(cnt, iv);
    bool in_order = true;
    for (int b = 0; b < 200; b++) in_order &= iv[b] == b;
    check(*cnt == 200 && !in_order, "blocks run in a scrambled order");

    k_divergent_barrier<<<1, 64>>>(x);
    check(cudaGetLastError() == cudaErrorLaunchFailure, "a __syncthreads that lanes waiting at a shuffle never reach fails the launch");

    k_fill<<<1, 2048>>>(x, 1.0f, 16);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "a block of 2048 threads is refused");
    k_dyn_smem<<<1, 32, 64 << 10>>>(x);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "64 KiB of dynamic shared memory is refused");
    k_dyn_smem<<<1, 32, 32 * sizeof(float)>>>(x);
    check(cudaGetLastError() == cudaSuccess && x[31] == 1.0f, "dynamic shared memory within the limit works");

    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaGraph_t g;
    cudaGraphExec_t e;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture begins");
    cudaMemsetAsync(x, 0, 16 * sizeof(float), s);
    k_fill<<<2, 32, 0, s>>>(x, 2.0f, 16);
    k_fill<<<2, 32, 0, s>>>(x, 0.5f, 16);
    bool untouched = x[5] == 1.0f; /* recorded, not run */
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&e, g, 0);
    bool ok = untouched;
    for (int rep = 0; rep < 2; rep++) {
        x[5] = 99.0f;
        ok &= cudaGraphLaunch(e, s) == cudaSuccess && x[5] == 2.5f;
    }
    check(ok, "a captured graph records its memset and launches and replays them");
    cudaGraphExecDestroy(e);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);

    cudaFree(x);
    cudaFree(out);
    cudaFree(iv);
    cudaFree(cnt);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
