/* emu.cc: the CPU emulator's runtime (tools/cuda-emu/emu.h says what it is
 * for): kernel launches run on fibers, one block at a time; stream capture
 * records launches, memsets and GEMMs for replay; cuBLAS's two GEMMs are
 * computed by a plain loop that checks their arguments as cuBLAS does.
 * The rest of the runtime (memory, copies, devices, events) is the mock's
 * (tools/cuda-mock.c). Built only by `make CUDA_EMU=1`.
 *
 * Scheduling: blocks run one at a time; a block runs warp by warp up to
 * its next __syncthreads, the lanes of a warp up to their next warp
 * barrier (a shuffle, __syncwarp), which opens when every live lane of the
 * warp is there; __syncthreads opens when every live thread of the block
 * is. The order of the blocks of a grid, of the warps of a block in each
 * pass and of the lanes of a warp in each pass is TOY_EMU_ORDER's:
 *   shuffle[:SEED]  (the default, seed 1) a random start and direction
 *                   each pass, a scrambled block order each launch;
 *   forward         0, 1, 2, ... every time;
 *   reverse         ..., 2, 1, 0 every time.
 * Device code that reads what another thread (another block) writes
 * without a barrier between then reads the wrong value in some order, as
 * it may on a GPU: forward and reverse run every two threads of a barrier
 * interval, and every two blocks of a grid, both ways round, which one
 * random order does only by chance. A barrier
 * that can never open (threads of a block waiting at different barriers)
 * and a shuffle with an exited or missing lane are launch failures with a
 * message naming the kernel, where a GPU would hang or return garbage.
 */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <functional>
#include <map>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#include "emu.h"

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
void *toy_emu_smem;

namespace {

enum state { RUNNABLE, AT_BARRIER, AT_WARP, DONE };
const size_t STACK = 256 << 10;
const size_t MAX_SMEM = 48 << 10; /* dynamic shared memory without an opt-in */

/* a switch between stacks: x86-64 saves the callee-saved registers on the
 * old stack and swaps the stack pointer (no system call, unlike
 * swapcontext, which saves the signal mask: 5x slower over the suite);
 * elsewhere ucontext */
#if defined(__x86_64__)
extern "C" void toy_emu_switch(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".globl toy_emu_switch\n"
        ".type toy_emu_switch,@function\n"
        "toy_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size toy_emu_switch, .-toy_emu_switch\n");
struct context {
    void *sp;
};
#else
struct context {
    ucontext_t uc;
};
#endif

struct fiber {
    context ctx;
    char *stack = nullptr; /* mmapped, a guard page below */
    state st = DONE;
    void *fake = nullptr; /* ASan's fake stack while switched away */
    unsigned long wmma = 0; /* wmma calls made in this block */
};

struct block_run {
    std::vector<fiber> th;
    std::vector<uint64_t> slot;
    int n = 0, cur = -1;
    std::function<void()> *body = nullptr;
    context sched;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    const char *name = "";
    char err[256] = "";
};
block_run B;
/* TOY_EMU_ORDER (the header comment), read at the first launch */
enum schedule { SHUFFLE, FORWARD, REVERSE } order = SHUFFLE;
unsigned rng = 1;
/* TOY_EMU_STATS=1: kernels, blocks and threads run, printed at exit;
 * TOY_EMU_KERNELS=FILE: the name of every kernel launched, a line each,
 * appended to FILE at exit (tools/cuda-emu/coverage.sh reads it) */
unsigned long long n_launch, n_block, n_thread, n_gemm, n_replay;
std::map<std::string, unsigned long long> *per_kernel;
const char *kernels_file;
void write_kernels() {
    FILE *f = fopen(kernels_file, "a");
    if (!f) return;
    std::string all; /* one write: processes of a parallel test run append to the same file */
    for (auto &k : *per_kernel) all += k.first + "\n";
    fwrite(all.data(), 1, all.size(), f);
    fclose(f);
}
void print_stats() {
    fprintf(stderr, "cuda-emu: %llu kernel launches, %llu blocks, %llu threads; %llu GEMMs; %llu graph replays\n",
            n_launch, n_block, n_thread, n_gemm, n_replay);
    for (auto &k : *per_kernel) fprintf(stderr, "cuda-emu:   %s %llu\n", k.first.c_str(), k.second);
}
cudaError_t last_error = cudaSuccess;

/* a launch error: sticky until cudaGetLastError, as the runtime's are */
void fail(cudaError_t e, const char *fmt, const char *name, const char *detail) {
    if (last_error == cudaSuccess) last_error = e;
    fprintf(stderr, "cuda-emu: kernel %s: ", name);
    fprintf(stderr, fmt, detail);
    fputc('\n', stderr);
}

void fiber_main();

void switch_to(context *save, context *to) {
#if defined(__x86_64__)
    toy_emu_switch(&save->sp, to->sp);
#else
    swapcontext(&save->uc, &to->uc);
#endif
}

/* a fresh fiber on stack [stack, stack + STACK) that starts in fiber_main */
void start_context(context *c, char *stack) {
#if defined(__x86_64__)
    void **sp = (void **)(stack + STACK); /* 16-byte aligned */
    *--sp = nullptr;                       /* fiber_main's return address: it never returns */
    *--sp = (void *)fiber_main;            /* where the switch's ret goes */
    for (int i = 0; i < 6; i++) *--sp = nullptr; /* rbp rbx r12-r15 */
    c->sp = sp;
#else
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = STACK;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, fiber_main, 0);
#endif
}

