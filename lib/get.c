/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Get (DESIGN §7): a source publishes its buffer for remote read, a getter
 * pulls each published version once.
 *
 * Two words at the source carry the protocol, each (tag << 32) | count with
 * the source's generation as tag: the published word, which the source's
 * owner bumps at creation and at each dchan_ready, and the taken word,
 * which the getter writes after a read has landed. The getter compares the
 * published count with the versions it took (no round trip: a load where
 * the provider maps the word); the source's progress compares the taken
 * count with the versions it published and then runs done_fn. A source
 * that is destroyed zeroes its published word, so a getter finds it gone
 * instead of reading a buffer that may be freed.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "handle.h"

static int h_valid(const dchan_handle_t *h)
{
    if (!h)
        return DCHAN_ERR_INVALID_ARG;
    if (h->magic == DCHAN_H_DEAD)
        return DCHAN_ERR_STATE;
    return h->magic == DCHAN_H_MAGIC ? DCHAN_SUCCESS : DCHAN_ERR_INVALID_ARG;
}

static inline uint64_t word(uint32_t tag, uint32_t count)
{
    return ((uint64_t)tag << 32) | count;
}

/* One more callback due on h (done_fn or arrival_fn), run from progress. */
static void due(dchan_handle_t *h)
{
    h->n_done++;
    if (!h->on_fire)
        dchan_fire_push(h->ctx, h);
}

static void srcq_add(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    h->on_srcq = true;
    h->srcq_next = ctx->srcq_head;
    ctx->srcq_head = h;
}

static void srcq_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    for (dchan_handle_t **pp = &ctx->srcq_head; *pp; pp = &(*pp)->srcq_next)
        if (*pp == h) {
            *pp = h->srcq_next;
            break;
        }
    h->on_srcq = false;
}

/* ---- source --------------------------------------------------------------------- */

DCHAN_API int dchan_create_source(dchan_ctx_t *ctx, int receiver_rank, const void *buf,
                                  size_t size, dchan_arrival_fn done_fn, void *arg,
                                  dchan_handle_t **out)
{
    struct dchan_wire_fields wf;
    dchan_handle_t *h;
    void *ctl;
    int rc;

    if (!dchan_ctx_ok(ctx) || !buf || size == 0 || !done_fn || !out || receiver_rank < 0 ||
        receiver_rank >= ctx->nranks)
        return DCHAN_ERR_INVALID_ARG;
    dchan_ctx_lock(ctx);
    struct dchan_prov *p = ctx->route[receiver_rank];
    if (!p->ops->get) {
        rc = DCHAN_ERR_UNSUPPORTED;
        goto out;
    }
    h = dchan_handle_new(ctx, p, DCHAN_ROLE_SOURCE);
    if (!h) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto out;
    }
    h->buf = (void *)buf;
    h->size = size;
    h->peer = receiver_rank;
    h->fn = done_fn;
    h->arg = arg;
    /* Where peers on this host reach them without a system call (the
     * shared segment when shm runs). */
    if ((rc = dchan_core_mem_alloc(ctx, 16, 16, true, &ctl)) != DCHAN_SUCCESS)
        goto free_handle;
    h->gctl = ctl;
    if ((rc = dchan_handle_id_alloc(ctx, h)) != DCHAN_SUCCESS)
        goto free_ctl;
    /* The tag of the words: a serial of the context's sources above the
     * id's generation byte (which the wire checks). A slot's generation
     * alone repeats across slots, and a getter of a destroyed source that
     * reads the words where they lie (shm) must never take a later
     * source's words, allocated in the same place, for its own. */
    ctx->src_serial = (ctx->src_serial + 1) & 0xffffffu;
    h->gen = (ctx->src_serial << 8) | (h->gen & 0xffu);
    h->n_pub = 1; /* published at creation */
    __atomic_store_n(&h->gctl[1], word(h->gen, 0), __ATOMIC_RELAXED);
    __atomic_store_n(&h->gctl[0], word(h->gen, 1), __ATOMIC_RELEASE);
    memset(&wf, 0, sizeof wf);
    if ((rc = p->ops->get->src_open(h, wf.prov)) != DCHAN_SUCCESS)
        goto free_id;
    wf.provider_id = p->ops->wire_id;
    wf.detect = DCHAN_DETECT_EVENT; /* no mode: the getter learns by its own read */
    wf.job_key = ctx->job_key;
    wf.recv_rank = (uint32_t)ctx->rank; /* the handle's owner, as for a receive handle */
    wf.send_rank = (uint32_t)receiver_rank;
    wf.handle_id = h->id;
    wf.handle_gen = h->gen;
    wf.size = size;
    wf.depth = 1;
    wf.source = true;
    dchan_wire_encode(&wf, &h->wire);
    srcq_add(ctx, h);
    dchan_handle_link(ctx, h);
    *out = h;
    dchan_ctx_unlock(ctx);
    return DCHAN_SUCCESS;

