/* SPDX-License-Identifier: BSD-3-Clause */
/* Credit, depth and direct store (DESIGN §7) on self channels in every
 * detection mode: exact credit counts, slots in order, bad input of every
 * kind answered with its code, out-parameters untouched on failure, and
 * the channel still working after each refusal; DCHAN_CREDIT_WORDS on a
 * provider whose credit area is laid out at open (shm serving this rank),
 * and the self provider's, which grows with the channels. */
#include "config.h"

#include "unit.h"

#include "core.h"
#include "wire.h"

#define OOBP 0x0b0b0b0b0b0b0b0bull

/* A credited self channel of depth k. */
struct cchan {
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    size_t size;
    int k, calls;
    void *slot_in_cb; /* dchan_slot as the callback saw it */
};

static void ccb(dchan_handle_t *h, void *arg)
{
    struct cchan *c = arg;
    void *p = NULL;
    /* In a callback something is always held: the oldest held slot. */
    assert_int_equal(dchan_slot(h, &p), DCHAN_SUCCESS);
    c->slot_in_cb = p;
    c->calls++;
}

static void cchan_open(struct cchan *c, dchan_ctx_t *ctx, size_t size, int k)
{
    dchan_handle_attr_t ha;
    dchan_wire_t w;
    memset(c, 0, sizeof *c);
    c->size = size;
    c->k = k;
    c->rbuf = calloc((size_t)k, size);
    c->sbuf = calloc(1, size);
    assert_non_null(c->rbuf);
    assert_non_null(c->sbuf);
    dchan_handle_attr_init(&ha);
    ha.credit = 1;
    ha.depth = k;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, c->rbuf, size, OOBP, ccb, c, &ha, &c->rh),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(c->rh, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(ctx, &w, c->sbuf, size, &c->sh), DCHAN_SUCCESS);
}

