/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * ofi channels: receive and send handles, puts and progress.
 *
 * A put is a list of writes: the bulk [0, bulk) in pieces of at most
 * max_msg bytes (for a gathered send side, each piece an iovec list of
 * its segments: see "gathered send sides"), then one last write that the
 * receiver detects:
 *   EVENT     the last piece, with the receive handle's id as remote CQ data;
 *   FLAG      the sender's 8-byte sequence word into the receiver's;
 *   SENTINEL  the buffer's last 8 bytes.
 * The last write is ordered after the bulk by the provider's guarantees, by
 * FI_FENCE, or by posting it only once the bulk's FI_DELIVERY_COMPLETE
 * completions were read (ofi_init.c chooses). Writes that find the queue
 * full (-FI_EAGAIN) are posted later, so a put is never repeated half-way
 * nor lost; the put is done locally when every write completed.
 *
 * A connection-oriented provider (tcp) drops the connection to a peer on a
 * remote access error (a write to a closed region), failing every write in
 * flight on it: those puts fail on their handles, since any of them may
 * have been delivered. Puts that then find the connection gone were not
 * sent: they are posted again, whole, once the provider reconnected.
 */
#include "config.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ofi.h"
#include "wire.h"

/* How long a put may keep finding its connection gone before it fails. */
#define OFI_RETRY_NS 10000000000ull
/* First wait before posting such a put again, doubled at each retry up to
 * 64 times: time for the provider to drop the dead connection. */
#define OFI_RETRY_GAP_NS 1000000ull
/* How long a put may drive progress to post its last write. */
#define OFI_POST_WAIT_NS 1000000000ull

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- operation contexts ------------------------------------------------------------- */

struct ofi_op *dchan_ofi_op_of(const struct ofi_state *st, void *ctx)
{
    uintptr_t a = (uintptr_t)ctx, base = (uintptr_t)st->ops;
    if (a < base || a >= base + st->nops * sizeof *st->ops || (a - base) % sizeof *st->ops)
        return NULL;
    return ctx;
}

static struct ofi_rx *rx_of(const struct ofi_state *st, void *ctx)
{
    uintptr_t a = (uintptr_t)ctx, base = (uintptr_t)st->rx;
    if (!st->rx || a < base || a >= base + st->nrx * sizeof *st->rx ||
        (a - base) % sizeof *st->rx)
        return NULL;
    return ctx;
}

void dchan_ofi_op_free(struct ofi_state *st, struct ofi_op *op)
{
    op->h = NULL;
    op->orphan = NULL;
    op->next_free = st->free_ops;
    st->free_ops = op;
}

int dchan_ofi_keys_map(struct dchan_prov *p, const struct ofi_wire *w, bool raw, bool word,
                       uint64_t *bkey, uint64_t *wkey, uint8_t *mapped)
{
    struct ofi_state *st = p->state;
    int ret;

    *mapped = 0;
    if (!raw) {
        *bkey = w->buf_key;
        *wkey = w->seq_key;
        return DCHAN_SUCCESS;
    }
    if ((ret = fi_mr_map_raw(st->domain, w->buf_key, (uint8_t *)w->raw, w->buf_raw_len, bkey, 0)))
        return dchan_ofi_rc(p, ret, "fi_mr_map_raw");
    *mapped = 1;
    if (word) {
        ret = fi_mr_map_raw(st->domain, w->seq_key, (uint8_t *)w->raw + w->buf_raw_len,
                            w->seq_raw_len, wkey, 0);
        if (ret)
            return dchan_ofi_rc(p, ret, "fi_mr_map_raw");
        *mapped |= 2;
    }
    return DCHAN_SUCCESS;
}

void dchan_ofi_keys_unmap(struct ofi_state *st, uint64_t bkey, uint64_t wkey, uint8_t *mapped)
{
    if (*mapped & 1)
        fi_mr_unmap_key(st->domain, bkey);
    if (*mapped & 2)
        fi_mr_unmap_key(st->domain, wkey);
    *mapped = 0;
}

void dchan_ofi_keys_orphan(struct ofi_orphan *o, uint64_t bkey, uint64_t wkey, uint8_t *mapped)
{
    if (*mapped & 1)
        o->keys[o->nkeys++] = bkey;
    if (*mapped & 2)
        o->keys[o->nkeys++] = wkey;
    *mapped = 0;
}

void dchan_ofi_op_take(struct ofi_state *st, struct ofi_op *op, dchan_handle_t *h, int kind,
                       int peer)
{
    st->free_ops = op->next_free;
    op->next_free = NULL;
    op->h = h;
    op->kind = (uint8_t)kind;
    op->peer = peer;
    op->after_loss = st->conn_lost[peer];
}

/* Post one write of n local segments (len bytes in all) to one remote
 * range for h; -FI_EAGAIN when the provider or our context pool is full. */
static int post_v(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s,
                  const struct iovec *iov, void **desc, size_t n, size_t len, uint64_t raddr,
                  uint64_t key, uint64_t flags, uint64_t data)
{
    struct ofi_op *op = st->free_ops;
    struct fi_rma_iov rma = {.addr = raddr, .len = len, .key = key};
    struct fi_msg_rma msg;
    ssize_t ret;

    if (!op)
        return -FI_EAGAIN;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.desc = desc;
    msg.iov_count = n;
    msg.addr = s->dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op;
    msg.data = data;
    ret = fi_writemsg(st->ep, &msg, flags | FI_COMPLETION);
    if (ret)
        return (int)ret;
    dchan_ofi_op_take(st, op, h, OFI_OP_PUT, dchan_h_peer(h));
    s->outstanding++;
    return 0;
}

