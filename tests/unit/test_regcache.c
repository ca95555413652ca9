/* SPDX-License-Identifier: BSD-3-Clause */
/* Registration cache against a fake provider that counts registrations. */
#include "config.h"

#include "unit.h"

#include "core.h"
#include "regcache.h"

#define MAXREC 4096

struct fake {
    int regs, deregs;
    int fail; /* mr_reg returns this when non-zero */
    void *last_addr;
    size_t last_len;
    unsigned last_access;
    struct dchan_prov *last_prov;
    uintptr_t next_mr;
    void *dereg_mr[MAXREC];
};

static struct fake F;

static int fake_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access,
                       void **mr)
{
    F.last_prov = p;
    F.last_addr = addr;
    F.last_len = len;
    F.last_access = access;
    if (F.fail)
        return F.fail;
    F.regs++;
    *mr = (void *)(F.next_mr += 0x10);
    return DCHAN_SUCCESS;
}

static void fake_mr_dereg(struct dchan_prov *p, void *mr)
{
    F.last_prov = p;
    if (F.deregs < MAXREC)
        F.dereg_mr[F.deregs] = mr;
    F.deregs++;
}

static const struct dchan_provider_ops fake_ops = {
    .name = "fake",
    .wire_id = 0x7f,
    .mr_reg = fake_mr_reg,
    .mr_dereg = fake_mr_dereg,
};

struct env {
    struct dchan_prov p;
    dchan_ctx_t *ctx;
};

static int setup(void **state)
{
    struct env *e = calloc(1, sizeof *e);
    memset(&F, 0, sizeof F);
    F.next_mr = 0x1000;
    e->ctx = calloc(1, sizeof *e->ctx);
    e->p.ops = &fake_ops;
    e->p.ctx = e->ctx;
    assert_int_equal(dchan_regcache_create(&e->p), DCHAN_SUCCESS);
    assert_non_null(e->p.regs);
    assert_int_equal(dchan_regcache_count(&e->p), 0);
    *state = e;
    return 0;
}

static int teardown(void **state)
{
    struct env *e = *state;
    dchan_regcache_destroy(&e->p);
    assert_null(e->p.regs);
    free(e->ctx);
    free(e);
    return 0;
}

static int dereg_seen(void *mr)
{
    int n = 0;
    for (int i = 0; i < F.deregs && i < MAXREC; i++)
        n += F.dereg_mr[i] == mr;
    return n;
}

static void test_refcount(void **state)
{
    struct env *e = *state;
    static char buf[256];
    struct dchan_reg *r1 = NULL, *r2 = NULL, *r3 = NULL;

    assert_int_equal(dchan_reg_get(&e->p, buf, 100, DCHAN_ACCESS_SEND, &r1), DCHAN_SUCCESS);
    assert_non_null(r1);
    assert_int_equal(F.regs, 1);
    assert_ptr_equal(F.last_prov, &e->p);
    assert_ptr_equal(F.last_addr, buf);
    assert_int_equal(F.last_len, 100);
    assert_int_equal(F.last_access, DCHAN_ACCESS_SEND);
    void *mr = dchan_reg_mr(r1);
    assert_ptr_equal(mr, (void *)0x1010);
    assert_true(e->ctx->stats.registrations == 1);
    assert_true(e->ctx->stats.reg_cache_hits == 0);

    assert_int_equal(dchan_reg_get(&e->p, buf, 100, DCHAN_ACCESS_SEND, &r2), DCHAN_SUCCESS);
    assert_int_equal(dchan_reg_get(&e->p, buf, 100, DCHAN_ACCESS_SEND, &r3), DCHAN_SUCCESS);
    assert_ptr_equal(r2, r1);
    assert_ptr_equal(r3, r1);
    assert_ptr_equal(dchan_reg_mr(r3), mr);
    assert_int_equal(F.regs, 1);
    assert_true(e->ctx->stats.registrations == 1);
    assert_true(e->ctx->stats.reg_cache_hits == 2);
    assert_int_equal(dchan_regcache_count(&e->p), 1);

    dchan_reg_put(r3);
    dchan_reg_put(r2);
    assert_int_equal(F.deregs, 0);
    assert_int_equal(dchan_regcache_count(&e->p), 1);
    dchan_reg_put(r1);
    assert_int_equal(F.deregs, 1);
    assert_ptr_equal(F.dereg_mr[0], mr);
    assert_int_equal(dchan_regcache_count(&e->p), 0);

    /* Gone: the next get registers again. */
    assert_int_equal(dchan_reg_get(&e->p, buf, 100, DCHAN_ACCESS_SEND, &r1), DCHAN_SUCCESS);
    assert_int_equal(F.regs, 2);
    assert_ptr_not_equal(dchan_reg_mr(r1), mr);
    dchan_reg_put(r1);
    assert_int_equal(F.deregs, 2);
}