free_id:
    dchan_handle_id_free(ctx, h->id);
free_ctl:
    dchan_core_mem_free(ctx, ctl, true);
free_handle:
    free(h);
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

int dchan_source_ready(dchan_handle_t *h)
{
    dchan_ctx_t *ctx = h->ctx;
    int rc = DCHAN_SUCCESS;
    dchan_ctx_lock(ctx);
    if (h->error)
        rc = h->error;
    else if (h->on_srcq || h->n_cdone != h->n_done)
        rc = DCHAN_ERR_STATE; /* the current version was not taken, or done_fn has not run */
    else {
        h->n_pub++;
        __atomic_store_n(&h->gctl[0], word(h->gen, h->n_pub), __ATOMIC_RELEASE);
        if ((rc = h->prov->ops->get->src_publish(h)) != DCHAN_SUCCESS)
            dchan_core_handle_error(h, rc);
        else
            srcq_add(ctx, h);
    }
    dchan_ctx_unlock(ctx);
    return rc;
}

void dchan_get_scan(dchan_ctx_t *ctx)
{
    dchan_handle_t **pp = &ctx->srcq_head;
    while (*pp) {
        dchan_handle_t *h = *pp;
        uint64_t v = __atomic_load_n(&h->gctl[1], __ATOMIC_ACQUIRE);
        if (h->error || v == word(h->gen, h->n_pub)) {
            *pp = h->srcq_next;
            h->on_srcq = false;
            if (!h->error)
                due(h); /* the data has left the buffer */
        } else {
            pp = &h->srcq_next;
        }
    }
}

/* ---- getter --------------------------------------------------------------------- */

DCHAN_API int dchan_assoc_remote(dchan_ctx_t *ctx, const dchan_wire_t *wire, void *buf, size_t size,
                                 dchan_arrival_fn arrival_fn, void *arg, dchan_handle_t **out)
{
    struct dchan_wire_fields wf;
    dchan_handle_t *h;
    int rc;

    if (!dchan_ctx_ok(ctx) || !wire || !buf || size == 0 || !arrival_fn || !out)
        return DCHAN_ERR_INVALID_ARG;
    if ((rc = dchan_wire_decode(wire, &wf)) != DCHAN_SUCCESS)
        return rc;
    /* Only a source's wire, made for this rank, of this job. */
    if (!wf.source || wf.job_key != ctx->job_key || wf.send_rank != (uint32_t)ctx->rank ||
        wf.recv_rank >= (uint32_t)ctx->nranks)
        return DCHAN_ERR_HANDLE;
    dchan_ctx_lock(ctx);
    struct dchan_prov *p = ctx->route[wf.recv_rank];
    if (wf.provider_id != p->ops->wire_id || !p->ops->get) {
        rc = DCHAN_ERR_HANDLE;
        goto out;
    }
    if (wf.size != size) {
        rc = DCHAN_ERR_SIZE;
        goto out;
    }
    h = dchan_handle_new(ctx, p, DCHAN_ROLE_GETTER);
    if (!h) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto out;
    }
    h->buf = buf;
    h->size = size;
    h->peer = (int)wf.recv_rank;
    h->id = wf.handle_id;
    h->gen = wf.handle_gen;
    h->fn = arrival_fn;
    h->arg = arg;
    if ((rc = p->ops->get->get_open(h, wf.prov)) != DCHAN_SUCCESS) {
        free(h);
        goto out;
    }
    dchan_handle_link(ctx, h);
    *out = h;
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

/* The read landed: tell the source, and the arrival is due. */
static void got(dchan_handle_t *h)
{
    h->inflight = false;
    /* A source destroyed while the data was read: what arrived may be torn,
     * so it is not delivered. */
    uint64_t v = 0;
    int rc = h->prov->ops->get->get_peek(h, &v);
    if (rc == DCHAN_SUCCESS && (uint32_t)(v >> 32) != h->gen)
        rc = DCHAN_ERR_PEER;
    if (rc != DCHAN_SUCCESS) {
        dchan_core_handle_error(h, rc);
        return;
    }
    h->n_got++;
    rc = h->prov->ops->get->get_ack(h, word(h->gen, h->n_got));
    if (rc != DCHAN_SUCCESS) {
        dchan_core_handle_error(h, rc);
        return;
    }
    h->ctx->stats.arrivals++;
    h->hstats.arrivals++;
    due(h);
}

