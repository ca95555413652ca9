/* SPDX-License-Identifier: BSD-3-Clause */
/* Handle internals shared by context.c and handle.c. */
#ifndef DCHAN_HANDLE_H
#define DCHAN_HANDLE_H

#include "core.h"

bool dchan_in_callback(const dchan_ctx_t *ctx);
/* Destroy a live handle (lock held): cancel, release, quarantine. */
int dchan_handle_release(dchan_handle_t *h);
/* Free quarantined handles beyond keep. */
void dchan_quarantine_flush(dchan_ctx_t *ctx, uint64_t keep);
/* Scan the polling queue: arrivals seen there go onto the fire list. */
void dchan_scan_pollq(dchan_ctx_t *ctx);

#define PQ_NONE UINT32_MAX

/* Inline: both run once per arrival, on the path a callback waits for. */
static inline void dchan_pq_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    uint32_t i = h->pq_pos, last = --ctx->pq_len;
    if (i != last) {
        ctx->pq[i] = ctx->pq[last];
        ctx->pq[i].h->pq_pos = i;
    }
    h->pq_pos = PQ_NONE;
}

static inline void dchan_fire_push(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    h->fire_next = NULL;
    h->fire_prev = ctx->fire_tail;
    if (ctx->fire_tail)
        ctx->fire_tail->fire_next = h;
    else
        ctx->fire_head = h;
    ctx->fire_tail = h;
    h->on_fire = true;
}

static inline void dchan_fire_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (h->fire_prev)
        h->fire_prev->fire_next = h->fire_next;
    else
        ctx->fire_head = h->fire_next;
    if (h->fire_next)
        h->fire_next->fire_prev = h->fire_prev;
    else
        ctx->fire_tail = h->fire_prev;
    h->fire_next = h->fire_prev = NULL;
    h->on_fire = false;
}

#endif
