/* SPDX-License-Identifier: BSD-3-Clause */
/* The polling queue and callback dispatch, in each detection mode. */
#include "config.h"

#include <pthread.h>

#include "unit.h"

#include "core.h"

#define OOB 0x0b0b0b0b0b0b0b0bull

/* A channel whose callback records everything and may act. */
struct rec {
    struct unit_chan c; /* first: unit helpers take &rec.c */
    int calls;
    dchan_handle_t *h;
    void *arg;
    int on_main_thread;
    int it;        /* iteration the data should carry */
    int data_ok;   /* data checked inside the callback */
    /* actions */
    int rearm;     /* dchan_ready on itself */
    struct rec *put_other;
    int destroy_self;
    struct rec *destroy_other;
    int try_nested;
    dchan_ctx_t *progress_ctx; /* another context to drive from the callback */
    int rc_progress, rc_wait, rc_finalize, rc_allgather, rc_barrier, rc_action;
};

static pthread_t main_thread;

static void rec_cb(dchan_handle_t *h, void *arg)
{
    struct rec *r = arg;
    r->calls++;
    r->c.calls++;
    r->h = h;
    r->arg = arg;
    r->on_main_thread = pthread_equal(pthread_self(), main_thread);
    r->data_ok = unit_check(r->c.rbuf, r->c.size, r->c.id, r->it);
    if (r->try_nested) {
        char in[4] = "abc", out[4];
        r->rc_progress = dchan_progress(r->c.ctx);
        r->rc_wait = dchan_wait(r->c.ctx, 0);
        r->rc_finalize = dchan_finalize(r->c.ctx);
        r->rc_allgather = dchan_allgather(r->c.ctx, in, out, sizeof in);
        r->rc_barrier = dchan_barrier(r->c.ctx);
    }
    if (r->progress_ctx)
        r->rc_action = dchan_progress(r->progress_ctx);
    if (r->rearm)
        r->rc_action = dchan_ready(h);
    if (r->put_other) {
        unit_fill(r->put_other->c.sbuf, r->put_other->c.size, r->put_other->c.id,
                  r->put_other->it);
        r->rc_action = dchan_put(r->put_other->c.sh);
    }
    if (r->destroy_self) {
        r->rc_action = dchan_handle_destroy(h);
        r->c.rh = NULL;
    }
    if (r->destroy_other && r->destroy_other->c.rh) {
        r->rc_action = dchan_handle_destroy(r->destroy_other->c.rh);
        r->destroy_other->c.rh = NULL;
    }
}

static void rec_open(struct rec *r, dchan_ctx_t *ctx, int id, size_t size)
{
    memset(r, 0, sizeof *r);
    unit_chan_open_cb(&r->c, ctx, size, OOB, rec_cb, r);
    r->c.id = id;
}

static void rec_put(struct rec *r, int it)
{
    r->it = it;
    unit_fill(r->c.sbuf, r->c.size, r->c.id, it);
    assert_int_equal(dchan_put(r->c.sh), DCHAN_SUCCESS);
}

static int setup(void **state)
{
    main_thread = pthread_self();
    return 0;
}

/* ---- exactly once, right handle and argument, calling thread -------------------------- */