static int post(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s, const void *src,
                size_t len, void *desc, uint64_t raddr, uint64_t key, uint64_t flags,
                uint64_t data)
{
    struct iovec iov = {.iov_base = (void *)src, .iov_len = len};
    return post_v(st, h, s, &iov, &desc, 1, len, raddr, key, flags, data);
}

/* ---- gathered send sides ---------------------------------------------------------------- */

/*
 * A gathered put is the same list of writes as a contiguous one, each
 * write taking its bytes from the segments (fi_writemsg iovecs) into one
 * remote range: a write covers at most max_msg bytes and iov_limit
 * segments, so a list longer than the fabric's iov_limit is split into
 * more writes (one remote range per write: rma_iov_limit is never above 1).
 * EVENT's last write must be a single one, so it starts where the last
 * iov_limit segments (or max_msg bytes) before the end begin; SENTINEL's
 * tail is the last segment's last 8 bytes, or an 8-byte copy where those
 * straddle segments.
 *
 * A write costs the fabric a round of its protocol (a command on shm, a
 * message on tcp) that is worth copying some KiB: where the segments need
 * more writes than a contiguous put of the same size would and average
 * under OFI_GATHER_MIN_SEG bytes (a face of single elements, rows of
 * 1 KiB), the provider gathers them into a staging buffer of its own at
 * each put and writes that instead (measured on this VM's shm, z-face of
 * 16384 doubles: 9 ms in 4096 writes of 4 segments against 0.07 ms copied).
 */
#define OFI_GATHER_MIN_SEG 65536

/* Register the segments (FI_MR_LOCAL): the span they cover, one
 * registration, where that works; else each segment on its own. */
static int gather_regs(struct dchan_prov *p, struct ofi_gather *g)
{
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    struct dchan_reg *r = NULL;
    for (size_t i = 0; i < g->nseg; i++) {
        uintptr_t b = (uintptr_t)g->segs[i].base;
        if (b < lo)
            lo = b;
        if (b + g->segs[i].len > hi)
            hi = b + g->segs[i].len;
    }
    g->desc = calloc(g->nseg, sizeof *g->desc);
    g->regs = calloc(g->nseg, sizeof *g->regs);
    if (!g->desc || !g->regs)
        return DCHAN_ERR_NO_MEMORY;
    if (dchan_reg_get(p, (void *)lo, hi - lo, DCHAN_ACCESS_SEND, &r) == DCHAN_SUCCESS) {
        g->regs[g->nregs++] = r;
        void *d = ((struct ofi_mr *)dchan_reg_mr(r))->desc;
        for (size_t i = 0; i < g->nseg; i++)
            g->desc[i] = d;
        return DCHAN_SUCCESS;
    }
    /* The span holds unmapped holes (separate allocations). */
    for (size_t i = 0; i < g->nseg; i++) {
        int rc = dchan_reg_get(p, (void *)g->segs[i].base, g->segs[i].len, DCHAN_ACCESS_SEND,
                               &g->regs[g->nregs]);
        if (rc != DCHAN_SUCCESS)
            return rc;
        g->desc[i] = ((struct ofi_mr *)dchan_reg_mr(g->regs[g->nregs++]))->desc;
    }
    return DCHAN_SUCCESS;
}

static void gather_free(struct ofi_gather *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->nregs; i++)
        dchan_reg_put(g->regs[i]);
    dchan_reg_put(g->bounce_reg);
    dchan_reg_put(g->stage_reg);
    free(g->stage);
    free(g->regs);
    free(g->desc);
    free(g);
}

static int gather_open(struct dchan_prov *p, dchan_handle_t *h, struct ofi_sh *s)
{
    struct ofi_state *st = p->state;
    const dchan_iov_t *segs;
    size_t nseg = dchan_h_segs(h, &segs), size = dchan_h_size(h);
    struct ofi_gather *g;
    int rc = DCHAN_SUCCESS;

    if (nseg == 0)
        return DCHAN_SUCCESS;
    if (!(g = calloc(1, sizeof *g)))
        return DCHAN_ERR_NO_MEMORY;
    g->segs = segs;
    g->nseg = nseg;
    /* EVENT: the last write takes the last segments, at most iov_limit of
     * them and max_msg bytes; everything before is bulk. */
    size_t start = size;
    for (size_t i = nseg, k = 0; i-- > 0 && k < st->iov_limit; k++) {
        size_t room = st->max_msg - (size - start);
        size_t take = segs[i].len < room ? segs[i].len : room;
        start -= take;
        if (take < segs[i].len || start == size - st->max_msg)
            break;
    }
    g->event_bulk = start;
    size_t writes = (nseg + st->iov_limit - 1) / st->iov_limit,
           contig = st->max_msg == SIZE_MAX ? 1 : (size + st->max_msg - 1) / st->max_msg;
    if (writes > contig && size / nseg < OFI_GATHER_MIN_SEG) {
        if (posix_memalign((void **)&g->stage, 64, size) != 0) {
            free(g);
            return DCHAN_ERR_NO_MEMORY;
        }
        if (st->mr_local) {
            rc = dchan_reg_get(p, g->stage, size, DCHAN_ACCESS_SEND, &g->stage_reg);
            if (rc != DCHAN_SUCCESS) {
                gather_free(g);
                return rc;
            }
            g->stage_desc = ((struct ofi_mr *)dchan_reg_mr(g->stage_reg))->desc;
        }
        s->g = g;
        return DCHAN_SUCCESS;
    }
    if (st->mr_local) {
        rc = gather_regs(p, g);
        if (rc == DCHAN_SUCCESS && dchan_h_detect(h) == DCHAN_DETECT_SENTINEL &&
            segs[nseg - 1].len < 8) {
            rc = dchan_reg_get(p, &g->bounce, sizeof g->bounce, DCHAN_ACCESS_SEND,
                               &g->bounce_reg);
            if (rc == DCHAN_SUCCESS)
                g->bounce_desc = ((struct ofi_mr *)dchan_reg_mr(g->bounce_reg))->desc;
        }
    }
    if (rc != DCHAN_SUCCESS) {
        gather_free(g);
        return rc;
    }
    s->g = g;
    return DCHAN_SUCCESS;
}