void set_coords(int t) {
    if (blockDim.x == (unsigned)B.n) { /* a 1-D block */
        threadIdx.x = (unsigned)t;
        threadIdx.y = threadIdx.z = 0;
        return;
    }
    threadIdx.x = (unsigned)t % blockDim.x;
    threadIdx.y = (unsigned)t / blockDim.x % blockDim.y;
    threadIdx.z = (unsigned)t / (blockDim.x * blockDim.y);
}

void to_scheduler(bool exiting) {
    fiber &f = B.th[B.cur];
#if EMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake, B.sched_bottom, B.sched_size);
#else
    (void)exiting;
#endif
    switch_to(&f.ctx, &B.sched);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake, &B.sched_bottom, &B.sched_size);
#endif
}

void fiber_main() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &B.sched_bottom, &B.sched_size);
#endif
    (*B.body)();
    B.th[B.cur].st = DONE;
    to_scheduler(true);
}

void run_thread(int t) {
    fiber &f = B.th[t];
    B.cur = t;
    set_coords(t);
    void *fake = nullptr;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&fake, f.stack, STACK);
#endif
    switch_to(&B.sched, &f.ctx);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
    (void)fake;
}

bool ensure_stacks(int n) {
    while ((int)B.th.size() < n) {
        fiber f;
        long page = 4096;
        void *p = mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        mprotect(p, page, PROT_NONE); /* an overflowing fiber faults instead of corrupting its neighbour */
        f.stack = (char *)p + page;
        B.th.push_back(f);
    }
    return true;
}

/* the order of the next pass over k items: start, start + step, ...
 * modulo k (a step of k - 1 goes down) */
void next_order(int k, int *start, int *step) {
    if (order != SHUFFLE) {
        *start = order == FORWARD ? 0 : k - 1;
        *step = order == FORWARD ? 1 : k - 1;
        return;
    }
    rng = rng * 1103515245u + 12345u;
    *start = (int)((rng >> 8) % (unsigned)k);
    *step = (rng >> 30) & 1 ? 1 : k - 1;
}

/* TOY_EMU_ORDER=forward|reverse|shuffle[:SEED]; anything else is refused
 * (a typo must not quietly run the default order) */