static void test_once_per_arrival(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r;
    dchan_stats_t st;
    rec_open(&r, ctx, 5, 256);
    for (int i = 0; i < 5; i++)
        assert_int_equal(dchan_progress(ctx), 0);
    for (int it = 1; it <= 20; it++) {
        rec_put(&r, it);
        int got = 0;
        for (int i = 0; i < 10; i++) {
            int n = dchan_progress(ctx);
            assert_true(n >= 0);
            got += n;
        }
        assert_int_equal(got, 1);
        assert_int_equal(r.calls, it);
        assert_ptr_equal(r.h, r.c.rh);
        assert_ptr_equal(r.arg, &r);
        assert_true(r.on_main_thread);
        assert_true(r.data_ok);
        assert_true(unit_check(r.c.rbuf, r.c.size, 5, it));
        assert_int_equal(dchan_ready(r.c.rh), DCHAN_SUCCESS);
    }
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.puts == 20);
    assert_true(st.arrivals == 20);
    assert_true(st.callbacks == 20);
    assert_true(st.progress_calls >= 205);
    assert_true(st.errors == 0);
    unit_chan_close(&r.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* ---- the mark / pollq split ---------------------------------------------------------- */

static void test_mark_pollq_split(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r;
    rec_open(&r, ctx, 1, 128);
    rec_put(&r, 0);
    assert_int_equal(unit_progress_until(ctx, &r.calls, 1), DCHAN_SUCCESS);
    for (int it = 1; it <= 10; it++) {
        assert_int_equal(dchan_ready_mark(r.c.rh), DCHAN_SUCCESS);
        rec_put(&r, it);
        /* Marked but not queued: the arrival waits for pollq. */
        for (int i = 0; i < 5; i++)
            assert_int_equal(dchan_progress(ctx), 0);
        assert_int_equal(r.calls, it);
        assert_int_equal(dchan_ready_pollq(r.c.rh), DCHAN_SUCCESS);
        assert_int_equal(dchan_progress(ctx), 1);
        assert_int_equal(r.calls, it + 1);
        assert_true(r.data_ok);
        for (int i = 0; i < 3; i++)
            assert_int_equal(dchan_progress(ctx), 0);
    }
    /* Mark, pollq, then the put: the usual order. */
    assert_int_equal(dchan_ready_mark(r.c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready_pollq(r.c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_progress(ctx), 0);
    rec_put(&r, 99);
    assert_int_equal(dchan_progress(ctx), 1);
    assert_int_equal(r.calls, 12);
    assert_true(r.data_ok);
    unit_chan_close(&r.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* A long idle phase between mark and pollq costs nothing and loses nothing. */
static void test_mark_idle_pollq(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r[4];
    for (int i = 0; i < 4; i++)
        rec_open(&r[i], ctx, i, 64);
    for (int i = 0; i < 4; i++)
        rec_put(&r[i], 0);
    int total = 0;
    for (int i = 0; i < 10; i++)
        total += dchan_progress(ctx);
    assert_int_equal(total, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dchan_ready_mark(r[i].c.rh), DCHAN_SUCCESS);
    rec_put(&r[2], 1); /* only channel 2 gets data */
    for (int i = 0; i < 100; i++)
        assert_int_equal(dchan_progress(ctx), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dchan_ready_pollq(r[i].c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_progress(ctx), 1);
    assert_int_equal(r[2].calls, 2);
    assert_true(r[2].data_ok);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            assert_int_equal(r[i].calls, 1);
    for (int i = 0; i < 4; i++)
        unit_chan_close(&r[i].c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* ---- what callbacks may do ----------------------------------------------------------- */

static void test_callback_rearms_itself(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r;
    rec_open(&r, ctx, 2, 64);
    r.rearm = 1;
    for (int it = 1; it <= 10; it++) {
        rec_put(&r, it);
        assert_int_equal(unit_progress_until(ctx, &r.calls, it), DCHAN_SUCCESS);
        assert_int_equal(r.rc_action, DCHAN_SUCCESS);
        assert_true(r.data_ok);
        /* Re-armed by the callback: a second ready is misuse. */
        assert_int_equal(dchan_ready(r.c.rh), DCHAN_ERR_STATE);
    }
    assert_int_equal(r.calls, 10);
    unit_chan_close(&r.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_callback_puts_on_other(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec a, b;
    rec_open(&a, ctx, 1, 64);
    rec_open(&b, ctx, 2, 64);
    a.put_other = &b;
    a.rearm = 1;
    for (int it = 1; it <= 5; it++) {
        b.it = 100 + it;
        rec_put(&a, it);
        assert_int_equal(unit_progress_until(ctx, &b.calls, it), DCHAN_SUCCESS);
        assert_int_equal(a.calls, it);
        assert_int_equal(b.calls, it);
        assert_true(a.data_ok);
        assert_true(b.data_ok);
        assert_true(unit_check(b.c.rbuf, 64, 2, 100 + it));
        assert_int_equal(a.rc_action, DCHAN_SUCCESS);
        assert_int_equal(dchan_ready(b.c.rh), DCHAN_SUCCESS);
        for (int i = 0; i < 3; i++)
            assert_int_equal(dchan_progress(ctx), 0);
    }
    unit_chan_close(&a.c);
    unit_chan_close(&b.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_callback_destroys_itself(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec a, b;
    rec_open(&a, ctx, 1, 64);
    rec_open(&b, ctx, 2, 64);
    dchan_handle_t *old = a.c.rh;
    a.destroy_self = 1;
    rec_put(&a, 1);
    rec_put(&b, 1);
    int total = 0;
    for (int i = 0; i < 5; i++)
        total += dchan_progress(ctx);
    assert_int_equal(total, 2);
    assert_int_equal(a.calls, 1);
    assert_int_equal(b.calls, 1);
    assert_int_equal(a.rc_action, DCHAN_SUCCESS);
    assert_null(a.c.rh);
    assert_int_equal(dchan_ready(old), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put(a.c.sh), DCHAN_ERR_PEER);
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(a.calls, 1);
    assert_int_equal(dchan_ready(b.c.rh), DCHAN_SUCCESS);
    rec_put(&b, 2);
    assert_int_equal(unit_progress_until(ctx, &b.calls, 2), DCHAN_SUCCESS);
    assert_true(b.data_ok);
    unit_chan_close(&a.c);
    unit_chan_close(&b.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_callback_destroys_queued_other(void **state)
{
    int mode = UNIT_MODE(state);
    for (int order = 0; order < 2; order++) {
        dchan_ctx_t *ctx = unit_ctx(mode);
        struct rec a, b, c;
        rec_open(&a, ctx, 1, 64);
        rec_open(&b, ctx, 2, 64);
        rec_open(&c, ctx, 3, 64);
        /* Whichever fires first destroys the other: both had arrived. */
        a.destroy_other = &b;
        b.destroy_other = &a;
        if (order) {
            rec_put(&b, 1);
            rec_put(&a, 1);
        } else {
            rec_put(&a, 1);
            rec_put(&b, 1);
        }
        rec_put(&c, 1);
        int total = 0;
        for (int i = 0; i < 10; i++)
            total += dchan_progress(ctx);
        assert_int_equal(total, 2);
        assert_int_equal(a.calls + b.calls, 1);
        assert_int_equal(c.calls, 1);
        assert_true(c.data_ok);
        struct rec *dead = a.calls ? &b : &a, *alive = a.calls ? &a : &b;
        assert_null(dead->c.rh);
        assert_int_equal(alive->rc_action, DCHAN_SUCCESS);
        assert_true(alive->data_ok);
        /* The destroyed one never fires. */
        for (int i = 0; i < 10; i++)
            assert_int_equal(dchan_progress(ctx), 0);
        assert_int_equal(dead->calls, 0);
        alive->destroy_other = NULL;
        assert_int_equal(dchan_ready(alive->c.rh), DCHAN_SUCCESS);
        rec_put(alive, 2);
        assert_int_equal(unit_progress_until(ctx, &alive->calls, 2), DCHAN_SUCCESS);
        assert_true(alive->data_ok);
        assert_int_equal(dead->calls, 0);
        unit_chan_close(&a.c);
        unit_chan_close(&b.c);
        unit_chan_close(&c.c);
        assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    }
}

static void test_no_progress_inside_callback(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r;
    rec_open(&r, ctx, 1, 64);
    r.try_nested = 1;
    rec_put(&r, 1);
    assert_int_equal(unit_progress_until(ctx, &r.calls, 1), DCHAN_SUCCESS);
    assert_int_equal(r.rc_progress, DCHAN_ERR_STATE);
    assert_int_equal(r.rc_wait, DCHAN_ERR_STATE);
    assert_int_equal(r.rc_finalize, DCHAN_ERR_STATE);
    assert_int_equal(r.rc_allgather, DCHAN_ERR_STATE);
    assert_int_equal(r.rc_barrier, DCHAN_ERR_STATE);
    /* Outside the callback they work again. */
    assert_int_equal(dchan_progress(ctx), 0);
    r.try_nested = 0;
    assert_int_equal(dchan_ready(r.c.rh), DCHAN_SUCCESS);
    rec_put(&r, 2);
    assert_int_equal(dchan_wait(ctx, -1), 1);
    assert_int_equal(r.calls, 2);
    assert_true(r.data_ok);
    unit_chan_close(&r.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* A callback of one context may drive another context. */
static void test_progress_other_ctx_in_callback(void **state)
{
    dchan_ctx_t *c1 = unit_ctx(UNIT_MODE(state));
    dchan_ctx_t *c2 = unit_ctx(UNIT_MODE(state));
    struct rec a, b;
    rec_open(&a, c1, 1, 64);
    rec_open(&b, c2, 2, 64);
    a.progress_ctx = c2;
    rec_put(&b, 1);
    rec_put(&a, 1);
    assert_int_equal(unit_progress_until(c1, &a.calls, 1), DCHAN_SUCCESS);
    assert_int_equal(a.rc_action, 1); /* b's callback ran inside a's */
    assert_int_equal(b.calls, 1);
    assert_true(a.data_ok);
    assert_true(b.data_ok);
    assert_int_equal(dchan_progress(c2), 0);
    assert_int_equal(dchan_progress(c1), 0);
    unit_chan_close(&a.c);
    unit_chan_close(&b.c);
    assert_int_equal(dchan_finalize(c2), DCHAN_SUCCESS);
    assert_int_equal(dchan_finalize(c1), DCHAN_SUCCESS);
}

/* ---- many handles, random subsets ----------------------------------------------------- */

#define MANY 1000

static void test_many_handles(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct rec *r = calloc(MANY, sizeof *r);
    int *expect = calloc(MANY, sizeof *expect), *put_now = calloc(MANY, sizeof *put_now);
    for (int i = 0; i < MANY; i++)
        rec_open(&r[i], ctx, i, 8 * (size_t)(1 + i % 17));
    srand(4242 + mode);
    for (int it = 1; it <= 8; it++) {
        int want = 0;
        for (int i = 0; i < MANY; i++) {
            expect[i] = r[i].calls;
            put_now[i] = rand() % 3 == 0;
            if (put_now[i]) {
                rec_put(&r[i], it);
                expect[i]++;
                want++;
            }
        }
        int got = 0;
        for (int k = 0; k < 20 && got < want; k++) {
            int n = dchan_progress(ctx);
            assert_true(n >= 0);
            got += n;
        }
        for (int k = 0; k < 3; k++)
            got += dchan_progress(ctx);
        assert_int_equal(got, want);
        for (int i = 0; i < MANY; i++) {
            assert_int_equal(r[i].calls, expect[i]);
            if (!put_now[i])
                continue;
            /* Fired this iteration, for this handle: byte-for-byte content. */
            assert_ptr_equal(r[i].h, r[i].c.rh);
            assert_ptr_equal(r[i].arg, &r[i]);
            assert_true(r[i].data_ok);
            assert_true(unit_check(r[i].c.rbuf, r[i].c.size, i, it));
            assert_int_equal(dchan_ready(r[i].c.rh), DCHAN_SUCCESS);
        }
    }
    dchan_stats_t st;
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.arrivals == st.puts);
    assert_true(st.callbacks == st.puts);
    for (int i = 0; i < MANY; i += 2)
        unit_chan_close(&r[i].c);
    /* finalize destroys the rest */
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    for (int i = 1; i < MANY; i += 2) {
        free(r[i].c.rbuf);
        free(r[i].c.sbuf);
    }
    free(r);
    free(expect);
    free(put_now);
}

/* ---- dchan_wait ----------------------------------------------------------------------- */

static void test_wait(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r, s;
    rec_open(&r, ctx, 1, 64);
    rec_open(&s, ctx, 2, 64);
    assert_int_equal(dchan_wait(ctx, 0), DCHAN_ERR_TIMEOUT);
    assert_int_equal(dchan_wait(ctx, 1), DCHAN_ERR_TIMEOUT);
    rec_put(&r, 1);
    assert_int_equal(dchan_wait(ctx, 0), 1);
    assert_int_equal(r.calls, 1);
    assert_true(r.data_ok);
    assert_int_equal(dchan_wait(ctx, 0), DCHAN_ERR_TIMEOUT);
    assert_int_equal(dchan_ready(r.c.rh), DCHAN_SUCCESS);
    rec_put(&r, 2);
    rec_put(&s, 2);
    int n = dchan_wait(ctx, -1);
    assert_true(n >= 1 && n <= 2);
    if (n == 1)
        assert_int_equal(dchan_wait(ctx, 1000), 1);
    assert_int_equal(r.calls, 2);
    assert_int_equal(s.calls, 1);
    assert_true(r.data_ok && s.data_ok);
    assert_int_equal(dchan_wait(ctx, 0), DCHAN_ERR_TIMEOUT);
    unit_chan_close(&r.c);
    unit_chan_close(&s.c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Finalize with arrivals pending, handles held and handles marked. */
static void test_finalize_with_pending(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct rec r[4];
    for (int i = 0; i < 4; i++)
        rec_open(&r[i], ctx, i, 64);
    rec_put(&r[0], 1);
    rec_put(&r[1], 1);
    assert_int_equal(unit_progress_until(ctx, &r[1].calls, 1), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready_mark(r[1].c.rh), DCHAN_SUCCESS);
    rec_put(&r[2], 1);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    for (int i = 0; i < 4; i++) {
        free(r[i].c.rbuf);
        free(r[i].c.sbuf);
    }
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        UNIT_TEST_MODES(test_once_per_arrival),
        UNIT_TEST_MODES(test_mark_pollq_split),
        UNIT_TEST_MODES(test_mark_idle_pollq),
        UNIT_TEST_MODES(test_callback_rearms_itself),
        UNIT_TEST_MODES(test_callback_puts_on_other),
        UNIT_TEST_MODES(test_callback_destroys_itself),
        UNIT_TEST_MODES(test_callback_destroys_queued_other),
        UNIT_TEST_MODES(test_no_progress_inside_callback),
        UNIT_TEST_MODES(test_progress_other_ctx_in_callback),
        UNIT_TEST_MODES(test_many_handles),
        UNIT_TEST_MODES(test_wait),
        UNIT_TEST_MODES(test_finalize_with_pending),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
