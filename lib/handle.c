/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Handles: the per-handle state machine of DESIGN §3, the polling queue,
 * the fire list and the sender's put path. No heap allocation happens here
 * after a handle was created or associated: queues are intrusive or sized
 * when handles are made.
 */
#include "config.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "handle.h"
#include "strided.h"

static inline int h_check(const dchan_handle_t *h)
{
    if (__builtin_expect(h && h->magic == DCHAN_H_MAGIC, 1))
        return DCHAN_SUCCESS;
    return h && h->magic == DCHAN_H_DEAD ? DCHAN_ERR_STATE : DCHAN_ERR_INVALID_ARG;
}

static bool scanned(int detect)
{
    return detect == DCHAN_DETECT_SENTINEL || detect == DCHAN_DETECT_FLAG;
}

static struct dchan_prov *route(dchan_ctx_t *ctx, int peer)
{
    return ctx->route[peer];
}

static int resolve_detect(const dchan_ctx_t *ctx, const struct dchan_prov *p)
{
    return ctx->detect != DCHAN_DETECT_AUTO ? ctx->detect : p->default_detect;
}

/* ---- receive handle ids ------------------------------------------------------ */

static int grow_array(void **arr, size_t elem, uint32_t cap)
{
    void *n = realloc(*arr, (size_t)cap * elem);
    if (!n)
        return DCHAN_ERR_NO_MEMORY;
    *arr = n;
    return DCHAN_SUCCESS;
}

static int id_alloc(dchan_ctx_t *ctx, dchan_handle_t *h, uint32_t *id, uint32_t *gen)
{
    if (ctx->hfree_len == 0) {
        uint32_t old = ctx->htab_cap, max = (uint32_t)ctx->params.MAX_HANDLES;
        if (old >= max)
            return DCHAN_ERR_NO_MEMORY;
        uint32_t cap = old ? (old > max / 2 ? max : old * 2) : 64;
        if (cap > max)
            cap = max;
        if (grow_array((void **)&ctx->htab, sizeof *ctx->htab, cap) ||
            grow_array((void **)&ctx->hgen, sizeof *ctx->hgen, cap) ||
            grow_array((void **)&ctx->hfree, sizeof *ctx->hfree, cap))
            return DCHAN_ERR_NO_MEMORY;
        for (uint32_t i = old; i < cap; i++) {
            ctx->htab[i] = NULL;
            ctx->hgen[i] = 1;
        }
        for (uint32_t i = cap; i-- > old;)
            ctx->hfree[ctx->hfree_len++] = i;
        ctx->htab_cap = cap;
    }
    uint32_t idx = ctx->hfree[--ctx->hfree_len];
    ctx->htab[idx] = h;
    *gen = ctx->hgen[idx];
    *id = DCHAN_ID_MAKE(idx, *gen & 0xffu);
    return DCHAN_SUCCESS;
}

static void id_free(dchan_ctx_t *ctx, uint32_t id)
{
    uint32_t idx = DCHAN_ID_INDEX(id);
    ctx->htab[idx] = NULL;
    /* A new generation, so that a stale id (a late completion) finds nothing;
     * the low byte, which ids carry, skips 0 so that no id is 0. */
    uint32_t g = ctx->hgen[idx] + 1;
    if ((g & 0xffu) == 0)
        g++;
    ctx->hgen[idx] = g;
    ctx->hfree[ctx->hfree_len++] = idx;
}

dchan_handle_t *dchan_ctx_recv_handle(dchan_ctx_t *ctx, uint32_t id)
{
    uint32_t idx = DCHAN_ID_INDEX(id);
    if (idx >= ctx->htab_cap || (ctx->hgen[idx] & 0xffu) != DCHAN_ID_GEN(id))
        return NULL;
    return ctx->htab[idx];
}

/* ---- polling queue and fire list ----------------------------------------------- */

static int pq_reserve(dchan_ctx_t *ctx, uint32_t need)
{
    if (need <= ctx->pq_cap)
        return DCHAN_SUCCESS;
    uint32_t cap = ctx->pq_cap ? ctx->pq_cap * 2 : 64;
    while (cap < need)
        cap *= 2;
    if (grow_array((void **)&ctx->pq, sizeof *ctx->pq, cap))
        return DCHAN_ERR_NO_MEMORY;
    ctx->pq_cap = cap;
    return DCHAN_SUCCESS;
}

static void pq_add(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    struct dchan_pq_ent *e = &ctx->pq[ctx->pq_len];
    e->probe = h->probe;
    e->idle = h->idle;
    e->h = h;
    /* The slot the next arrival fills. */
    h->pf = h->detect == DCHAN_DETECT_FLAG && h->size <= DCHAN_PQ_PREFETCH_SIZE
                ? (const char *)h->buf + (size_t)dchan_slot_of(h->n_arr, h->depth) * h->size
                : NULL;
    h->pq_pos = ctx->pq_len++;
}

/* Back on the scan queue when a slot is armed and the handle is queued:
 * the probe is the tail of the next slot to fill (SENTINEL) or the
 * sequence word at its last value (FLAG). */
static void pq_rearm(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (!scanned(h->detect) || h->pq_pos != PQ_NONE || !h->in_pollq || h->error ||
        DCHAN_R_ARMED(h) == 0)
        return;
    if (h->detect == DCHAN_DETECT_SENTINEL)
        h->probe = (const uint64_t *)((char *)h->buf + (size_t)dchan_slot_of(h->n_arr, h->depth) * h->size +
                                      h->size - 8);
    else
        h->idle = h->seq;
    pq_add(ctx, h);
}

static void errq_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    dchan_handle_t **pp = &ctx->errq_head, *prev = NULL;
    while (*pp && *pp != h) {
        prev = *pp;
        pp = &(*pp)->errq_next;
    }
    if (*pp) {
        *pp = h->errq_next;
        if (ctx->errq_tail == h)
            ctx->errq_tail = prev;
    }
    h->on_errq = false;
}

/* ---- arrivals and errors --------------------------------------------------------- */

static inline __attribute__((always_inline)) void arrived(dchan_handle_t *h, uint32_t n)
{
    /* The callback reads the message next: ask for its first and last
     * lines now, while the arrival is dispatched, rather than at its first
     * read (FLAG's body is not on the word's line, nor a long message's
     * start on its tail's). */
    const char *slot = (const char *)h->buf + (size_t)dchan_slot_of(h->n_arr, h->depth) * h->size;
    __builtin_prefetch(slot);
    __builtin_prefetch(slot + h->size - 1);
    /* And for the credit written at the release, its word's line. */
    if (h->credit && h->prov->ops->credit_prefetch)
        h->prov->ops->credit_prefetch(h);
    h->n_arr += n;
    h->ctx->stats.arrivals += n;
    h->hstats.arrivals += n;
    /* Off the polling queue (between mark and pollq) it waits for pollq. */
    if (h->in_pollq && !h->on_fire)
        dchan_fire_push(h->ctx, h);
}

/* The sequence word that follows last: the next count of the same epoch,
 * or the first count of a new association. */
static uint64_t seq_next(uint64_t last)
{
    return (last & ~0xffffffffull) | (uint32_t)((uint32_t)last + 1);
}

/* The scan saw *probe change to v on a queued SENTINEL or FLAG handle. */
void dchan_recv_detected(dchan_handle_t *h, uint64_t v)
{
    uint32_t n = 1;
    if (h->detect == DCHAN_DETECT_FLAG && h->credit) {
        /* A credited sender counts every put it made (in the low half):
         * all up to that count have landed, in order. */
        n = (uint32_t)v - h->n_arr;
        if (n == 0 || n > DCHAN_R_ARMED(h)) {
            dchan_core_handle_error(h, DCHAN_ERR_OVERRUN);
            return;
        }
        h->seq = v;
    } else if (h->detect == DCHAN_DETECT_FLAG) {
        bool same_epoch = (v >> 32) == (h->seq >> 32);
        if (same_epoch ? v != seq_next(h->seq) : (uint32_t)v != 1) {
            /* The count moved by more than one: a put before the re-arm. */
            dchan_core_handle_error(h, DCHAN_ERR_OVERRUN);
            return;
        }
        h->seq = v;
    }
    arrived(h, n);
    if (h->depth > 1)
        pq_rearm(h->ctx, h); /* a later slot is armed: keep watching */
}

