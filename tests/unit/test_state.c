/* SPDX-License-Identifier: BSD-3-Clause */
/* The handle state machine of DESIGN §3, through the public API: misuse
 * gets its code and the handle stays usable; overruns are reported. */
#include "config.h"

#include "unit.h"

#include "core.h"

#define OOB 0x0b0b0b0b0b0b0b0bull

/* ---- misuse on a healthy channel --------------------------------------------------- */

static void test_ready_on_armed(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    assert_int_equal(dchan_handle_detect(c.rh), UNIT_MODE(state));
    assert_int_equal(dchan_handle_detect(c.sh), UNIT_MODE(state));
    for (int it = 0; it < 3; it++) {
        /* Armed (fresh, or re-armed by the previous cycle). */
        assert_int_equal(dchan_ready(c.rh), DCHAN_ERR_STATE);
        assert_int_equal(dchan_ready_mark(c.rh), DCHAN_ERR_STATE);
        assert_int_equal(c.calls, it);
        unit_cycle(&c, it);
    }
    /* Marked but not queued is armed too. */
    unit_fill(c.sbuf, c.size, 0, 10);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(ctx, &c.calls, 4), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready_mark(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready_mark(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    unit_cycle(&c, 11);
    /* Marked, put to, not queued: the arrival is pending, still no re-arm. */
    unit_fill(c.sbuf, c.size, 0, 12);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(ctx, &c.calls, 6), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready_mark(c.rh), DCHAN_SUCCESS);
    unit_fill(c.sbuf, c.size, 0, 13);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(dchan_ready_mark(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_progress(ctx), 1);
    assert_int_equal(c.calls, 7);
    assert_true(unit_check(c.rbuf, c.size, 0, 13));
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    unit_cycle(&c, 14);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_put_on_receive_handle(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    dchan_stats_t st;
    unsigned char snap[64];
    unit_chan_open(&c, ctx, 64);
    memcpy(snap, c.rbuf, sizeof snap);
    unit_fill(c.sbuf, c.size, 7, 7);
    assert_int_equal(dchan_put(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put_test(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(c.calls, 0);
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.puts == 0);
    assert_memory_equal(c.rbuf, snap, sizeof snap);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_receiver_calls_on_send_handle(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    dchan_wire_t w, ref;
    unit_chan_open(&c, ctx, 64);
    assert_int_equal(dchan_put_test(c.sh), 1); /* nothing in flight */
    assert_int_equal(dchan_ready(c.sh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_mark(c.sh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_pollq(c.sh), DCHAN_ERR_STATE);
    memset(&w, 0x5a, sizeof w);
    ref = w;
    assert_int_equal(dchan_handle_export(c.sh, &w), DCHAN_ERR_STATE);
    assert_memory_equal(&w, &ref, sizeof w);
    unit_cycle(&c, 1);
    assert_int_equal(dchan_put_test(c.sh), 1); /* self completes at once */
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void expect_dead(dchan_handle_t *h)
{
    dchan_wire_t w;
    assert_int_equal(dchan_put(h), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put_test(h), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready(h), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_mark(h), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_pollq(h), DCHAN_ERR_STATE);
    assert_int_equal(dchan_handle_export(h, &w), DCHAN_ERR_STATE);
    assert_int_equal(dchan_handle_detect(h), DCHAN_ERR_STATE);
    assert_null(dchan_handle_provider(h));
    assert_int_equal(dchan_handle_destroy(h), DCHAN_ERR_STATE);
}

static void test_calls_after_destroy(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan a, b;
    unit_chan_open(&a, ctx, 64);
    unit_chan_open(&b, ctx, 64);
    b.id = 1;
    unit_cycle(&a, 1);
    unit_cycle(&b, 1);

    /* Destroyed while armed, with an arrival pending, and when held. */
    unit_fill(a.sbuf, a.size, 0, 2);
    assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(a.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(a.sh), DCHAN_SUCCESS);
    expect_dead(a.rh);
    expect_dead(a.sh);
    for (int i = 0; i < 5; i++)
        assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(a.calls, 1);
    a.rh = a.sh = NULL;

    /* The other channel is untouched. */
    for (int it = 2; it < 5; it++)
        unit_cycle(&b, it);

    /* Receiver gone, sender left: its puts fail and nothing fires. */
    assert_int_equal(dchan_handle_destroy(b.rh), DCHAN_SUCCESS);
    expect_dead(b.rh);
    b.rh = NULL;
    unit_fill(b.sbuf, b.size, 1, 9);
    assert_int_equal(dchan_put(b.sh), DCHAN_ERR_PEER); /* self: dchan_put(3) */
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(b.calls, 4);
    assert_int_equal(dchan_handle_destroy(b.sh), DCHAN_SUCCESS);
    expect_dead(b.sh);
    b.sh = NULL;
    unit_chan_close(&a);
    unit_chan_close(&b);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* A sender destroyed and the receiver kept: a new sender (a new send
 * buffer, say) can associate with the same wire and carry on. */
static void test_reassociate(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    dchan_wire_t w;
    dchan_stats_t st;
    unit_chan_open(&c, ctx, 64);
    unit_cycle(&c, 1);
    unit_cycle(&c, 2);
    assert_int_equal(dchan_handle_destroy(c.sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(c.rh, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(ctx, &w, c.sbuf, c.size, &c.sh), DCHAN_SUCCESS);
    unit_fill(c.sbuf, c.size, 0, 3);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    for (int i = 0; i < 5; i++)
        assert_true(dchan_progress(ctx) >= 0);
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    if (c.calls != 3 || st.errors != 0) {
        int rc = dchan_ready(c.rh);
        assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS); /* no leak report */
        free(c.rbuf);
        free(c.sbuf);
        fail_msg("%s: first put of a re-associated sender gave %d callbacks, %d errors "
                 "(ready now gives '%s')",
                 unit_mode_name(UNIT_MODE(state)), c.calls - 2, (int)st.errors,
                 dchan_strerror(rc));
    }
    assert_true(unit_check(c.rbuf, c.size, 0, 3));
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    unit_cycle(&c, 4);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_pollq_on_held(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    unit_fill(c.sbuf, c.size, 0, 1);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(ctx, &c.calls, 1), DCHAN_SUCCESS);
    /* Held: not marked yet. */
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(c.calls, 1);
    assert_true(unit_check(c.rbuf, c.size, 0, 1));
    /* Still usable. */
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    unit_cycle(&c, 2);
    unit_cycle(&c, 3);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_pollq_twice(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    /* A new handle is already queued: a no-op. */
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    unit_cycle(&c, 1); /* ends with dchan_ready */
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    for (int it = 2; it < 5; it++) {
        unit_fill(c.sbuf, c.size, 0, it);
        assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
        assert_int_equal(unit_progress_until(ctx, &c.calls, it), DCHAN_SUCCESS);
        for (int i = 0; i < 5; i++)
            assert_int_equal(dchan_progress(ctx), 0);
        assert_int_equal(c.calls, it); /* exactly once, not once per pollq */
        assert_true(unit_check(c.rbuf, c.size, 0, it));
        assert_int_equal(dchan_ready_mark(c.rh), DCHAN_SUCCESS);
        assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
        assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
        assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    }
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_size_mismatch(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(UNIT_MODE(state));
    struct unit_chan c;
    dchan_wire_t w;
    unsigned char *big = calloc(1, 4096);
    size_t sizes[] = {56, 72, 8, 128, 1, 63, 65, 4096};
    unit_chan_open(&c, ctx, 64);
    assert_int_equal(dchan_handle_export(c.rh, &w), DCHAN_SUCCESS);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        dchan_handle_t *sh = (dchan_handle_t *)&c;
        uint64_t live = ctx->nlive;
        assert_int_equal(dchan_assoc_local(ctx, &w, big, sizes[i], &sh), DCHAN_ERR_SIZE);
        assert_ptr_equal(sh, (dchan_handle_t *)&c);
        assert_true(ctx->nlive == live);
    }
    unit_cycle(&c, 1);
    free(big);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* ---- SENTINEL rules -------------------------------------------------------------------- */

static void test_sentinel_put_refused(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(DCHAN_DETECT_SENTINEL);
    struct unit_chan c;
    dchan_stats_t st0, st1;
    unsigned char snap[64];
    uint64_t oob = OOB, tail;

    unit_chan_open(&c, ctx, 64);
    memcpy(&tail, c.rbuf + 56, 8);
    assert_true(tail == oob); /* armed: the tail holds the pattern */
    unit_cycle(&c, 1);
    memcpy(&tail, c.rbuf + 56, 8);
    assert_true(tail == oob); /* re-armed by dchan_ready */

    memcpy(snap, c.rbuf, sizeof snap);
    assert_int_equal(dchan_get_stats(ctx, &st0), DCHAN_SUCCESS);
    unit_fill(c.sbuf, c.size, 0, 2);
    memcpy(c.sbuf + 56, &oob, 8);
    assert_int_equal(dchan_put(c.sh), DCHAN_ERR_SENTINEL);
    memset(c.sbuf, 0x0b, c.size); /* the whole buffer is the pattern */
    assert_int_equal(dchan_put(c.sh), DCHAN_ERR_SENTINEL);
    for (int i = 0; i < 5; i++)
        assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(c.calls, 1);
    assert_memory_equal(c.rbuf, snap, sizeof snap);
    assert_int_equal(dchan_get_stats(ctx, &st1), DCHAN_SUCCESS);
    assert_true(st1.puts == st0.puts);
    assert_true(st1.arrivals == st0.arrivals);
    assert_int_equal(dchan_put_test(c.sh), 1);

    /* Only the last 8 bytes matter: the pattern elsewhere is fine. */
    unit_fill(c.sbuf, c.size, 0, 3);
    memcpy(c.sbuf, &oob, 8);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(ctx, &c.calls, 2), DCHAN_SUCCESS);
    assert_memory_equal(c.rbuf, c.sbuf, c.size);
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    unit_cycle(&c, 4);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Outside SENTINEL the oob argument is ignored: any content goes. */
static void test_oob_ignored_elsewhere(void **state)
{
    int mode = UNIT_MODE(state);
    if (mode == DCHAN_DETECT_SENTINEL)
        skip();
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan c;
    uint64_t oob = OOB;
    unit_chan_open(&c, ctx, 64);
    memset(c.sbuf, 0x0b, c.size);
    memcpy(c.sbuf + 56, &oob, 8);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(ctx, &c.calls, 1), DCHAN_SUCCESS);
    assert_memory_equal(c.rbuf, c.sbuf, c.size);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_create_size_alignment(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan dummy = {0};
    uint64_t store[8];
    unsigned char *raw = (unsigned char *)store;
    size_t sizes[] = {1, 4, 7, 12, 20, 60};

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        dchan_handle_t *h = (dchan_handle_t *)store;
        uint64_t live = ctx->nlive;
        int rc = dchan_create_handle(ctx, 0, raw, sizes[i], OOB, unit_count_cb, &dummy, &h);
        if (mode == DCHAN_DETECT_SENTINEL) {
            assert_int_equal(rc, DCHAN_ERR_SIZE);
            assert_ptr_equal(h, (dchan_handle_t *)store);
            assert_true(ctx->nlive == live);
        } else {
            assert_int_equal(rc, DCHAN_SUCCESS);
            assert_int_equal(dchan_handle_destroy(h), DCHAN_SUCCESS);
        }
    }
    for (int off = 1; off < 8; off++) {
        dchan_handle_t *h = (dchan_handle_t *)store;
        int rc = dchan_create_handle(ctx, 0, raw + off, 16, OOB, unit_count_cb, &dummy, &h);
        if (mode == DCHAN_DETECT_SENTINEL) {
            assert_int_equal(rc, DCHAN_ERR_INVALID_ARG);
            assert_ptr_equal(h, (dchan_handle_t *)store);
        } else {
            assert_int_equal(rc, DCHAN_SUCCESS);
            assert_int_equal(dchan_handle_destroy(h), DCHAN_SUCCESS);
        }
    }

    /* The smallest SENTINEL buffer (the tail is the whole buffer), and odd
     * sizes and misaligned buffers elsewhere, carry data correctly. */
    struct {
        size_t off, size;
    } ok[] = {{0, 8}, {0, 16}, {3, 12}, {1, 1}, {5, 37}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (mode == DCHAN_DETECT_SENTINEL && (ok[i].off || ok[i].size % 8))
            continue;
        struct unit_chan c;
        dchan_wire_t w;
        unsigned char *rb = malloc(ok[i].size + 16), *sb = malloc(ok[i].size + 16);
        memset(&c, 0, sizeof c);
        c.ctx = ctx;
        c.size = ok[i].size;
        c.rbuf = rb + ok[i].off;
        c.sbuf = sb + ok[i].off;
        c.id = (int)i;
        memset(rb, 0xee, ok[i].size + 16);
        assert_int_equal(dchan_create_handle(ctx, 0, c.rbuf, c.size, OOB, unit_count_cb, &c,
                                             &c.rh),
                         DCHAN_SUCCESS);
        assert_int_equal(dchan_handle_export(c.rh, &w), DCHAN_SUCCESS);
        assert_int_equal(dchan_assoc_local(ctx, &w, c.sbuf, c.size, &c.sh), DCHAN_SUCCESS);
        for (int it = 0; it < 3; it++)
            unit_cycle(&c, it);
        /* Exactly [buf, buf+size) was written. */
        for (size_t j = 0; j < ok[i].off; j++)
            assert_int_equal(rb[j], 0xee);
        for (size_t j = ok[i].off + ok[i].size; j < ok[i].size + 16; j++)
            assert_int_equal(rb[j], 0xee);
        assert_int_equal(dchan_handle_destroy(c.sh), DCHAN_SUCCESS);
        assert_int_equal(dchan_handle_destroy(c.rh), DCHAN_SUCCESS);
        free(rb);
        free(sb);
    }
    assert_int_equal(dummy.calls, 0);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_auto_mode(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(DCHAN_DETECT_AUTO);
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    assert_string_equal(dchan_provider_name(ctx), "self");
    assert_string_equal(dchan_handle_provider(c.rh), "self");
    assert_string_equal(dchan_handle_provider(c.sh), "self");
    int d = dchan_handle_detect(c.rh);
    assert_true(d >= DCHAN_DETECT_SENTINEL && d <= DCHAN_DETECT_EVENT);
    assert_int_equal(dchan_handle_detect(c.sh), d);
    unit_cycle(&c, 1);
    unit_cycle(&c, 2);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* ---- overruns (FLAG and EVENT detect them; SENTINEL cannot) --------------------------- */

struct errlog {
    int calls;
    dchan_handle_t *h;
    int rc;
    void *arg;
    int in_cb_progress;
};

static void err_cb(dchan_handle_t *h, int rc, void *arg)
{
    struct errlog *e = arg;
    e->calls++;
    e->h = h;
    e->rc = rc;
    e->arg = arg;
    /* error_fn runs from progress: progress is refused inside it as well. */
    e->in_cb_progress = dchan_progress(dchan_h_prov(h)->ctx);
}

static void expect_overrun_reported(dchan_ctx_t *ctx, struct errlog *e, struct unit_chan *c,
                                    int calls_before)
{
    dchan_stats_t st;
    for (int i = 0; i < 5 && e->calls == 0; i++)
        assert_true(dchan_progress(ctx) >= 0);
    assert_int_equal(e->calls, 1);
    assert_ptr_equal(e->h, c->rh);
    assert_int_equal(e->rc, DCHAN_ERR_OVERRUN);
    assert_ptr_equal(e->arg, e);
    assert_int_equal(e->in_cb_progress, DCHAN_ERR_STATE);
    assert_int_equal(c->calls, calls_before); /* no arrival for an overrun */
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.errors == 1);
    /* Sticky: later calls on the handle return the error; reported once. */
    assert_int_equal(dchan_ready(c->rh), DCHAN_ERR_OVERRUN);
    assert_int_equal(dchan_ready_mark(c->rh), DCHAN_ERR_OVERRUN);
    assert_int_equal(dchan_ready_pollq(c->rh), DCHAN_ERR_OVERRUN);
    for (int i = 0; i < 5; i++)
        assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(e->calls, 1);
    assert_int_equal(c->calls, calls_before);
}

enum overrun_kind {
    OV_BEFORE_PROGRESS, /* put, put, progress */
    OV_WHILE_HELD,      /* put, progress (callback), put, ready */
    OV_BETWEEN_MARK     /* ..., mark, put, put, pollq, progress */
};

static void run_overrun(int mode, enum overrun_kind kind)
{
    struct errlog e = {0};
    dchan_ctx_t *ctx = unit_ctx_err(mode, err_cb, &e);
    struct unit_chan a, b;
    unit_chan_open(&a, ctx, 64);
    unit_chan_open(&b, ctx, 64);
    b.id = 1;
    unit_cycle(&a, 0);
    unit_cycle(&b, 0);

    switch (kind) {
    case OV_BEFORE_PROGRESS: {
        unit_fill(a.sbuf, a.size, 0, 1);
        assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
        unit_fill(a.sbuf, a.size, 0, 2);
        /* self refuses to write over an arrival it already delivered (EVENT);
         * a FLAG word it cannot see yet is caught by the scan. */
        int rc2 = dchan_put(a.sh);
        assert_int_equal(rc2, mode == DCHAN_DETECT_EVENT ? DCHAN_ERR_OVERRUN : DCHAN_SUCCESS);
        expect_overrun_reported(ctx, &e, &a, 1);
        break;
    }
    case OV_WHILE_HELD:
        unit_fill(a.sbuf, a.size, 0, 1);
        assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
        assert_int_equal(unit_progress_until(ctx, &a.calls, 2), DCHAN_SUCCESS);
        unit_fill(a.sbuf, a.size, 0, 2);
        /* The application holds the data: self refuses and keeps it intact. */
        assert_int_equal(dchan_put(a.sh), DCHAN_ERR_OVERRUN);
        assert_true(unit_check(a.rbuf, a.size, 0, 1));
        assert_int_equal(dchan_ready(a.rh), DCHAN_ERR_OVERRUN);
        expect_overrun_reported(ctx, &e, &a, 2);
        break;
    case OV_BETWEEN_MARK:
        assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
        assert_int_equal(unit_progress_until(ctx, &a.calls, 2), DCHAN_SUCCESS);
        assert_int_equal(dchan_ready_mark(a.rh), DCHAN_SUCCESS);
        assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
        /* EVENT saw the first put arrive (pending until pollq): the second
         * is refused at once; FLAG only learns of it at the scan. */
        assert_int_equal(dchan_put(a.sh),
                         mode == DCHAN_DETECT_EVENT ? DCHAN_ERR_OVERRUN : DCHAN_SUCCESS);
        /* An error report counts as an event of progress. */
        assert_int_equal(dchan_progress(ctx), mode == DCHAN_DETECT_EVENT ? 1 : 0);
        assert_int_equal(e.calls, 0 + (mode == DCHAN_DETECT_EVENT ? 1 : 0));
        int rc = dchan_ready_pollq(a.rh);
        assert_true(rc == DCHAN_SUCCESS || rc == DCHAN_ERR_OVERRUN);
        expect_overrun_reported(ctx, &e, &a, 2);
        break;
    }

    /* Other handles keep working. */
    for (int it = 1; it < 4; it++)
        unit_cycle(&b, it);
    assert_int_equal(e.calls, 1);
    /* The broken handle can still be destroyed, and a new one works. */
    assert_int_equal(dchan_handle_destroy(a.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(a.sh), DCHAN_SUCCESS);
    a.rh = a.sh = NULL;
    unit_chan_close(&a);
    unit_chan_open(&a, ctx, 64);
    a.id = 2;
    unit_cycle(&a, 5);
    unit_chan_close(&a);
    unit_chan_close(&b);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

static void test_overrun_before_progress(void **state)
{
    if (UNIT_MODE(state) == DCHAN_DETECT_SENTINEL)
        skip(); /* SENTINEL cannot see a second put (DESIGN §3) */
    run_overrun(UNIT_MODE(state), OV_BEFORE_PROGRESS);
}

static void test_overrun_while_held(void **state)
{
    if (UNIT_MODE(state) == DCHAN_DETECT_SENTINEL)
        skip();
    run_overrun(UNIT_MODE(state), OV_WHILE_HELD);
}

static void test_overrun_between_mark_and_pollq(void **state)
{
    if (UNIT_MODE(state) == DCHAN_DETECT_SENTINEL)
        skip();
    run_overrun(UNIT_MODE(state), OV_BETWEEN_MARK);
}

/* dchan_wait(3): an error report ends the wait like an arrival, so that
 * nobody waits forever on a channel that broke. */
static void test_wait_runs_error_fn(void **state)
{
    int mode = UNIT_MODE(state);
    if (mode == DCHAN_DETECT_SENTINEL)
        skip();
    struct errlog e = {0};
    dchan_ctx_t *ctx = unit_ctx_err(mode, err_cb, &e);
    struct unit_chan a, b;
    unit_chan_open(&a, ctx, 64);
    unit_chan_open(&b, ctx, 64);
    b.id = 1;
    assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
    int rc2 = dchan_put(a.sh);
    assert_true(rc2 == DCHAN_SUCCESS || rc2 == DCHAN_ERR_OVERRUN);
    assert_int_equal(dchan_wait(ctx, 20000), 1);
    assert_int_equal(e.calls, 1);
    assert_ptr_equal(e.h, a.rh);
    assert_int_equal(e.rc, DCHAN_ERR_OVERRUN);
    assert_int_equal(e.in_cb_progress, DCHAN_ERR_STATE);
    assert_int_equal(a.calls, 0);
    /* An arrival on another channel does end it. */
    unit_fill(b.sbuf, b.size, 1, 1);
    assert_int_equal(dchan_put(b.sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_wait(ctx, -1), 1);
    assert_int_equal(b.calls, 1);
    assert_true(unit_check(b.rbuf, b.size, 1, 1));
    assert_int_equal(e.calls, 1);
    unit_chan_close(&a);
    unit_chan_close(&b);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Without an error_fn the error is still returned by later calls. */
static void test_overrun_without_error_fn(void **state)
{
    int mode = UNIT_MODE(state);
    if (mode == DCHAN_DETECT_SENTINEL)
        skip();
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan a;
    dchan_stats_t st;
    unit_chan_open(&a, ctx, 64);
    assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
    int rc2 = dchan_put(a.sh);
    assert_true(rc2 == DCHAN_SUCCESS || rc2 == DCHAN_ERR_OVERRUN);
    /* The error is reported once (counted by progress), never an arrival. */
    int events = 0;
    for (int i = 0; i < 3; i++)
        events += dchan_progress(ctx);
    assert_int_equal(events, 1);
    assert_int_equal(a.calls, 0);
    assert_int_equal(dchan_ready(a.rh), DCHAN_ERR_OVERRUN);
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.errors == 1);
    unit_chan_close(&a);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        UNIT_TEST_MODES(test_ready_on_armed),
        UNIT_TEST_MODES(test_put_on_receive_handle),
        UNIT_TEST_MODES(test_receiver_calls_on_send_handle),
        UNIT_TEST_MODES(test_calls_after_destroy),
        UNIT_TEST_MODES(test_reassociate),
        UNIT_TEST_MODES(test_pollq_on_held),
        UNIT_TEST_MODES(test_pollq_twice),
        UNIT_TEST_MODES(test_size_mismatch),
        cmocka_unit_test(test_sentinel_put_refused),
        UNIT_TEST_MODES(test_oob_ignored_elsewhere),
        UNIT_TEST_MODES(test_create_size_alignment),
        cmocka_unit_test(test_auto_mode),
        UNIT_TEST_MODES(test_overrun_before_progress),
        UNIT_TEST_MODES(test_overrun_while_held),
        UNIT_TEST_MODES(test_overrun_between_mark_and_pollq),
        UNIT_TEST_MODES(test_overrun_without_error_fn),
        UNIT_TEST_MODES(test_wait_runs_error_fn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
