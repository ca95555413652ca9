/* SPDX-License-Identifier: BSD-3-Clause */
/* A counting malloc interposer; see alloc_count.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ALLOC_COUNT_OFF 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(__GLIBC__)
#define ALLOC_COUNT_OFF 1
#endif

#define NCALLERS 16

/* Thread-local, so that helper threads (MPI's runtime) do not count. */
static __thread int counting;
static __thread unsigned long count;
static __thread void *callers[NCALLERS];
static __thread int ncallers;

#ifndef ALLOC_COUNT_OFF

/* glibc's allocator under its own names. */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t m);
extern void *__libc_realloc(void *p, size_t n);
extern void *__libc_memalign(size_t align, size_t n);
extern void *__libc_valloc(size_t n);
extern void *__libc_pvalloc(size_t n);

static inline void note(void *caller)
{
    if (counting) {
        count++;
        if (ncallers < NCALLERS)
            callers[ncallers++] = caller;
    }
}

void *malloc(size_t n)
{
    note(__builtin_return_address(0));
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    note(__builtin_return_address(0));
    return __libc_calloc(n, m);
}

/* Every realloc counts: it may move the block, which is an allocation. */
void *realloc(void *p, size_t n)
{
    note(__builtin_return_address(0));
    return __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t n, size_t m)
{
    note(__builtin_return_address(0));
    if (m && n > SIZE_MAX / m) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, n * m);
}

void *memalign(size_t align, size_t n)
{
    note(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    note(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    note(__builtin_return_address(0));
    if (align < sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t n)
{
    note(__builtin_return_address(0));
    return __libc_valloc(n);
}

void *pvalloc(size_t n)
{
    note(__builtin_return_address(0));
    return __libc_pvalloc(n);
}

int alloc_count_available(void)
{
    return 1;
}

#else

int alloc_count_available(void)
{
    return 0;
}

#endif

void alloc_count_on(void)
{
    counting = 1;
}

void alloc_count_off(void)
{
    counting = 0;
}

unsigned long alloc_count_total(void)
{
    return count;
}

void alloc_count_reset(void)
{
    count = 0;
    ncallers = 0;
}

void alloc_count_report(FILE *f, const char *indent)
{
    for (int i = 0; i < ncallers; i++) {
        Dl_info di;
        memset(&di, 0, sizeof di);
        if (dladdr(callers[i], &di) && di.dli_fname) {
            /* The offset in the object is what addr2line -e OBJECT wants; the
             * nearest exported symbol is only a hint (internals are hidden). */
            const char *base = strrchr(di.dli_fname, '/');
            fprintf(f, "%s%s+0x%lx (near %s)\n", indent, base ? base + 1 : di.dli_fname,
                    (unsigned long)((uintptr_t)callers[i] - (uintptr_t)di.dli_fbase),
                    di.dli_sname ? di.dli_sname : "?");
        } else {
            fprintf(f, "%s%p\n", indent, callers[i]);
        }
    }
}