int dchan_core_recv_writable(dchan_handle_t *r, uint32_t slot)
{
    if (r->error)
        return r->error;
    /* Slots [n_rel, n_arr) hold data the application has not released. */
    uint32_t pos = dchan_slot_of(slot + r->depth - dchan_slot_of(r->n_rel, r->depth), r->depth);
    if (pos < (uint32_t)(r->n_arr - r->n_rel)) {
        dchan_core_handle_error(r, DCHAN_ERR_OVERRUN);
        return DCHAN_ERR_OVERRUN;
    }
    return DCHAN_SUCCESS;
}

/* May an arrival be counted on receive handle h? Not after an error, and
 * not with no slot armed: the sender broke the contract (the overrun is
 * raised, and the data the application holds stays intact). */
static inline bool arrival_armed(dchan_handle_t *h)
{
    if (h->error)
        return false;
    if (DCHAN_R_ARMED(h) == 0) {
        dchan_core_handle_error(h, DCHAN_ERR_OVERRUN);
        return false;
    }
    return true;
}

void dchan_core_arrival(dchan_handle_t *h)
{
    if (h->magic == DCHAN_H_MAGIC && h->role == DCHAN_ROLE_RECV && arrival_armed(h))
        arrived(h, 1);
}

/* Whole words, then bytes: most notices carry a few dozen bytes, where a
 * call to memcpy costs more than the copy; staged bodies (shm) are larger. */
static void copy_small(unsigned char *d, const unsigned char *s, size_t n)
{
    if (n > 64) {
        memcpy(d, s, n);
        return;
    }
    for (; n >= 8; n -= 8, d += 8, s += 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        memcpy(d, &w, 8);
    }
    while (n--)
        *d++ = *s++;
}

/* The live EVENT receive handle of p that id names (dchan_core_arrival_id),
 * or NULL. */
static inline dchan_handle_t *arrival_handle(struct dchan_prov *p, uint32_t id, uint32_t gen,
                                             int peer)
{
    dchan_handle_t *h = dchan_ctx_recv_handle(p->ctx, id);
    /* Sources and getters have ids in the same table: none takes arrivals. */
    if (!h || h->role != DCHAN_ROLE_RECV || h->prov != p || h->detect != DCHAN_DETECT_EVENT ||
        (gen && gen != h->gen) || (peer >= 0 && peer != h->peer))
        return NULL;
    return h;
}

static inline __attribute__((always_inline)) void arrival_take(dchan_handle_t *h,
                                                               const void *data, size_t len)
{
    if (data && len != h->size) {
        dchan_core_handle_error(h, DCHAN_ERR_SIZE);
        return;
    }
    if (!arrival_armed(h))
        return;
    if (data)
        copy_small((unsigned char *)h->buf + (size_t)dchan_slot_of(h->n_arr, h->depth) * h->size,
                   data, len);
    arrived(h, 1);
}

bool dchan_core_arrival_id(struct dchan_prov *p, uint32_t id, uint32_t gen, int peer,
                           const void *data, size_t len)
{
    dchan_handle_t *h = arrival_handle(p, id, gen, peer);
    if (!h)
        return false;
    arrival_take(h, data, len);
    return true;
}

bool dchan_core_signal_id(struct dchan_prov *p, uint32_t id, uint32_t slot, uint64_t value,
                          const void *data, size_t len)
{
    dchan_handle_t *h = dchan_ctx_recv_handle(p->ctx, id);
    if (!h || h->role != DCHAN_ROLE_RECV || h->prov != p || !scanned(h->detect) ||
        slot >= h->depth)
        return false;
    /* The body before the word: all of it but the tail, or all of it. */
    size_t body = h->detect == DCHAN_DETECT_SENTINEL ? h->size - 8 : h->size;
    if (data && len != body) {
        dchan_core_handle_error(h, DCHAN_ERR_SIZE);
        return true;
    }
    /* A failed handle takes nothing; a slot the application still holds
     * is an overrun, as a second EVENT arrival would be, and its data
     * stays as it was. */
    if (h->error || dchan_core_recv_writable(h, slot) != DCHAN_SUCCESS)
        return true;
    char *at = (char *)h->buf + (size_t)slot * h->size;
    if (data)
        copy_small((unsigned char *)at, data, len);
    __atomic_store_n(h->detect == DCHAN_DETECT_FLAG ? h->seq_word : (uint64_t *)(at + body),
                     value, __ATOMIC_RELEASE);
    return true;
}

static void credit_hint(dchan_handle_t *r, uint32_t index, uint64_t value);

bool dchan_core_arrival_id_hint(struct dchan_prov *p, uint32_t id, const void *data, size_t len,
                                uint32_t index, uint64_t value)
{
    dchan_handle_t *h = arrival_handle(p, id, 0, -1);
    if (!h)
        return false;
    credit_hint(h, index, value);
    arrival_take(h, data, len);
    return true;
}

void dchan_core_put_done(dchan_handle_t *h, int rc)
{
    h->inflight = false;
    if (rc != DCHAN_SUCCESS)
        dchan_core_handle_error(h, rc);
    else
        dchan_put_completed(h->ctx, h);
}

void dchan_core_handle_error(dchan_handle_t *h, int rc)
{
    dchan_ctx_t *ctx = h->ctx;
    if (h->error || h->magic != DCHAN_H_MAGIC)
        return;
    h->error = rc;
    ctx->stats.errors++;
    if (rc == DCHAN_ERR_OVERRUN)
        h->hstats.overruns++;
    if (h->pq_pos != PQ_NONE)
        dchan_pq_remove(ctx, h);
    if (h->on_fire)
        dchan_fire_remove(ctx, h);
    h->errq_next = NULL;
    if (ctx->errq_tail)
        ctx->errq_tail->errq_next = h;
    else
        ctx->errq_head = h;
    ctx->errq_tail = h;
    h->on_errq = true;
    static const char *const role[] = {"", "receive handle from", "send handle to",
                                       "source for", "get handle from"};
    dchan_warn(ctx, h->prov->ops->name, "%s rank %d: %s", role[h->role], h->peer,
               dchan_strerror(rc));
}

void dchan_core_peer_error(struct dchan_prov *p, int peer, int rc)
{
    for (dchan_handle_t *h = p->ctx->all_head; h; h = h->all_next)
        if (h->prov == p && h->peer == peer)
            dchan_core_handle_error(h, rc);
}

/* ---- creation -------------------------------------------------------------------- */

static dchan_handle_t *h_new(dchan_ctx_t *ctx, struct dchan_prov *p, int role)
{
    dchan_handle_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->magic = DCHAN_H_MAGIC;
    h->role = (uint8_t)role;
    h->ctx = ctx;
    h->prov = p;
    h->pq_pos = PQ_NONE;
    h->depth = 1;
    return h;
}

static void all_link(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    h->all_prev = NULL;
    h->all_next = ctx->all_head;
    if (ctx->all_head)
        ctx->all_head->all_prev = h;
    ctx->all_head = h;
    ctx->nlive++;
}

static void all_unlink(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (h->all_prev)
        h->all_prev->all_next = h->all_next;
    else
        ctx->all_head = h->all_next;
    if (h->all_next)
        h->all_next->all_prev = h->all_prev;
    ctx->nlive--;
}

/* For lib/get.c, which makes handles of its own roles. */
dchan_handle_t *dchan_handle_new(dchan_ctx_t *ctx, struct dchan_prov *p, int role)
{
    return h_new(ctx, p, role);
}

void dchan_handle_link(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    all_link(ctx, h);
}

int dchan_handle_id_alloc(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    return id_alloc(ctx, h, &h->id, &h->gen);
}

void dchan_handle_id_free(dchan_ctx_t *ctx, uint32_t id)
{
    id_free(ctx, id);
}

