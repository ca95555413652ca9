/* SPDX-License-Identifier: BSD-3-Clause */
/* Bootstrap methods: external callbacks, and MPI / PMIx refusing cleanly
 * when the process was not started for them. */
#include "config.h"

#include "unit.h"

#include "core.h"

struct gather {
    int calls;
    int fail_at;      /* fail the n-th call (1-based), 0: never */
    int fail_rc;
    size_t last_len;
    unsigned char last_in[256];
    void *self;
};

static int ext_gather(const void *in, void *out, size_t len, void *arg)
{
    struct gather *g = arg;
    g->calls++;
    g->last_len = len;
    g->self = arg;
    if (len <= sizeof g->last_in)
        memcpy(g->last_in, in, len);
    if (g->fail_at && g->calls == g->fail_at)
        return g->fail_rc ? g->fail_rc : -1;
    memcpy(out, in, len); /* one rank: out is in */
    return 0;
}

static void ext_attr(dchan_attr_t *a, struct gather *g)
{
    dchan_attr_init(a);
    a->bootstrap = DCHAN_BOOT_EXTERNAL;
    a->log_level = DCHAN_LOG_NONE;
    a->ext_rank = 0;
    a->ext_size = 1;
    a->ext_allgather = ext_gather;
    a->ext_arg = g;
}

static void test_external(void **state)
{
    struct gather g = {0};
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    ext_attr(&a, &g);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_int_equal(dchan_rank(ctx), 0);
    assert_int_equal(dchan_nranks(ctx), 1);
    assert_string_equal(dchan_provider_name(ctx), "self");
    assert_true(g.calls >= 1);
    assert_ptr_equal(g.self, &g);
    int init_calls = g.calls;

    /* dchan_allgather goes through the callback, bytes intact. */
    unsigned char in[40], out[40];
    for (int i = 0; i < 40; i++)
        in[i] = (unsigned char)(i * 3 + 1);
    memset(out, 0, sizeof out);
    assert_int_equal(dchan_allgather(ctx, in, out, sizeof in), DCHAN_SUCCESS);
    assert_int_equal(g.calls, init_calls + 1);
    assert_int_equal(g.last_len, sizeof in);
    assert_memory_equal(g.last_in, in, sizeof in);
    assert_memory_equal(out, in, sizeof in);

    /* A failing callback is reported, not ignored. */
    g.fail_at = g.calls + 1;
    assert_int_equal(dchan_allgather(ctx, in, out, sizeof in), DCHAN_ERR_PROVIDER);
    g.fail_at = 0;

    /* One rank: a barrier has no one to wait for (it may skip the callback). */
    assert_int_equal(dchan_barrier(ctx), DCHAN_SUCCESS);

    /* Channels work on an externally bootstrapped context. */
    struct unit_chan c;
    unit_chan_open(&c, ctx, 128);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* DCHAN_BOOT_AUTO with an allgather given uses it (never guessed otherwise). */
static void test_auto_with_callback(void **state)
{
    struct gather g = {0};
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    ext_attr(&a, &g);
    a.bootstrap = DCHAN_BOOT_AUTO;
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_true(g.calls >= 1);
    assert_int_equal(dchan_nranks(ctx), 1);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_external_bad_settings(void **state)
{
    struct gather g = {0};
    dchan_attr_t a;
    struct {
        int rank, size, has_fn;
    } bad[] = {{0, 1, 0}, {1, 1, 1}, {5, 2, 1}, {0, 0, 1}, {-1, 1, 1}, {0, -3, 1}, {-1, -1, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dchan_ctx_t *ctx = (dchan_ctx_t *)&g;
        ext_attr(&a, &g);
        a.ext_rank = bad[i].rank;
        a.ext_size = bad[i].size;
        if (!bad[i].has_fn)
            a.ext_allgather = NULL;
        assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_INVALID_ARG);
        assert_ptr_equal(ctx, (dchan_ctx_t *)&g);
    }
    assert_int_equal(g.calls, 0);
}

/* A callback failing at any of its calls during init fails init cleanly. */
static void test_external_callback_fails(void **state)
{
    struct gather g = {0};
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;

    ext_attr(&a, &g);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    int n = g.calls;
    assert_true(n >= 1);
    for (int k = 1; k <= n; k++) {
        int rcs[] = {-1, 1, 42};
        for (size_t r = 0; r < 3; r++) {
            memset(&g, 0, sizeof g);
            g.fail_at = k;
            g.fail_rc = rcs[r];
            ctx = NULL;
            ext_attr(&a, &g);
            assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_PROVIDER);
            assert_null(ctx);
            assert_true(g.calls >= k);
        }
    }
}

#ifdef HAVE_MPI
static void test_mpi_not_initialised(void **state)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    dchan_attr_init(&a);
    a.bootstrap = DCHAN_BOOT_MPI;
    a.log_level = DCHAN_LOG_NONE;
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_STATE);
    assert_null(ctx);
}
#endif

#ifdef HAVE_PMIX
static void test_pmix_without_launcher(void **state)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    unsetenv("PMIX_NAMESPACE");
    unsetenv("PMIX_RANK");
    dchan_attr_init(&a);
    a.bootstrap = DCHAN_BOOT_PMIX;
    a.log_level = DCHAN_LOG_NONE;
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_STATE);
    assert_null(ctx);
}
#endif

/* AUTO, no MPI initialised, no launcher: a singleton. */
static void test_auto_singleton(void **state)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    unsetenv("PMIX_NAMESPACE");
    unsetenv("PMIX_RANK");
    dchan_attr_init(&a);
    a.log_level = DCHAN_LOG_NONE;
    assert_int_equal(a.bootstrap, DCHAN_BOOT_AUTO);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_int_equal(dchan_rank(ctx), 0);
    assert_int_equal(dchan_nranks(ctx), 1);
    assert_string_equal(dchan_provider_name(ctx), "self");
    assert_int_equal(dchan_barrier(ctx), DCHAN_SUCCESS);
    char in[3] = "ab", out[3] = "";
    assert_int_equal(dchan_allgather(ctx, in, out, 3), DCHAN_SUCCESS);
    assert_string_equal(out, "ab");
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Several contexts at once get distinct job keys. */
static void test_job_keys(void **state)
{
    dchan_ctx_t *c[4];
    for (int i = 0; i < 4; i++)
        c[i] = unit_ctx(DCHAN_DETECT_AUTO);
    for (int i = 0; i < 4; i++) {
        assert_true(c[i]->job_key != 0);
        for (int j = 0; j < i; j++)
            assert_true(c[i]->job_key != c[j]->job_key);
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(dchan_finalize(c[i]), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_external),
        cmocka_unit_test(test_auto_with_callback),
        cmocka_unit_test(test_external_bad_settings),
        cmocka_unit_test(test_external_callback_fails),
#ifdef HAVE_MPI
        cmocka_unit_test(test_mpi_not_initialised),
#endif
#ifdef HAVE_PMIX
        cmocka_unit_test(test_pmix_without_launcher),
#endif
        cmocka_unit_test(test_auto_singleton),
        cmocka_unit_test(test_job_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
