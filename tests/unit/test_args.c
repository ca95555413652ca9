/* SPDX-License-Identifier: BSD-3-Clause */
/* Every NULL, zero or out-of-range argument of every public call gives
 * DCHAN_ERR_INVALID_ARG (or NULL / a negative code where documented), and
 * outputs are left alone. */
#include "config.h"

#include "unit.h"

#include "core.h"

#define OOB 0x0b0b0b0b0b0b0b0bull
#define UNTOUCHED ((dchan_handle_t *)(uintptr_t)0x5a5a5a5a)

static int noop_allgather(const void *in, void *out, size_t len, void *arg)
{
    memcpy(out, in, len);
    return 0;
}

static void test_attr_init_null(void **state)
{
    dchan_attr_init(NULL); /* must not crash */
    dchan_attr_t a;
    memset(&a, 0xa5, sizeof a);
    dchan_attr_init(&a);
    assert_int_equal(a.struct_size, sizeof a);
    assert_null(a.provider);
    assert_int_equal(a.detect, DCHAN_DETECT_AUTO);
    assert_int_equal(a.thread_level, DCHAN_THREAD_SINGLE);
    assert_int_equal(a.bootstrap, DCHAN_BOOT_AUTO);
    assert_int_equal(a.log_level, DCHAN_LOG_WARN);
    assert_int_equal(a.config_error, 0);
    assert_null(a.ext_allgather);
    assert_null(a.error_fn);
    assert_null(a.mpi_comm);
    for (int i = 0; i < 6; i++)
        assert_null(a.reserved[i]);
}

