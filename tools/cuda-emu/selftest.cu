/* selftest.cu: the CPU emulator's own checks (built by make CUDA_EMU=1,
 * run by its check-cuda). Each catch the
 * emulator claims (tools/cuda-emu/emu.h) is a kernel here that must be
 * caught, so a change that quietly stops catching it fails this program:
 *   - warp shuffles and a block reduction give the right sums;
 *   - a read of shared memory another thread writes without a barrier
 *     between sees the old value for some thread (the random order);
 *   - blocks, and the threads of a block, run in TOY_EMU_ORDER's order:
 *     forward in index order, reverse the other way round, shuffled
 *     (the default) in neither;
 *   - __syncthreads inside `if (lane == 0)`, the other lanes at a shuffle,
 *     is a launch failure, not a hang;
 *   - a launch of 2048 threads, or 64 KiB of dynamic shared memory, is
 *     refused; a captured graph replays its launches and memsets;
 *   - wmma tiles (BF16 operands in both layouts, F32 accumulators loaded
 *     and stored in both) multiply as a plain loop does; a tile the lanes
 *     write and load_matrix_sync reads with no __syncwarp between is read
 *     stale by some lane; a misaligned tile pointer, or wmma calls that only
 *     some lanes of a warp make, fail the launch;
 *   - mma.sync m16n8k16 fragments in the PTX layout multiply as a loop does.
 * Prints one line per check and "N passed, M failed"; exit 1 on a failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

using namespace nvcuda;
typedef __nv_bfloat16 bf16;

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

/* per warp: whether any lane's value is `hit` */
__global__ void k_vote(const int *x, int *out, int hit) {
    int any = __any_sync(0xffffffffu, x[threadIdx.x] == hit);
    if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = any;
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

/* the order a block's threads start in */
__global__ void k_thread_order(int *counter, int *order) { order[threadIdx.x] = atomicAdd(counter, 1); }

/* whether order[0..n) is 0, 1, ... (up) or n - 1, n - 2, ... (down) */
static bool ascending(const int *order, int n) {
    for (int i = 0; i < n; i++)
        if (order[i] != i) return false;
    return true;
}
static bool descending(const int *order, int n) {
    for (int i = 0; i < n; i++)
        if (order[i] != n - 1 - i) return false;
    return true;
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

/* out = A0 Bc + A1 Br + C0 (16 x 16 tiles): A (16 x 32, row-major), Bc read
 * column-major from X (X[n][k] = Bc[k][n]), Br row-major from Y, C0 loaded
 * row-major; the result stored row-major to out and column-major to outT */
__global__ void k_wmma(const bf16 *A, const bf16 *X, const bf16 *Y, const float *C0, float *out, float *outT) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a0, a1;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bc;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> br;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(a0, A, 32);
    wmma::load_matrix_sync(a1, A + 16, 32);
    wmma::load_matrix_sync(bc, X, 16);
    wmma::load_matrix_sync(br, Y, 16);
    wmma::load_matrix_sync(c, C0, 16, wmma::mem_row_major);
    wmma::mma_sync(c, a0, bc, c);
    wmma::mma_sync(c, a1, br, c);
    wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
    wmma::store_matrix_sync(outT, c, 16, wmma::mem_col_major);
}

/* out = A B for the 16 x 16 tiles at a (row-major) and b (column-major);
 * with `all` false only lanes 0..15 make the mma_sync */
__device__ void tile_product(const bf16 *a, const bf16 *b, float *out, bool all) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::fill_fragment(c, 0.0f);
    if (all || threadIdx.x < 16) wmma::mma_sync(c, fa, fb, c);
    wmma::store_matrix_sync(out, c, 16, wmma::mem_row_major);
}

/* each lane writes its share of a tile of v's, then the warp multiplies
 * it by itself: every element is 16 v^2, unless a lane loaded before the
 * others had written (no __syncwarp; v changes from launch to launch, as
 * what a block finds in shared memory is not what the last one left) */
__global__ void k_wmma_sync(float *out, bool sync, float v) {
    __shared__ __align__(32) bf16 tile[256];
    for (int e = threadIdx.x; e < 256; e += 32) tile[e] = __float2bfloat16(v);
    if (sync) __syncwarp();
    tile_product(tile, tile, out, true);
}

/* only half the lanes of the warp multiply: on a GPU, a hang or garbage */
__global__ void k_wmma_divergent(const bf16 *A, float *out) { tile_product(A, A, out, false); }

/* a tile 8 bytes past an aligned start */
__global__ void k_wmma_misaligned(const bf16 *A, float *out) { tile_product(A + 4, A, out, true); }

/* mma.sync.m16n8k16 (toy_emu_mma_bf16): each lane takes its fragment of
 * A (16 x 16), B (16 x 8, row-major here) and C from memory in the PTX
 * layout and writes its part of D back the same way */
