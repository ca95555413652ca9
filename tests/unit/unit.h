/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared helpers of the cmocka unit tests: a clean environment, singleton
 * contexts and self channels (one receive and one send handle in the same
 * process). Include after "config.h" and the system headers cmocka needs.
 */
#ifndef DCHAN_UNIT_H
#define DCHAN_UNIT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dchan.h"

extern char **environ;

/* Remove every DCHAN_* variable, so that the user's environment cannot
 * change what the tests see. */
static inline void unit_clean_env(void)
{
    for (;;) {
        char name[256];
        int found = 0;
        for (char **e = environ; e && *e; e++) {
            if (strncmp(*e, "DCHAN_", 6) == 0) {
                size_t n = strcspn(*e, "=");
                if (n >= sizeof name)
                    n = sizeof name - 1;
                memcpy(name, *e, n);
                name[n] = '\0';
                found = 1;
                break;
            }
        }
        if (!found)
            break;
        unsetenv(name);
    }
}

/* Attributes of a singleton context with the given detection and threads. */
static inline void unit_attr(dchan_attr_t *a, int detect, int thread_level)
{
    dchan_attr_init(a);
    a->bootstrap = DCHAN_BOOT_SINGLETON;
    a->detect = detect;
    a->thread_level = thread_level;
    a->log_level = DCHAN_LOG_NONE; /* misuse is on purpose here */
}

static inline dchan_ctx_t *unit_ctx(int detect)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    unit_attr(&a, detect, DCHAN_THREAD_SINGLE);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_non_null(ctx);
    assert_int_equal(dchan_rank(ctx), 0);
    assert_int_equal(dchan_nranks(ctx), 1);
    return ctx;
}

static inline dchan_ctx_t *unit_ctx_err(int detect, dchan_error_fn fn, void *arg)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    unit_attr(&a, detect, DCHAN_THREAD_SINGLE);
    a.error_fn = fn;
    a.error_arg = arg;
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    return ctx;
}

/* The three modes every test runs in. */
static const int unit_modes[] = {DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG, DCHAN_DETECT_EVENT};
#define UNIT_NMODES 3
/* Per-mode test cases: the mode is the test's initial state. */
static int unit_mode_vals[UNIT_NMODES] __attribute__((unused)) = {
    DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG, DCHAN_DETECT_EVENT};
#define UNIT_MODE(state) (*(int *)*(state))
#define UNIT_TEST_MODES(f)                                                                 \
    {#f "/sentinel", f, NULL, NULL, &unit_mode_vals[0]},                                  \
        {#f "/flag", f, NULL, NULL, &unit_mode_vals[1]},                                   \
        {#f "/event", f, NULL, NULL, &unit_mode_vals[2]}

/* A self channel: receiver and sender in one context. */
struct unit_chan {
    dchan_ctx_t *ctx;
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    size_t size;
    uint64_t oob;
    int calls;          /* arrival callbacks seen */
    dchan_handle_t *last_h;
    void *last_arg;
    int id;
};

static inline void unit_count_cb(dchan_handle_t *h, void *arg)
{
    struct unit_chan *c = arg;
    c->calls++;
    c->last_h = h;
    c->last_arg = arg;
}

/* An 8-byte-aligned buffer (SENTINEL needs it); malloc aligns to 16. */
static inline void unit_chan_open_cb(struct unit_chan *c, dchan_ctx_t *ctx, size_t size,
                                     uint64_t oob, dchan_arrival_fn fn, void *arg)
{
    dchan_wire_t w;
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->size = size;
    c->oob = oob;
    c->rbuf = calloc(1, size);
    c->sbuf = calloc(1, size);
    assert_non_null(c->rbuf);
    assert_non_null(c->sbuf);
    assert_int_equal(dchan_create_handle(ctx, 0, c->rbuf, size, oob, fn, arg, &c->rh),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(c->rh, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(ctx, &w, c->sbuf, size, &c->sh), DCHAN_SUCCESS);
}

static inline void unit_chan_open(struct unit_chan *c, dchan_ctx_t *ctx, size_t size)
{
    unit_chan_open_cb(c, ctx, size, 0x0b0b0b0b0b0b0b0bull, unit_count_cb, c);
}

/* Deterministic content for channel ch at iteration it, never ending with
 * the oob pattern 0x0b..0b (no byte of it is 0x0b at the tail). */
static inline unsigned char unit_pat(int ch, int it, size_t i)
{
    unsigned char v = (unsigned char)(ch * 131 + it * 17 + (int)i * 7 + 1);
    return v == 0x0b ? 0x0c : v;
}

static inline void unit_fill(unsigned char *b, size_t n, int ch, int it)
{
    for (size_t i = 0; i < n; i++)
        b[i] = unit_pat(ch, it, i);
}

static inline int unit_check(const unsigned char *b, size_t n, int ch, int it)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != unit_pat(ch, it, i))
            return 0;
    return 1;
}

static inline void unit_chan_close(struct unit_chan *c)
{
    if (c->sh)
        assert_int_equal(dchan_handle_destroy(c->sh), DCHAN_SUCCESS);
    if (c->rh)
        assert_int_equal(dchan_handle_destroy(c->rh), DCHAN_SUCCESS);
    free(c->rbuf);
    free(c->sbuf);
    c->rh = c->sh = NULL;
    c->rbuf = c->sbuf = NULL;
}

/* Progress until at least n callbacks of c ran more than before, with a
 * bound so that a lost arrival fails instead of hanging. */
static inline int unit_progress_until(dchan_ctx_t *ctx, const int *counter, int target)
{
    for (int i = 0; i < 100000 && *counter < target; i++) {
        int rc = dchan_progress(ctx);
        if (rc < 0)
            return rc;
    }
    return *counter >= target ? DCHAN_SUCCESS : DCHAN_ERR_TIMEOUT;
}

/* One full cycle on a healthy channel: fill, put, progress, verify, ready. */
static inline void unit_cycle(struct unit_chan *c, int it)
{
    int before = c->calls;
    unit_fill(c->sbuf, c->size, c->id, it);
    assert_int_equal(dchan_put(c->sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(c->ctx, &c->calls, before + 1), DCHAN_SUCCESS);
    assert_int_equal(c->calls, before + 1);
    assert_ptr_equal(c->last_h, c->rh);
    assert_true(unit_check(c->rbuf, c->size, c->id, it));
    assert_int_equal(dchan_ready(c->rh), DCHAN_SUCCESS);
}

static inline const char *unit_mode_name(int m)
{
    switch (m) {
    case DCHAN_DETECT_SENTINEL:
        return "sentinel";
    case DCHAN_DETECT_FLAG:
        return "flag";
    case DCHAN_DETECT_EVENT:
        return "event";
    default:
        return "auto";
    }
}

#endif
