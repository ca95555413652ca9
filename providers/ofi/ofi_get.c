/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * ofi get (DESIGN §7, lib/get.c): the getter reads the source's memory.
 *
 * The source registers its buffer for FI_REMOTE_READ and ships it in the
 * wire with its control words, in a copy the getter reads and writes (see
 * "source" below; the sequence-word fields of the put wire carry them). It
 * sends nothing: publishing is a store into the copy.
 *
 * The getter keeps the published word as it last read it. The core asks
 * for it (get_peek) before each get: while it shows the version already
 * taken, a read of the word is started and the answer is the old value
 * (DCHAN_ERR_AGAIN for the caller; a later call sees the new one). No
 * version can be published past one the getter has not taken, so a value
 * that shows a new version is exactly the current one. A get is then:
 *   1. fi_read of the buffer, in pieces of at most max_msg bytes;
 *   2. once all of it is here, fi_read of the published word: a source
 *      destroyed during step 1 cleared it first: the core then reports
 *      DCHAN_ERR_PEER and does not deliver what may be torn (a read that
 *      broke with its connection, which tcp drops after a read of a closed
 *      region, is read again if this check finds the source still there);
 *   3. the core's got() writes the taken word (fi_writemsg of 8 bytes),
 *      which the source's progress compares and then runs done_fn.
 * A read of the published word reads the taken word beside it too: a
 * taken word whose write failed (its connection broke) is written again
 * when the source still shows the old one, so a failed write is never an
 * error of its own (the source may just have gone, having seen it).
 * dchan_get runs no provider progress while no get is in flight, so
 * get_peek reads the completion queue itself while its read is out.
 * Reads and the taken word's write are idempotent: one that found its
 * connection gone, or whose connection broke under it (tcp drops a
 * connection after an access to a closed region, on any channel), is
 * posted again after a growing gap, for as long as puts are (ofi_rma.c);
 * the control words are never a closed region, so only a data read of a
 * source destroyed under it breaks a connection, once.
 *
 * Where the fabric does not grant FI_READ/FI_REMOTE_READ (ofi_init.c),
 * src_open and get_open return DCHAN_ERR_UNSUPPORTED.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ofi.h"

/* As for puts (ofi_rma.c): how long operations may keep finding their
 * connection gone, and the first gap before posting them again. */
#define OFI_GET_RETRY_NS 10000000000ull
#define OFI_GET_RETRY_GAP_NS 1000000ull

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct ofi_gh *gh(dchan_handle_t *h)
{
    return DCHAN_PROV_PRIV(h, struct ofi_gh);
}

static struct ofi_srch *srch(dchan_handle_t *h)
{
    return DCHAN_PROV_PRIV(h, struct ofi_srch);
}

/* ---- source ------------------------------------------------------------------------------ */

/*
 * The core's control words live in memory it frees at destroy. A getter
 * that reads them after that would touch a closed region (tcp then drops
 * the connection, failing every other channel's operations on it) or, on
 * a fabric that checks no key (shm's process_vm_readv), memory that holds
 * something else by then. So getters read a copy in slabs this provider
 * registers once and never closes before the endpoint: each entry holds
 * the published word (copied at creation and at each publish), the taken
 * word (written by the getter, copied to the core's by progress) and the
 * source's identity, which a destroyed source clears; entries are reused
 * oldest first, and a getter that finds another identity there reads its
 * source as gone.
 */
