/* alloc-count.c: counts heap allocations made through malloc & co. by code
 * linked statically into the test binary (libtoy.a), via ld --wrap. */
#include <stdatomic.h>
#include <stddef.h>

#include "alloc-count.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t s);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

static atomic_long count;

long toy_test_alloc_count(void) { return atomic_load(&count); }

void *__wrap_malloc(size_t n) { atomic_fetch_add(&count, 1); return __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t s) { atomic_fetch_add(&count, 1); return __real_calloc(n, s); }
void *__wrap_realloc(void *p, size_t n) { atomic_fetch_add(&count, 1); return __real_realloc(p, n); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) { atomic_fetch_add(&count, 1); return __real_posix_memalign(p, a, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { atomic_fetch_add(&count, 1); return __real_aligned_alloc(a, n); }
