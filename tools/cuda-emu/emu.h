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
#include <stdio.h>
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

/* a warp vote: every lane publishes its predicate, all wait, each reads
 * all of them, all wait again */
static inline int __any_sync(unsigned mask, int pred) {
    (void)mask;
    *toy_emu_lane_slot(-1) = pred != 0;
    toy_emu_syncwarp();
    int any = 0;
    for (int l = 0; l < 32; l++) any |= *toy_emu_lane_slot(l) != 0;
    toy_emu_syncwarp();
    return any;
}

/* mma.sync.m16n8k16 with BF16 A, B and F32 C, D (toy_mma_bf16 in
 * kernels-common.cuh), in the PTX fragment layout, which unlike wmma's is
 * fixed: lane 4 g + t holds A[g][2t, 2t+1], A[g+8][2t, 2t+1], A[g][2t+8,
 * 2t+9], A[g+8][2t+8, 2t+9] (a[0..3], the lower column in the low half),
 * B[2t, 2t+1][g] and B[2t+8, 2t+9][g] (b[0..1]), and C[g][2t], C[g][2t+1],
 * C[g+8][2t], C[g+8][2t+1]. Each lane publishes its registers in five
 * rounds through the warp's exchange slots and computes its own four
 * results, so a kernel that puts an element in the wrong lane or register
 * gets a wrong product, as on a GPU. */
extern "C" void toy_emu_wmma_op(void);
static inline float toy_emu_f32(uint32_t v) {
    float f;
    memcpy(&f, &v, 4);
    return f;
}
static inline uint32_t toy_emu_u32(float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    return v;
}
static inline float toy_emu_bf_lo(uint32_t v) { return toy_emu_f32(v << 16); }
static inline float toy_emu_bf_hi(uint32_t v) { return toy_emu_f32(v & 0xffff0000u); }
static inline void toy_emu_mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
    toy_emu_wmma_op();
    uint64_t mine[5], all[5][32];
    mine[0] = a[0] | (uint64_t)a[1] << 32;
    mine[1] = a[2] | (uint64_t)a[3] << 32;
    mine[2] = b[0] | (uint64_t)b[1] << 32;
    mine[3] = toy_emu_u32(c[0]) | (uint64_t)toy_emu_u32(c[1]) << 32;
    mine[4] = toy_emu_u32(c[2]) | (uint64_t)toy_emu_u32(c[3]) << 32;
    for (int r = 0; r < 5; r++) {
        *toy_emu_lane_slot(-1) = mine[r];
        toy_emu_syncwarp();
        for (int l = 0; l < 32; l++) all[r][l] = *toy_emu_lane_slot(l);
        toy_emu_syncwarp();
    }
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        uint32_t r0 = (uint32_t)all[0][l], r1 = (uint32_t)(all[0][l] >> 32), r2 = (uint32_t)all[1][l],
                 r3 = (uint32_t)(all[1][l] >> 32), b0 = (uint32_t)all[2][l], b1 = (uint32_t)(all[2][l] >> 32);
        A[g][2 * t] = toy_emu_bf_lo(r0), A[g][2 * t + 1] = toy_emu_bf_hi(r0);
        A[g + 8][2 * t] = toy_emu_bf_lo(r1), A[g + 8][2 * t + 1] = toy_emu_bf_hi(r1);
        A[g][2 * t + 8] = toy_emu_bf_lo(r2), A[g][2 * t + 9] = toy_emu_bf_hi(r2);
        A[g + 8][2 * t + 8] = toy_emu_bf_lo(r3), A[g + 8][2 * t + 9] = toy_emu_bf_hi(r3);
        B[2 * t][g] = toy_emu_bf_lo(b0), B[2 * t + 1][g] = toy_emu_bf_hi(b0);
        B[2 * t + 8][g] = toy_emu_bf_lo(b1), B[2 * t + 9][g] = toy_emu_bf_hi(b1);
        C[g][2 * t] = toy_emu_f32((uint32_t)all[3][l]), C[g][2 * t + 1] = toy_emu_f32((uint32_t)(all[3][l] >> 32));
        C[g + 8][2 * t] = toy_emu_f32((uint32_t)all[4][l]), C[g + 8][2 * t + 1] = toy_emu_f32((uint32_t)(all[4][l] >> 32));
    }
    int lane = (int)(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float acc = C[row][col];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[e] = acc;
    }
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

