/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A heap allocation counter for dchan_pollcost. The program defines malloc
 * and its relatives, forwarding to glibc's allocator; the shared libdchan
 * and MPI resolve to these definitions through symbol interposition, so the
 * count covers everything that allocates on the calling thread while
 * counting is on. Not built under AddressSanitizer or ThreadSanitizer,
 * whose allocators must not be bypassed.
 */
#ifndef DCHAN_BENCH_ALLOC_COUNT_H
#define DCHAN_BENCH_ALLOC_COUNT_H

#include <stdio.h>

/* 1 when this build counts allocations. */
int alloc_count_available(void);
/* Count this thread's allocations from now on / no longer. */
void alloc_count_on(void);
void alloc_count_off(void);
/* Allocations counted on this thread since the last reset. */
unsigned long alloc_count_total(void);
void alloc_count_reset(void);
/* Where the first counted allocations came from (shared object and symbol). */
void alloc_count_report(FILE *f, const char *indent);

#endif /* DCHAN_BENCH_ALLOC_COUNT_H */
