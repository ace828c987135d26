/* gemm-bf16-amx.c: C = A B^T over bfloat16 operands with f32 accumulation,
 * on Intel AMX tiles (tdpbf16ps: a 16 x 32 bf16 tile of A times a 32 x 16
 * tile of B, added into a 16 x 16 f32 tile of C; 16,384 flops an
 * instruction, about 2.2 TFLOPS on one core of a Xeon here).
 *
 * It reads the operands exactly as the AVX-512 BF16 kernel packs them
 * (gemm-bf16-avx512.c): A as rows of kp bf16 (kp a multiple of 32, zero
 * rows up to a multiple of 16 present), B as panels of 16 columns holding,
 * for every pair of k, the 16 columns' two values side by side. Sixteen
 * pairs of one panel are 16 rows of 64 bytes, contiguous: the layout of a B
 * tile, so B tiles load straight from the panels. A 2 x 2 block of C tiles
 * (32 rows by 32 columns) keeps every loaded tile used twice: 4 tiles of C,
 * 2 of A and 2 of B are the 8 tile registers.
 *
 * Only called once toy_cpu_amx_bf16() has said yes: the CPU has AMX-BF16
 * and Linux has granted this process the tile state (arch_prctl).
 */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backends/cpu/cpu-impl.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Ask Linux for the tile data state: without it the first tile instruction
 * faults. Granted to the whole process, once. */
bool toy_amx_request(void) {
#ifdef SYS_arch_prctl
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return false;
#endif
}

/* palette 1: every tile 16 rows of 64 bytes */
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static void configure(void) {
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* C tiles -> the valid part of C (rows, cols), beta C added */
static void put(const float *t, float *c, int64_t ldc, int rows, int cols, float beta) {
    if (cols <= 0) return;
    __mmask16 m = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
    for (int r = 0; r < rows && r < 16; r++) {
        __m512 v = _mm512_loadu_ps(t + 16 * r);
        float *dst = c + r * ldc;
        if (beta != 0) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, dst), _mm512_set1_ps(beta), v);
        _mm512_mask_storeu_ps(dst, m, v);
    }
}

/* One block of R x P tiles of C (R, P in 1..2; tile numbers must be
 * constants, so each shape is its own inlined copy). a: the block's first
 * row of A; b: its first panel; pe: elements per panel. A whole block with
 * beta 0 or 1 starts from zero or from C and is stored straight to C; an
 * edge block goes through a tile on the stack. */
static inline __attribute__((always_inline)) void block(int R, int P, const uint16_t *a, int64_t kp,
                                                        const uint16_t *b, int64_t pe, float *c, int64_t ldc,
                                                        int rows, int cols, float beta) {
    int64_t pairs = kp / 2, sa = kp * 2, sc = ldc * 4;
    bool direct = rows >= 16 * R && cols >= 16 * P && (beta == 0 || beta == 1);
    if (direct && beta == 1) {
        _tile_loadd(0, c, sc);
        if (P > 1) _tile_loadd(1, c + 16, sc);
        if (R > 1) _tile_loadd(2, c + 16 * ldc, sc);
        if (R > 1 && P > 1) _tile_loadd(3, c + 16 * ldc + 16, sc);
    } else {
        _tile_zero(0);
        if (P > 1) _tile_zero(1);
        if (R > 1) _tile_zero(2);
        if (R > 1 && P > 1) _tile_zero(3);
    }
    for (int64_t q = 0; q < pairs; q += 16) {
        _tile_loadd(4, a + 2 * q, sa);
        _tile_loadd(6, b + q * 32, 64);
        if (P > 1) _tile_loadd(7, b + pe + q * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (P > 1) _tile_dpbf16ps(1, 4, 7);
        if (R > 1) {
            _tile_loadd(5, a + 16 * kp + 2 * q, sa);
            _tile_dpbf16ps(2, 5, 6);
            if (P > 1) _tile_dpbf16ps(3, 5, 7);
        }
    }
    if (direct) {
        _tile_stored(0, c, sc);
        if (P > 1) _tile_stored(1, c + 16, sc);
        if (R > 1) _tile_stored(2, c + 16 * ldc, sc);
        if (R > 1 && P > 1) _tile_stored(3, c + 16 * ldc + 16, sc);
        return;
    }
    float t[16 * 16];
    _tile_stored(0, t, 64);
    put(t, c, ldc, rows, cols, beta);
    if (P > 1) {
        _tile_stored(1, t, 64);
        put(t, c + 16, ldc, rows, cols - 16, beta);
    }
    if (R > 1) {
        _tile_stored(2, t, 64);
        put(t, c + 16 * ldc, ldc, rows - 16, cols, beta);
        if (P > 1) {
            _tile_stored(3, t, 64);
            put(t, c + 16 * ldc + 16, ldc, rows - 16, cols - 16, beta);
        }
    }
}

/* C (m x nc, ldc) = beta C + A (m rows of kp bf16, kp a multiple of 32,
 * zero rows up to a multiple of 16 present) times the panels of nc
 * columns, pe elements apart (kp / 2 * 32 when they hold just these kp
 * values) */
void toy_gemm_bf16_amx(int64_t m, int64_t nc, int64_t kp, const uint16_t *A, const uint16_t *panels, int64_t pe,
                       float *C, int64_t ldc, float beta) {
    configure();
    for (int64_t i = 0; i < m; i += 32) {
        int rows = m - i < 32 ? (int)(m - i) : 32;
        for (int64_t j = 0; j < nc; j += 32) {
            int cols = nc - j < 32 ? (int)(nc - j) : 32;
            const uint16_t *a = A + i * kp, *b = panels + (j / 16) * pe;
            float *c = C + i * ldc + j;
            if (rows > 16 && cols > 16) block(2, 2, a, kp, b, pe, c, ldc, rows, cols, beta);
            else if (rows > 16) block(2, 1, a, kp, b, pe, c, ldc, rows, cols, beta);
            else if (cols > 16) block(1, 2, a, kp, b, pe, c, ldc, rows, cols, beta);
            else block(1, 1, a, kp, b, pe, c, ldc, rows, cols, beta);
        }
    }
    /* back to the initial tile state: context switches save none of it */
    _tile_release();
}
