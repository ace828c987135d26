/* alloc-count.h: heap allocations made so far by libtoy code in the tests. */
#ifndef TOY_TEST_ALLOC_COUNT_H
#define TOY_TEST_ALLOC_COUNT_H
long toy_test_alloc_count(void);
#endif