static void cchan_close(struct cchan *c)
{
    assert_int_equal(dchan_handle_destroy(c->sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(c->rh), DCHAN_SUCCESS);
    free(c->rbuf);
    free(c->sbuf);
}

static int drain(dchan_ctx_t *ctx, struct cchan *c, int target)
{
    return unit_progress_until(ctx, &c->calls, target);
}

/* k puts go without a re-arm, the (k+1)-th is refused and sends nothing;
 * arrivals come in order, one per slot; each ready gives one credit back. */
static void test_credit_exact(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    static const int ks[] = {1, 2, 8, 64};
    for (size_t t = 0; t < sizeof ks / sizeof *ks; t++) {
        struct cchan c;
        int k = ks[t];
        cchan_open(&c, ctx, 64, k);
        for (int round = 0; round < 3; round++) {
            for (int i = 0; i < k; i++) {
                assert_int_equal(dchan_credits(c.sh), k - i);
                unit_fill(c.sbuf, c.size, k, round * k + i);
                assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
            }
            assert_int_equal(dchan_credits(c.sh), 0);
            unit_fill(c.sbuf, c.size, 99, 99);
            assert_int_equal(dchan_put(c.sh), DCHAN_ERR_AGAIN);
            void *p = (void *)&p;
            assert_int_equal(dchan_put_ptr(c.sh, &p), DCHAN_ERR_AGAIN);
            assert_ptr_equal(p, (void *)&p);
            c.calls = 0;
            assert_int_equal(drain(ctx, &c, k), DCHAN_SUCCESS);
            assert_int_equal(c.calls, k);
            assert_int_equal(dchan_progress(ctx), 0);
            for (int i = 0; i < k; i++) {
                /* The oldest unreleased slot, in put order. */
                assert_int_equal(dchan_slot(c.rh, &p), DCHAN_SUCCESS);
                assert_ptr_equal(p, c.rbuf + (size_t)((round * k + i) % k) * c.size);
                assert_true(unit_check(p, c.size, k, round * k + i));
                assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
                assert_int_equal(dchan_credits(c.sh), i + 1);
            }
            p = (void *)&p;
            assert_int_equal(dchan_slot(c.rh, &p), DCHAN_ERR_STATE);
            assert_ptr_equal(p, (void *)&p);
            assert_int_equal(dchan_ready(c.rh), DCHAN_ERR_STATE);
        }
        dchan_handle_stats_t s = {.struct_size = sizeof s};
        assert_int_equal(dchan_handle_stats(c.sh, &s), DCHAN_SUCCESS);
        assert_true(s.puts == 3u * (unsigned)k && s.credit_stalls == 6 && s.overruns == 0);
        assert_true(s.copied == s.bytes && s.bytes == 3u * (unsigned)k * 64);
        s.struct_size = sizeof s;
        assert_int_equal(dchan_handle_stats(c.rh, &s), DCHAN_SUCCESS);
        assert_true(s.arrivals == 3u * (unsigned)k && s.overruns == 0);
        cchan_close(&c);
    }
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* In the callback of an arrival with nothing older held, dchan_slot is
 * the slot that just arrived; a slot held keeps later arrivals coming. */
static void test_slot_in_callback(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct cchan c;
    cchan_open(&c, ctx, 48, 2);
    unit_fill(c.sbuf, 48, 1, 0);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(drain(ctx, &c, 1), DCHAN_SUCCESS);
    assert_ptr_equal(c.slot_in_cb, c.rbuf);
    /* Slot 0 held: slot 1 still arrives, and dchan_slot stays on slot 0. */
    unit_fill(c.sbuf, 48, 1, 1);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(drain(ctx, &c, 2), DCHAN_SUCCESS);
    assert_ptr_equal(c.slot_in_cb, c.rbuf); /* slot 0, still held, is the oldest */
    void *p;
    assert_int_equal(dchan_slot(c.rh, &p), DCHAN_SUCCESS);
    assert_ptr_equal(p, c.rbuf);
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_slot(c.rh, &p), DCHAN_SUCCESS);
    assert_ptr_equal(p, c.rbuf + 48);
    assert_true(unit_check(p, 48, 1, 1));
    /* ready_pollq on a deep handle: queued already, a no-op. */
    assert_int_equal(dchan_ready_pollq(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    cchan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* dchan_put_ptr: the receiver's slot on self (mapped), except in SENTINEL
 * mode; a message written there arrives intact, and nothing is copied. */
static void test_put_ptr(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct cchan c;
    cchan_open(&c, ctx, 256, 4);
    for (int i = 0; i < 10; i++) {
        void *p = NULL;
        assert_int_equal(dchan_put_ptr(c.sh, &p), DCHAN_SUCCESS);
        if (mode == DCHAN_DETECT_SENTINEL)
            assert_ptr_equal(p, c.sbuf);
        else
            assert_ptr_equal(p, c.rbuf + (size_t)(i % 4) * 256);
        unit_fill(p, 256, 7, i);
        assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
        int before = c.calls;
        assert_int_equal(drain(ctx, &c, before + 1), DCHAN_SUCCESS);
        assert_int_equal(dchan_slot(c.rh, &p), DCHAN_SUCCESS);
        assert_ptr_equal(p, c.rbuf + (size_t)(i % 4) * 256);
        assert_true(unit_check(p, 256, 7, i));
        assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    }
    dchan_handle_stats_t s = {.struct_size = sizeof s};
    assert_int_equal(dchan_handle_stats(c.sh, &s), DCHAN_SUCCESS);
    assert_true(s.puts == 10 && s.bytes == 2560);
    assert_true(s.copied == (mode == DCHAN_DETECT_SENTINEL ? 2560u : 0u));
    cchan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Every refusal of the new calls, each followed by proof that the
 * channels still work. */
static void test_bad_input(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    struct unit_chan u; /* an uncredited channel */
    struct cchan c;
    unit_chan_open(&u, ctx, 64);
    cchan_open(&c, ctx, 64, 2);
    unsigned char *buf = calloc(65, 64);
    dchan_handle_attr_t ha;
    dchan_handle_t *h = (dchan_handle_t *)&h;

    dchan_handle_attr_init(NULL); /* harmless */
    dchan_handle_attr_init(&ha);
    assert_int_equal(ha.struct_size, sizeof ha);
    assert_int_equal(ha.credit, 0);
    assert_int_equal(ha.depth, 1);
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, NULL, &h),
                     DCHAN_ERR_INVALID_ARG);
    ha.struct_size = sizeof ha - 8;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    ha.struct_size = sizeof ha + 8;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    dchan_handle_attr_init(&ha);
    ha.depth = 0;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    ha.depth = DCHAN_MAX_DEPTH + 1;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    ha.depth = -3;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    ha.depth = 64; /* slots that cannot fit in memory */
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, SIZE_MAX / 32, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    ha.depth = 2;
    assert_int_equal(dchan_create_handle_attr(ctx, 1, buf, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG); /* no rank 1 in a singleton */
    assert_int_equal(dchan_create_handle_attr(ctx, 0, NULL, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, NULL, &c, &ha, &h),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, NULL),
                     DCHAN_ERR_INVALID_ARG);
    /* A dchan_alloc block too small for two slots of 64 bytes. */
    void *small = NULL;
    assert_int_equal(dchan_alloc(ctx, 100, &small), DCHAN_SUCCESS);
    assert_int_equal(dchan_create_handle_attr(ctx, 0, small, 64, OOBP, ccb, &c, &ha, &h),
                     DCHAN_ERR_SIZE);
    assert_ptr_equal(h, (dchan_handle_t *)&h); /* untouched by every failure */
    assert_int_equal(dchan_free(ctx, small), DCHAN_SUCCESS);

    /* credit = 0 with depth > 1 is a credited handle. */
    dchan_handle_t *r2, *s2;
    dchan_wire_t w;
    ha.credit = 0;
    ha.depth = 3;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 64, OOBP, ccb, &c, &ha, &r2),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(r2, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(ctx, &w, buf + 64 * 64, 64, &s2), DCHAN_SUCCESS);
    assert_int_equal(dchan_credits(s2), 3);
    assert_int_equal(dchan_handle_destroy(s2), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(r2), DCHAN_SUCCESS);

    /* The calls of a credited sender on the wrong handles. */
    void *p = (void *)&p;
    assert_int_equal(dchan_credits(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_credits(u.sh), DCHAN_ERR_STATE); /* no credit */
    assert_int_equal(dchan_credits(u.rh), DCHAN_ERR_STATE);
    assert_int_equal(dchan_credits(c.rh), DCHAN_ERR_STATE); /* a receive handle */
    assert_int_equal(dchan_put_ptr(NULL, &p), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_put_ptr(c.sh, NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_put_ptr(u.sh, &p), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put_ptr(c.rh, &p), DCHAN_ERR_STATE);
    assert_int_equal(dchan_slot(NULL, &p), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_slot(c.rh, NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_slot(c.sh, &p), DCHAN_ERR_STATE);
    assert_int_equal(dchan_slot(c.rh, &p), DCHAN_ERR_STATE); /* nothing delivered */
    assert_int_equal(dchan_slot(u.rh, &p), DCHAN_ERR_STATE);
    assert_ptr_equal(p, (void *)&p);

    /* Both channels still work; the uncredited one also has a slot. */
    unit_cycle(&u, 1);
    unit_fill(c.sbuf, 64, 3, 1);
    assert_int_equal(dchan_put(c.sh), DCHAN_SUCCESS);
    assert_int_equal(drain(ctx, &c, 1), DCHAN_SUCCESS);
    assert_int_equal(dchan_slot(c.rh, &p), DCHAN_SUCCESS);
    assert_true(unit_check(p, 64, 3, 1));
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_credits(c.sh), 2);

    /* Destroyed handles answer DCHAN_ERR_STATE. */
    dchan_handle_t *dead_s = c.sh, *dead_r = c.rh;
    cchan_close(&c);
    assert_int_equal(dchan_credits(dead_s), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put_ptr(dead_s, &p), DCHAN_ERR_STATE);
    assert_int_equal(dchan_slot(dead_r, &p), DCHAN_ERR_STATE);
    unit_cycle(&u, 2);
    unit_chan_close(&u);
    free(buf);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* A fresh channel takes exactly its depth of puts (message id, i), refuses
 * the next, and all of them arrive. */
static void put_to_depth(dchan_ctx_t *ctx, struct cchan *c, int id)
{
    assert_int_equal(dchan_credits(c->sh), c->k);
    for (int i = 0; i < c->k; i++) {
        unit_fill(c->sbuf, c->size, id, i);
        assert_int_equal(dchan_put(c->sh), DCHAN_SUCCESS);
    }
    assert_int_equal(dchan_put(c->sh), DCHAN_ERR_AGAIN);
    assert_int_equal(drain(ctx, c, c->k), DCHAN_SUCCESS);
}

/* A context whose ranks keep 'words' credit words for each peer, on
 * provider (NULL: the automatic choice, self). */
static dchan_ctx_t *ctx_with_words_on(int mode, const char *words, const char *provider)
{
    setenv("DCHAN_CREDIT_WORDS", words, 1);
    if (provider)
        setenv("DCHAN_PROVIDER", provider, 1);
    dchan_ctx_t *ctx = unit_ctx(mode);
    unsetenv("DCHAN_CREDIT_WORDS");
    unsetenv("DCHAN_PROVIDER");
    return ctx;
}

static dchan_ctx_t *ctx_with_words(int mode, const char *words)
{
    return ctx_with_words_on(mode, words, NULL);
}

/* DCHAN_CREDIT_WORDS bounds the credited channels from one sender where
 * the provider lays its credit area out at open (shm, here serving this
 * rank's own channels); a word freed and taken again starts the new
 * channel with full credit, whatever count the old one left there. */
static void test_credit_words(void **state)
{
    int mode = UNIT_MODE(state);
#ifndef HAVE_SHM
    skip(); /* no provider with a fixed credit area serves a one-rank job */
#endif
    dchan_ctx_t *ctx = ctx_with_words_on(mode, "2", "shm");
    assert_string_equal(dchan_provider_name(ctx), "shm");
    struct cchan a, b;
    cchan_open(&a, ctx, 32, 2);
    cchan_open(&b, ctx, 32, 2);
    unsigned char *buf = calloc(2, 32);
    dchan_handle_attr_t ha;
    dchan_handle_t *h = NULL;
    dchan_handle_attr_init(&ha);
    ha.credit = 1;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, 32, OOBP, ccb, &a, &ha, &h),
                     DCHAN_ERR_NO_MEMORY);
    assert_null(h);
    /* An uncredited handle needs no word. */
    assert_int_equal(dchan_create_handle(ctx, 0, buf, 32, OOBP, ccb, &a, &h), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(h), DCHAN_SUCCESS);
    /* a leaves a count of 5 in its word, then goes. */
    for (int i = 0; i < 5; i++) {
        unit_fill(a.sbuf, 32, 0, i);
        assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
        assert_int_equal(drain(ctx, &a, i + 1), DCHAN_SUCCESS);
        assert_int_equal(dchan_ready(a.rh), DCHAN_SUCCESS);
    }
    cchan_close(&a);
    struct cchan c;
    cchan_open(&c, ctx, 32, 2);
    put_to_depth(ctx, &c, 1);
    assert_ptr_equal(c.slot_in_cb, c.rbuf); /* slot 0, still held, is the oldest */
    void *p;
    assert_int_equal(dchan_slot(c.rh, &p), DCHAN_SUCCESS);
    assert_ptr_equal(p, c.rbuf);
    assert_true(unit_check(p, 32, 1, 0));
    cchan_close(&c);
    cchan_close(&b);
    free(buf);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* The self provider keeps credit words as plain memory: a rank's own
 * credited channels are not bounded by DCHAN_CREDIT_WORDS (2 here). 300 of
 * depth 2 at once, each filled to its depth and refused beyond it, every
 * message checked, every credit back; then 300 new ones on the words the
 * first left, each with full credit. A wire of one of them with another's
 * credit word index, resealed, is refused. */
static void test_self_credit_grows(void **state)
{
    enum { N = 300, SIZE = 16 };
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = ctx_with_words(mode, "2");
    assert_string_equal(dchan_provider_name(ctx), "self");
    struct cchan *c = calloc(N, sizeof *c);
    assert_non_null(c);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++)
            cchan_open(&c[i], ctx, SIZE, 2);
        for (int i = 0; i < N; i++) {
            put_to_depth(ctx, &c[i], i);
            for (int s = 0; s < 2; s++) {
                void *p;
                assert_int_equal(dchan_slot(c[i].rh, &p), DCHAN_SUCCESS);
                assert_ptr_equal(p, c[i].rbuf + s * SIZE);
                assert_true(unit_check(p, SIZE, i, s));
                assert_int_equal(dchan_ready(c[i].rh), DCHAN_SUCCESS);
            }
            assert_int_equal(dchan_credits(c[i].sh), 2);
        }
        if (round == 1) {
            dchan_wire_t w;
            struct dchan_wire_fields f;
            dchan_handle_t *h = NULL;
            assert_int_equal(dchan_handle_export(c[7].rh, &w), DCHAN_SUCCESS);
            assert_int_equal(dchan_wire_decode(&w, &f), DCHAN_SUCCESS);
            f.credit_index = c[8].rh->cidx;
            dchan_wire_encode(&f, &w);
            assert_int_equal(dchan_assoc_local(ctx, &w, c[7].sbuf, SIZE, &h), DCHAN_ERR_HANDLE);
            assert_null(h);
            put_to_depth(ctx, &c[7], 1000); /* and the channel goes on */
        }
        for (int i = 0; i < N; i++)
            cchan_close(&c[i]);
    }
    free(c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* A credit word's count does not wrap: a channel past 2^32 releases goes on
 * with exact credit, a stale count written late is ignored, and the next
 * channel on the word starts above all the old one wrote, with full credit.
 * The counters are set 4 short of 2^32 on both sides at the start, where
 * four billion put/ready rounds would have left them. */
static void test_credit_count_64(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = ctx_with_words(mode, "1");
    struct cchan a, c;
    cchan_open(&a, ctx, 32, 2);
    const uint32_t start = UINT32_MAX - 3;
    a.rh->n_arr = a.rh->n_fired = a.rh->n_rel = start;
    a.rh->crel = start;
    a.sh->n_put = start;
    a.sh->cgranted = start;
    const uint64_t base = (uint64_t)a.rh->ctag << 32;
    for (int i = 0; i < 8; i++) {
        unit_fill(a.sbuf, 32, 3, i);
        assert_int_equal(dchan_put(a.sh), DCHAN_SUCCESS);
        assert_int_equal(dchan_credits(a.sh), 1);
        assert_int_equal(drain(ctx, &a, i + 1), DCHAN_SUCCESS);
        void *p;
        assert_int_equal(dchan_slot(a.rh, &p), DCHAN_SUCCESS);
        assert_true(unit_check(p, 32, 3, i));
        assert_int_equal(dchan_ready(a.rh), DCHAN_SUCCESS);
        assert_int_equal(dchan_credits(a.sh), 2);
        /* The word carried into its high half, and only grows. */
        assert_true(*a.sh->cword == base + (uint64_t)start + (uint64_t)i + 1);
    }
    assert_true(*a.sh->cword > base + UINT32_MAX);
    const uint64_t last = *a.sh->cword;
    /* A count of this channel from before, landing late: ignored. */
    *(volatile uint64_t *)a.sh->cword = last - 1;
    assert_int_equal(dchan_credits(a.sh), 2);
    *(volatile uint64_t *)a.sh->cword = last;
    cchan_close(&a);
    /* The word again, for another channel: above the old values by 2^32. */
    cchan_open(&c, ctx, 32, 2);
    assert_true(((uint64_t)c.rh->ctag << 32) >= last + (1ull << 32));
    assert_int_equal(dchan_credits(c.sh), 2);
    /* The old channel's last count, written late: not this channel's. */
    *(volatile uint64_t *)c.sh->cword = last;
    put_to_depth(ctx, &c, 4);
    assert_int_equal(dchan_ready(c.rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_credits(c.sh), 1);
    cchan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* A credited sender's buffer is size bytes, whatever the depth: a
 * dchan_alloc block just past it is not in use (dchan_free once took the
 * sender's buffer for depth slots, and refused to free its neighbours). */
static void test_free_beside_sender(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_ctx_t *ctx = unit_ctx(mode);
    enum { NB = 8, BLOCK = 256, SIZE = 64 };
    unsigned char *b[NB], *rbuf = calloc(4, SIZE);
    assert_non_null(rbuf);
    int low = 0;
    for (int i = 0; i < NB; i++) {
        assert_int_equal(dchan_alloc(ctx, BLOCK, (void **)&b[i]), DCHAN_SUCCESS);
        if (b[i] < b[low])
            low = i;
    }
    /* The lowest block's last SIZE bytes send on a depth-4 channel: the
     * blocks above it lie within the depth slots that were wrongly
     * counted. */
    dchan_handle_attr_t ha;
    dchan_handle_attr_init(&ha);
    ha.credit = 1;
    ha.depth = 4;
    dchan_handle_t *rh, *sh;
    dchan_wire_t w;
    struct cchan c = {.size = SIZE, .k = 4};
    unsigned char *sbuf = b[low] + BLOCK - SIZE;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, rbuf, SIZE, OOBP, ccb, &c, &ha, &rh),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(rh, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(ctx, &w, sbuf, SIZE, &sh), DCHAN_SUCCESS);
    for (int i = 0; i < NB; i++)
        if (i != low)
            assert_int_equal(dchan_free(ctx, b[i]), DCHAN_SUCCESS);
    assert_int_equal(dchan_free(ctx, b[low]), DCHAN_ERR_STATE); /* the sender's own */
    /* And the channel still carries a message. */
    unit_fill(sbuf, SIZE, 9, 1);
    assert_int_equal(dchan_put(sh), DCHAN_SUCCESS);
    assert_int_equal(drain(ctx, &c, 1), DCHAN_SUCCESS);
    assert_true(unit_check(rbuf, SIZE, 9, 1));
    assert_int_equal(dchan_ready(rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_free(ctx, b[low]), DCHAN_SUCCESS);
    free(rbuf);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        UNIT_TEST_MODES(test_credit_exact),  UNIT_TEST_MODES(test_slot_in_callback),
        UNIT_TEST_MODES(test_put_ptr),       UNIT_TEST_MODES(test_bad_input),
        UNIT_TEST_MODES(test_credit_words),  UNIT_TEST_MODES(test_credit_count_64),
        UNIT_TEST_MODES(test_free_beside_sender), UNIT_TEST_MODES(test_self_credit_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
