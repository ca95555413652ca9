/* SPDX-License-Identifier: BSD-3-Clause */
/* dchan_progress_n (a progress budget) and dchan_handle_stats (per-handle
 * counters), on self channels in every detection mode. */
#include "config.h"

#include "unit.h"

#define NCH 8

struct errlog {
    int calls;
    dchan_handle_t *h;
    int rc;
};

static void err_cb(dchan_handle_t *h, int rc, void *arg)
{
    struct errlog *e = arg;
    e->calls++;
    e->h = h;
    e->rc = rc;
}

static int total_calls(const struct unit_chan *c, int n)
{
    int t = 0;
    for (int i = 0; i < n; i++)
        t += c[i].calls;
    return t;
}

/* Puts on NCH channels; budgets of 3, 3, 5 run 3, 3 and the last 2
 * callbacks, each exactly once with its own data; nothing is lost. */
static void test_budget_runs_at_most_max(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan c[NCH];
    for (int i = 0; i < NCH; i++) {
        unit_chan_open(&c[i], ctx, 64 + 8 * (size_t)i);
        c[i].id = i;
    }
    for (int it = 1; it <= 3; it++) {
        for (int i = 0; i < NCH; i++) {
            unit_fill(c[i].sbuf, c[i].size, i, it);
            assert_int_equal(dchan_put(c[i].sh), DCHAN_SUCCESS);
        }
        int before = total_calls(c, NCH);
        /* self places the data at put time: every arrival is there now. */
        assert_int_equal(dchan_progress_n(ctx, 3), 3);
        assert_int_equal(total_calls(c, NCH), before + 3);
        assert_int_equal(dchan_progress_n(ctx, 3), 3);
        assert_int_equal(total_calls(c, NCH), before + 6);
        assert_int_equal(dchan_progress_n(ctx, 5), NCH - 6);
        assert_int_equal(dchan_progress_n(ctx, 1), 0);
        assert_int_equal(dchan_progress(ctx), 0);
        for (int i = 0; i < NCH; i++) {
            assert_int_equal(c[i].calls, it);
            assert_ptr_equal(c[i].last_h, c[i].rh);
            assert_true(unit_check(c[i].rbuf, c[i].size, i, it));
            assert_int_equal(dchan_ready(c[i].rh), DCHAN_SUCCESS);
        }
    }
    dchan_stats_t st;
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.callbacks == 3 * NCH && st.arrivals == 3 * NCH);
    for (int i = 0; i < NCH; i++)
        unit_chan_close(&c[i]);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Error reports count against the budget like callbacks, after the
 * arrivals that were due before them, and none is lost either. */