/* The cursor moves past what a posted write covered. */
static void gather_commit(struct ofi_gather *g, size_t to)
{
    while (g->pos < to) {
        size_t left = g->segs[g->seg].len - g->off, step = to - g->pos;
        if (step < left) {
            g->off += step;
            g->pos += step;
        } else {
            g->pos += left;
            g->seg++;
            g->off = 0;
        }
    }
}

/* The segments of message bytes [from, to), at most st->iov_limit of them;
 * returns how many, and the bytes they cover in *len. The cursor follows
 * the writes in order; a put posted again from byte 0 starts it over. */
static size_t gather_iov(const struct ofi_state *st, struct ofi_gather *g, size_t from, size_t to,
                         struct iovec *iov, void **desc, size_t *len)
{
    if (from < g->pos) {
        g->pos = g->seg = g->off = 0;
    }
    gather_commit(g, from); /* skip forward (the tail of SENTINEL, say) */
    size_t n = 0, pos = g->pos, seg = g->seg, off = g->off;
    while (pos < to && n < st->iov_limit) {
        size_t take = g->segs[seg].len - off;
        if (take > to - pos)
            take = to - pos;
        iov[n].iov_base = (char *)g->segs[seg].base + off;
        iov[n].iov_len = take;
        desc[n] = g->desc ? g->desc[seg] : NULL;
        n++;
        pos += take;
        off += take;
        if (off == g->segs[seg].len) {
            seg++;
            off = 0;
        }
    }
    *len = pos - from;
    return n;
}


/* Post one write of message bytes [from, at most to) of a gathered put;
 * *len: the bytes it covers. */
static int post_gathered(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s, size_t from,
                         size_t to, size_t *len, uint64_t flags, uint64_t data)
{
    struct iovec iov[64];
    void *desc[64];
    size_t n = gather_iov(st, s->g, from, to, iov, desc, len);
    int ret = post_v(st, h, s, iov, desc, n, *len, s->raddr + s->off + from, s->rkey, flags, data);
    if (ret == 0)
        gather_commit(s->g, from + *len);
    return ret;
}

/* ---- waiting lists: pending (room in the queue), retry (connection gone) ------------------ */

static struct ofi_sh *sh(dchan_handle_t *h)
{
    return DCHAN_PROV_PRIV(h, struct ofi_sh);
}

static void list_add(dchan_handle_t **head, dchan_handle_t **tail, dchan_handle_t *h)
{
    sh(h)->pend_next = NULL;
    if (*tail)
        sh(*tail)->pend_next = h;
    else
        *head = h;
    *tail = h;
}

static void list_remove(dchan_handle_t **head, dchan_handle_t **tail, dchan_handle_t *h)
{
    dchan_handle_t *prev = NULL;
    for (dchan_handle_t *x = *head; x && x != h; x = sh(x)->pend_next)
        prev = x;
    if (prev)
        sh(prev)->pend_next = sh(h)->pend_next;
    else if (*head == h)
        *head = sh(h)->pend_next;
    if (*tail == h)
        *tail = prev;
    sh(h)->pend_next = NULL;
}

static void pend_add(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s)
{
    if (s->pending)
        return;
    s->pending = true;
    list_add(&st->pend_head, &st->pend_tail, h);
}

static void pend_remove(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s)
{
    if (!s->pending)
        return;
    list_remove(&st->pend_head, &st->pend_tail, h);
    s->pending = false;
}

/* The whole put goes again after a growing gap. */
static void retry_add(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s, uint64_t t)
{
    pend_remove(st, h, s);
    s->next = 0;
    s->err = 0;
    s->unsent = false;
    s->phase = OFI_PH_BULK;
    s->retry_at = t + (OFI_RETRY_GAP_NS << (s->backoff < 6 ? s->backoff : 6));
    s->backoff++;
    s->queued = true;
    list_add(&st->retry_head, &st->retry_tail, h);
}

static void retry_remove(struct ofi_state *st, dchan_handle_t *h, struct ofi_sh *s)
{
    if (!s->queued)
        return;
    list_remove(&st->retry_head, &st->retry_tail, h);
    s->queued = false;
}

/* ---- the put state machine -------------------------------------------------------------- */

/* Post what can be posted now. Returns 0, or -FI_EAGAIN when a write must
 * wait for room; a hard failure is kept in s->err. */
