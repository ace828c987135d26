/* emu.h: what CUDA device code needs to compile and run as plain C++ on the
 * CPU, for `make CUDA_EMU=1` (docs/cuda.md, "Without a GPU").
 *
 * The build rewrites each .cu file of src/backends/cuda/ (tools/cuda-emu/cu2cc.pl:
 * `k<<<grid, block, smem, stream>>>(args)` becomes a call of
 * toy_emu_launch, `extern __shared__ T x[]` a pointer to the launch's
 * dynamic shared memory) and compiles it with g++, this header included
 * first. Every GPU thread of a block then runs the kernel body as a fiber
 * (tools/cuda-emu/emu.cc): __syncthreads and the warp shuffles switch
 * fibers, so block reductions, shared-memory tiles and warp collectives
 * run as they would on a GPU, one block after another. What this checks is
 * the device code's own logic (indexing, tiling, barriers, launch shapes,
 * cuBLAS arguments); not timing, not the memory model, not the hardware's
 * rounding of fast-math intrinsics.
 */
#ifndef TOY_CUDA_EMU_H
#define TOY_CUDA_EMU_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

/* device code is host code here */
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __constant__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __constant__ static
/* one copy per function, which every block's threads share: blocks run
 * one at a time, so that is per-block shared memory */
#define __shared__ static
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)

/* the thread's coordinates, set by the scheduler before it runs a fiber */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static const int warpSize = 32;
/* the launch's dynamic shared memory (`extern __shared__` arrays) */
extern void *toy_emu_smem;

extern "C" {
/* block barrier and warp barrier: switch to the scheduler until every
 * live thread of the block (of the warp) has arrived */
void toy_emu_syncthreads(void);
void toy_emu_syncwarp(void);
/* this thread's slot in its warp's exchange area, and lane l's */
uint64_t *toy_emu_lane_slot(int lane);
/* a launch of `name` with this configuration: runs `body` for every
 * thread of the grid now, or records it while a stream is captured */
void toy_emu_submit(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                    std::function<void()> *body);
}

static inline void __syncthreads(void) { toy_emu_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    toy_emu_syncwarp();
}

/* every lane publishes its value, all wait, each reads its partner's,
 * all wait again (so the next exchange cannot overwrite a value unread) */
template <class T> static inline T toy_emu_shfl(T v, int src_lane) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a wide type");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    *toy_emu_lane_slot(-1) = bits;
    toy_emu_syncwarp();
    T r;
    uint64_t got = *toy_emu_lane_slot(src_lane & 31);
    memcpy(&r, &got, sizeof r);
    toy_emu_syncwarp();
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    (void)mask, (void)width;
    return toy_emu_shfl(v, (int)(threadIdx.x % 32) ^ lane_mask);
}

/* one fiber runs at a time: atomics are plain read-modify-writes */
template <class T> static inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}

/* the rounded intrinsics: IEEE single operations, which the host's are */
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }

/* `k<<<g, b, smem, s>>>(args...)` after cu2cc.pl:
 * `toy_emu_launch(toy_emu_config(g, b, smem, s), "k", [](auto... x) { k(x...); }, args...)`
 * (a lambda, so a kernel template's arguments are deduced at the call, as
 * nvcc deduces them) */
struct toy_emu_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
static inline toy_emu_cfg toy_emu_config(dim3 grid, dim3 block, size_t smem = 0, cudaStream_t s = 0) {
    return toy_emu_cfg{grid, block, smem, s};
}
template <class F, class... A> static void toy_emu_launch(toy_emu_cfg c, const char *name, F kernel, A &&...a) {
    /* the arguments are copied at launch, as the CUDA runtime does */
    std::tuple<typename std::decay<A>::type...> args(std::forward<A>(a)...);
    std::function<void()> body = [kernel, args]() { std::apply(kernel, args); };
    toy_emu_submit(name, c.grid, c.block, c.smem, c.stream, &body);
}

#endif