static struct ofi_cent *cent_get(struct dchan_prov *p, struct ofi_cslab **slab)
{
    struct ofi_state *st = p->state;
    if (!st->cfree_head) {
        struct ofi_cslab *s = calloc(1, sizeof *s);
        void *mem = NULL;
        if (!s || posix_memalign(&mem, OFI_CSLAB_BYTES, OFI_CSLAB_BYTES) != 0) {
            free(s);
            return NULL;
        }
        memset(mem, 0, OFI_CSLAB_BYTES);
        s->ent = mem;
        if (dchan_ofi_mr_reg(p, mem, OFI_CSLAB_BYTES, OFI_ACCESS_REMOTE_RW, (void **)&s->mr) !=
            DCHAN_SUCCESS) {
            free(mem);
            free(s);
            return NULL;
        }
        s->next = st->cslabs;
        st->cslabs = s;
        for (size_t k = 0; k < OFI_CSLAB_BYTES / sizeof *s->ent; k++) {
            s->ent[k].next_free = NULL;
            if (st->cfree_tail)
                st->cfree_tail->next_free = &s->ent[k];
            else
                st->cfree_head = &s->ent[k];
            st->cfree_tail = &s->ent[k];
        }
    }
    struct ofi_cent *e = st->cfree_head;
    st->cfree_head = e->next_free;
    if (!st->cfree_head)
        st->cfree_tail = NULL;
    e->next_free = NULL;
    for (struct ofi_cslab *s = st->cslabs; s; s = s->next)
        if (e >= s->ent && e < s->ent + OFI_CSLAB_BYTES / sizeof *s->ent)
            *slab = s;
    return e;
}

static void cent_put(struct ofi_state *st, struct ofi_cent *e)
{
    e->next_free = NULL;
    if (st->cfree_tail)
        st->cfree_tail->next_free = e;
    else
        st->cfree_head = e;
    st->cfree_tail = e;
}

void dchan_ofi_cslabs_free(struct ofi_state *st)
{
    while (st->cslabs) {
        struct ofi_cslab *s = st->cslabs;
        st->cslabs = s->next;
        free(s->mr); /* closed with the others (dchan_ofi_mr_close_all) */
        free(s->ent);
        free(s);
    }
    st->cfree_head = st->cfree_tail = NULL;
}

static uint64_t ident_of(dchan_handle_t *h)
{
    return (uint64_t)dchan_h_id(h) << 32 | dchan_h_gen(h);
}

