/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libuv glue for dchan. Three handles, in libuv's order of a loop turn:
 *   uv_idle_t     runs only while dchan has work (its presence makes the
 *                 poll phase return at once): progress with the budget;
 *   uv_prepare_t  right before the loop blocks: dchan_wakeup_arm. Success:
 *                 the idle handle stops and the loop may block; AGAIN: it
 *                 starts, so the loop comes round again without blocking;
 *   uv_poll_t     on dchan's descriptor: readable when an arrival, a
 *                 credit or an error came while the loop slept: progress.
 * So the loop never spins while dchan is idle, and never blocks while
 * dchan has work.
 */
#include <stdlib.h>

#include "dchan_uv.h"

struct dchan_uv {
    uv_poll_t poll;
    uv_prepare_t prepare;
    uv_idle_t idle;
    dchan_ctx_t *ctx;
    int budget;
    int error;
    int open; /* handles not closed yet */
    unsigned long wakeups;
    dchan_uv_close_cb close_cb;
    void *close_arg;
};

static void note(dchan_uv_t *du, int rc)
{
    if (rc < 0 && rc != DCHAN_ERR_AGAIN && !du->error)
        du->error = rc;
}

static void run_progress(dchan_uv_t *du)
{
    note(du, dchan_progress_n(du->ctx, du->budget));
}

static void on_idle(uv_idle_t *h)
{
    run_progress(h->data);
}

static void on_prepare(uv_prepare_t *h)
{
    dchan_uv_t *du = h->data;
    int rc = dchan_wakeup_arm(du->ctx);
    if (rc == DCHAN_SUCCESS) {
        uv_idle_stop(&du->idle);
        return;
    }
    note(du, rc);
    /* Work first: come round again without blocking (the idle callback
     * runs progress). On a failure, too, rather than sleep unarmed. */
    uv_idle_start(&du->idle, on_idle);
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    dchan_uv_t *du = h->data;
    du->wakeups++;
    run_progress(du);
}

int dchan_uv_start(uv_loop_t *loop, dchan_ctx_t *ctx, int budget, dchan_uv_t **out)
{
    int fd, rc;
    if (!loop || !out || budget < 1)
        return DCHAN_ERR_INVALID_ARG;
    rc = dchan_wakeup_fd(ctx, &fd);
    if (rc != DCHAN_SUCCESS)
        return rc;
    dchan_uv_t *du = calloc(1, sizeof *du);
    if (!du)
        return UV_ENOMEM;
    du->ctx = ctx;
    du->budget = budget;
    rc = uv_poll_init(loop, &du->poll, fd);
    if (rc != 0) {
        free(du);
        return rc;
    }
    uv_prepare_init(loop, &du->prepare);
    uv_idle_init(loop, &du->idle);
    du->poll.data = du->prepare.data = du->idle.data = du;
    du->open = 3;
    uv_poll_start(&du->poll, UV_READABLE, on_poll);
    uv_prepare_start(&du->prepare, on_prepare);
    /* Whatever is due already runs at the first turn. */
    uv_idle_start(&du->idle, on_idle);
    *out = du;
    return 0;
}

static void on_close(uv_handle_t *h)
{
    dchan_uv_t *du = h->data;
    if (--du->open > 0)
        return;
    if (du->close_cb)
        du->close_cb(du, du->close_arg);
    free(du);
}

void dchan_uv_stop(dchan_uv_t *du, dchan_uv_close_cb cb, void *arg)
{
    if (!du)
        return;
    du->close_cb = cb;
    du->close_arg = arg;
    uv_poll_stop(&du->poll);
    uv_prepare_stop(&du->prepare);
    uv_idle_stop(&du->idle);
    uv_close((uv_handle_t *)&du->poll, on_close);
    uv_close((uv_handle_t *)&du->prepare, on_close);
    uv_close((uv_handle_t *)&du->idle, on_close);
}

int dchan_uv_error(const dchan_uv_t *du)
{
    return du->error;
}

unsigned long dchan_uv_wakeups(const dchan_uv_t *du)
{
    return du->wakeups;
}