static void expect_init_invalid(const dchan_attr_t *a)
{
    dchan_ctx_t *ctx = (dchan_ctx_t *)UNTOUCHED;
    assert_int_equal(dchan_init(a, &ctx), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(ctx, (dchan_ctx_t *)UNTOUCHED);
}

static void test_init_args(void **state)
{
    dchan_attr_t a;

    unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
    assert_int_equal(dchan_init(&a, NULL), DCHAN_ERR_INVALID_ARG);

    unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
    a.struct_size = 0;
    expect_init_invalid(&a);
    a.struct_size = sizeof a + 1;
    expect_init_invalid(&a);
    a.struct_size = (size_t)-1;
    expect_init_invalid(&a);

    int bad_detect[] = {-1, DCHAN_DETECT_EVENT + 1, 100, -100000};
    for (size_t i = 0; i < sizeof bad_detect / sizeof bad_detect[0]; i++) {
        unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
        a.detect = bad_detect[i];
        expect_init_invalid(&a);
    }
    int bad_thread[] = {-1, DCHAN_THREAD_MULTIPLE + 1, 1 << 20};
    for (size_t i = 0; i < sizeof bad_thread / sizeof bad_thread[0]; i++) {
        unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
        a.thread_level = bad_thread[i];
        expect_init_invalid(&a);
    }
    int bad_boot[] = {-1, DCHAN_BOOT_SINGLETON + 1, 77};
    for (size_t i = 0; i < sizeof bad_boot / sizeof bad_boot[0]; i++) {
        unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
        a.bootstrap = bad_boot[i];
        expect_init_invalid(&a);
    }
    int bad_log[] = {-1, DCHAN_LOG_DEBUG + 1, 1000};
    for (size_t i = 0; i < sizeof bad_log / sizeof bad_log[0]; i++) {
        unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
        a.log_level = bad_log[i];
        expect_init_invalid(&a);
    }
    /* Provider names: unknown, empty items, too long. */
    const char *bad_prov[] = {"foo", ",self", "self,,self", "selfself_selfself_selfself_selfself"};
    for (size_t i = 0; i < sizeof bad_prov / sizeof bad_prov[0]; i++) {
        unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
        a.provider = bad_prov[i];
        expect_init_invalid(&a);
    }
    /* External bootstrap with bad settings. */
    unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
    a.bootstrap = DCHAN_BOOT_EXTERNAL;
    a.ext_rank = 0;
    a.ext_size = 1;
    expect_init_invalid(&a); /* no callback */
    a.ext_allgather = noop_allgather;
    a.ext_size = 0;
    expect_init_invalid(&a);
    a.ext_size = 1;
    a.ext_rank = 1;
    expect_init_invalid(&a);
    a.ext_rank = -1;
    expect_init_invalid(&a);

    /* A shorter attribute struct (an older caller) is fine: the rest is default. */
    unit_attr(&a, DCHAN_DETECT_FLAG, DCHAN_THREAD_SINGLE);
    a.struct_size = offsetof(dchan_attr_t, mpi_comm);
    dchan_ctx_t *ctx = NULL;
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_int_equal(dchan_nranks(ctx), 1);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_ctx_null(void **state)
{
    dchan_stats_t st;
    dchan_wire_t w;
    char in[8] = "abcdefg", out[8];
    dchan_handle_t *h = UNTOUCHED;
    char buf[64];

    memset(&w, 0, sizeof w);
    assert_int_equal(dchan_finalize(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_rank(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_nranks(NULL), DCHAN_ERR_INVALID_ARG);
    assert_null(dchan_provider_name(NULL));
    assert_int_equal(dchan_progress(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_wait(NULL, 0), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_wait(NULL, -1), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_allgather(NULL, in, out, sizeof in), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_barrier(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_get_stats(NULL, &st), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle(NULL, 0, buf, 64, OOB, unit_count_cb, NULL, &h),
                     DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(h, UNTOUCHED);
    assert_int_equal(dchan_assoc_local(NULL, &w, buf, 64, &h), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(h, UNTOUCHED);
    void *p = UNTOUCHED;
    assert_int_equal(dchan_alloc(NULL, 64, &p), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(p, UNTOUCHED);
    assert_int_equal(dchan_free(NULL, buf), DCHAN_ERR_INVALID_ARG);
}

/* dchan_alloc / dchan_free without a shared-memory provider (heap blocks):
 * every misuse refused, nothing lost, and a channel on the memory works. */
static void test_alloc_heap(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(DCHAN_DETECT_EVENT);
    void *p = UNTOUCHED, *q;
    static char stack_like[64];

    assert_int_equal(dchan_alloc(ctx, 0, &p), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_alloc(ctx, 64, NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_alloc(ctx, SIZE_MAX, &p), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(p, UNTOUCHED);
    assert_int_equal(dchan_free(ctx, NULL), DCHAN_SUCCESS);
    assert_int_equal(dchan_free(ctx, stack_like), DCHAN_ERR_INVALID_ARG);

    assert_int_equal(dchan_alloc(ctx, 100, &p), DCHAN_SUCCESS);
    assert_int_equal(dchan_alloc(ctx, 4096, &q), DCHAN_SUCCESS);
    assert_true((uintptr_t)p % 64 == 0 && (uintptr_t)q % 64 == 0);
    memset(p, 1, 100);
    memset(q, 2, 4096);
    assert_int_equal(dchan_free(ctx, (char *)q + 8), DCHAN_ERR_INVALID_ARG);

    /* A handle on q: freeing it is refused until the handle is gone. */
    dchan_handle_t *rh;
    assert_int_equal(dchan_create_handle(ctx, 0, q, 4096, OOB, unit_count_cb, NULL, &rh),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_free(ctx, q), DCHAN_ERR_STATE);
    assert_int_equal(dchan_handle_destroy(rh), DCHAN_SUCCESS);
    assert_int_equal(((unsigned char *)q)[4095], 2);
    assert_int_equal(dchan_free(ctx, q), DCHAN_SUCCESS);
    assert_int_equal(dchan_free(ctx, q), DCHAN_ERR_INVALID_ARG); /* twice */
    assert_int_equal(((unsigned char *)p)[99], 1);               /* p untouched */

    /* p is left to dchan_finalize (LeakSanitizer would see it otherwise). */
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_handle_null(void **state)
{
    dchan_wire_t w;
    assert_int_equal(dchan_handle_export(NULL, &w), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_ready(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_ready_mark(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_ready_pollq(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_put(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_put_test(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_handle_destroy(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_handle_detect(NULL), DCHAN_ERR_INVALID_ARG);
    assert_null(dchan_handle_provider(NULL));
}

static void test_live_ctx_args(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan c;
    dchan_handle_t *h = UNTOUCHED;
    dchan_wire_t w, ref;
    uint64_t live;

    unit_chan_open(&c, ctx, 64);
    live = ctx->nlive;

    /* create_handle */
    assert_int_equal(dchan_create_handle(ctx, 0, NULL, 64, OOB, unit_count_cb, &c, &h),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle(ctx, 0, c.rbuf, 0, OOB, unit_count_cb, &c, &h),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle(ctx, 0, c.rbuf, 64, OOB, NULL, &c, &h),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle(ctx, 0, c.rbuf, 64, OOB, unit_count_cb, &c, NULL),
                     DCHAN_ERR_INVALID_ARG);
    int bad_ranks[] = {-1, 1, 2, -1000, 0x7fffffff};
    for (size_t i = 0; i < sizeof bad_ranks / sizeof bad_ranks[0]; i++)
        assert_int_equal(
            dchan_create_handle(ctx, bad_ranks[i], c.rbuf, 64, OOB, unit_count_cb, &c, &h),
            DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(h, UNTOUCHED);

    /* export */
    assert_int_equal(dchan_handle_export(c.rh, NULL), DCHAN_ERR_INVALID_ARG);

    /* assoc_local */
    assert_int_equal(dchan_handle_export(c.rh, &w), DCHAN_SUCCESS);
    ref = w;
    assert_int_equal(dchan_assoc_local(ctx, NULL, c.sbuf, 64, &h), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local(ctx, &w, NULL, 64, &h), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local(ctx, &w, c.sbuf, 0, &h), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local(ctx, &w, c.sbuf, 64, NULL), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(h, UNTOUCHED);
    assert_memory_equal(&w, &ref, sizeof w);

    /* wait, allgather, stats */
    int bad_timeouts[] = {-2, -3, -1000, -2147483647 - 1};
    for (size_t i = 0; i < sizeof bad_timeouts / sizeof bad_timeouts[0]; i++)
        assert_int_equal(dchan_wait(ctx, bad_timeouts[i]), DCHAN_ERR_INVALID_ARG);
    char in[4] = "xyz", out[4] = "---";
    assert_int_equal(dchan_allgather(ctx, NULL, out, 4), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_allgather(ctx, in, NULL, 4), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_allgather(ctx, in, out, 0), DCHAN_ERR_INVALID_ARG);
    assert_string_equal(out, "---");
    assert_int_equal(dchan_allgather(ctx, in, out, 4), DCHAN_SUCCESS);
    assert_string_equal(out, "xyz");
    assert_int_equal(dchan_barrier(ctx), DCHAN_SUCCESS);
    assert_int_equal(dchan_get_stats(ctx, NULL), DCHAN_ERR_INVALID_ARG);

    /* Nothing was created by the failed calls, and the channel works. */
    assert_true(ctx->nlive == live);
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(c.calls, 0);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Pointers to memory that is not a context or a handle. */
static void check_garbage_ctx(dchan_ctx_t *g, dchan_ctx_t *real)
{
    dchan_stats_t st;
    dchan_handle_t *h = UNTOUCHED;
    dchan_wire_t w;
    char buf[64], in[4] = "abc", out[4];

    assert_int_equal(dchan_rank(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_nranks(g), DCHAN_ERR_INVALID_ARG);
    assert_null(dchan_provider_name(g));
    assert_int_equal(dchan_progress(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_wait(g, 0), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_wait(g, -1), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_allgather(g, in, out, sizeof in), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_barrier(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_get_stats(g, &st), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle(g, 0, buf, 64, OOB, unit_count_cb, NULL, &h),
                     DCHAN_ERR_INVALID_ARG);
    void *p = UNTOUCHED;
    assert_int_equal(dchan_alloc(g, 64, &p), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(p, UNTOUCHED);
    assert_int_equal(dchan_free(g, buf), DCHAN_ERR_INVALID_ARG);
    /* A genuine wire of a live context, offered to the garbage one. */
    struct unit_chan c;
    unit_chan_open(&c, real, 64);
    assert_int_equal(dchan_handle_export(c.rh, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(g, &w, buf, 64, &h), DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(h, UNTOUCHED);
    assert_int_equal(dchan_finalize(g), DCHAN_ERR_INVALID_ARG);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
}

static void check_garbage_handle(dchan_handle_t *g)
{
    dchan_wire_t w, ref;
    memset(&w, 0x33, sizeof w);
    ref = w;
    assert_int_equal(dchan_handle_export(g, &w), DCHAN_ERR_INVALID_ARG);
    assert_memory_equal(&w, &ref, sizeof w);
    assert_int_equal(dchan_ready(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_ready_mark(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_ready_pollq(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_put(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_put_test(g), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_handle_detect(g), DCHAN_ERR_INVALID_ARG);
    assert_null(dchan_handle_provider(g));
    assert_int_equal(dchan_handle_destroy(g), DCHAN_ERR_INVALID_ARG);
}

static void test_garbage_pointers(void **state)
{
    dchan_ctx_t *real = unit_ctx(DCHAN_DETECT_AUTO);
    int fills[] = {0x00, 0xff, 0xa5, 0x01};
    for (size_t i = 0; i < sizeof fills / sizeof fills[0]; i++) {
        /* 16-aligned storage of the right sizes. */
        dchan_ctx_t *gc = aligned_alloc(64, (sizeof(struct dchan_ctx) + 63) / 64 * 64);
        dchan_handle_t *gh = aligned_alloc(64, (sizeof(struct dchan_handle) + 63) / 64 * 64);
        memset(gc, fills[i], sizeof(struct dchan_ctx));
        memset(gh, fills[i], sizeof(struct dchan_handle));
        check_garbage_ctx(gc, real);
        check_garbage_handle(gh);
        /* Still garbage: nothing was written into them. */
        for (size_t j = 0; j < sizeof(struct dchan_ctx); j++)
            assert_int_equal(((unsigned char *)gc)[j], fills[i]);
        for (size_t j = 0; j < sizeof(struct dchan_handle); j++)
            assert_int_equal(((unsigned char *)gh)[j], fills[i]);
        free(gc);
        free(gh);
    }
    /* A context pointer where a handle is expected, and the reverse. */
    check_garbage_handle((dchan_handle_t *)real);
    assert_int_equal(dchan_finalize(real), DCHAN_SUCCESS);
}

static void test_version(void **state)
{
    assert_int_equal(dchan_version(), DCHAN_VERSION);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attr_init_null),
        cmocka_unit_test(test_init_args),
        cmocka_unit_test(test_ctx_null),
        cmocka_unit_test(test_handle_null),
        UNIT_TEST_MODES(test_live_ctx_args),
        cmocka_unit_test(test_garbage_pointers),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_alloc_heap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