void dchan_core_get_done(dchan_handle_t *h, int rc)
{
    if (rc != DCHAN_SUCCESS) {
        h->inflight = false;
        dchan_core_handle_error(h, rc);
        return;
    }
    got(h);
}

DCHAN_API int dchan_get(dchan_handle_t *h)
{
    int rc = h_valid(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (h->role != DCHAN_ROLE_GETTER)
        return DCHAN_ERR_STATE; /* a put channel, a source: nothing to get */
    dchan_ctx_t *ctx = h->ctx;
    dchan_ctx_lock(ctx);
    if (h->error) {
        rc = h->error;
        goto out;
    }
    if (h->inflight) /* completions come from the providers' progress */
        dchan_core_poll_providers(ctx);
    /* In flight until arrival_fn ran: the buffer is the application's
     * until then, and a new get would overwrite it. */
    if (h->inflight || h->n_cdone != h->n_done) {
        rc = DCHAN_ERR_AGAIN;
        goto out;
    }
    uint64_t v = 0;
    if ((rc = h->prov->ops->get->get_peek(h, &v)) != DCHAN_SUCCESS) {
        dchan_core_handle_error(h, rc);
        goto out;
    }
    if ((uint32_t)(v >> 32) != h->gen) {
        /* The source was destroyed (its word zeroed or reused). */
        rc = DCHAN_ERR_PEER;
        dchan_core_handle_error(h, rc);
        goto out;
    }
    if ((uint32_t)v == h->n_got) {
        rc = DCHAN_ERR_AGAIN; /* this version was taken: wait for the next */
        h->gwant = ctx->gwant = true; /* whose publication is worth a wake-up */
        goto out;
    }
    h->gwant = false;
    h->inflight = true;
    rc = h->prov->ops->get->get(h);
    if (rc == DCHAN_PROV_PUT_DONE) {
        got(h);
        rc = h->error;
    } else if (rc != DCHAN_SUCCESS) {
        h->inflight = false;
        if (rc != DCHAN_ERR_AGAIN)
            dchan_core_handle_error(h, rc);
    }
    h->hstats.bytes += rc == DCHAN_SUCCESS ? h->size : 0;
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

/* O(handles) only while some getter waits for a version. */
bool dchan_get_published(dchan_ctx_t *ctx)
{
    bool any = false, waiting = false;
    if (!ctx->gwant)
        return false;
    for (dchan_handle_t *h = ctx->all_head; h; h = h->all_next) {
        if (!h->gwant)
            continue;
        uint64_t v = 0;
        if (h->error || h->prov->ops->get->get_peek(h, &v) != DCHAN_SUCCESS ||
            (uint32_t)(v >> 32) != h->gen || (uint32_t)v != h->n_got) {
            h->gwant = false; /* reported once: dchan_get tells which */
            any = true;
        } else {
            waiting = true;
        }
    }
    ctx->gwant = waiting;
    return any;
}

/* ---- both ------------------------------------------------------------------------ */

void dchan_get_release(dchan_handle_t *h)
{
    dchan_ctx_t *ctx = h->ctx;
    if (h->on_fire)
        dchan_fire_remove(ctx, h);
    if (h->role == DCHAN_ROLE_SOURCE) {
        if (h->on_srcq)
            srcq_remove(ctx, h);
        /* Gone: a getter's next look finds a tag that is not the source's. */
        __atomic_store_n(&h->gctl[0], 0, __ATOMIC_RELEASE);
        h->prov->ops->get->src_close(h);
        dchan_core_mem_free(ctx, h->gctl, true);
        h->gctl = NULL;
    } else {
        /* Reads in flight: wait for them (the buffer is the caller's to
         * free after destroy) for at most the drain time. */
        uint64_t deadline = dchan_now_ns() + ctx->params.DRAIN_TIMEOUT_MS * 1000000ull;
        while (h->inflight && !h->error && dchan_now_ns() < deadline)
            dchan_core_poll_providers(ctx);
        h->prov->ops->get->get_close(h);
    }
}
