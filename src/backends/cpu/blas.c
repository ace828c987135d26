/* blas.c: OpenBLAS's kernels for this CPU.
 *
 * OpenBLAS as Debian builds it (DYNAMIC_ARCH) picks its kernels once, when
 * it loads, from the CPU's model number. A release older than the CPU does
 * not know the model and falls back to its generic x86-64 kernels,
 * "Prescott" (SSE3): OpenBLAS 0.3.21 (Debian 12) on an Emerald Rapids Xeon
 * runs SGEMM at 62 GFLOPS on 2 cores where its Cooper Lake kernels run 275
 * (bench-blas). The model number is not what the kernels need; the ISA is.
 *
 * So when OpenBLAS chose a pre-AVX2 core on a CPU with AVX2 or AVX-512,
 * toy_blas_init re-runs OpenBLAS's own selection with OPENBLAS_CORETYPE (its
 * documented override) naming the best core the CPU's flags allow. It runs
 * once, as a constructor, before main (so setting the variable races no
 * thread of the program's; OpenBLAS's own workers are kept out, see
 * pick_core), and toy_cpu_init calls it too (a no-op then; the
 * call also links this file into every program that uses the CPU
 * backend). A user's own OPENBLAS_CORETYPE
 * is left alone, and so is a core OpenBLAS chose knowingly (Haswell, Zen,
 * SkylakeX, ...): this only repairs the fallback. The entry points are weak
 * symbols, so a BLAS without them (a non-DYNAMIC_ARCH build) is left as it
 * is. Other libraries of the process that use OpenBLAS (PyTorch, NumPy in a
 * host program) get the same kernels, since OpenBLAS's choice is global.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "toy/device.h"
#include <cblas.h>

void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
void *blas_memory_alloc(int procpos) __attribute__((weak));
void blas_memory_free(void *buffer) __attribute__((weak));

/* OpenBLAS's x86-64 core names by the widest vector ISA their kernels use:
 * 2 AVX-512, 1 AVX2 + FMA, 0 older, -1 a name this table does not know */
static int core_isa(const char *core) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen", "Excavator"};
    static const char *const old[] = {"Prescott",    "Core2",     "Penryn",    "Dunnington", "Nehalem",
                                      "Atom",        "Sandybridge", "Opteron", "Opteron_SSE3", "Barcelona",
                                      "Bobcat",      "Bulldozer", "Piledriver", "Steamroller", "Nano",
                                      "Katmai",      "Coppermine", "Northwood", "Banias",     "Athlon"};
    if (!core) return -1;
    for (size_t i = 0; i < sizeof avx512 / sizeof avx512[0]; i++)
        if (!strcmp(core, avx512[i])) return 2;
    for (size_t i = 0; i < sizeof avx2 / sizeof avx2[0]; i++)
        if (!strcmp(core, avx2[i])) return 1;
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (!strcmp(core, old[i])) return 0;
    return -1;
}

const char *toy_blas_better_core(const char *picked, bool avx2, bool avx512, bool avx512bf16) {
    if (core_isa(picked) != 0) return NULL; /* chosen knowingly, or a name we do not know */
    if (avx512) return avx512bf16 ? "Cooperlake" : "SkylakeX";
    if (avx2) return "Haswell";
    return NULL;
}

static char note[160];

static void pick_core(void) {
    const char *picked = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit || !blas_memory_alloc ||
        !blas_memory_free)
        return;
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = toy_cpu_has_avx512();
    const char *want = toy_blas_better_core(picked, avx2, avx512, avx512 && toy_cpu_has_avx512bf16());
    if (!want) return;
    char was[32];
    snprintf(was, sizeof was, "%s", picked ? picked : "?");
    /* OpenBLAS's own constructor has started its worker threads, and each
     * one's first buffer (blas_memory_alloc) runs gotoblas_dynamic_init
     * too, once, under OpenBLAS's allocation lock, while memory is not yet
     * initialised. Interleaved with the quit + init below, a worker can
     * store its NULL first guess of the core (OpenBLAS does not know this
     * CPU) just as this thread reloads it: a crash at start-up, one run in
     * some hundreds on a loaded machine. Taking a buffer here waits on that
     * lock until memory is initialised, after which no worker re-runs the
     * selection. */
    blas_memory_free(blas_memory_alloc(0));
    setenv("OPENBLAS_CORETYPE", want, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
    snprintf(note, sizeof note, "chosen by toy: OpenBLAS fell back to %s on this CPU", was);
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
void toy_blas_init(void) { pthread_once(&once, pick_core); }
__attribute__((constructor)) static void blas_at_start(void) { toy_blas_init(); }

const char *toy_blas_core(void) {
    toy_blas_init();
    const char *c = openblas_get_corename();
    return c ? c : "?";
}

int toy_blas_core_isa(void) {
    toy_blas_init();
    return core_isa(openblas_get_corename());
}

const char *toy_blas_core_note(void) {
    toy_blas_init();
    return note[0] ? note : NULL;
}