static void test_distinct_keys(void **state)
{
    struct env *e = *state;
    static char buf[256];
    struct dchan_reg *r[6];
    struct {
        void *addr;
        size_t len;
        unsigned access;
    } k[6] = {{buf, 100, DCHAN_ACCESS_SEND},
              {buf, 200, DCHAN_ACCESS_SEND},
              {buf, 100, DCHAN_ACCESS_REMOTE_WRITE},
              {buf + 1, 100, DCHAN_ACCESS_SEND},
              {buf, 99, DCHAN_ACCESS_SEND},
              {buf, 100, DCHAN_ACCESS_SEND | DCHAN_ACCESS_REMOTE_WRITE}};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(dchan_reg_get(&e->p, k[i].addr, k[i].len, k[i].access, &r[i]),
                         DCHAN_SUCCESS);
        assert_int_equal(F.regs, i + 1);
        assert_ptr_equal(F.last_addr, k[i].addr);
        assert_int_equal(F.last_len, k[i].len);
        assert_int_equal(F.last_access, k[i].access);
        for (int j = 0; j < i; j++) {
            assert_ptr_not_equal(r[i], r[j]);
            assert_ptr_not_equal(dchan_reg_mr(r[i]), dchan_reg_mr(r[j]));
        }
    }
    assert_int_equal(dchan_regcache_count(&e->p), 6);
    /* Each found again under its own key. */
    for (int i = 0; i < 6; i++) {
        struct dchan_reg *x;
        assert_int_equal(dchan_reg_get(&e->p, k[i].addr, k[i].len, k[i].access, &x),
                         DCHAN_SUCCESS);
        assert_ptr_equal(x, r[i]);
        dchan_reg_put(x);
    }
    assert_int_equal(F.regs, 6);
    assert_int_equal(F.deregs, 0);
    /* Dropping one leaves the others. */
    void *mr2 = dchan_reg_mr(r[2]);
    dchan_reg_put(r[2]);
    assert_int_equal(F.deregs, 1);
    assert_ptr_equal(F.dereg_mr[0], mr2);
    for (int i = 0; i < 6; i++)
        if (i != 2)
            dchan_reg_put(r[i]);
    assert_int_equal(F.deregs, 6);
    assert_int_equal(dchan_regcache_count(&e->p), 0);
}

#define MANY 1000

static void test_many_entries(void **state)
{
    struct env *e = *state;
    char *base = malloc(MANY * 16);
    struct dchan_reg **r = calloc(MANY, sizeof *r);
    void **mr = calloc(MANY, sizeof *mr);
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(dchan_reg_get(&e->p, base + i * 16, 16 + (size_t)(i % 5),
                                       (unsigned)(1 + i % 2), &r[i]),
                         DCHAN_SUCCESS);
        mr[i] = dchan_reg_mr(r[i]);
    }
    assert_int_equal(F.regs, MANY);
    assert_int_equal(dchan_regcache_count(&e->p), MANY);
    /* After the rehashes every entry is found again, with its registration. */
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < MANY; i++) {
            struct dchan_reg *x;
            assert_int_equal(dchan_reg_get(&e->p, base + i * 16, 16 + (size_t)(i % 5),
                                           (unsigned)(1 + i % 2), &x),
                             DCHAN_SUCCESS);
            assert_ptr_equal(x, r[i]);
            assert_ptr_equal(dchan_reg_mr(x), mr[i]);
        }
    assert_int_equal(F.regs, MANY);
    assert_true(e->ctx->stats.reg_cache_hits == 2 * MANY);
    /* Three references each: the third put deregisters, in any order. */
    for (int i = MANY - 1; i >= 0; i -= 2)
        for (int k = 0; k < 3; k++)
            dchan_reg_put(r[i]);
    assert_int_equal(F.deregs, MANY / 2);
    for (int i = 0; i < MANY; i += 2)
        for (int k = 0; k < 3; k++)
            dchan_reg_put(r[i]);
    assert_int_equal(F.deregs, MANY);
    for (int i = 0; i < MANY; i++)
        assert_int_equal(dereg_seen(mr[i]), 1);
    assert_int_equal(dchan_regcache_count(&e->p), 0);
    free(base);
    free(r);
    free(mr);
}