static int advance(struct dchan_prov *p, dchan_handle_t *h, struct ofi_sh *s)
{
    struct ofi_state *st = p->state;
    const char *src = s->g && s->g->stage ? s->g->stage : dchan_h_buf(h);
    size_t size = dchan_h_size(h);
    int detect = dchan_h_detect(h), ret;
    enum ofi_order ord = detect == DCHAN_DETECT_EVENT ? st->ord_event : st->ord_tail;

    while (!s->err && !s->unsent && s->next < s->bulk) {
        size_t len = s->bulk - s->next < st->max_msg ? s->bulk - s->next : st->max_msg;
        uint64_t bfl = ord == OFI_ORD_COMPLETION ? FI_DELIVERY_COMPLETE : 0;
        if (s->gathered)
            ret = post_gathered(st, h, s, s->next, s->next + len, &len, bfl, 0);
        else
            ret = post(st, h, s, src + s->next, len, s->buf_desc, s->raddr + s->off + s->next,
                       s->rkey, bfl, 0);
        if (ret == -FI_EAGAIN)
            return ret;
        if (ret && dchan_ofi_unsent(ret)) {
            s->unsent = true;
            return 0;
        }
        if (ret) {
            s->err = dchan_ofi_rc(p, ret, "fi_writemsg");
            return 0;
        }
        s->next += len;
    }
    if (s->err || s->unsent || s->phase != OFI_PH_BULK)
        return 0;
    /* The last write: now, or once the bulk is delivered. */
    if (s->bulk && ord == OFI_ORD_COMPLETION && s->outstanding)
        return 0;
    uint64_t fl = s->bulk && ord == OFI_ORD_FENCE ? FI_FENCE | FI_DELIVERY_COMPLETE : 0;
    if (s->dc_last)
        fl |= FI_DELIVERY_COMPLETE;
    size_t glen = 0;
    switch (detect) {
    case DCHAN_DETECT_EVENT:
        if (s->gathered) /* one write by the choice of bulk (gather_open) */
            ret = post_gathered(st, h, s, s->bulk, size, &glen, fl | FI_REMOTE_CQ_DATA,
                                s->cq_data);
        else
            ret = post(st, h, s, src + s->bulk, size - s->bulk, s->buf_desc,
                       s->raddr + s->off + s->bulk, s->rkey, fl | FI_REMOTE_CQ_DATA, s->cq_data);
        break;
    case DCHAN_DETECT_FLAG:
        ret = post(st, h, s, dchan_h_seq_word(h), sizeof(uint64_t), s->seq_desc, s->seq_raddr,
                   s->seq_rkey, fl | (s->quiet_data ? FI_REMOTE_CQ_DATA : 0), OFI_CQ_QUIET);
        break;
    default: { /* SENTINEL */
        const void *tail = src + size - 8;
        void *tdesc = s->buf_desc;
        if (s->gathered) {
            const struct ofi_gather *g = s->g;
            const dchan_iov_t *last = &g->segs[g->nseg - 1];
            if (last->len >= 8) {
                tail = (const char *)last->base + last->len - 8;
                tdesc = g->desc ? g->desc[g->nseg - 1] : NULL;
            } else {
                /* Straddling segments: one 8-byte write from a copy, so
                 * that the word lands whole (the core checked it is not
                 * the oob pattern); the put in flight owns the copy. */
                s->g->bounce = 0;
                size_t pos = size;
                unsigned char *b = (unsigned char *)&s->g->bounce + 8;
                for (size_t i = g->nseg; i-- > 0 && pos > size - 8;) {
                    size_t take = g->segs[i].len < pos - (size - 8) ? g->segs[i].len
                                                                     : pos - (size - 8);
                    b -= take;
                    pos -= take;
                    memcpy(b, (const char *)g->segs[i].base + g->segs[i].len - take, take);
                }
                tail = &s->g->bounce;
                tdesc = g->bounce_desc;
            }
        }
        ret = post(st, h, s, tail, 8, tdesc, s->raddr + s->off + size - 8, s->rkey,
                   fl | (s->quiet_data ? FI_REMOTE_CQ_DATA : 0), OFI_CQ_QUIET);
        break;
    }
    }
    if (ret == -FI_EAGAIN)
        return ret;
    if (ret && dchan_ofi_unsent(ret))
        s->unsent = true;
    else if (ret)
        s->err = dchan_ofi_rc(p, ret, "fi_writemsg (last write)");
    else
        s->phase = OFI_PH_LAST;
    return 0;
}

/* After a completion of h's, or when its waiting writes were posted:
 * finish the put, queue it for another try, or move it on. */
static void settle(struct dchan_prov *p, dchan_handle_t *h, struct ofi_sh *s)
{
    struct ofi_state *st = p->state;

    if (s->outstanding || s->phase == OFI_PH_IDLE || s->queued)
        return;
    if (s->unsent && !s->err) {
        uint64_t t = now_ns();
        if (!s->retry_deadline)
            s->retry_deadline = t + OFI_RETRY_NS;
        if (t < s->retry_deadline) {
            retry_add(st, h, s, t);
            return;
        }
        s->err = DCHAN_ERR_PEER;
    }
    if (!s->err && s->phase == OFI_PH_BULK && !s->pending) {
        if (advance(p, h, s) == -FI_EAGAIN) {
            pend_add(st, h, s);
            return;
        }
        if (s->outstanding)
            return;
    }
    if (s->err || s->phase == OFI_PH_LAST) {
        int rc = s->err;
        pend_remove(st, h, s);
        s->err = 0;
        s->backoff = 0;
        s->retry_deadline = 0;
        s->unsent = false;
        s->phase = OFI_PH_IDLE;
        dchan_core_put_done(h, rc);
    }
}

/* Post again the puts whose time came. */
static void retry_due(struct dchan_prov *p)
{
    struct ofi_state *st = p->state;
    uint64_t t = 0;
    for (dchan_handle_t *h = st->retry_head, *next; h; h = next) {
        struct ofi_sh *s = sh(h);
        next = s->pend_next;
        if (!t)
            t = now_ns();
        if (t < s->retry_at)
            continue;
        retry_remove(st, h, s);
        if (advance(p, h, s) == -FI_EAGAIN)
            pend_add(st, h, s);
        else
            settle(p, h, s);
    }
}

