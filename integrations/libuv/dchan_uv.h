/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan in a libuv loop: the loop sleeps on dchan's wake-up descriptor and
 * runs dchan progress, with a budget, when it fires (integrations/libuv/
 * README.md, dchan_embed(7)).
 *
 *   dchan_uv_t *du;
 *   dchan_uv_start(loop, ctx, 64, &du);   arrivals now run from the loop
 *   uv_run(loop, UV_RUN_DEFAULT);
 *   dchan_uv_stop(du, NULL, NULL);        its handles close; then dchan_finalize
 */
#ifndef DCHAN_UV_H
#define DCHAN_UV_H

#include <uv.h>

#include <dchan.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dchan_uv dchan_uv_t;
typedef void (*dchan_uv_close_cb)(dchan_uv_t *du, void *arg);

/* Serve ctx from loop: callbacks of at most budget arrivals (>= 1) per
 * turn of the loop. 0, a negative DCHAN_ERR_* (from dchan_wakeup_fd), or
 * UV_ENOMEM; *du is written on success only. */
int dchan_uv_start(uv_loop_t *loop, dchan_ctx_t *ctx, int budget, dchan_uv_t **du);
/* Stop serving: the handles close in the loop, then cb (may be NULL) runs
 * and du is freed. The context stays the caller's. */
void dchan_uv_stop(dchan_uv_t *du, dchan_uv_close_cb cb, void *arg);
/* The first error dchan progress or arming returned (0: none); the loop
 * goes on serving. */
int dchan_uv_error(const dchan_uv_t *du);
/* How many times the loop was woken by the descriptor (for tests). */
unsigned long dchan_uv_wakeups(const dchan_uv_t *du);

#ifdef __cplusplus
}
#endif

#endif