void read_order() {
    const char *e = getenv("TOY_EMU_ORDER");
    if (!e || !*e) return;
    if (!strcmp(e, "forward")) order = FORWARD;
    else if (!strcmp(e, "reverse")) order = REVERSE;
    else if (!strncmp(e, "shuffle", 7) && (!e[7] || (e[7] == ':' && e[8]))) {
        char *end = nullptr;
        if (e[7]) rng = (unsigned)strtoul(e + 8, &end, 10);
        if (end && *end) {
            fprintf(stderr, "cuda-emu: TOY_EMU_ORDER=%s: the seed is not a number\n", e);
            exit(2);
        }
    } else {
        fprintf(stderr, "cuda-emu: TOY_EMU_ORDER=%s: not forward, reverse or shuffle[:SEED]\n", e);
        exit(2);
    }
}

/* wmma calls are warp-wide: between two barriers every lane of a warp
 * must make the same ones (on a GPU, a hang or garbage otherwise) */
bool wmma_converged(int w, int lanes) {
    fiber *th = &B.th[(size_t)w * 32];
    for (int l = 1; l < lanes; l++)
        if (th[l].wmma != th[0].wmma) {
            snprintf(B.err, sizeof B.err,
                     "wmma calls diverge in warp %d of block (%u,%u,%u): lane 0 made %lu, lane %d made %lu", w,
                     blockIdx.x, blockIdx.y, blockIdx.z, th[0].wmma, l, th[l].wmma);
            return false;
        }
    return true;
}

/* runs warp w until each of its live lanes waits at a block barrier or
 * has ended: a warp barrier opens as soon as all of its live lanes are
 * there (so the block is not walked for every shuffle). False on an error. */
bool run_warp(int w, int lanes) {
    fiber *th = &B.th[(size_t)w * 32];
    for (;;) {
        int start, step;
        next_order(lanes, &start, &step);
        for (int i = 0, l = start; i < lanes; i++, l = l + step >= lanes ? l + step - lanes : l + step)
            if (th[l].st == RUNNABLE) {
                run_thread(w * 32 + l);
                if (B.err[0]) return false;
            }
        int live = 0, at_warp = 0;
        for (int l = 0; l < lanes; l++) {
            live += th[l].st != DONE;
            at_warp += th[l].st == AT_WARP;
        }
        if (!wmma_converged(w, lanes)) return false;
        if (!at_warp) return true;
        if (at_warp < live) {
            snprintf(B.err, sizeof B.err,
                     "deadlock: in warp %d of block (%u,%u,%u), lanes wait at a warp collective and at __syncthreads", w,
                     blockIdx.x, blockIdx.y, blockIdx.z);
            return false;
        }
        if (live < 32) {
            snprintf(B.err, sizeof B.err, "a warp collective in warp %d with %d of 32 lanes present", w, live);
            return false;
        }
        for (int l = 0; l < lanes; l++) th[l].st = RUNNABLE;
    }
}

/* runs one block; false when it failed (B.err says why). Each pass runs
 * the warps, in a random order and direction, up to the next
 * __syncthreads; then the barrier opens. */
bool run_block(int n) {
    for (int t = 0; t < n; t++) {
        start_context(&B.th[t].ctx, B.th[t].stack);
        B.th[t].st = RUNNABLE;
        B.th[t].wmma = 0;
    }
    int nw = (n + 31) / 32;
    for (;;) {
        int start, step;
        next_order(nw, &start, &step);
        for (int i = 0, w = start; i < nw; i++, w = w + step >= nw ? w + step - nw : w + step)
            if (!run_warp(w, n - w * 32 < 32 ? n - w * 32 : 32)) return false;
        bool live = false;
        for (int t = 0; t < n; t++)
            if (B.th[t].st == AT_BARRIER) {
                B.th[t].st = RUNNABLE;
                live = true;
            }
        if (!live) return true;
    }
}