/* ---- credit word indices ------------------------------------------------------- */

/* Per sender rank: which words of its credit area this rank's receive
 * handles use, and the tag each word's next user starts from (never 0).
 *
 * A channel's credit word is (tag << 32) + releases, a 64-bit count that
 * may carry into the high half, and every value a word ever holds is larger
 * than the one before, across the channels that use it in turn: the next
 * user's tag lies above the last user's final value by at least 2^32. So a
 * word may be written in any order as long as the largest write wins (an
 * atomic maximum), and a sender tells its own channel's counts apart from
 * an older or newer user's by its own 64-bit count (credits_now).
 *
 * The sender's area holds CREDIT_WORDS words for this rank, or, where its
 * provider allocates them as needed (credit_words_max: self), up to that
 * many: cap grows, doubling, when every word is taken. */
struct dchan_credit_ids {
    uint32_t nfree, cap;
    uint16_t *free;
    uint32_t *tag;
};

/* The words [c->cap, cap) join the free ones, the lowest to be taken first. */
static int cid_grow(struct dchan_credit_ids *c, uint32_t cap)
{
    uint16_t *f = realloc(c->free, cap * sizeof *f);
    if (f)
        c->free = f;
    uint32_t *t = f ? realloc(c->tag, cap * sizeof *t) : NULL;
    if (!t)
        return DCHAN_ERR_NO_MEMORY;
    c->tag = t;
    for (uint32_t i = cap; i-- > c->cap;) {
        c->free[c->nfree++] = (uint16_t)i;
        c->tag[i] = 1;
    }
    c->cap = cap;
    return DCHAN_SUCCESS;
}

static int cid_alloc(dchan_ctx_t *ctx, const struct dchan_prov *p, int peer, uint16_t *idx,
                     uint32_t *tag)
{
    uint32_t n = (uint32_t)ctx->params.CREDIT_WORDS;
    uint32_t max = p->ops->credit_words_max > n ? p->ops->credit_words_max : n;
    if (!ctx->cids && !(ctx->cids = calloc((size_t)ctx->nranks, sizeof *ctx->cids)))
        return DCHAN_ERR_NO_MEMORY;
    struct dchan_credit_ids *c = ctx->cids[peer];
    if (!c) {
        if (!(c = calloc(1, sizeof *c)))
            return DCHAN_ERR_NO_MEMORY;
        if (cid_grow(c, n) != DCHAN_SUCCESS) {
            free(c->free);
            free(c->tag);
            free(c);
            return DCHAN_ERR_NO_MEMORY;
        }
        ctx->cids[peer] = c;
    }
    if (c->nfree == 0 && c->cap < max)
        cid_grow(c, c->cap > max / 2 ? max : 2 * c->cap); /* on no memory: none free */
    if (c->nfree == 0) {
        dchan_info(ctx, p->ops->name, "all %u credit words of rank %d's area for this rank are "
                   "taken: no more credited channels from it (DCHAN_CREDIT_WORDS)",
                   c->cap, peer);
        return DCHAN_ERR_NO_MEMORY;
    }
    *idx = c->free[--c->nfree];
    *tag = c->tag[*idx];
    return DCHAN_SUCCESS;
}

/* last: the largest value the channel could have written to the word. */
static void cid_free(dchan_ctx_t *ctx, int peer, uint16_t idx, uint64_t last)
{
    struct dchan_credit_ids *c = ctx->cids[peer];
    uint64_t next = (last >> 32) + 2;
    if (next > UINT32_MAX)
        return; /* values would stop growing: the word is used up for good */
    c->tag[idx] = (uint32_t)next;
    c->free[c->nfree++] = idx;
}

/* A send handle's entry in ctx->csend, where dchan_core_arrival_id_hint finds
 * it; on no memory it just gets no hints. An entry found taken belongs to
 * an earlier channel on the word whose send handle still lives: the newer
 * one takes it (the older one's credit is in the word anyway). */
static void csend_add(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (!ctx->csend && !(ctx->csend = calloc((size_t)ctx->nranks, sizeof *ctx->csend)))
        return;
    struct dchan_csend_row *row = &ctx->csend[h->peer];
    if (h->cidx >= row->n) {
        /* CREDIT_WORDS entries, doubled until cidx fits. */
        uint32_t n = (uint32_t)ctx->params.CREDIT_WORDS;
        while (n <= h->cidx)
            n *= 2;
        if (n > 65536)
            n = 65536; /* above every 16-bit index */
        dchan_handle_t **e = realloc(row->h, n * sizeof *e);
        if (!e)
            return;
        memset(e + row->n, 0, (n - row->n) * sizeof *e);
        row->h = e;
        row->n = n;
    }
    row->h[h->cidx] = h;
}

static void csend_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (ctx->csend && h->cidx < ctx->csend[h->peer].n && ctx->csend[h->peer].h[h->cidx] == h)
        ctx->csend[h->peer].h[h->cidx] = NULL;
}

void dchan_credit_ids_fini(dchan_ctx_t *ctx)
{
    if (ctx->csend) {
        for (int i = 0; i < ctx->nranks; i++)
            free(ctx->csend[i].h);
        free(ctx->csend);
        ctx->csend = NULL;
    }
    if (!ctx->cids)
        return;
    for (int i = 0; i < ctx->nranks; i++)
        if (ctx->cids[i]) {
            free(ctx->cids[i]->free);
            free(ctx->cids[i]->tag);
            free(ctx->cids[i]);
        }
    free(ctx->cids);
    ctx->cids = NULL;
}

/* ---- credit return (receiver) ---------------------------------------------------- */

static void credq_add(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    if (h->on_credq)
        return;
    h->on_credq = true;
    h->credq_next = ctx->credq_head;
    ctx->credq_head = h;
}

static void credq_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    for (dchan_handle_t **pp = &ctx->credq_head; *pp; pp = &(*pp)->credq_next)
        if (*pp == h) {
            *pp = h->credq_next;
            break;
        }
    h->on_credq = false;
}

/* The value of the channel's credit word after the releases so far. */
static inline uint64_t credit_value(const dchan_handle_t *h)
{
    return ((uint64_t)h->ctag << 32) + h->crel;
}

/* Tell the sender how many slots were released so far. The count is
 * cumulative, so a write that is late, or one skipped while another is in
 * flight, only delays credit: it never grants a slot that is not free. */
static void credit_push(dchan_handle_t *h)
{
    if (h->cbusy) {
        h->cdirty = true; /* written when the one in flight completes */
        return;
    }
    h->csrc = credit_value(h);
    int rc = h->prov->ops->credit_write(h, h->cidx, &h->csrc);
    h->cdirty = rc == DCHAN_ERR_AGAIN;
    if (rc == DCHAN_SUCCESS)
        h->cbusy = true;
    else if (rc == DCHAN_ERR_AGAIN)
        credq_add(h->ctx, h);
    else if (rc != DCHAN_PROV_PUT_DONE)
        dchan_core_handle_error(h, rc);
}

void dchan_core_credit_done(dchan_handle_t *h, int rc)
{
    h->cbusy = false;
    if (rc != DCHAN_SUCCESS)
        dchan_core_handle_error(h, rc);
    else if (h->cdirty)
        credq_add(h->ctx, h); /* not from inside the provider's progress */
}

void dchan_credq_run(dchan_ctx_t *ctx)
{
    dchan_handle_t *list = ctx->credq_head;
    ctx->credq_head = NULL;
    while (list) {
        dchan_handle_t *h = list;
        list = h->credq_next;
        h->on_credq = false;
        if (!h->error && h->cdirty)
            credit_push(h);
    }
}

/* ---- receive handles -------------------------------------------------------------- */

DCHAN_API void dchan_handle_attr_init(dchan_handle_attr_t *hattr)
{
    if (!hattr)
        return;
    memset(hattr, 0, sizeof *hattr);
    hattr->struct_size = sizeof *hattr;
    hattr->depth = 1;
}