static int ofi_src_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_srch *r = srch(h);
    bool virt = (st->mr_mode & FI_MR_VIRT_ADDR) != 0;
    void *buf = dchan_h_buf(h);
    uint64_t *ctl = dchan_h_ctl(h);
    struct ofi_wire w;
    int rc;

    if (!st->can_read)
        return DCHAN_ERR_UNSUPPORTED;
    memset(&w, 0, sizeof w);
    /* Exactly the buffer, for reads only. */
    rc = dchan_reg_get(p, buf, dchan_h_size(h), OFI_ACCESS_REMOTE_READ, &r->buf_reg);
    if (rc != DCHAN_SUCCESS)
        return rc;
    rc = DCHAN_ERR_NO_MEMORY;
    if (!(r->e = cent_get(p, &r->slab)))
        goto put_buf;
    r->taken = __atomic_load_n(&ctl[1], __ATOMIC_RELAXED);
    __atomic_store_n(&r->e->taken, r->taken, __ATOMIC_RELAXED);
    __atomic_store_n(&r->e->ident, ident_of(h), __ATOMIC_RELAXED);
    __atomic_store_n(&r->e->pub, __atomic_load_n(&ctl[0], __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    w.flags = (uint8_t)(((st->mr_mode & FI_MR_RAW) ? OFI_WIRE_RAW : 0) | OFI_WIRE_SEQ);
    w.buf_addr = virt ? (uint64_t)(uintptr_t)buf : 0;
    w.seq_addr = virt ? (uint64_t)(uintptr_t)r->e
                      : (uint64_t)((char *)r->e - (char *)r->slab->ent);
    rc = dchan_ofi_fill_key(p, dchan_reg_mr(r->buf_reg), &w, &w.buf_key, &w.buf_raw_len);
    if (rc == DCHAN_SUCCESS)
        rc = dchan_ofi_fill_key(p, r->slab->mr, &w, &w.seq_key, &w.seq_raw_len);
    if (rc != DCHAN_SUCCESS)
        goto put_e;
    dchan_ofi_wire_pack(&w, wire_fields);
    r->prev = NULL;
    r->next = st->src_head;
    if (st->src_head)
        srch(st->src_head)->prev = h;
    st->src_head = h;
    return DCHAN_SUCCESS;

put_e:
    __atomic_store_n(&r->e->ident, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&r->e->pub, 0, __ATOMIC_RELEASE);
    cent_put(st, r->e);
    r->e = NULL;
put_buf:
    dchan_reg_put(r->buf_reg);
    r->buf_reg = NULL;
    return rc;
}

/* Gone: a getter's next read of the words finds no source there. */
static void ofi_src_close(dchan_handle_t *h)
{
    struct ofi_state *st = dchan_h_prov(h)->state;
    struct ofi_srch *r = srch(h);
    if (r->prev)
        srch(r->prev)->next = r->next;
    else if (st->src_head == h)
        st->src_head = r->next;
    if (r->next)
        srch(r->next)->prev = r->prev;
    r->prev = r->next = NULL;
    if (r->e) {
        __atomic_store_n(&r->e->pub, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&r->e->ident, 0, __ATOMIC_RELEASE);
        cent_put(st, r->e);
        r->e = NULL;
    }
    dchan_reg_put(r->buf_reg);
    r->buf_reg = NULL;
}

/* The core bumped its published word: the getter reads the copy. */
static int ofi_src_publish(dchan_handle_t *h)
{
    struct ofi_srch *r = srch(h);
    __atomic_store_n(&r->e->pub, __atomic_load_n(&dchan_h_ctl(h)[0], __ATOMIC_ACQUIRE),
                     __ATOMIC_RELEASE);
    return DCHAN_SUCCESS;
}

/* From progress, before the core compares its taken words: the getters'
 * writes, copied. */
void dchan_ofi_get_sources(struct dchan_prov *p)
{
    struct ofi_state *st = p->state;
    for (dchan_handle_t *h = st->src_head; h; h = srch(h)->next) {
        struct ofi_srch *r = srch(h);
        uint64_t v = __atomic_load_n(&r->e->taken, __ATOMIC_ACQUIRE);
        if (v != r->taken) {
            r->taken = v;
            __atomic_store_n(&dchan_h_ctl(h)[1], v, __ATOMIC_RELEASE);
        }
    }
}

/* ---- getter: posting ---------------------------------------------------------------------- */

static void gpend_add(struct ofi_state *st, dchan_handle_t *h)
{
    struct ofi_gh *g = gh(h);
    if (g->pending)
        return;
    g->pending = true;
    g->gpend_next = st->gpend_head;
    st->gpend_head = h;
}

static void gpend_remove(struct ofi_state *st, dchan_handle_t *h)
{
    struct ofi_gh *g = gh(h);
    if (!g->pending)
        return;
    for (dchan_handle_t **pp = &st->gpend_head; *pp; pp = &gh(*pp)->gpend_next)
        if (*pp == h) {
            *pp = g->gpend_next;
            break;
        }
    g->pending = false;
    g->gpend_next = NULL;
}

/* One read (write: the taken word) of len bytes for h. */
static int post_op(struct ofi_state *st, dchan_handle_t *h, uint8_t kind, void *local,
                   size_t len, void *desc, uint64_t raddr, uint64_t key, uint64_t flags,
                   uint64_t data)
{
    struct ofi_gh *g = gh(h);
    struct ofi_op *op = st->free_ops;
    struct iovec iov = {.iov_base = local, .iov_len = len};
    struct fi_rma_iov rma = {.addr = raddr, .len = len, .key = key};
    struct fi_msg_rma msg;
    ssize_t ret;

    if (!op)
        return -FI_EAGAIN;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = g->dest;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op;
    msg.data = data;
    if (kind == OFI_OP_GACK)
        ret = fi_writemsg(st->ep, &msg, flags | FI_COMPLETION);
    else
        ret = fi_readmsg(st->ep, &msg, flags | FI_COMPLETION);
    if (ret)
        return (int)ret;
    dchan_ofi_op_take(st, op, h, kind, dchan_h_peer(h));
    g->outstanding++;
    return 0;
}

/* A failure to post: 0 posted, -FI_EAGAIN (later), or a code. */
static int post_rc(struct dchan_prov *p, int ret, const char *what)
{
    if (ret == 0 || ret == -FI_EAGAIN)
        return ret;
    if (dchan_ofi_unsent(ret))
        return -FI_EAGAIN; /* libfabric connects again at a later post */
    return dchan_ofi_rc(p, ret, what);
}

static int post_peek(struct dchan_prov *p, dchan_handle_t *h)
{
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    /* Zero first: a read that a provider completes without placing
     * anything (a closed region on shm) reads as a source gone. */
    g->w->pub = g->w->rtaken = g->w->ident = 0;
    int ret = post_op(st, h, OFI_OP_GPEEK, &g->w->pub, OFI_CENT_READ, g->w_desc, g->ctl_raddr,
                      g->ctl_rkey, 0, 0);
    ret = post_rc(p, ret, "fi_readmsg (published word)");
    if (ret == 0) {
        g->peeking = true;
        g->peek_due = false;
    }
    return ret;
}

static int post_ack(struct dchan_prov *p, dchan_handle_t *h)
{
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    /* Delivery completion where the put path asks for it (a network
     * provider): a taken word lost with a connection is then seen here.
     * On shm the word goes through the source's own progress, as the
     * puts' polled words do (ofi_open): whole, and with a completion there
     * that wakes a source asleep on its descriptor. */
    uint64_t fl = st->dc_last ? FI_DELIVERY_COMPLETE : 0;
    if (st->word_at_target && st->cq_data)
        fl |= FI_REMOTE_CQ_DATA;
    int ret = post_op(st, h, OFI_OP_GACK, &g->w->taken, sizeof g->w->taken, g->w_desc,
                      g->ctl_raddr + sizeof(uint64_t), g->ctl_rkey, fl, OFI_CQ_QUIET);
    ret = post_rc(p, ret, "fi_writemsg (taken word)");
    if (ret == 0) {
        g->ack_due = false;
        g->acking = true;
    }
    return ret;
}

/* The data reads not posted yet. */
static int post_data(struct dchan_prov *p, dchan_handle_t *h)
{
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    size_t size = dchan_h_size(h);
    char *buf = dchan_h_buf(h);
    while (g->next < size) {
        size_t len = size - g->next < st->max_msg ? size - g->next : st->max_msg;
        int ret = post_op(st, h, OFI_OP_GREAD, buf + g->next, len, g->buf_desc,
                          g->raddr + g->next, g->rkey, 0, 0);
        ret = post_rc(p, ret, "fi_readmsg (get)");
        if (ret)
            return ret;
        g->reading++;
        g->next += len;
    }
    return 0;
}

/* Post what h has due; true when nothing is left. */
static bool post_due(struct dchan_prov *p, dchan_handle_t *h)
{
    struct ofi_gh *g = gh(h);
    int ret = 0;
    if (g->retry_at) {
        if (now_ns() < g->retry_at)
            return false;
        g->retry_at = 0;
    }
    if (g->phase == OFI_GPH_DATA && !g->err && g->next < dchan_h_size(h)) {
        ret = post_data(p, h);
        if (ret && ret != -FI_EAGAIN)
            g->err = ret;
    }
    if (g->peek_due && !g->peeking && (ret = post_peek(p, h)) != 0 && ret != -FI_EAGAIN) {
        g->peek_due = false;
        if (g->phase == OFI_GPH_CHECK) {
            g->phase = OFI_GPH_IDLE;
            dchan_core_get_done(h, ret);
            return true;
        }
        g->pub = 0; /* cannot ask: reported as gone */
    }
    if (g->ack_due && !g->acking && (ret = post_ack(p, h)) != 0 && ret != -FI_EAGAIN)
        g->ack_due = false; /* the next read of the words asks again */
    if (g->phase == OFI_GPH_DATA && g->err && g->reading == 0) {
        int rc = g->err;
        g->err = 0;
        g->phase = OFI_GPH_IDLE;
        dchan_core_get_done(h, rc);
    }
    return !g->peek_due && !g->ack_due &&
           !(g->phase == OFI_GPH_DATA && !g->err && g->next < dchan_h_size(h));
}

void dchan_ofi_get_pending(struct dchan_prov *p)
{
    struct ofi_state *st = p->state;
    dchan_handle_t *list = st->gpend_head;
    st->gpend_head = NULL;
    /* Taken off first: what a report adds back stays for the next round. */
    while (list) {
        dchan_handle_t *h = list;
        struct ofi_gh *g = gh(h);
        list = g->gpend_next;
        g->pending = false;
        g->gpend_next = NULL;
        if (!post_due(p, h))
            gpend_add(st, h);
    }
}

/* ---- getter: completions ----------------------------------------------------------------- */

/* Found its connection gone, or it broke under it: ask again
 * (idempotent) after a gap. */
static bool again(struct ofi_gh *g, int fi_err)
{
    if (!(dchan_ofi_unsent(fi_err) || dchan_ofi_reset(fi_err)))
        return false;
    uint64_t t = now_ns();
    if (!g->retry_deadline)
        g->retry_deadline = t + OFI_GET_RETRY_NS;
    if (t > g->retry_deadline)
        return false;
    g->retry_at = t + (OFI_GET_RETRY_GAP_NS << (g->backoff < 6 ? g->backoff : 6));
    g->backoff++;
    return true;
}

static void retry_reset(struct ofi_gh *g)
{
    g->backoff = 0;
    g->retry_at = g->retry_deadline = 0;
}

void dchan_ofi_get_op_done(struct dchan_prov *p, struct ofi_op *op, int fi_err, int rc)
{
    struct ofi_state *st = p->state;
    dchan_handle_t *h = op->h;
    struct ofi_orphan *o = op->orphan;
    uint8_t kind = op->kind;
    bool retry = false;

    if (!h) {
        dchan_ofi_op_free(st, op);
        if (o && --o->outstanding == 0)
            dchan_ofi_orphan_release(st, o);
        return;
    }
    struct ofi_gh *g = gh(h);
    g->outstanding--;
    if (fi_err)
        retry = again(g, fi_err);
    else if (!g->retry_at)
        g->retry_deadline = 0; /* connected again */
    dchan_ofi_op_free(st, op);
    switch (kind) {
    case OFI_OP_GPEEK:
        g->peeking = false;
        if (retry) {
            g->peek_due = true;
            break;
        }
        /* Another identity there: the source was destroyed (its entry
         * may serve another one by now). */
        g->pub = fi_err || g->w->ident != ident_of(h) ? 0 : g->w->pub;
        /* The source still shows the version before the one taken: the
         * taken word's write was lost with a connection. */
        if (!fi_err && g->phase == OFI_GPH_IDLE && g->taken && !g->acking &&
            (uint32_t)g->pub == g->taken && (uint32_t)(g->pub >> 32) == dchan_h_gen(h) &&
            g->w->rtaken != ((uint64_t)dchan_h_gen(h) << 32 | g->taken))
            g->ack_due = true;
        if (g->phase == OFI_GPH_CHECK && g->redo) {
            /* A data read broke with its connection: if the version asked
             * for is still there, read it again; else the source is gone. */
            g->redo = false;
            if (g->pub && (uint32_t)g->pub == g->taken + 1) {
                g->phase = OFI_GPH_DATA;
                g->next = 0;
                break;
            }
            g->phase = OFI_GPH_IDLE;
            dchan_core_get_done(h, DCHAN_ERR_PEER);
            return;
        }
        if (g->phase == OFI_GPH_CHECK) {
            /* The data landed, then the word said the source was still
             * there (got() compares its tag). */
            g->phase = OFI_GPH_IDLE;
            dchan_core_get_done(h, fi_err ? DCHAN_ERR_PEER : DCHAN_SUCCESS);
            return;
        }
        if (fi_err)
            dchan_debug(p->ctx, OFI_NAME, "read of a source's published word failed: gone");
        break;
    case OFI_OP_GREAD:
        g->reading--;
        if (retry && dchan_ofi_unsent(fi_err))
            g->next = 0; /* not sent: the whole buffer again (reads are idempotent) */
        else if (retry)
            g->redo = true; /* broke under it: the check decides */
        else if (fi_err && !g->err)
            g->err = DCHAN_ERR_PEER; /* the region is gone (detail logged) */
        if (g->reading || g->err)
            break;
        if (g->phase != OFI_GPH_DATA || g->next < dchan_h_size(h))
            break; /* more to post (post_due) */
        /* All data here: the published word, read after it. */
        if (!g->err) {
            g->phase = OFI_GPH_CHECK;
            g->peek_due = true;
        }
        break;
    case OFI_OP_GACK:
        g->acking = false;
        if (retry)
            g->ack_due = true;
        else if (fi_err)
            dchan_debug(p->ctx, OFI_NAME, "write of a source's taken word failed (rc %d)", rc);
        break;
    }
    if (!post_due(p, h))
        gpend_add(st, h);
}

/* ---- getter: the core's calls --------------------------------------------------------------- */

static int ofi_get_open(dchan_handle_t *h, const unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    bool raw = (st->mr_mode & FI_MR_RAW) != 0;
    struct ofi_wire w;
    int rc;

    if (!st->can_read)
        return DCHAN_ERR_UNSUPPORTED;
    rc = dchan_ofi_wire_unpack(wire_fields, raw, true, (st->mr_mode & FI_MR_VIRT_ADDR) != 0, &w);
    if (rc != DCHAN_SUCCESS)
        return rc;
    g->dest = st->peers[dchan_h_peer(h)];
    g->raddr = w.buf_addr;
    g->ctl_raddr = w.seq_addr;
    rc = dchan_ofi_keys_map(p, &w, raw, true, &g->rkey, &g->ctl_rkey, &g->raw_mapped);
    if (rc != DCHAN_SUCCESS)
        goto unmap;
    rc = DCHAN_ERR_NO_MEMORY;
    if (!(g->w = calloc(1, sizeof *g->w)))
        goto unmap;
    if (st->mr_local) {
        rc = dchan_reg_get(p, dchan_h_buf(h), dchan_h_size(h), OFI_ACCESS_READ_INTO, &g->buf_reg);
        if (rc == DCHAN_SUCCESS)
            rc = dchan_reg_get(p, g->w, sizeof *g->w, OFI_ACCESS_READ_INTO, &g->w_reg);
        if (rc != DCHAN_SUCCESS)
            goto free_w;
        g->buf_desc = ((struct ofi_mr *)dchan_reg_mr(g->buf_reg))->desc;
        g->w_desc = ((struct ofi_mr *)dchan_reg_mr(g->w_reg))->desc;
    }
    /* Version 1 was published when the source was created. */
    g->pub = (uint64_t)dchan_h_gen(h) << 32 | 1;
    g->taken = 0;
    return DCHAN_SUCCESS;

free_w:
    dchan_reg_put(g->buf_reg);
    dchan_reg_put(g->w_reg);
    g->buf_reg = g->w_reg = NULL;
    free(g->w);
    g->w = NULL;
unmap:
    dchan_ofi_keys_unmap(st, g->rkey, g->ctl_rkey, &g->raw_mapped);
    return rc;
}

/* The core waited for the data; what is still in flight (a read of the
 * published word, the taken word's write, data past the drain time)
 * keeps the words and registrations it uses until it completes. */
static void ofi_get_close(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    struct ofi_orphan *o = NULL;

    gpend_remove(st, h);
    if (g->outstanding && (o = calloc(1, sizeof *o)) != NULL) {
        o->regs[0] = g->buf_reg;
        o->regs[1] = g->w_reg;
        dchan_ofi_keys_orphan(o, g->rkey, g->ctl_rkey, &g->raw_mapped);
        o->mem = g->w;
        o->outstanding = g->outstanding;
        o->next = st->orphans;
        st->orphans = o;
        g->buf_reg = g->w_reg = NULL;
        g->w = NULL;
    } else if (g->outstanding) {
        /* No memory for the record: the words stay allocated for good
         * rather than be written after free. */
        dchan_warn(p->ctx, OFI_NAME, "a closed getter's operations keep their memory");
        g->w = NULL;
    }
    if (g->outstanding)
        for (size_t k = 0; k < st->nops; k++)
            if (st->ops[k].h == h) {
                st->ops[k].h = NULL;
                st->ops[k].orphan = o;
            }
    g->outstanding = g->reading = 0;
    dchan_reg_put(g->buf_reg);
    dchan_reg_put(g->w_reg);
    g->buf_reg = g->w_reg = NULL;
    free(g->w);
    g->w = NULL;
    dchan_ofi_keys_unmap(st, g->rkey, g->ctl_rkey, &g->raw_mapped);
}

static int ofi_get_peek(dchan_handle_t *h, uint64_t *published)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    /* The core polls no provider while no get is in flight. */
    if ((g->peeking || g->peek_due) && !st->progressing)
        dchan_ofi_progress(p);
    *published = g->pub;
    /* Nothing new known, the source still there: ask again. */
    if (g->phase == OFI_GPH_IDLE && !g->peeking && !g->peek_due &&
        (uint32_t)g->pub == g->taken && (uint32_t)(g->pub >> 32) == dchan_h_gen(h)) {
        retry_reset(g);
        int ret = post_peek(p, h);
        if (ret == -FI_EAGAIN) {
            g->peek_due = true;
            gpend_add(st, h);
        } else if (ret) {
            return ret;
        }
    }
    return DCHAN_SUCCESS;
}