void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, std::function<void()> *body) {
    int n = (int)(block.x * block.y * block.z);
    if (!ensure_stacks(n)) {
        fail(cudaErrorMemoryAllocation, "%s", name, "no memory for the emulator's fiber stacks");
        return;
    }
    B.slot.assign((size_t)n, 0);
    B.n = n;
    B.body = body;
    B.name = name;
    B.err[0] = 0;
    gridDim = grid;
    blockDim = block;
    static bool stats = [] {
        const char *e = getenv("TOY_EMU_STATS"), *kf = getenv("TOY_EMU_KERNELS");
        if ((e && *e && strcmp(e, "0")) || (kf && *kf)) per_kernel = new std::map<std::string, unsigned long long>;
        if (e && *e && strcmp(e, "0")) atexit(print_stats);
        if (kf && *kf) {
            kernels_file = kf;
            atexit(write_kernels);
        }
        read_order();
        return true;
    }();
    (void)stats;
    n_launch++;
    if (per_kernel) (*per_kernel)[name]++;
    n_block += (unsigned long long)grid.x * grid.y * grid.z;
    n_thread += (unsigned long long)grid.x * grid.y * grid.z * (unsigned)n;
    /* dynamic shared memory: a heap block that ends where the launch's size
     * does (ASan reports a kernel that reads past it), filled with NaN
     * bytes, and only 16-byte aligned (all CUDA promises: a kernel that
     * needs more, wmma's 32, aligns its own offsets) */
    void *sm = nullptr;
    if (posix_memalign(&sm, 64, smem + 16)) {
        fail(cudaErrorMemoryAllocation, "%s", name, "no memory for shared memory");
        return;
    }
    memset(sm, 0xff, smem + 16);
    toy_emu_smem = (char *)sm + 16;
    /* blocks in TOY_EMU_ORDER's order (a GPU promises none): i -> (start
     * + i * stride) mod count, stride coprime with count; shuffled, a
     * random start and a prime stride, forward 0 and 1, reverse count - 1
     * and count - 1 */
    uint64_t count = (uint64_t)grid.x * grid.y * grid.z, stride = 1, start = 0;
    if (order == REVERSE) {
        start = count - 1;
        stride = count > 1 ? count - 1 : 1;
    }
    if (order == SHUFFLE) {
        rng = rng * 1103515245u + 12345u;
        start = (rng >> 4) % count;
        static const uint64_t primes[] = {7919, 104729, 15485863, 3, 5};
        for (uint64_t p : primes)
            if (count % p) {
                stride = p % count ? p % count : 1;
                break;
            }
    }
    for (uint64_t i = 0, b = start; i < count; i++, b = (b + stride) % count) {
        blockIdx.x = (unsigned)(b % grid.x);
        blockIdx.y = (unsigned)(b / grid.x % grid.y);
        blockIdx.z = (unsigned)(b / ((uint64_t)grid.x * grid.y));
        if (!run_block(n)) {
            fail(cudaErrorLaunchFailure, "%s", name, B.err);
            free(sm);
            toy_emu_smem = nullptr;
            B.cur = -1;
            return;
        }
    }
    free(sm);
    toy_emu_smem = nullptr;
    B.cur = -1;
}

/* stream capture: what would be enqueued is recorded for the graph */
std::vector<std::function<void()>> *capturing;

void enqueue(std::function<void()> op) {
    if (capturing) capturing->push_back(std::move(op));
    else op();
}

} // namespace

extern "C" void toy_emu_syncthreads(void) {
    if (B.cur < 0) return;
    B.th[B.cur].st = AT_BARRIER;
    to_scheduler(false);
}

extern "C" void toy_emu_syncwarp(void) {
    if (B.cur < 0) return;
    B.th[B.cur].st = AT_WARP;
    to_scheduler(false);
}

extern "C" void toy_emu_wmma_op(void) {
    if (B.cur >= 0) B.th[B.cur].wmma++;
}

/* a device-side error the emulator detects (a misaligned wmma pointer):
 * the launch fails with it once this thread yields */