__global__ void k_mma(const bf16 *A, const bf16 *B, const float *C, float *D) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    auto pair = [](bf16 lo, bf16 hi) {
        uint16_t l, h;
        memcpy(&l, &lo, 2);
        memcpy(&h, &hi, 2);
        return (uint32_t)l | (uint32_t)h << 16;
    };
    uint32_t a[4], b[2];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
        a[i] = pair(A[16 * row + col], A[16 * row + col + 1]);
    }
    for (int i = 0; i < 2; i++) b[i] = pair(B[8 * (2 * t + 8 * i) + g], B[8 * (2 * t + 8 * i + 1) + g]);
    float c[4], d[4];
    for (int e = 0; e < 4; e++) c[e] = C[8 * (g + 8 * (e / 2)) + 2 * t + e % 2];
    toy_emu_mma_bf16(d, a, b, c);
    for (int e = 0; e < 4; e++) D[8 * (g + 8 * (e / 2)) + 2 * t + e % 2] = d[e];
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

    for (int i = 0; i < 96; i++) iv[i] = i == 37 || i == 70 || i == 71 ? 7 : 0;
    iv[100] = iv[101] = iv[102] = -1;
    k_vote<<<1, 96>>>(iv, iv + 100, 7);
    check(cudaGetLastError() == cudaSuccess && iv[100] == 0 && iv[101] == 1 && iv[102] == 1, "__any_sync votes per warp");

    bool raced = false;
    for (int rep = 0; rep < 8 && !raced; rep++) {
        memset(iv, 0, 64 * sizeof(int));
        k_race<<<1, 64>>>(iv);
        for (int t = 0; t < 64; t++) raced |= iv[t] != (t + 1) % 64 + 1;
    }
    check(raced, "a shared-memory read with no barrier after the write sees the old value");

    /* TOY_EMU_ORDER as the emulator reads it (it refuses anything else) */
    const char *order = getenv("TOY_EMU_ORDER");
    bool fwd = order && !strcmp(order, "forward"), rev = order && !strcmp(order, "reverse");
    *cnt = 0;
    k_order<<<200, 32>>>(cnt, iv);
    bool up = ascending(iv, 200), down = descending(iv, 200);
    check(*cnt == 200 && (fwd ? up : rev ? down : !up && !down), fwd   ? "forward: blocks run in index order"
                                                                : rev ? "reverse: blocks run in reverse index order"
                                                                      : "blocks run in a scrambled order");
    /* 64 threads: two warps, the order across warps and within each */
    bool all_up = true, all_down = true;
    for (int rep = 0; rep < 8; rep++) {
        *cnt = 0;
        k_thread_order<<<1, 64>>>(cnt, iv);
        all_up &= ascending(iv, 64);
        all_down &= descending(iv, 64);
    }
    check(fwd ? all_up : rev ? all_down : !all_up && !all_down,
          fwd   ? "forward: threads run in index order, warp after warp"
          : rev ? "reverse: threads run in reverse index order"
                : "threads run in varying orders");

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

    bf16 *A, *X, *Y;
    float *C0, *wo, *woT;
    cudaMalloc((void **)&A, 512 * sizeof(bf16));
    cudaMalloc((void **)&X, 256 * sizeof(bf16));
    cudaMalloc((void **)&Y, 256 * sizeof(bf16));
    cudaMalloc((void **)&C0, 256 * sizeof(float));
    cudaMalloc((void **)&wo, 256 * sizeof(float));
    cudaMalloc((void **)&woT, 256 * sizeof(float));
    for (int i = 0; i < 512; i++) A[i] = __float2bfloat16((float)(i * 37 % 11) - 5.0f);
    for (int i = 0; i < 256; i++) {
        X[i] = __float2bfloat16((float)(i * 13 % 7) - 3.0f);
        Y[i] = __float2bfloat16((float)(i * 29 % 5) - 2.0f);
        C0[i] = (float)(i % 9) * 0.5f;
    }
    k_wmma<<<1, 32>>>(A, X, Y, C0, wo, woT);
    ok = cudaGetLastError() == cudaSuccess;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            double want = C0[16 * m + n];
            for (int k = 0; k < 16; k++)
                want += (double)__bfloat162float(A[32 * m + k]) * __bfloat162float(X[16 * n + k]) +
                        (double)__bfloat162float(A[32 * m + 16 + k]) * __bfloat162float(Y[16 * k + n]);
            ok &= wo[16 * m + n] == (float)want && woT[16 * n + m] == (float)want;
        }
    check(ok, "wmma: a 16 x 32 x 16 product in both operand layouts, accumulators loaded and stored both ways");
    k_wmma_sync<<<1, 32>>>(wo, true, 1.0f);
    ok = cudaGetLastError() == cudaSuccess;
    for (int i = 0; i < 256; i++) ok &= wo[i] == 16.0f;
    check(ok, "wmma: a tile written by the lanes, __syncwarp, then loaded, multiplies right");
    raced = false;
    for (int rep = 0; rep < 8 && !raced; rep++) {
        k_wmma_sync<<<1, 32>>>(wo, false, 2.0f + rep);
        for (int i = 0; i < 256; i++) raced |= wo[i] != 16.0f * (2.0f + rep) * (2.0f + rep);
    }
    check(raced, "wmma: a tile loaded with no __syncwarp after the lanes wrote it is read stale");
    k_wmma_divergent<<<1, 32>>>(A, wo);
    check(cudaGetLastError() == cudaErrorLaunchFailure, "wmma: an mma_sync that only some lanes of the warp make fails the launch");
    /* mma.sync: A's first 16 columns, X as a 16 x 8 B, C0's first 128 */
    k_mma<<<1, 32>>>(A, X, C0, wo);
    ok = cudaGetLastError() == cudaSuccess;
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++) {
            double want = C0[8 * m + n];
            for (int k = 0; k < 16; k++) want += (double)__bfloat162float(A[16 * m + k]) * __bfloat162float(X[8 * k + n]);
            ok &= wo[8 * m + n] == (float)want;
        }
    check(ok, "mma.sync m16n8k16: fragments in the PTX layout multiply as a plain loop does");
    k_wmma_misaligned<<<1, 32>>>(A, wo);
    check(cudaGetLastError() == cudaErrorLaunchFailure, "wmma: a tile pointer that is not 32-byte aligned fails the launch");
    cudaFree(A);
    cudaFree(X);
    cudaFree(Y);
    cudaFree(C0);
    cudaFree(wo);
    cudaFree(woT);

    cudaFree(x);
    cudaFree(out);
    cudaFree(iv);
    cudaFree(cnt);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