static int ofi_get(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);

    if (g->phase != OFI_GPH_IDLE)
        return DCHAN_ERR_STATE;
    g->phase = OFI_GPH_DATA;
    g->next = 0;
    g->err = 0;
    retry_reset(g);
    int ret = post_data(p, h);
    if (ret && g->reading == 0) {
        /* Nothing posted: busy (the core says DCHAN_ERR_AGAIN), or failed. */
        g->phase = OFI_GPH_IDLE;
        return ret == -FI_EAGAIN ? DCHAN_ERR_AGAIN : ret;
    }
    if (ret && ret != -FI_EAGAIN)
        g->err = ret; /* reported when what was posted completed */
    if (ret)
        gpend_add(st, h);
    return DCHAN_SUCCESS;
}

static int ofi_get_ack(dchan_handle_t *h, uint64_t v)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct ofi_state *st = p->state;
    struct ofi_gh *g = gh(h);
    g->taken = (uint32_t)v;
    /* The previous write of the word completed at the source before it
     * published this version, so its source may be rewritten. */
    g->w->taken = v;
    int ret = post_ack(p, h);
    if (ret == -FI_EAGAIN) {
        g->ack_due = true;
        gpend_add(st, h);
        return DCHAN_SUCCESS;
    }
    return ret;
}

const struct dchan_get_ops dchan_ofi_get_ops = {
    .src_open = ofi_src_open,
    .src_close = ofi_src_close,
    .src_publish = ofi_src_publish,
    .get_open = ofi_get_open,
    .get_close = ofi_get_close,
    .get_peek = ofi_get_peek,
    .get = ofi_get,
    .get_ack = ofi_get_ack,
};
