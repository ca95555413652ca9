/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * "No heap allocation on the put and progress paths in steady state." The
 * program is linked with -Wl,--wrap for every allocation function, so each
 * call the library (linked statically) makes goes through the counters.
 */
#include "config.h"

#include "unit.h"

#include "core.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void __wrap_free(void *p);

static volatile int counting;
static unsigned long n_alloc, n_free;

void *__wrap_malloc(size_t n)
{
    if (counting)
        n_alloc++;
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    if (counting)
        n_alloc++;
    return __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    if (counting)
        n_alloc++;
    return __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    if (counting)
        n_alloc++;
    return __real_posix_memalign(p, a, n);
}

void __wrap_free(void *p)
{
    if (counting && p)
        n_free++;
    __real_free(p);
}

static void count_start(void)
{
    n_alloc = n_free = 0;
    counting = 1;
}

static void count_stop(void)
{
    counting = 0;
}

#define NCH 8
#define ITERS 1000

static const size_t sizes[NCH] = {8, 16, 64, 256, 1024, 4096, 8, 65536};

static void run_steady(int mode, int thread_level)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    struct unit_chan c[NCH];
    dchan_stats_t st;
    int bad_data = 0, total = 0;

    unit_attr(&a, mode, thread_level);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);

    /* The wrappers see the library's allocations (creating a handle allocates). */
    count_start();
    for (int i = 0; i < NCH; i++) {
        unit_chan_open(&c[i], ctx, sizes[i]);
        c[i].id = i;
    }
    count_stop();
    assert_true(n_alloc >= NCH);

    for (int it = 0; it < 10; it++) /* warm-up */
        for (int i = 0; i < NCH; i++)
            unit_cycle(&c[i], it);

    count_start();
    for (int it = 0; it < ITERS; it++) {
        for (int i = 0; i < NCH; i++) {
            unit_fill(c[i].sbuf, c[i].size, i, it);
            if (dchan_put(c[i].sh) != DCHAN_SUCCESS)
                bad_data++;
        }
        int want = total + NCH, spins = 0;
        while (total < want && spins++ < 1000) {
            int n = (it % 4 == 3) ? dchan_wait(ctx, 0) : dchan_progress(ctx);
            if (n > 0)
                total += n;
        }
        for (int i = 0; i < NCH; i++) {
            bad_data += !unit_check(c[i].rbuf, c[i].size, i, it);
            bad_data += dchan_put_test(c[i].sh) != 1;
            if (it % 2) {
                bad_data += dchan_ready(c[i].rh) != DCHAN_SUCCESS;
            } else {
                bad_data += dchan_ready_mark(c[i].rh) != DCHAN_SUCCESS;
                bad_data += dchan_ready_pollq(c[i].rh) != DCHAN_SUCCESS;
            }
        }
        dchan_get_stats(ctx, &st);
    }
    count_stop();

    assert_int_equal(bad_data, 0);
    assert_int_equal(total, ITERS * NCH);
    for (int i = 0; i < NCH; i++)
        assert_int_equal(c[i].calls, 10 + ITERS);
    if (n_alloc || n_free)
        fail_msg("%s, thread level %d: %lu allocations and %lu frees in steady state",
                 unit_mode_name(mode), thread_level, n_alloc, n_free);

    for (int i = 0; i < NCH; i++)
        unit_chan_close(&c[i]);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_steady_single(void **state)
{
    run_steady(UNIT_MODE(state), DCHAN_THREAD_SINGLE);
}

static void test_steady_multiple(void **state)
{
    run_steady(UNIT_MODE(state), DCHAN_THREAD_MULTIPLE);
}

/* Misuse and errors on the hot path do not allocate either. */
static void test_error_paths(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    unit_cycle(&c, 0);
    count_start();
    for (int i = 0; i < 100; i++) {
        (void)dchan_ready(c.rh);        /* armed: STATE */
        (void)dchan_put(c.rh);          /* receive handle: STATE */
        (void)dchan_progress(ctx);
        (void)dchan_wait(ctx, 0);       /* nothing: TIMEOUT */
    }
    if (mode == DCHAN_DETECT_SENTINEL) {
        memset(c.sbuf, 0x0b, c.size);
        for (int i = 0; i < 100; i++)
            (void)dchan_put(c.sh);      /* SENTINEL refusal */
    }
    count_stop();
    assert_int_equal(n_alloc, 0);
    assert_int_equal(n_free, 0);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        UNIT_TEST_MODES(test_steady_single),
        UNIT_TEST_MODES(test_steady_multiple),
        UNIT_TEST_MODES(test_error_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