int dchan_ofi_put(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_sh *s = sh(h);
    uint64_t deadline = 0;
    int ret;

    if (s->phase != OFI_PH_IDLE)
        return DCHAN_ERR_STATE; /* the core waits for put_done first */
    s->gathered = d->iov != NULL && s->g != NULL && !s->g->stage;
    if (d->iov && !s->g)
        return DCHAN_ERR_STATE; /* a gathered put to a send side opened contiguous */
    if (d->iov && s->g->stage) {
        /* The previous put completed (the core waits for it): the staging
         * buffer is free. */
        dchan_gather_copy(d, 0, d->size, s->g->stage);
        s->buf_desc = s->g->stage_desc;
    }
    switch (d->detect) {
    case DCHAN_DETECT_EVENT: {
        /* Every piece but the last is bulk; the last carries the CQ data. */
        size_t last = d->size % st->max_msg ? d->size % st->max_msg : st->max_msg;
        s->bulk = s->gathered ? s->g->event_bulk : d->size > st->max_msg ? d->size - last : 0;
        break;
    }
    case DCHAN_DETECT_FLAG:
        s->bulk = d->size;
        break;
    default:
        s->bulk = d->size - 8;
        break;
    }
    s->off = d->offset; /* the core only hands us the send buffer (no map_slot) */
    s->next = 0;
    s->err = 0;
    s->backoff = 0;
    s->retry_deadline = 0;
    s->unsent = false;
    s->phase = OFI_PH_BULK;
    ret = advance(p, h, s);
    if (ret == -FI_EAGAIN && s->outstanding == 0 && s->next == 0 && s->phase == OFI_PH_BULK) {
        /* Nothing posted: the core progresses and calls again. */
        s->phase = OFI_PH_IDLE;
        return DCHAN_ERR_AGAIN;
    }
    if (s->err && s->outstanding == 0) {
        int rc = s->err; /* nothing in flight: the put fails here */
        s->err = 0;
        s->phase = OFI_PH_IDLE;
        return rc;
    }
    if (s->unsent && s->outstanding == 0)
        settle(p, h, s); /* the connection is gone: posted again later */
    /*
     * The last write may have to wait for the bulk's completion or for room
     * in the queue. Posting it from a later progress call would make the
     * receiver depend on this process calling dchan again, which a program
     * that puts and then blocks elsewhere (a barrier) never does: so post
     * it now, driving progress (which also serves this process's incoming
     * transfers). Past a bound, the rest is posted by later progress.
     */
    for (unsigned spins = 0;
         s->phase == OFI_PH_BULK && !s->err && !s->unsent && !s->queued; spins++) {
        if (spins == 64)
            deadline = now_ns() + OFI_POST_WAIT_NS;
        if (spins > 64) {
            if (now_ns() > deadline) {
                if (ret == -FI_EAGAIN)
                    pend_add(st, h, s);
                break;
            }
            sched_yield(); /* with more ranks than cores the peer needs it */
        }
        dchan_ofi_progress(p);
        if (s->phase == OFI_PH_BULK && !s->pending && !s->err && !s->unsent && !s->queued)
            ret = advance(p, h, s);
    }
    return DCHAN_SUCCESS;
}

/* ---- receiver ---------------------------------------------------------------------------- */

int dchan_ofi_fill_key(struct dchan_prov *p, const struct ofi_mr *m, struct ofi_wire *w,
                       uint64_t *key, uint8_t *raw_len)
{
    struct ofi_state *st = p->state;
    size_t used = (size_t)w->buf_raw_len + w->seq_raw_len;
    if (!(st->mr_mode & FI_MR_RAW)) {
        *key = m->key;
        return DCHAN_SUCCESS;
    }
    if (m->raw_len == 0 || m->raw_len > OFI_WIRE_RAW_BYTES - used) {
        dchan_err(p->ctx, OFI_NAME,
                  "a raw memory key of %zu bytes does not fit the wire's %d bytes of raw keys",
                  m->raw_len, OFI_WIRE_RAW_BYTES);
        return DCHAN_ERR_UNSUPPORTED;
    }
    memcpy(w->raw + used, m->raw, m->raw_len);
    *raw_len = (uint8_t)m->raw_len;
    *key = m->raw_base;
    return DCHAN_SUCCESS;
}

int dchan_ofi_recv_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_rh *r = DCHAN_PROV_PRIV(h, struct ofi_rh);
    bool virt = (st->mr_mode & FI_MR_VIRT_ADDR) != 0;
    bool flag = dchan_h_detect(h) == DCHAN_DETECT_FLAG;
    void *buf = dchan_h_buf(h), *base = NULL;
    size_t len = 0;
    struct ofi_wire w;
    int rc;

    memset(&w, 0, sizeof w);
    /* Every slot: the sender writes slot n at n * size. */
    rc = dchan_reg_get(p, buf, dchan_h_span(h), DCHAN_ACCESS_REMOTE_WRITE, &r->buf_reg);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (flag) {
        /* The whole chunk, once for every handle whose word lives in it. */
        dchan_h_seq_chunk(h, &base, &len);
        rc = dchan_reg_get(p, base, len, DCHAN_ACCESS_REMOTE_WRITE, &r->seq_reg);
        if (rc != DCHAN_SUCCESS)
            goto put_buf;
    }
    w.flags = (uint8_t)(((st->mr_mode & FI_MR_RAW) ? OFI_WIRE_RAW : 0) | (flag ? OFI_WIRE_SEQ : 0));
    w.buf_addr = virt ? (uint64_t)(uintptr_t)buf : 0;
    rc = dchan_ofi_fill_key(p, dchan_reg_mr(r->buf_reg), &w, &w.buf_key, &w.buf_raw_len);
    if (rc != DCHAN_SUCCESS)
        goto put_seq;
    if (flag) {
        uint64_t *word = dchan_h_seq_word(h);
        w.seq_addr = virt ? (uint64_t)(uintptr_t)word : (uint64_t)((char *)word - (char *)base);
        rc = dchan_ofi_fill_key(p, dchan_reg_mr(r->seq_reg), &w, &w.seq_key, &w.seq_raw_len);
        if (rc != DCHAN_SUCCESS)
            goto put_seq;
    }
    dchan_ofi_wire_pack(&w, wire_fields);
    return DCHAN_SUCCESS;

put_seq:
    dchan_reg_put(r->seq_reg);
    r->seq_reg = NULL;