DCHAN_API int dchan_create_handle(dchan_ctx_t *ctx, int sender_rank, void *buf, size_t size,
                                  uint64_t oob, dchan_arrival_fn fn, void *arg,
                                  dchan_handle_t **out)
{
    dchan_handle_attr_t hattr;
    dchan_handle_attr_init(&hattr);
    return dchan_create_handle_attr(ctx, sender_rank, buf, size, oob, fn, arg, &hattr, out);
}

DCHAN_API int dchan_create_handle_attr(dchan_ctx_t *ctx, int sender_rank, void *buf, size_t size,
                                       uint64_t oob, dchan_arrival_fn fn, void *arg,
                                       const dchan_handle_attr_t *hattr, dchan_handle_t **out)
{
    struct dchan_wire_fields wf;
    dchan_handle_t *h;
    int rc;

    if (!dchan_ctx_ok(ctx) || !buf || size == 0 || !fn || !out || sender_rank < 0 ||
        sender_rank >= ctx->nranks || !hattr || hattr->struct_size != sizeof *hattr ||
        hattr->depth < 1 || hattr->depth > DCHAN_MAX_DEPTH ||
        size > SIZE_MAX / (size_t)hattr->depth)
        return DCHAN_ERR_INVALID_ARG;
    uint32_t depth = (uint32_t)hattr->depth;
    bool credit = hattr->credit != 0 || depth > 1;
    size_t span = size * depth;
    dchan_ctx_lock(ctx);
    struct dchan_prov *p = route(ctx, sender_rank);
    int detect = resolve_detect(ctx, p);
    if (credit && p->ops->credit_write == dchan_prov_nosys_credit_write) {
        rc = DCHAN_ERR_UNSUPPORTED;
        goto out;
    }
    /* A dchan_alloc block too small for the slots asked for. */
    if (dchan_core_mem_overflows(ctx, buf, span)) {
        rc = DCHAN_ERR_SIZE;
        goto out;
    }
    if (detect == DCHAN_DETECT_SENTINEL) {
        if (size < 8 || size % 8 != 0) {
            rc = DCHAN_ERR_SIZE;
            goto out;
        }
        if ((uintptr_t)buf % 8 != 0) {
            rc = DCHAN_ERR_INVALID_ARG;
            goto out;
        }
    }
    /* Size the polling queue now so that ready_pollq never allocates. */
    if (scanned(detect) && (rc = pq_reserve(ctx, ctx->nscan + 1)) != DCHAN_SUCCESS)
        goto out;
    h = h_new(ctx, p, DCHAN_ROLE_RECV);
    if (!h) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto out;
    }
    h->detect = (uint8_t)detect;
    h->buf = buf;
    h->size = size;
    h->depth = depth;
    h->credit = credit;
    h->peer = sender_rank;
    h->oob = detect == DCHAN_DETECT_SENTINEL ? oob : 0;
    h->fn = fn;
    h->arg = arg;
    h->arm_op = p->ops->recv_arm != dchan_prov_noop_recv_arm;
    h->fast = !ctx->locking ? DCHAN_FAST_RECV : 0;
    if (credit && (rc = cid_alloc(ctx, p, sender_rank, &h->cidx, &h->ctag)) != DCHAN_SUCCESS)
        goto free_handle;
    rc = id_alloc(ctx, h, &h->id, &h->gen);
    if (rc != DCHAN_SUCCESS)
        goto free_cid;
    if (detect == DCHAN_DETECT_FLAG) {
        rc = dchan_seqpool_get(&ctx->recv_seq, &h->slot, &h->seq_word);
        if (rc != DCHAN_SUCCESS)
            goto free_id;
        h->probe = h->seq_word;
        h->idle = 0;
    } else if (detect == DCHAN_DETECT_SENTINEL) {
        for (uint32_t i = depth; i-- > 0;) {
            h->probe = (uint64_t *)((char *)buf + (size_t)i * size + size - 8);
            __atomic_store_n((uint64_t *)h->probe, oob, __ATOMIC_RELEASE);
        }
        h->idle = oob;
    }
    memset(&wf, 0, sizeof wf);
    rc = p->ops->recv_open(h, wf.prov);
    if (rc != DCHAN_SUCCESS)
        goto free_slot;
    for (uint32_t i = 0; i < depth; i++)
        if ((rc = p->ops->recv_arm(h, i)) != DCHAN_SUCCESS)
            goto close_prov;

    wf.provider_id = p->ops->wire_id;
    wf.detect = (uint8_t)detect;
    wf.job_key = ctx->job_key;
    wf.recv_rank = (uint32_t)ctx->rank;
    wf.send_rank = (uint32_t)sender_rank;
    wf.handle_id = h->id;
    wf.handle_gen = h->gen;
    wf.size = size;
    wf.oob = h->oob;
    wf.depth = depth;
    wf.credit = credit;
    wf.credit_index = h->cidx;
    wf.credit_tag = h->ctag;
    dchan_wire_encode(&wf, &h->wire);

    h->in_pollq = true;
    if (scanned(detect)) {
        ctx->nscan++;
        pq_add(ctx, h);
    }
    all_link(ctx, h);
    *out = h;
    dchan_ctx_unlock(ctx);
    return DCHAN_SUCCESS;

close_prov:
    p->ops->recv_close(h);
free_slot:
    if (detect == DCHAN_DETECT_FLAG)
        dchan_seqpool_put(&ctx->recv_seq, h->slot);
free_id:
    id_free(ctx, h->id);
free_cid:
    if (credit)
        cid_free(ctx, sender_rank, h->cidx, credit_value(h));
free_handle:
    free(h);
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

DCHAN_API int dchan_handle_export(const dchan_handle_t *h, dchan_wire_t *wire)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (!wire)
        return DCHAN_ERR_INVALID_ARG;
    if (h->role != DCHAN_ROLE_RECV && h->role != DCHAN_ROLE_SOURCE)
        return DCHAN_ERR_STATE;
    *wire = h->wire;
    return DCHAN_SUCCESS;
}

DCHAN_API int dchan_assoc_local(dchan_ctx_t *ctx, const dchan_wire_t *wire, const void *buf,
                                size_t size, dchan_handle_t **out)
{
    if (!dchan_ctx_ok(ctx) || !wire || !buf || size == 0 || !out)
        return DCHAN_ERR_INVALID_ARG;
    return dchan_assoc_send(ctx, wire, buf, size, NULL, 0, out);
}

/* The fields of a send handle's put descriptor that every put repeats
 * (h->pd), set once at association; a put fills in the rest. */
static void put_desc_init(dchan_handle_t *h)
{
    struct dchan_put_desc *d = &h->pd;
    memset(d, 0, sizeof *d);
    d->priv = h->priv;
    d->remote_id = h->id;
    d->src = h->buf;
    d->size = h->size;
    d->detect = h->detect;
    d->seq_src = h->seq_word;
    if (h->segs && !h->stage) {
        d->src = NULL;
        d->iov = h->segs;
        d->iovcnt = h->nseg;
    }
}