/* ---- tensor cores: nvcuda::wmma (16 x 16 x 16 tiles) ----------------------------------
 * <mma.h> declares nothing for a host compiler; these stand in. A fragment
 * here holds its whole tile (as floats: a BF16 / F16 value converts
 * exactly) in every lane, where a GPU spreads it over the warp's registers,
 * so an mma needs nothing from the other lanes. What the GPU's layout
 * would make visible is kept: each lane loads a tile at its own time (a
 * tile written by other lanes must be behind a __syncwarp or
 * __syncthreads), and stores only its share of a tile (elements e with
 * e % 32 == lane), so a lane that reads a stored tile before a __syncwarp
 * reads stale values. load/store_matrix_sync check what the hardware
 * requires: a 32-byte aligned pointer and ldm a multiple of 16 bytes; and
 * every lane of a warp must make the same calls between two barriers. */
extern "C" void toy_emu_fault(const char *what);
/* counts this thread's wmma calls: at each barrier every lane of a warp
 * must have made as many (tensor-core calls are warp-wide) */
extern "C" void toy_emu_wmma_op(void);
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16 x 16 x 16 tiles only");
    static_assert(std::is_same<Use, accumulator>::value ? std::is_same<T, float>::value
                                                        : (std::is_same<T, __nv_bfloat16>::value ||
                                                           std::is_same<T, __half>::value),
                  "the emulator has bf16 / f16 operands and f32 accumulators only");
    enum { num_elements = 256 };
    float x[256]; /* row-major: the element (r, c) of the 16 x 16 tile is x[16 r + c] */
};

static inline void toy_emu_wmma_check(const void *p, unsigned ldm, size_t esize, const char *fn) {
    char m[160];
    if ((uintptr_t)p % 32) snprintf(m, sizeof m, "wmma::%s: pointer %p is not 32-byte aligned", fn, p);
    else if ((ldm * esize) % 16) snprintf(m, sizeof m, "wmma::%s: ldm %u is not a multiple of 16 bytes", fn, ldm);
    else return;
    toy_emu_fault(m);
}

template <class T> static inline float toy_emu_wf(T v) { return (float)v; }
template <> inline float toy_emu_wf<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> inline float toy_emu_wf<__half>(__half v) { return __half2float(v); }

template <class Use, class T, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
    static_assert(!std::is_same<Use, accumulator>::value, "an accumulator load takes a layout");
    toy_emu_wmma_op();
    toy_emu_wmma_check(p, ldm, sizeof(T), "load_matrix_sync");
    bool rm = std::is_same<L, row_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[16 * r + c] = toy_emu_wf(rm ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]);
}

static inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm,
                                    layout_t l) {
    toy_emu_wmma_op();
    toy_emu_wmma_check(p, ldm, 4, "load_matrix_sync");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[16 * r + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}

static inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm,
                                     layout_t l) {
    toy_emu_wmma_op();
    toy_emu_wmma_check(p, ldm, 4, "store_matrix_sync");
    for (int e = (int)(threadIdx.x % 32); e < 256; e += 32) {
        int r = e / 16, c = e % 16;
        p[l == mem_row_major ? (size_t)r * ldm + c : (size_t)c * ldm + r] = f.x[e];
    }
}

template <class Use, class T, class L> static inline void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, float v) {
    for (int e = 0; e < 256; e++) f.x[e] = toy_emu_wf((T)v);
}

/* d = a b + c, f32 accumulation (d may be c) */
template <class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, T, LB> &b,
                            const fragment<accumulator, 16, 16, 16, float> &c) {
    toy_emu_wmma_op();
    float out[256];
    for (int m = 0; m < 16; m++) {
        float row[16];
        for (int n = 0; n < 16; n++) row[n] = c.x[16 * m + n];
        for (int k = 0; k < 16; k++) {
            float av = a.x[16 * m + k];
            for (int n = 0; n < 16; n++) row[n] += av * b.x[16 * k + n];
        }
        for (int n = 0; n < 16; n++) out[16 * m + n] = row[n];
    }
    memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda

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