put_buf:
    dchan_reg_put(r->buf_reg);
    r->buf_reg = NULL;
    return rc;
}

void dchan_ofi_recv_close(dchan_handle_t *h)
{
    struct ofi_rh *r = DCHAN_PROV_PRIV(h, struct ofi_rh);
    /* A credit write still in flight completes without its handle (the
     * core waited for it as long as it would); its source is ours. */
    if (r->credit_op)
        r->credit_op->h = NULL;
    r->credit_op = NULL;
    /* Writes still aimed at the buffer now fail at their sender. */
    dchan_reg_put(r->seq_reg);
    dchan_reg_put(r->buf_reg);
    r->seq_reg = r->buf_reg = NULL;
}

/* Remote CQ data: the receive handle's id, and its whole generation when
 * 8 bytes are carried. */
static void arrival(struct dchan_prov *p, uint64_t data)
{
    if (!dchan_core_arrival_id(p, (uint32_t)data, (uint32_t)(data >> 32), -1, NULL, 0))
        /* A late write for a destroyed handle. */
        dchan_debug(p->ctx, OFI_NAME, "remote CQ data %#llx matches no handle",
                    (unsigned long long)data);
}

/* ---- sender ------------------------------------------------------------------------------ */

int dchan_ofi_send_open(dchan_handle_t *h, const unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_sh *s = sh(h);
    int detect = dchan_h_detect(h), rc;
    bool raw = (st->mr_mode & FI_MR_RAW) != 0, flag = detect == DCHAN_DETECT_FLAG;
    struct ofi_wire w;

    rc = dchan_ofi_wire_unpack(wire_fields, raw, flag, (st->mr_mode & FI_MR_VIRT_ADDR) != 0, &w);
    if (rc != DCHAN_SUCCESS)
        return rc;
    s->dest = st->peers[dchan_h_peer(h)];
    s->raddr = w.buf_addr;
    s->seq_raddr = w.seq_addr;
    rc = dchan_ofi_keys_map(p, &w, raw, flag, &s->rkey, &s->seq_rkey, &s->raw_mapped);
    if (rc != DCHAN_SUCCESS)
        goto unmap;
    const dchan_iov_t *segs;
    if (dchan_h_segs(h, &segs)) {
        /* Gathered: the segments, not one buffer. */
        if ((rc = gather_open(p, h, s)) != DCHAN_SUCCESS)
            goto unmap;
    }
    if (st->mr_local) {
        /* The registration cache makes one registration of a send buffer
         * shared by many channels (multicast). */
        if (!s->g) {
            rc = dchan_reg_get(p, dchan_h_buf(h), dchan_h_size(h), DCHAN_ACCESS_SEND,
                               &s->buf_reg);
            if (rc != DCHAN_SUCCESS)
                goto unmap;
            s->buf_desc = ((struct ofi_mr *)dchan_reg_mr(s->buf_reg))->desc;
        }
        if (flag) {
            void *base;
            size_t len;
            dchan_h_seq_chunk(h, &base, &len);
            rc = dchan_reg_get(p, base, len, DCHAN_ACCESS_SEND, &s->seq_reg);
            if (rc != DCHAN_SUCCESS)
                goto put_buf;
            s->seq_desc = ((struct ofi_mr *)dchan_reg_mr(s->seq_reg))->desc;
        }
    }
    /*
     * With k > 1 slots the sender runs ahead of the receiver, so put n+1
     * may start before put n was seen. The core assigns EVENT arrivals to
     * slots in the order of their CQ data, and takes every FLAG count up to
     * the one it sees: both need put n's last write processed at the target
     * before put n+1's. The core starts a put only once the previous one
     * completed locally; with delivery completion of the last write that
     * local completion means the target processed it (tcp has it anyway,
     * dc_last). SENTINEL needs nothing: each slot has its own tail, polled
     * in slot order, and each tail is ordered after its own body.
     */
    s->dc_last = st->dc_last || (dchan_h_depth(h) > 1 && detect != DCHAN_DETECT_SENTINEL);
    /* The polled word through the target's progress (ofi_open). */
    if (!s->dc_last && st->word_at_target && detect != DCHAN_DETECT_EVENT) {
        s->quiet_data = st->cq_data > 0;
        s->dc_last = !s->quiet_data;
    }
    if (detect == DCHAN_DETECT_EVENT)
        s->cq_data = st->cq_data >= 8
                         ? (uint64_t)dchan_h_gen(h) << 32 | dchan_h_remote_id(h)
                         : dchan_h_remote_id(h);
    return DCHAN_SUCCESS;

put_buf:
    dchan_reg_put(s->buf_reg);
    s->buf_reg = NULL;
unmap:
    gather_free(s->g);
    s->g = NULL;
    dchan_ofi_keys_unmap(st, s->rkey, s->seq_rkey, &s->raw_mapped);
    return rc;
}

/* The put did not complete in time: its writes finish in the background,
 * holding the registrations they use until their completions arrive. */
void dchan_ofi_put_abandon(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_sh *s = sh(h);
    struct ofi_orphan *o = NULL;

    pend_remove(st, h, s);
    retry_remove(st, h, s);
    if (s->outstanding) {
        o = calloc(1, sizeof *o);
        if (o) {
            o->regs[0] = s->buf_reg;
            o->regs[1] = s->seq_reg;
            dchan_ofi_keys_orphan(o, s->rkey, s->seq_rkey, &s->raw_mapped);
            o->outstanding = s->outstanding;
            o->g = s->g; /* its registrations, and the bounce the tail comes from */
            o->next = st->orphans;
            st->orphans = o;
            s->g = NULL;
            s->buf_reg = s->seq_reg = NULL;
        } else {
            dchan_warn(p->ctx, OFI_NAME, "abandoned writes keep no registration (no memory)");
        }
        for (size_t k = 0; k < st->nops; k++) {
            if (st->ops[k].h == h) {
                st->ops[k].h = NULL;
                st->ops[k].orphan = o;
            }
        }
    }
    s->outstanding = 0;
    s->err = 0;
    s->unsent = false;
    s->phase = OFI_PH_IDLE;
}