int dchan_assoc_send(dchan_ctx_t *ctx, const dchan_wire_t *wire, const void *buf, size_t size,
                     dchan_iov_t *segs, size_t nseg, dchan_handle_t **out)
{
    struct dchan_wire_fields wf;
    dchan_handle_t *h;
    int rc;

    rc = dchan_wire_decode(wire, &wf);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (wf.job_key != ctx->job_key || wf.send_rank != (uint32_t)ctx->rank ||
        wf.recv_rank >= (uint32_t)ctx->nranks)
        return DCHAN_ERR_HANDLE;
    if (wf.source)
        return DCHAN_ERR_HANDLE; /* a source is read with dchan_assoc_remote */
    dchan_ctx_lock(ctx);
    struct dchan_prov *p = route(ctx, (int)wf.recv_rank);
    if (wf.provider_id != p->ops->wire_id || !(p->modes & DCHAN_MODE_BIT(wf.detect))) {
        rc = DCHAN_ERR_HANDLE;
        goto out;
    }
    if (wf.size != size) {
        rc = DCHAN_ERR_SIZE;
        goto out;
    }
    h = h_new(ctx, p, DCHAN_ROLE_SEND);
    if (!h) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto out;
    }
    h->detect = wf.detect;
    h->buf = (void *)buf;
    h->size = size;
    if (segs) {
        /* A provider without a gather gets a contiguous buffer that the
         * core gathers into at each put; it registers that one. */
        h->segs = segs;
        h->nseg = nseg;
        if (!p->ops->gather) {
            if (posix_memalign(&h->stage, DCHAN_ALLOC_ALIGN, size) != 0) {
                rc = DCHAN_ERR_NO_MEMORY;
                goto free_handle;
            }
            h->buf = h->stage;
        } else {
            h->buf = (void *)segs[0].base;
        }
    }
    h->peer = (int)wf.recv_rank;
    h->id = wf.handle_id;
    h->gen = wf.handle_gen;
    h->oob = wf.oob;
    h->depth = wf.depth;
    h->credit = wf.credit;
    h->cidx = wf.credit_index;
    h->ctag = wf.credit_tag;
    if (h->detect == DCHAN_DETECT_FLAG) {
        rc = dchan_seqpool_get(&ctx->send_seq, &h->slot, &h->seq_word);
        if (rc != DCHAN_SUCCESS)
            goto free_handle;
        /* splitmix64 over a per-context state seeded from the job key. */
        uint64_t z = (ctx->epoch_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        h->seq = (z | 1) << 32; /* a non-zero epoch, count 0 */
    }
    rc = p->ops->send_open(h, wf.prov);
    if (rc != DCHAN_SUCCESS)
        goto free_slot;
    if (h->credit) {
        if ((rc = p->ops->credit_open(h, h->cidx, &h->cword)) != DCHAN_SUCCESS) {
            p->ops->send_close(h);
            goto free_slot;
        }
        csend_add(ctx, h);
        /* Associating again: go on from what the receiver released (a
         * value below the channel's base is an earlier user's). */
        uint64_t w = __atomic_load_n(h->cword, __ATOMIC_ACQUIRE), base = (uint64_t)h->ctag << 32;
        if (w >= base) {
            h->cgranted = w - base;
            h->n_put = (uint32_t)h->cgranted;
        }
        /* Credit from the slots' tails (credits_now) where another process's
         * slots are mapped here, which stays so while the provider lives
         * (map_slot); a receiver in this process may free its buffer. */
        void *slot0;
        if (h->detect == DCHAN_DETECT_SENTINEL && h->peer != ctx->rank &&
            p->ops->map_slot(h, 0, &slot0) == DCHAN_SUCCESS)
            h->ctail = (const char *)slot0 + h->size - 8;
    }
    put_desc_init(h);
    h->fast = !ctx->locking && !segs ? DCHAN_FAST_SEND : 0;
    all_link(ctx, h);
    *out = h;
    dchan_ctx_unlock(ctx);
    return DCHAN_SUCCESS;

free_slot:
    if (h->detect == DCHAN_DETECT_FLAG)
        dchan_seqpool_put(&ctx->send_seq, h->slot);
free_handle:
    free(h->stage); /* segs stay the caller's on failure */
    free(h);
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

/* ---- receiver: re-arming ---------------------------------------------------------- */

static int mark_locked(dchan_handle_t *h)
{
    int rc;
    if (h->error)
        return h->error;
    if (DCHAN_R_HELD(h) == 0)
        return DCHAN_ERR_STATE;
    uint32_t slot = dchan_slot_of(h->n_rel, h->depth);
    if (h->detect == DCHAN_DETECT_SENTINEL) {
        __atomic_store_n((uint64_t *)((char *)h->buf + (size_t)slot * h->size + h->size - 8),
                         h->oob, __ATOMIC_RELEASE);
    } else if (h->detect == DCHAN_DETECT_FLAG && h->depth == 1) {
        /* The word moved on while the application held the data: the sender
         * put again before this re-arm. */
        if (__atomic_load_n(h->seq_word, __ATOMIC_ACQUIRE) != h->seq) {
            dchan_core_handle_error(h, DCHAN_ERR_OVERRUN);
            return DCHAN_ERR_OVERRUN;
        }
        h->idle = h->seq;
    }
    /* Most providers need nothing per re-arm: skip the call. */
    if (h->arm_op && (rc = h->prov->ops->recv_arm(h, slot)) != DCHAN_SUCCESS)
        return rc;
    h->n_rel++;
    h->crel++;
    /* Depth 1 waits for ready_pollq; deeper handles stay queued. */
    if (h->depth == 1)
        h->in_pollq = false;
    else
        pq_rearm(h->ctx, h);
    if (h->credit)
        credit_push(h);
    return DCHAN_SUCCESS;
}

static int pollq_locked(dchan_handle_t *h)
{
    if (h->error)
        return h->error;
    if (h->in_pollq)
        return DCHAN_SUCCESS; /* always so for depth > 1 */
    if (DCHAN_R_HELD(h))
        return DCHAN_ERR_STATE;
    h->in_pollq = true;
    if (DCHAN_R_DUE(h))
        dchan_fire_push(h->ctx, h); /* arrived between mark and pollq */
    else
        pq_rearm(h->ctx, h);
    return DCHAN_SUCCESS;
}

static int recv_entry(dchan_handle_t *h)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    return h->role == DCHAN_ROLE_RECV ? DCHAN_SUCCESS : DCHAN_ERR_STATE;
}