extern "C" void toy_emu_fault(const char *what) {
    if (B.cur >= 0 && !B.err[0]) snprintf(B.err, sizeof B.err, "thread %d of block (%u,%u,%u): %s", B.cur, blockIdx.x,
                                          blockIdx.y, blockIdx.z, what);
}

extern "C" uint64_t *toy_emu_lane_slot(int lane) {
    int me = B.cur, base = me / 32 * 32;
    if (lane < 0) return &B.slot[(size_t)me];
    if (base + lane >= B.n) { /* a lane past the block's last thread */
        if (!B.err[0])
            snprintf(B.err, sizeof B.err, "thread %d reads lane %d of a warp of %d lanes", me, lane, B.n - base);
        return &B.slot[(size_t)me];
    }
    return &B.slot[(size_t)(base + lane)];
}

extern "C" void toy_emu_submit(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               std::function<void()> *body) {
    (void)s;
    char why[128] = "";
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > 1024 || block.z > 64)
        snprintf(why, sizeof why, "block of %u x %u x %u threads", block.x, block.y, block.z);
    else if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535)
        snprintf(why, sizeof why, "grid of %u x %u x %u blocks", grid.x, grid.y, grid.z);
    else if (smem > MAX_SMEM)
        snprintf(why, sizeof why, "%zu bytes of dynamic shared memory (more than 48 KiB needs an opt-in)", smem);
    if (why[0]) { /* the runtime refuses such a launch: nothing runs */
        fail(cudaErrorInvalidConfiguration, "invalid launch: %s", name, why);
        return;
    }
    std::function<void()> b = *body;
    enqueue([name, grid, block, smem, b]() mutable { run_grid(name, grid, block, smem, &b); });
}

/* ---- the runtime calls that depend on capture ---------------------------------- */

extern "C" cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
extern "C" cudaError_t cudaPeekAtLastError(void) { return last_error; }

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "operation not permitted when stream is capturing";
    default: return "emulator error";
    }
}
extern "C" const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaErrorUnknown";
    }
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    (void)s;
    enqueue([p, v, n]() { memset(p, v, n); });
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                       cudaStream_t s) {
    (void)s;
    if (capturing) {
        capturing->push_back([=]() { cudaMemcpy(dst, src, n, kind); });
        return cudaSuccess;
    }
    return cudaMemcpy(dst, src, n, kind);
}

extern "C" cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    (void)s, (void)mode;
    if (capturing) return cudaErrorIllegalState;
    capturing = new std::vector<std::function<void()>>;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    (void)s;
    *g = (cudaGraph_t)capturing;
    capturing = nullptr;
    return *g ? cudaSuccess : cudaErrorIllegalState;
}
extern "C" cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags) {
    (void)flags;
    *e = (cudaGraphExec_t) new std::vector<std::function<void()>>(*(std::vector<std::function<void()>> *)g);
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete (std::vector<std::function<void()>> *)g;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete (std::vector<std::function<void()>> *)e;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    (void)s;
    n_replay++;
    for (auto &op : *(std::vector<std::function<void()>> *)e) {
        op();
        if (last_error != cudaSuccess) return cudaGetLastError();
    }
    return cudaSuccess;
}

/* ---- cuBLAS's GEMMs ----------------------------------------------------------- */

namespace {

float load(cudaDataType t, const void *base, int64_t i) {
    switch (t) {
    case CUDA_R_32F: return ((const float *)base)[i];
    case CUDA_R_16F: return __half2float(((const __half *)base)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)base)[i]);
    default: return NAN;
    }
}
void store(cudaDataType t, void *base, int64_t i, float v) {
    switch (t) {
    case CUDA_R_32F: ((float *)base)[i] = v; break;
    case CUDA_R_16F: ((__half *)base)[i] = __float2half(v); break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)base)[i] = __float2bfloat16(v); break;
    default: break;
    }
}
size_t tsize(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
/* TF32: 10 mantissa bits, rounded to nearest */
float tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, 4);
    return x;
}