void dchan_ofi_send_close(dchan_handle_t *h)
{
    struct ofi_state *st = dchan_h_prov(h)->state;
    struct ofi_sh *s = sh(h);

    pend_remove(st, h, s);
    retry_remove(st, h, s);
    dchan_reg_put(s->seq_reg);
    dchan_reg_put(s->buf_reg);
    s->seq_reg = s->buf_reg = NULL;
    gather_free(s->g);
    s->g = NULL;
    dchan_ofi_keys_unmap(st, s->rkey, s->seq_rkey, &s->raw_mapped);
}

void dchan_ofi_orphan_release(struct ofi_state *st, struct ofi_orphan *o)
{
    for (struct ofi_orphan **pp = &st->orphans; *pp; pp = &(*pp)->next) {
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    }
    dchan_reg_put(o->regs[0]);
    dchan_reg_put(o->regs[1]);
    for (unsigned k = 0; k < o->nkeys; k++)
        fi_mr_unmap_key(st->domain, o->keys[k]);
    gather_free(o->g);
    free(o->mem);
    free(o);
}

void dchan_ofi_orphans_release(struct ofi_state *st)
{
    while (st->orphans)
        dchan_ofi_orphan_release(st, st->orphans);
}

/* ---- credit ---------------------------------------------------------------------------------- */

int dchan_ofi_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word)
{
    struct ofi_state *st = dchan_h_prov(h)->state;
    if (index >= st->credit_words)
        return DCHAN_ERR_HANDLE; /* the receiver's index would land in another row */
    *word = &st->credit_area[(size_t)dchan_h_peer(h) * st->credit_words + index];
    return DCHAN_SUCCESS;
}

int dchan_ofi_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    int peer = dchan_h_peer(h);
    const struct ofi_cpeer *c = &st->cpeer[peer];
    ssize_t ret;

    if (index >= c->words)
        return DCHAN_ERR_HANDLE;
    /* Our row of the sender's area, with the stride it published. */
    uint64_t raddr = c->raddr + ((uint64_t)dchan_ctx_rank(p->ctx) * c->words + index) * 8;
    if (st->credit_inject || st->credit_atomic) {
        /* No completion, so no error either. A connection that tcp drops
         * (under a write to a closed region) may take it along: the sender
         * then sees that credit only with this channel's next return, and
         * a sender left without any waits for good. A known limit: the
         * drop itself comes from a channel broken by its own user. As an
         * atomic maximum, an older count landing after a newer one
         * changes nothing. */
        ret = st->credit_inject
                  ? fi_inject_write(st->ep, src, sizeof *src, st->peers[peer], raddr, c->key)
                  : fi_inject_atomic(st->ep, src, 1, st->peers[peer], raddr, c->key, FI_UINT64,
                                     FI_MAX);
        if (ret == 0)
            return DCHAN_PROV_PUT_DONE;
        /* Not sent: the core tries again from progress. */
        if (ret == -FI_EAGAIN || dchan_ofi_unsent((int)ret))
            return DCHAN_ERR_AGAIN;
        return dchan_ofi_rc(p, (int)ret, st->credit_inject ? "fi_inject_write (credit)"
                                                           : "fi_inject_atomic (credit)");
    }

    struct ofi_op *op = st->free_ops;
    if (!op)
        return DCHAN_ERR_AGAIN;
    uint64_t *csrc = &st->csrc[op - st->ops];
    *csrc = *src; /* the handle may be gone before the write completes */
    struct iovec iov = {.iov_base = csrc, .iov_len = sizeof *csrc};
    struct fi_rma_iov rma = {.addr = raddr, .len = sizeof *csrc, .key = c->key};
    void *desc = st->csrc_desc;
    struct fi_msg_rma msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = st->peers[peer];
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op;
    ret = fi_writemsg(st->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
    if (ret == -FI_EAGAIN || (ret && dchan_ofi_unsent((int)ret)))
        return DCHAN_ERR_AGAIN;
    if (ret)
        return dchan_ofi_rc(p, (int)ret, "fi_writemsg (credit)");
    dchan_ofi_op_take(st, op, h, OFI_OP_CREDIT, peer);
    DCHAN_PROV_PRIV(h, struct ofi_rh)->credit_op = op;
    return DCHAN_SUCCESS;
}

/* ---- progress ------------------------------------------------------------------------------ */

/* Was the write surely not delivered, so that posting it again cannot
 * deliver anything twice? Its connection was gone when it was posted, or
 * had already broken under an earlier write with none completed since:
 * then it went nowhere, or on a connection that broke before it, and
 * libfabric connects again for the next post. (This is what lets the
 * other channels to a peer go on after tcp reset the connection under a
 * write to a closed region.) */
static bool write_unsent(const struct ofi_op *op, int fi_err)
{
    return dchan_ofi_unsent(fi_err) || (op->after_loss && dchan_ofi_reset(fi_err));
}

/* A write of ours completed: fi_err 0, or the libfabric error it died of
 * (rc its conversion). */