DCHAN_API int dchan_ready_mark(dchan_handle_t *h)
{
    int rc = recv_entry(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    dchan_ctx_lock(h->ctx);
    rc = mark_locked(h);
    dchan_ctx_unlock(h->ctx);
    return rc;
}

DCHAN_API int dchan_ready_pollq(dchan_handle_t *h)
{
    int rc = recv_entry(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    dchan_ctx_lock(h->ctx);
    rc = pollq_locked(h);
    dchan_ctx_unlock(h->ctx);
    return rc;
}

/* dchan_ready of a depth-1 handle whose callback ran, on the path from
 * one message to the next: mark_locked and pollq_locked in one, without
 * the checks that cannot fail here. */
static int ready_one(dchan_handle_t *h)
{
    int rc;
    if (h->detect == DCHAN_DETECT_SENTINEL)
        __atomic_store_n((uint64_t *)h->probe, h->oob, __ATOMIC_RELEASE);
    if (h->arm_op && (rc = h->prov->ops->recv_arm(h, 0)) != DCHAN_SUCCESS)
        return rc;
    h->n_rel++;
    h->crel++;
    h->in_pollq = true;
    if (h->credit) {
        credit_push(h);
        if (h->error)
            return h->error;
    }
    if (h->n_arr != h->n_fired)
        dchan_fire_push(h->ctx, h); /* arrived between the callback and now */
    else if (h->detect != DCHAN_DETECT_EVENT)
        pq_add(h->ctx, h);
    return DCHAN_SUCCESS;
}

DCHAN_API int dchan_ready(dchan_handle_t *h)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    /* A SENTINEL handle's probe is its one tail, a FLAG handle's idle
     * value the sequence word as the last arrival left it: unchanged, the
     * sender did not put again before this re-arm. */
    if (__builtin_expect(h->fast == DCHAN_FAST_RECV && h->depth == 1 && !h->error &&
                             !h->in_pollq && h->n_fired != h->n_rel && h->pq_pos == PQ_NONE &&
                             (h->detect != DCHAN_DETECT_FLAG ||
                              __atomic_load_n(h->seq_word, __ATOMIC_ACQUIRE) == h->seq),
                         1)) {
        if (h->detect == DCHAN_DETECT_FLAG)
            h->idle = h->seq;
        return ready_one(h);
    }
    /* Deeper: a handle stays on the polling queue, so the release is the
     * whole of it (pollq_locked has nothing to do). */
    if (h->fast == DCHAN_FAST_RECV && h->depth > 1) {
        rc = mark_locked(h); /* an error already set is its answer */
        return rc == DCHAN_SUCCESS && h->error ? h->error : rc;
    }
    /* On a source: publish the next version. */
    if (h->role == DCHAN_ROLE_SOURCE)
        return dchan_source_ready(h);
    if ((rc = recv_entry(h)) != DCHAN_SUCCESS)
        return rc;
    dchan_ctx_lock(h->ctx);
    rc = mark_locked(h);
    if (rc == DCHAN_SUCCESS)
        rc = pollq_locked(h);
    dchan_ctx_unlock(h->ctx);
    return rc;
}

/* ---- sender: credit ------------------------------------------------------------------- */

/* Puts the credit known so far allows: the slots the receiver released,
 * plus depth, less the puts made (in 32 bits, as n_put). */
static inline uint32_t credit_known(const dchan_handle_t *h)
{
    return (uint32_t)h->cgranted + h->depth - h->n_put;
}

/* Puts the receiver allows now: credit_known after a look at the words. A
 * value of another user of the word (an index reused) or an older count
 * (it cannot be, but a count never goes back) changes nothing. */
static inline uint32_t credits_now(dchan_handle_t *h)
{
    if (h->ctail) {
        /* SENTINEL into slots mapped here: a slot is free again once its
         * tail holds the sentinel, which the receiver stores at ready
         * (before its credit word). That tail is on the line the next put
         * writes anyway, where the credit word is a line of its own that
         * the receiver writes and this side must fetch. Slots are released
         * in order, so the free ones follow the known ones. */
        uint32_t known = credit_known(h), n = known;
        for (; n < h->depth; n++) {
            const uint64_t *t = (const uint64_t *)(h->ctail + (size_t)dchan_slot_of(h->n_put + n, h->depth) *
                                                                  h->size);
            dchan_prefetch_owned(t); /* the put that follows writes that line */
            if (__atomic_load_n(t, __ATOMIC_ACQUIRE) != h->oob)
                break;
        }
        h->cgranted += n - known;
        return n;
    }
    /* Ours when at most depth above what is known: an earlier user's
     * values lie below the base, a later user's 2^32 or more above ours. */
    uint64_t c = __atomic_load_n(h->cword, __ATOMIC_ACQUIRE) - ((uint64_t)h->ctag << 32);
    if (c - h->cgranted <= h->depth && c != h->cgranted) {
        h->cgranted = c;
        h->chint = false; /* this credit came by the word: look for the next one */
    }
    return credit_known(h);
}

/* A copy of the value that r's sender last wrote to this rank's credit
 * word index (dchan_core_arrival_id_hint): credit for the send handle of
 * this rank to that sender whose word it is, if the value is one it can
 * have. */
static void credit_hint(dchan_handle_t *r, uint32_t index, uint64_t value)
{
    dchan_ctx_t *ctx = r->ctx;
    if (!ctx->csend || index >= ctx->csend[r->peer].n)
        return;
    dchan_handle_t *h = ctx->csend[r->peer].h[index];
    if (!h || h->prov != r->prov || h->error)
        return;
    /* The test of credits_now: only a value of this channel, at most depth
     * above what is known. One equal to it still shows that the credit
     * comes with records: the next put leaves the word alone. */
    uint64_t c = value - ((uint64_t)h->ctag << 32);
    if (c - h->cgranted <= h->depth) {
        h->cgranted = c;
        h->chint = true;
    }
}

/* Credit for one put, after one round of provider progress if there is
 * none yet (transports that apply a remote write from the target's
 * progress); a refusal is counted. */
static int credit_take(dchan_handle_t *h)
{
    /* Credit known from an earlier look costs no load of the word, whose
     * cache line the receiver writes. */
    if (credit_known(h) == 0 && credits_now(h) == 0) {
        dchan_core_poll_providers(h->ctx);
        if (h->error)
            return h->error;
        if (credits_now(h) == 0) {
            h->cwant = h->ctx->cwant = true; /* a credit returned now is worth a wake-up */
            h->hstats.credit_stalls++;
            if (!h->stall_ns)
                h->stall_ns = dchan_now_ns();
            return DCHAN_ERR_AGAIN;
        }
    }
    return DCHAN_SUCCESS;
}

/* A send handle whose puts used up the credit it knows of is looked at by
 * progress, while the application waits anyway: its next put then finds
 * the credit known, where it would otherwise load a line the receiver has
 * just written, a transfer between cores on the put's own path. */
static void look_add(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    h->on_look = true;
    h->look_next = ctx->look_head;
    ctx->look_head = h;
}

static void look_remove(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    for (dchan_handle_t **pp = &ctx->look_head; *pp; pp = &(*pp)->look_next)
        if (*pp == h) {
            *pp = h->look_next;
            break;
        }
    h->on_look = false;
}

/* Handles looked at per progress: the look saves a put one load of a
 * line, and must not cost a progress loop over thousands of channels
 * (a put of one further down loads the word itself). */
#define DCHAN_LOOK_MAX 16

void dchan_credit_look(dchan_ctx_t *ctx)
{
    unsigned n = 0;
    for (dchan_handle_t **pp = &ctx->look_head; *pp && n++ < DCHAN_LOOK_MAX;) {
        dchan_handle_t *h = *pp;
        if (h->error || credit_known(h) > 0 || credits_now(h) > 0) {
            *pp = h->look_next;
            h->on_look = false;
        } else {
            pp = &h->look_next;
        }
    }
}

/* O(handles) only while some send handle waits for credit. */
bool dchan_credit_returned(dchan_ctx_t *ctx)
{
    bool any = false, waiting = false;
    if (!ctx->cwant)
        return false;
    for (dchan_handle_t *h = ctx->all_head; h; h = h->all_next) {
        if (!h->cwant)
            continue;
        if (!h->error && credits_now(h) > 0) {
            h->cwant = false; /* reported once */
            any = true;
        } else {
            waiting = true;
        }
    }
    ctx->cwant = waiting;
    return any;
}

static int send_entry(const dchan_handle_t *h, bool need_credit)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (h->role != DCHAN_ROLE_SEND || (need_credit && !h->credit))
        return DCHAN_ERR_STATE;
    return DCHAN_SUCCESS;
}

DCHAN_API int dchan_credits(const dchan_handle_t *ch)
{
    int rc = send_entry(ch, true);
    if (rc != DCHAN_SUCCESS)
        return rc;
    dchan_handle_t *h = (dchan_handle_t *)ch; /* the cached count moves on */
    dchan_ctx_lock(h->ctx);
    uint32_t n = credits_now(h);
    if (n == 0 && !h->error) {
        dchan_core_poll_providers(h->ctx);
        n = credits_now(h);
        h->cwant = n == 0;
        h->ctx->cwant |= h->cwant;
    }
    rc = h->error ? h->error : (int)n;
    dchan_ctx_unlock(h->ctx);
    return rc;
}

/* The receiver's slot of the next put, where it is mapped here. Never in
 * SENTINEL mode: the tail written in place would announce the message
 * before dchan_put, so such a handle writes its send buffer. */
static inline bool next_slot_mapped(dchan_handle_t *h, void **p)
{
    return h->detect != DCHAN_DETECT_SENTINEL &&
           h->prov->ops->map_slot(h, (size_t)dchan_slot_of(h->n_put, h->depth) * h->size, p) ==
               DCHAN_SUCCESS;
}

