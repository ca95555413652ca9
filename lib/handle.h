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
/* The scan saw the probe of h (off the queue now) change to v. */
void dchan_recv_detected(dchan_handle_t *h, uint64_t v);

#define PQ_NONE UINT32_MAX
/* The scan prefetches the bodies of FLAG messages up to this size, while
 * at most this many handles are armed (see dchan_scan_pollq). */
#define DCHAN_PQ_PREFETCH_SIZE 256
#define DCHAN_PQ_PREFETCH 8

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

/* One pass over the polling queue; pre: prefetch FLAG bodies (below).
 * Inlined with pre constant, so the long scan carries no test of it. */
static inline __attribute__((always_inline)) void pq_pass(dchan_ctx_t *ctx, const bool pre)
{
    struct dchan_pq_ent *pq = ctx->pq;
    for (uint32_t i = 0; i < ctx->pq_len;) {
        uint64_t v = __atomic_load_n(pq[i].probe, __ATOMIC_ACQUIRE);
        if (__builtin_expect(v == pq[i].idle, 1)) {
            if (pre && pq[i].h->pf)
                __builtin_prefetch(pq[i].h->pf);
            i++;
            continue;
        }
        /* Removal swaps the last entry into i, so i is looked at again. */
        dchan_handle_t *h = pq[i].h;
        dchan_pq_remove(ctx, h);
        dchan_recv_detected(h, v);
    }
}

/* Scan the polling queue, one dense array of (word, idle value) pairs:
 * arrivals seen there go onto the fire list. Inline in progress, where an
 * idle scan of a few handles is most of the work.
 *
 * FLAG: while a small message's sequence word is not there yet, ask for
 * the line the message starts in. The sender's write takes the line away
 * and the next look fetches it anew, so that it travels while the word
 * does instead of after it, when the callback reads it. Only with a few
 * handles armed, a latency-bound scan: with many, the lines would crowd
 * the cache that the dense array spares. Only for messages of a few
 * lines: from 512 B on, the looks slowed the sender's copy as much as
 * they saved. */
static inline __attribute__((always_inline)) void dchan_scan_pollq(dchan_ctx_t *ctx)
{
    if (ctx->pq_len <= DCHAN_PQ_PREFETCH)
        pq_pass(ctx, true);
    else
        pq_pass(ctx, false);
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

/* The first handle of the fire list, taken off it. */
static inline dchan_handle_t *dchan_fire_pop(dchan_ctx_t *ctx)
{
    dchan_handle_t *h = ctx->fire_head;
    if (h)
        dchan_fire_remove(ctx, h);
    return h;
}

/* Sender: one more put completed locally; with dchan_set_completion's
 * callback set, one more callback is due (dispatched from progress). */
static inline void dchan_put_completed(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (__builtin_expect(h->cfn != NULL, 0)) {
        h->n_done++;
        if (!h->on_fire)
            dchan_fire_push(ctx, h);
    }
}

/* Handles of lib/get.c: a new handle, its place on the list of live ones,
 * an id (and generation) in the receive-handle table. */
dchan_handle_t *dchan_handle_new(dchan_ctx_t *ctx, struct dchan_prov *p, int role);
void dchan_handle_link(dchan_ctx_t *ctx, dchan_handle_t *h);
int dchan_handle_id_alloc(dchan_ctx_t *ctx, dchan_handle_t *h);
void dchan_handle_id_free(dchan_ctx_t *ctx, uint32_t id);

/* dchan_assoc_local and its gathered forms: segs (nseg non-empty segments
 * of size bytes in all, owned by the handle on success) or buf. */
int dchan_assoc_send(dchan_ctx_t *ctx, const dchan_wire_t *wire, const void *buf, size_t size,
                     dchan_iov_t *segs, size_t nseg, dchan_handle_t **out);

#endif