static void write_done(struct dchan_prov *p, struct ofi_op *op, int fi_err, int rc)
{
    struct ofi_state *st = p->state;
    dchan_handle_t *h = op->h;
    struct ofi_orphan *o = op->orphan;
    bool unsent = fi_err && write_unsent(op, fi_err);

    if (!fi_err)
        st->conn_lost[op->peer] = false;
    else if (dchan_ofi_reset(fi_err))
        st->conn_lost[op->peer] = true;
    if (op->kind >= OFI_OP_GREAD) {
        dchan_ofi_get_op_done(p, op, fi_err, rc);
        return;
    }
    if (op->kind == OFI_OP_CREDIT) {
        dchan_ofi_op_free(st, op);
        if (h) {
            DCHAN_PROV_PRIV(h, struct ofi_rh)->credit_op = NULL;
            /* Lost or not, the count it carried cannot be told to have
             * landed: the channel fails rather than wait forever. */
            dchan_core_credit_done(h, fi_err ? rc : DCHAN_SUCCESS);
        }
        return;
    }
    dchan_ofi_op_free(st, op);
    if (o) {
        if (--o->outstanding == 0)
            dchan_ofi_orphan_release(st, o);
        return;
    }
    if (!h)
        return;
    struct ofi_sh *s = sh(h);
    int peer = dchan_h_peer(h);
    s->outstanding--;
    if (unsent)
        s->unsent = true; /* posted again once reconnected (settle) */
    else if (fi_err && !s->err)
        s->err = rc;
    settle(p, h, s);
    /* A peer that cannot be reached fails every channel bound to it. */
    if (fi_err && dchan_ofi_unreachable(fi_err))
        dchan_core_peer_error(p, peer, DCHAN_ERR_PEER);
}

static void rx_done(struct dchan_prov *p, struct ofi_rx *rx, bool canceled)
{
    struct ofi_state *st = p->state;
    if (canceled)
        return; /* the endpoint is closing */
    int ret = dchan_ofi_post_rx(st, rx);
    if (ret)
        dchan_ofi_rc(p, ret, "fi_recv (repost for FI_RX_CQ_DATA)");
}

static void read_error(struct dchan_prov *p)
{
    struct ofi_state *st = p->state;
    struct fi_cq_err_entry e;
    char detail[128], what[224];
    ssize_t ret;

    memset(&e, 0, sizeof e);
    ret = fi_cq_readerr(st->cq, &e, 0);
    if (ret < 0) {
        if (ret != -FI_EAGAIN)
            dchan_ofi_rc(p, (int)ret, "fi_cq_readerr");
        return;
    }
    int err = e.err ? e.err : FI_EOTHER;
    const char *d = fi_cq_strerror(st->cq, e.prov_errno, e.err_data, detail, sizeof detail);
    struct ofi_op *op = dchan_ofi_op_of(st, e.op_context);
    if (op) {
        if (write_unsent(op, err)) {
            /* Not an error yet: the put goes again once reconnected. */
            dchan_debug(p->ctx, OFI_NAME, "write to rank %d found its connection gone: %s",
                        op->peer, d ? d : "no detail");
            write_done(p, op, err, DCHAN_ERR_PEER);
            return;
        }
        snprintf(what, sizeof what, "%s to rank %d: %s",
                 op->kind == OFI_OP_GREAD || op->kind == OFI_OP_GPEEK ? "read" : "write",
                 op->peer, d ? d : "no detail");
        int rc = dchan_ofi_rc(p, -err, what);
        write_done(p, op, err, rc);
        return;
    }
    struct ofi_rx *rx = rx_of(st, e.op_context);
    if (rx) {
        if (err != FI_ECANCELED)
            dchan_ofi_rc(p, -err, "receive for remote CQ data");
        rx_done(p, rx, err == FI_ECANCELED);
        return;
    }
    /* An incoming write that failed here (a stale key, say): the sender
     * gets the error on its handle; nothing of ours is concerned. */
    snprintf(what, sizeof what, "incoming transfer: %s", d ? d : "no detail");
    dchan_ofi_rc(p, -err, what);
}

int dchan_ofi_progress(struct dchan_prov *p)
{
    struct ofi_state *st = p->state;
    struct fi_cq_data_entry ent[16];
    int events = 0;
    bool outer = !st->progressing;
    st->progressing = true;

    for (int round = 0; round < 8; round++) {
        ssize_t n = fi_cq_read(st->cq, ent, sizeof ent / sizeof ent[0]);
        if (n == -FI_EAGAIN)
            break;
        if (n == -FI_EAVAIL) {
            read_error(p);
            events++;
            continue;
        }
        if (n < 0) {
            if (outer)
                st->progressing = false;
            return dchan_ofi_rc(p, (int)n, "fi_cq_read");
        }
        for (ssize_t k = 0; k < n; k++) {
            struct ofi_op *op = dchan_ofi_op_of(st, ent[k].op_context);
            if (op) {
                write_done(p, op, 0, DCHAN_SUCCESS);
                continue;
            }
            struct ofi_rx *rx = rx_of(st, ent[k].op_context);
            if (rx)
                rx_done(p, rx, false);
            uint64_t data = st->cq_data >= 8 ? ent[k].data : (uint32_t)ent[k].data;
            if ((ent[k].flags & FI_REMOTE_CQ_DATA) && data != OFI_CQ_QUIET)
                arrival(p, data);
        }
        events += (int)n;
        if ((size_t)n < sizeof ent / sizeof ent[0])
            break;
    }
    /* Completions made room: post what waited, oldest first. */
    while (st->pend_head) {
        dchan_handle_t *h = st->pend_head;
        struct ofi_sh *s = sh(h);
        if (advance(p, h, s) == -FI_EAGAIN)
            break;
        pend_remove(st, h, s);
        settle(p, h, s);
    }
    if (st->retry_head)
        retry_due(p);
    if (st->gpend_head)
        dchan_ofi_get_pending(p);
    if (st->src_head)
        dchan_ofi_get_sources(p);
    if (events)
        dchan_waketimer_activity(&st->wt); /* a sleep looks again soon */
    if (outer)
        st->progressing = false;
    return events;
}