DCHAN_API int dchan_put_ptr(dchan_handle_t *h, void **ptr)
{
    /* The call of nearly every iteration: no lock, credit known, and the
     * next slot mapped here or the send buffer free. */
    if (__builtin_expect(h && h->magic == DCHAN_H_MAGIC && h->fast == DCHAN_FAST_SEND && h->credit &&
                             ptr && !h->error && (credit_known(h) != 0 || credits_now(h) != 0),
                         1)) {
        if (next_slot_mapped(h, ptr)) {
            h->in_place = true;
            return DCHAN_SUCCESS;
        }
        if (!h->inflight) {
            h->in_place = false;
            *ptr = h->buf;
            return DCHAN_SUCCESS;
        }
    }
    int rc = send_entry(h, true);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (!ptr)
        return DCHAN_ERR_INVALID_ARG;
    /* A gathered send side has no one place the message is written. */
    if (h->segs)
        return DCHAN_ERR_STATE;
    dchan_ctx_t *ctx = h->ctx;
    dchan_ctx_lock(ctx);
    if (h->error) {
        rc = h->error;
        goto out;
    }
    if ((rc = credit_take(h)) != DCHAN_SUCCESS)
        goto out;
    void *p;
    if (next_slot_mapped(h, &p)) {
        h->in_place = true;
    } else {
        if (h->inflight && (rc = dchan_core_drain_put(h, ctx->params.DRAIN_TIMEOUT_MS)))
            goto out;
        h->in_place = false;
        p = h->buf;
    }
    *ptr = p;
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

/* ---- sender: put -------------------------------------------------------------------- */

/* After the provider's put returned rc: retry while its resources are
 * busy, for at most the drain time (the put is then not started); report
 * what became of it. */
static int __attribute__((noinline)) put_again(dchan_handle_t *h, int rc)
{
    dchan_ctx_t *ctx = h->ctx;
    if (rc == DCHAN_ERR_AGAIN) {
        uint64_t deadline = dchan_now_ns() + ctx->params.DRAIN_TIMEOUT_MS * 1000000ull;
        for (unsigned long spins = 0; rc == DCHAN_ERR_AGAIN && !h->error; spins++) {
            dchan_core_poll_providers(ctx);
            if (spins > ctx->params.SPIN) {
                if (dchan_now_ns() > deadline) {
                    rc = DCHAN_ERR_TIMEOUT;
                    break;
                }
                sched_yield();
            }
            rc = h->prov->ops->put(h, &h->pd);
        }
    }
    if (rc != DCHAN_SUCCESS && rc != DCHAN_PROV_PUT_DONE) {
        h->inflight = false;
        if (h->error)
            rc = h->error;
    }
    return rc;
}

/* Hand the put described by h->pd (all but its sequence word) to the
 * provider, and count it once it went. */
static inline __attribute__((always_inline)) int put_issue(dchan_ctx_t *ctx, dchan_handle_t *h,
                                                           bool in_place)
{
    struct dchan_put_desc *d = &h->pd;
    d->src = in_place ? NULL : d->src;
    d->slot = dchan_slot_of(h->n_put, h->depth);
    d->offset = (size_t)d->slot * h->size;
    /* A credited receiver counts puts: the low half is this put's number. */
    d->seq = h->credit ? (h->seq & ~0xffffffffull) | (uint32_t)(h->n_put + 1) : seq_next(h->seq);
    if (h->detect == DCHAN_DETECT_FLAG)
        *h->seq_word = d->seq;
    /* Set first: a provider may complete the put before returning. */
    h->inflight = true;
    int rc = h->prov->ops->put(h, d);
    if (__builtin_expect(rc != DCHAN_PROV_PUT_DONE && rc != DCHAN_SUCCESS, 0) &&
        (rc = put_again(h, rc)) != DCHAN_SUCCESS && rc != DCHAN_PROV_PUT_DONE)
        return rc;
    if (rc == DCHAN_PROV_PUT_DONE) {
        h->inflight = false;
        dchan_put_completed(ctx, h); /* its callback runs from the next progress */
    }
    h->seq = d->seq;
    h->n_put++;
    /* A slot's tail is not looked at: the look would pull back and forth
     * the line that the receiver re-arms and the next put writes. Nor is
     * the word of a channel whose credit comes with records: each look
     * would take the line from the receiver, whose release then waits for
     * it again. */
    if (h->credit && credit_known(h) == 0 && !h->on_look && !h->ctail && !h->chint)
        look_add(ctx, h);
    ctx->stats.puts++;
    h->hstats.puts++; /* bytes and copied follow from puts and n_inplace */
    if (in_place) {
        h->in_place = false;
        h->n_inplace++;
    }
    return DCHAN_SUCCESS;
}

/* Every put the fast path below does not take: a gathered or staged send
 * side, a put still in flight, no credit known, a refusal to account for,
 * a context with a lock. */
static int __attribute__((noinline)) put_locked(dchan_handle_t *h)
{
    dchan_ctx_t *ctx = h->ctx;
    int rc;

    if (h->error)
        return h->error;
    if (h->credit && (rc = credit_take(h)) != DCHAN_SUCCESS)
        return rc;
    bool in_place = h->in_place; /* the next slot was written through dchan_put_ptr */
    if (h->detect == DCHAN_DETECT_SENTINEL) {
        uint64_t tail;
        if (h->segs) /* the last 8 bytes of the gathered message */
            dchan_segs_copy(h->segs, h->nseg, h->size - 8, h->size, &tail);
        else
            memcpy(&tail, (const char *)h->buf + h->size - 8, 8);
        if (tail == h->oob)
            return DCHAN_ERR_SENTINEL; /* it could never be detected */
    }
    if (h->inflight && (rc = dchan_core_drain_put(h, ctx->params.DRAIN_TIMEOUT_MS)) != DCHAN_SUCCESS)
        return rc;
    if (h->stage) {
        /* The previous put completed: the staging buffer is free. */
        if (h->vecs)
            dchan_gvec_copy(h->vecs, h->nvec, 0, h->size, h->stage);
        else
            dchan_segs_copy(h->segs, h->nseg, 0, h->size, h->stage);
    } else if (!h->segs) {
        h->pd.src = h->buf;
    }
    uint64_t stall = h->stall_ns;
    if ((rc = put_issue(ctx, h, in_place)) != DCHAN_SUCCESS)
        return rc;
    if (stall) {
        h->hstats.credit_wait_ns += dchan_now_ns() - stall;
        h->stall_ns = 0;
    }
    return DCHAN_SUCCESS;
}

DCHAN_API int dchan_put(dchan_handle_t *h)
{
    /* The put of nearly every iteration: a contiguous send side, the last
     * put completed, credit known, no lock, nothing to report. */
    if (__builtin_expect(h && h->magic == DCHAN_H_MAGIC && h->fast == DCHAN_FAST_SEND && !h->error &&
                             !h->inflight && !h->stall_ns &&
                             (!h->credit || credit_known(h) != 0 ||
                              credits_now(h) != 0),
                         1)) {
        if (h->detect == DCHAN_DETECT_SENTINEL) {
            uint64_t tail;
            memcpy(&tail, (const char *)h->buf + h->size - 8, 8);
            if (tail == h->oob)
                return DCHAN_ERR_SENTINEL; /* it could never be detected */
        }
        h->pd.src = h->buf;
        return put_issue(h->ctx, h, h->in_place);
    }
    int rc = send_entry(h, false); /* STATE: put before assoc_local */
    if (rc != DCHAN_SUCCESS)
        return rc;
    dchan_ctx_lock(h->ctx);
    rc = put_locked(h);
    dchan_ctx_unlock(h->ctx);
    return rc;
}

DCHAN_API int dchan_put_test(dchan_handle_t *h)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    /* Nothing in flight, nothing wrong: nothing to drive or lock for. */
    if (__builtin_expect(h->fast == DCHAN_FAST_SEND && !h->inflight && !h->error, 1))
        return 1;
    if (h->role != DCHAN_ROLE_SEND)
        return DCHAN_ERR_STATE;
    dchan_ctx_lock(h->ctx);
    if (h->inflight)
        dchan_core_poll_providers(h->ctx);
    rc = h->error ? h->error : !h->inflight;
    dchan_ctx_unlock(h->ctx);
    return rc;
}

/* ---- destruction ---------------------------------------------------------------------- */

void dchan_quarantine_flush(dchan_ctx_t *ctx, uint64_t keep)
{
    while (ctx->qt_len > keep) {
        dchan_handle_t *h = ctx->qt_head;
        ctx->qt_head = h->all_next;
        if (!ctx->qt_head)
            ctx->qt_tail = NULL;
        ctx->qt_len--;
        h->magic = 0;
        free(h);
    }
}