static void test_budget_counts_errors(void **state)
{
    int mode = UNIT_MODE(state);
    if (mode == DCHAN_DETECT_SENTINEL)
        skip(); /* SENTINEL cannot see an overrun (DESIGN §3) */
    struct errlog e = {0};
    dchan_ctx_t *ctx = unit_ctx_err(mode, err_cb, &e);
    struct unit_chan c[4];
    for (int i = 0; i < 4; i++) {
        unit_chan_open(&c[i], ctx, 64);
        c[i].id = i;
        unit_fill(c[i].sbuf, c[i].size, i, 1);
    }
    /* Channels 0 and 1 arrive; 2 and 3 are overrun (a second put before
     * the re-arm); the scan modes see it at the next progress. */
    for (int i = 0; i < 4; i++)
        assert_int_equal(dchan_put(c[i].sh), DCHAN_SUCCESS);
    for (int i = 2; i < 4; i++) {
        int rc = dchan_put(c[i].sh);
        assert_true(rc == DCHAN_SUCCESS || rc == DCHAN_ERR_OVERRUN);
    }
    int events = 0;
    for (int k = 0; k < 4; k++) {
        assert_int_equal(dchan_progress_n(ctx, 1), 1);
        events++;
        assert_int_equal(total_calls(c, 4) + e.calls, events);
    }
    assert_int_equal(dchan_progress_n(ctx, 1), 0);
    assert_int_equal(c[0].calls + c[1].calls, 2);
    assert_int_equal(c[2].calls + c[3].calls, 0);
    assert_int_equal(e.calls, 2);
    assert_int_equal(e.rc, DCHAN_ERR_OVERRUN);
    assert_int_equal(dchan_ready(c[2].rh), DCHAN_ERR_OVERRUN);
    for (int i = 0; i < 2; i++)
        assert_true(unit_check(c[i].rbuf, c[i].size, i, 1));
    for (int i = 0; i < 4; i++)
        unit_chan_close(&c[i]);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static dchan_ctx_t *cb_ctx;
static int cb_rc;
static void cb_progress_n(dchan_handle_t *h, void *arg)
{
    (void)h;
    ((struct unit_chan *)arg)->calls++;
    cb_rc = dchan_progress_n(cb_ctx, 4);
}

/* Bad arguments and state: the documented codes, nothing else changed. */
static void test_budget_args(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan a;
    unit_chan_open_cb(&a, ctx, 64, 0x0b0b0b0b0b0b0b0bull, cb_progress_n, &a);
    assert_int_equal(dchan_progress_n(NULL, 1), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_progress_n(ctx, 0), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_progress_n(ctx, -7), DCHAN_ERR_INVALID_ARG);
    /* A refused call ran nothing: the arrival is still delivered, once. */
    unit_fill(a.sbuf, a.size, 0, 1);
    assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_progress_n(ctx, 0), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(a.calls, 0);
    cb_ctx = ctx;
    cb_rc = 0;
    assert_int_equal(dchan_progress_n(ctx, 1), 1);
    assert_int_equal(a.calls, 1);
    assert_int_equal(cb_rc, DCHAN_ERR_STATE); /* from inside a callback */
    assert_true(unit_check(a.rbuf, a.size, 0, 1));
    assert_int_equal(dchan_ready(a.rh), DCHAN_SUCCESS);
    unit_chan_close(&a);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static dchan_handle_stats_t hstats(const dchan_handle_t *h)
{
    dchan_handle_stats_t s;
    memset(&s, 0xa5, sizeof s);
    s.struct_size = sizeof s;
    assert_int_equal(dchan_handle_stats(h, &s), DCHAN_SUCCESS);
    assert_int_equal(s.struct_size, sizeof s);
    return s;
}

/* Counters of each end, exact after puts, arrivals and an overrun. */
static void test_handle_stats_counts(void **state)
{
    int mode = UNIT_MODE(state);
    struct errlog e = {0};
    dchan_ctx_t *ctx = unit_ctx_err(mode, err_cb, &e);
    struct unit_chan a, b;
    unit_chan_open(&a, ctx, 200);
    unit_chan_open(&b, ctx, 64);
    b.id = 1;
    dchan_handle_stats_t s = hstats(a.sh);
    assert_true(s.puts == 0 && s.bytes == 0 && s.arrivals == 0 && s.overruns == 0);
    for (int it = 1; it <= 5; it++)
        unit_cycle(&a, it);
    s = hstats(a.sh);
    assert_true(s.puts == 5 && s.bytes == 5 * 200 && s.arrivals == 0 && s.overruns == 0);
    assert_true(s.credit_stalls == 0 && s.credit_wait_ns == 0); /* no credit here */
    s = hstats(a.rh);
    assert_true(s.puts == 0 && s.bytes == 0 && s.arrivals == 5 && s.overruns == 0);
    if (mode != DCHAN_DETECT_SENTINEL) {
        /* An overrun on b: counted on its receive end only. */
        assert_int_equal(dchan_put(b.sh), DCHAN_SUCCESS);
        int rc = dchan_put(b.sh);
        assert_true(rc == DCHAN_SUCCESS || rc == DCHAN_ERR_OVERRUN);
        for (int i = 0; i < 3; i++)
            assert_true(dchan_progress(ctx) >= 0);
        assert_int_equal(e.calls, 1);
        s = hstats(b.rh);
        assert_true(s.overruns == 1 && s.arrivals <= 1);
        s = hstats(b.sh);
        assert_true(s.puts >= 1 && s.puts <= 2 && s.bytes == s.puts * 64 && s.overruns == 0);
        assert_true(hstats(a.rh).overruns == 0);
    }
    unit_chan_close(&a);
    unit_chan_close(&b);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_handle_stats_args(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan a;
    unit_chan_open(&a, ctx, 64);
    unit_cycle(&a, 1);
    dchan_handle_stats_t s, before;
    memset(&s, 0x5a, sizeof s);
    assert_int_equal(dchan_handle_stats(NULL, &s), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_handle_stats(a.sh, NULL), DCHAN_ERR_INVALID_ARG);
    /* struct_size not set, too small for one counter, or larger than the
     * library's structure: refused, nothing written. */
    size_t bad[] = {0, 1, offsetof(dchan_handle_stats_t, puts), sizeof s + 8, SIZE_MAX};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memset(&s, 0x5a, sizeof s);
        s.struct_size = bad[k];
        before = s;
        assert_int_equal(dchan_handle_stats(a.sh, &s), DCHAN_ERR_INVALID_ARG);
        assert_memory_equal(&s, &before, sizeof s);
    }
    /* An older header's smaller structure: only what fits is written. */
    memset(&s, 0x5a, sizeof s);
    s.struct_size = offsetof(dchan_handle_stats_t, bytes);
    before = s;
    assert_int_equal(dchan_handle_stats(a.sh, &s), DCHAN_SUCCESS);
    assert_true(s.puts == 1);
    assert_memory_equal((char *)&s + offsetof(dchan_handle_stats_t, bytes),
                        (char *)&before + offsetof(dchan_handle_stats_t, bytes),
                        sizeof s - offsetof(dchan_handle_stats_t, bytes));
    /* The handle is untouched by all that, and a destroyed one says so. */
    unit_cycle(&a, 2);
    assert_true(hstats(a.sh).puts == 2);
    dchan_handle_t *sh = a.sh;
    assert_int_equal(dchan_handle_destroy(sh), DCHAN_SUCCESS);
    a.sh = NULL;
    memset(&s, 0x5a, sizeof s);
    s.struct_size = sizeof s;
    before = s;
    assert_int_equal(dchan_handle_stats(sh, &s), DCHAN_ERR_STATE);
    assert_memory_equal(&s, &before, sizeof s);
    unit_chan_close(&a);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        UNIT_TEST_MODES(test_budget_runs_at_most_max),
        UNIT_TEST_MODES(test_budget_counts_errors),
        UNIT_TEST_MODES(test_budget_args),
        UNIT_TEST_MODES(test_handle_stats_counts),
        UNIT_TEST_MODES(test_handle_stats_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