static void test_reg_failure(void **state)
{
    struct env *e = *state;
    static char buf[64];
    struct dchan_reg *r = (struct dchan_reg *)buf, *ok;
    int codes[] = {DCHAN_ERR_PROVIDER, DCHAN_ERR_NO_MEMORY, DCHAN_ERR_UNSUPPORTED,
                   DCHAN_ERR_AGAIN};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        F.fail = codes[i];
        assert_int_equal(dchan_reg_get(&e->p, buf, 64, DCHAN_ACCESS_SEND, &r), codes[i]);
        assert_ptr_equal(r, (struct dchan_reg *)buf); /* untouched */
        assert_int_equal(dchan_regcache_count(&e->p), 0);
    }
    assert_true(e->ctx->stats.registrations == 0);
    /* Nothing was cached: the next attempt asks the provider again. */
    F.fail = 0;
    assert_int_equal(dchan_reg_get(&e->p, buf, 64, DCHAN_ACCESS_SEND, &ok), DCHAN_SUCCESS);
    assert_int_equal(F.regs, 1);
    assert_true(e->ctx->stats.reg_cache_hits == 0);
    /* A failure for a new key leaves the existing entry alone. */
    F.fail = DCHAN_ERR_PROVIDER;
    assert_int_equal(dchan_reg_get(&e->p, buf, 32, DCHAN_ACCESS_SEND, &r), DCHAN_ERR_PROVIDER);
    assert_int_equal(dchan_regcache_count(&e->p), 1);
    F.fail = 0;
    dchan_reg_put(ok);
    assert_int_equal(F.deregs, 1);
}

static void test_bad_args(void **state)
{
    struct env *e = *state;
    static char buf[64];
    struct dchan_reg *r = NULL;
    assert_int_equal(dchan_reg_get(&e->p, NULL, 64, DCHAN_ACCESS_SEND, &r),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_reg_get(&e->p, buf, 0, DCHAN_ACCESS_SEND, &r),
                     DCHAN_ERR_INVALID_ARG);
    assert_null(r);
    assert_int_equal(F.regs, 0);
    dchan_reg_put(NULL);
    assert_null(dchan_reg_mr(NULL));
    /* A provider without a cache. */
    struct dchan_prov bare = {.ops = &fake_ops, .ctx = e->ctx};
    assert_int_equal(dchan_reg_get(&bare, buf, 64, DCHAN_ACCESS_SEND, &r),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_regcache_count(&bare), 0);
    dchan_regcache_destroy(&bare);
}

static void test_destroy_leftovers(void **state)
{
    struct env *e = *state;
    static char buf[1024];
    struct dchan_reg *r;
    void *mr[300];
    for (int i = 0; i < 300; i++) {
        assert_int_equal(dchan_reg_get(&e->p, buf + i, 8, DCHAN_ACCESS_REMOTE_WRITE, &r),
                         DCHAN_SUCCESS);
        mr[i] = dchan_reg_mr(r);
        if (i % 3 == 0) /* some with two references */
            assert_int_equal(dchan_reg_get(&e->p, buf + i, 8, DCHAN_ACCESS_REMOTE_WRITE, &r),
                             DCHAN_SUCCESS);
    }
    assert_int_equal(F.deregs, 0);
    dchan_regcache_destroy(&e->p);
    assert_null(e->p.regs);
    assert_int_equal(F.deregs, 300);
    for (int i = 0; i < 300; i++)
        assert_int_equal(dereg_seen(mr[i]), 1);
    dchan_regcache_destroy(&e->p); /* twice is harmless */
    assert_int_equal(F.deregs, 300);
}

/* Through a real context: a multicast send buffer on the self provider
 * never reaches mr_reg (self needs none), but the cache of every provider
 * is created and left empty. */
static void test_context_caches(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(DCHAN_DETECT_FLAG);
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    for (int i = 0; i < ctx->nprovs; i++) {
        assert_non_null(ctx->provs[i]->regs);
        assert_int_equal(dchan_regcache_count(ctx->provs[i]), 0);
    }
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_refcount, setup, teardown),
        cmocka_unit_test_setup_teardown(test_distinct_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_entries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reg_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_leftovers, setup, teardown),
        cmocka_unit_test(test_context_caches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