struct gemm {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha, beta;
    const void *A, *Bm;
    void *C;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    long long sa, sb, sc;
    int batch;
    bool tf;
};

/* C = alpha op(A) op(B) + beta C, column-major, as cuBLAS defines it; a
 * product with beta 0 never reads C (which may hold NaN) */
void run_gemm(const gemm &g) {
    n_gemm++;
    for (int b = 0; b < g.batch; b++) {
        const char *A = (const char *)g.A + (size_t)(b * g.sa) * tsize(g.at);
        const char *Bm = (const char *)g.Bm + (size_t)(b * g.sb) * tsize(g.bt);
        char *C = (char *)g.C + (size_t)(b * g.sc) * tsize(g.ct);
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                float acc = 0;
                for (int l = 0; l < g.k; l++) {
                    float a = load(g.at, A, g.ta == CUBLAS_OP_N ? i + (int64_t)l * g.lda : l + (int64_t)i * g.lda);
                    float x = load(g.bt, Bm, g.tb == CUBLAS_OP_N ? l + (int64_t)j * g.ldb : j + (int64_t)l * g.ldb);
                    if (g.tf) a = tf32(a), x = tf32(x);
                    acc += a * x;
                }
                int64_t ci = i + (int64_t)j * g.ldc;
                float v = g.alpha * acc;
                if (g.beta != 0.0f) v += g.beta * load(g.ct, C, ci);
                store(g.ct, C, ci, v);
            }
    }
}

bool op_ok(cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; }

cublasStatus_t submit_gemm(const gemm &g) {
    /* cuBLAS's argument checks */
    int arows = g.ta == CUBLAS_OP_N ? g.m : g.k, brows = g.tb == CUBLAS_OP_N ? g.k : g.n;
    if (!op_ok(g.ta) || !op_ok(g.tb) || g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 || g.lda < (arows > 1 ? arows : 1) ||
        g.ldb < (brows > 1 ? brows : 1) || g.ldc < (g.m > 1 ? g.m : 1)) {
        fprintf(stderr, "cuda-emu: cuBLAS GEMM: invalid argument (m %d n %d k %d lda %d ldb %d ldc %d)\n", g.m, g.n, g.k,
                g.lda, g.ldb, g.ldc);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
    enqueue([g]() { run_gemm(g); });
    return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" cublasStatus_t cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, const float *Bm, int ldb,
                                         const float *beta, float *C, int ldc) {
    (void)h;
    gemm g{ta, tb, m, n, k, *alpha, *beta, A, Bm, C, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, lda, ldb, ldc,
           0,  0,  0, 1, false};
    return submit_gemm(g);
}

extern "C" cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                     int m, int n, int k, const void *alpha, const void *A,
                                                     cudaDataType at, int lda, long long sa, const void *Bm,
                                                     cudaDataType bt, int ldb, long long sb, const void *beta, void *C,
                                                     cudaDataType ct, int ldc, long long sc, int batch,
                                                     cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)h, (void)algo;
    bool f32 = at == CUDA_R_32F && bt == CUDA_R_32F;
    bool half = (at == CUDA_R_16F || at == CUDA_R_16BF) && bt == at;
    if (!(f32 || half) || !(ct == CUDA_R_32F || ct == at) ||
        !(compute == CUBLAS_COMPUTE_32F || (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && f32))) {
        fprintf(stderr, "cuda-emu: cublasGemmStridedBatchedEx: types A %d B %d C %d compute %d not supported\n", (int)at,
                (int)bt, (int)ct, (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    gemm g{ta, tb,  m,  n,  k,  *(const float *)alpha, *(const float *)beta, A, Bm, C, at, bt, ct, lda, ldb, ldc,
           sa, sb, sc, batch, compute == CUBLAS_COMPUTE_32F_FAST_TF32};
    return submit_gemm(g);
}