int dchan_handle_release(dchan_handle_t *h)
{
    dchan_ctx_t *ctx = h->ctx;
    int rc = DCHAN_SUCCESS;

    if (h->role == DCHAN_ROLE_SOURCE || h->role == DCHAN_ROLE_GETTER) {
        dchan_get_release(h);
        if (h->role == DCHAN_ROLE_SOURCE)
            id_free(ctx, h->id);
    } else if (h->role == DCHAN_ROLE_RECV) {
        if (h->pq_pos != PQ_NONE)
            dchan_pq_remove(ctx, h);
        if (h->on_fire)
            dchan_fire_remove(ctx, h);
        if (h->on_credq)
            credq_remove(ctx, h);
        if (h->credit) {
            /* The word's next user must find this channel's last write
             * landed, not arriving over its own. */
            uint64_t deadline = dchan_now_ns() + ctx->params.DRAIN_TIMEOUT_MS * 1000000ull;
            while (h->cbusy && !h->error && !(ctx->ndead && ctx->dead[h->peer]) &&
                   dchan_now_ns() < deadline) {
                dchan_core_poll_providers(ctx);
                if (h->cbusy)
                    sched_yield();
            }
            if (h->on_credq)
                credq_remove(ctx, h);
            cid_free(ctx, h->peer, h->cidx, credit_value(h));
        }
        h->prov->ops->recv_close(h);
        if (h->detect == DCHAN_DETECT_FLAG)
            dchan_seqpool_put(&ctx->recv_seq, h->slot);
        if (scanned(h->detect))
            ctx->nscan--;
        id_free(ctx, h->id);
    } else {
        if (h->inflight) {
            rc = dchan_core_drain_put(h, ctx->params.DRAIN_TIMEOUT_MS);
            if (h->inflight && ctx->ndead && ctx->dead[h->peer]) {
                h->prov->ops->put_abandon(h); /* it will never complete */
            } else if (rc == DCHAN_ERR_TIMEOUT) {
                dchan_warn(ctx, h->prov->ops->name,
                           "put to rank %d still in flight after %lu ms: abandoned", h->peer,
                           ctx->params.DRAIN_TIMEOUT_MS);
                h->prov->ops->put_abandon(h);
            }
            h->inflight = false;
            if (rc != DCHAN_ERR_TIMEOUT)
                rc = DCHAN_SUCCESS; /* an error already reported on the handle */
        }
        if (h->on_look)
            look_remove(ctx, h);
        if (h->credit) {
            csend_remove(ctx, h);
            h->prov->ops->credit_close(h);
        }
        h->prov->ops->send_close(h);
        if (h->detect == DCHAN_DETECT_FLAG)
            dchan_seqpool_put(&ctx->send_seq, h->slot);
        if (h->on_fire)
            dchan_fire_remove(ctx, h); /* completion callbacks still due */
        free(h->segs);
        free(h->stage);
        free(h->vecs);
        h->segs = NULL;
        h->stage = NULL;
        h->vecs = NULL;
        h->buf = NULL;
    }
    if (h->on_errq)
        errq_remove(ctx, h);
    all_unlink(ctx, h);

    /* Kept for a while so that a later call finds DEAD, not freed memory. */
    h->magic = DCHAN_H_DEAD;
    h->all_next = NULL;
    if (ctx->qt_tail)
        ctx->qt_tail->all_next = h;
    else
        ctx->qt_head = h;
    ctx->qt_tail = h;
    ctx->qt_len++;
    dchan_quarantine_flush(ctx, ctx->params.QUARANTINE);
    return rc;
}

DCHAN_API int dchan_handle_destroy(dchan_handle_t *h)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    dchan_ctx_lock(h->ctx);
    dchan_ctx_t *ctx = h->ctx;
    rc = dchan_handle_release(h);
    dchan_ctx_unlock(ctx);
    return rc;
}

/* ---- queries and provider accessors ------------------------------------------------- */

DCHAN_API const char *dchan_handle_provider(const dchan_handle_t *h)
{
    return h_check(h) == DCHAN_SUCCESS ? h->prov->ops->name : NULL;
}

DCHAN_API int dchan_handle_detect(const dchan_handle_t *h)
{
    int rc = h_check(h);
    return rc == DCHAN_SUCCESS ? h->detect : rc;
}

DCHAN_API int dchan_handle_stats(const dchan_handle_t *h, dchan_handle_stats_t *stats)
{
    int rc = h_check(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    /* A struct_size from an older header is fine (fewer fields); one that
     * cannot even hold the first counter, or a larger one than we know,
     * is a structure the caller did not set up. */
    if (!stats || stats->struct_size < offsetof(dchan_handle_stats_t, bytes) ||
        stats->struct_size > sizeof *stats)
        return DCHAN_ERR_INVALID_ARG;
    dchan_ctx_t *ctx = h->ctx;
    dchan_ctx_lock(ctx);
    dchan_handle_stats_t s = h->hstats;
    if (h->role == DCHAN_ROLE_SEND) { /* counted as puts, not per put */
        s.bytes = s.puts * h->size;
        s.copied = (s.puts - h->n_inplace) * h->size;
    }
    dchan_ctx_unlock(ctx);
    s.struct_size = stats->struct_size;
    memcpy(stats, &s, stats->struct_size);
    return DCHAN_SUCCESS;
}

struct dchan_prov *dchan_h_prov(const dchan_handle_t *h)
{
    return h->prov;
}

void *dchan_h_buf(const dchan_handle_t *h)
{
    return h->buf;
}

size_t dchan_h_size(const dchan_handle_t *h)
{
    return h->size;
}

uint32_t dchan_h_depth(const dchan_handle_t *h)
{
    return h->depth;
}

size_t dchan_h_span(const dchan_handle_t *h)
{
    return h->size * h->depth;
}

DCHAN_API int dchan_slot(dchan_handle_t *h, void **ptr)
{
    /* Once per slot in the applications that use it: no lock to take. */
    if (__builtin_expect(h && h->magic == DCHAN_H_MAGIC && h->role == DCHAN_ROLE_RECV && ptr &&
                             !h->ctx->locking && DCHAN_R_HELD(h) != 0,
                         1)) {
        *ptr = (char *)h->buf + (size_t)dchan_slot_of(h->n_rel, h->depth) * h->size;
        return DCHAN_SUCCESS;
    }
    int rc = recv_entry(h);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (!ptr)
        return DCHAN_ERR_INVALID_ARG;
    dchan_ctx_lock(h->ctx);
    if (DCHAN_R_HELD(h) == 0)
        rc = DCHAN_ERR_STATE;
    else
        *ptr = (char *)h->buf + (size_t)dchan_slot_of(h->n_rel, h->depth) * h->size;
    dchan_ctx_unlock(h->ctx);
    return rc;
}

int dchan_h_peer(const dchan_handle_t *h)
{
    return h->peer;
}

int dchan_h_detect(const dchan_handle_t *h)
{
    return h->detect;
}

uint32_t dchan_h_id(const dchan_handle_t *h)
{
    return h->id;
}

uint32_t dchan_h_remote_id(const dchan_handle_t *h)
{
    return h->id;
}

uint32_t dchan_h_gen(const dchan_handle_t *h)
{
    return h->gen;
}

uint32_t dchan_h_credit_index(const dchan_handle_t *h)
{
    return h->role == DCHAN_ROLE_RECV && h->credit ? h->cidx : UINT32_MAX;
}

uint64_t *dchan_h_ctl(const dchan_handle_t *h)
{
    return h->gctl;
}

bool dchan_h_is_source(const dchan_handle_t *h)
{
    return h && h->magic == DCHAN_H_MAGIC && h->role == DCHAN_ROLE_SOURCE;
}

uint64_t *dchan_h_seq_word(const dchan_handle_t *h)
{
    return h->seq_word;
}

void dchan_h_seq_chunk(const dchan_handle_t *h, void **base, size_t *len)
{
    const struct dchan_seqpool *pool =
        h->role == DCHAN_ROLE_RECV ? &h->ctx->recv_seq : &h->ctx->send_seq;
    dchan_seqpool_chunk(pool, h->slot.chunk, base, len);
}
