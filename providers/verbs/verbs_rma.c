/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * verbs provider: registrations, handles, puts and completions.
 *
 * A put is a short list of work requests on the data QP to the receiver:
 *   EVENT     up to DCHAN_VERBS_EVENT_SPLIT bytes: one RDMA WRITE WITH
 *             IMMEDIATE (the receive handle's id in imm_data); larger: RDMA
 *             WRITEs, then a 0-byte WRITE WITH IMMEDIATE, which the bulk may
 *             reach by adaptive routing. The responder completes a WRITE
 *             WITH IMMEDIATE only once it and every earlier message of the
 *             QP are placed, so the receive completion means arrival.
 *   FLAG      RDMA WRITEs of the body, then the 8-byte sequence word into
 *             the receiver's word: write-after-write order on one RC QP
 *             without relaxed ordering lands it last.
 *   SENTINEL  RDMA WRITEs of the body, then the 8-byte tail as a write of
 *             its own, landing last for the same reason; or, where the
 *             receiver's QP reports whole-message data order for writes into
 *             it (a flag in the wire), the buffer as it is.
 * Writes longer than the port's max_msg_sz (or DCHAN_VERBS_MAX_MSG) are
 * split. A gathered put (dchan_assoc_local_iov/_subarray) is the same list
 * with SGE lists over the segments instead of one SGE: each WRITE covers a
 * contiguous range of the receive buffer with at most max_sge segments and
 * max_msg bytes; a SENTINEL tail, which may straddle segments, is gathered
 * into one word at put time and written on its own (never split, so no
 * part of it lands before the body). The segments are registered once, at
 * assoc: their bounding range where it is dense, else clusters of nearby
 * segments, else each segment. A layout that needs more WRs than the send
 * queue holds is gathered into a registered staging buffer at each put. Every WR carries its put in wr_id (via the connection's ring of
 * records); the last WR of each put is signalled, as is every sig_every-th,
 * so that the send queue always retires and a put completes when its own
 * last WR does. A put is posted whole or not at all. A handle of depth k
 * has k slots: a put writes its slot, at d->offset in the receive buffer.
 *
 * Credit (DESIGN §7). A receiver returns credit with one 8-byte RDMA WRITE
 * into its word of the sender's credit area, on the same data QP as its
 * own puts to that sender. Inline (the usual case) the value is copied into
 * the WQE, so credit_write is done on return; the WR is signalled only as
 * the sig_every rule says, and stays in the send queue until a later
 * signalled WR retires it. Without inline data it is sent from a
 * registered staging word, signalled, and dchan_core_credit_done follows
 * its completion. A credit WR flushed by a failure of the connection is
 * written again, with the handle's newest value, once the QP is rebuilt;
 * the value is cumulative and tagged, so writing it twice, late, or a newer
 * one in its place never grants a slot that is not free.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "verbs.h"
#include "wire.h"

/* Remote-access fields of the wire (DCHAN_WIRE_PROV_BYTES, little-endian). */
enum {
    W_ADDR = 0,      /* 8: receive buffer address */
    W_RKEY = 8,      /* 4: its rkey */
    W_QPN = 12,      /* 4: the receiver's data QP serving the sender */
    W_SEQ_ADDR = 16, /* 8: FLAG sequence word address */
    W_SEQ_RKEY = 24, /* 4: its rkey */
    W_FLAGS = 28,    /* 1: W_IN_ORDER */
    W_END = 29       /* the rest is zero */
};
/* SENTINEL: RDMA WRITEs into the receiver's QP land in address order
 * (ibv_query_qp_data_in_order describes the receiving side), so one write
 * of the whole buffer puts the tail last. */
#define W_IN_ORDER 1

static struct vrb_state *state_of(dchan_handle_t *h)
{
    return dchan_h_prov(h)->state;
}

/* ---- registrations ------------------------------------------------------------------- */

int dchan_verbs_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access, void **mr)
{
    struct vrb_state *s = p->state;
    /* Receive buffers (and FLAG words): local and remote write, nothing
     * more. Send buffers: local read only. Never relaxed ordering: SENTINEL
     * and FLAG arrivals are read from memory. */
    int flags = access & DCHAN_ACCESS_REMOTE_WRITE
                    ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
                    : 0;
    struct ibv_mr *m = ibv_reg_mr(s->pd, addr, len, flags);
    if (!m) {
        char what[96];
        snprintf(what, sizeof what, "ibv_reg_mr of %zu bytes at %p", len, addr);
        return dchan_verbs_rc(s, VRB_ERRNO, errno ? errno : ENOMEM, what);
    }
    *mr = m;
    return DCHAN_SUCCESS;
}

void dchan_verbs_mr_dereg(struct dchan_prov *p, void *mr)
{
    int rc = ibv_dereg_mr(mr);
    if (rc)
        dchan_verbs_rc(p->state, VRB_ERRNO, rc, "ibv_dereg_mr");
}

/* ---- receiver ---------------------------------------------------------------------- */

int dchan_verbs_recv_open(dchan_handle_t *h, unsigned char *wf)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct vrb_state *s = p->state;
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    struct vrb_conn *c = &s->conns[dchan_h_peer(h)];
    struct ibv_mr *mr;
    int rc;

    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    /* Every slot: the buffer is depth x size bytes. */
    rc = dchan_reg_get(p, dchan_h_buf(h), dchan_h_span(h), DCHAN_ACCESS_REMOTE_WRITE, &rh->reg);
    if (rc != DCHAN_SUCCESS)
        return rc;
    mr = dchan_reg_mr(rh->reg);
    dchan_put_le64(wf + W_ADDR, (uintptr_t)dchan_h_buf(h));
    dchan_put_le32(wf + W_RKEY, mr->rkey);
    dchan_put_le32(wf + W_QPN, c->qp->qp_num);
    if (dchan_h_detect(h) == DCHAN_DETECT_FLAG) {
        void *base;
        size_t len;
        /* The page-aligned chunk, once for every word in it. */
        dchan_h_seq_chunk(h, &base, &len);
        rc = dchan_reg_get(p, base, len, DCHAN_ACCESS_REMOTE_WRITE, &rh->seq_reg);
        if (rc != DCHAN_SUCCESS)
            goto put_reg;
        mr = dchan_reg_mr(rh->seq_reg);
        dchan_put_le64(wf + W_SEQ_ADDR, (uintptr_t)dchan_h_seq_word(h));
        dchan_put_le32(wf + W_SEQ_RKEY, mr->rkey);
    }
    if (dchan_h_detect(h) == DCHAN_DETECT_SENTINEL && c->in_order)
        wf[W_FLAGS] = W_IN_ORDER;
    rh->c = c;
    c->nrecv++;
    return DCHAN_SUCCESS;

put_reg:
    dchan_reg_put(rh->reg);
    rh->reg = NULL;
    return rc;
}

static void cred_unqueue(struct vrb_conn *c, dchan_handle_t *h)
{
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    if (!rh->queued)
        return;
    for (dchan_handle_t **pp = &c->cred_head; *pp;
         pp = &DCHAN_PROV_PRIV(*pp, struct vrb_rh)->cnext)
        if (*pp == h) {
            *pp = rh->cnext;
            break;
        }
    rh->cnext = NULL;
    rh->queued = false;
}

/* Queues h's credit word to be written from progress (the QP is being
 * rebuilt, or its send queue is full). */
static void cred_queue(struct vrb_state *s, struct vrb_conn *c, dchan_handle_t *h)
{
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    if (!rh->queued) {
        rh->queued = true;
        rh->cnext = c->cred_head;
        c->cred_head = h;
    }
    dchan_verbs_att(s, c);
}

void dchan_verbs_recv_close(dchan_handle_t *h)
{
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    struct vrb_conn *c = rh->c;
    if (c) {
        struct vrb_state *s = c->s;
        uint64_t last = 0;
        bool out = false;
        /* Credit WRs still out complete without it; one not written yet
         * never is (the word's next user writes it anew, tagged). */
        for (uint64_t q = c->retired; q < c->posted; q++) {
            struct vrb_wrrec *r = &c->ring[q % s->sq_depth];
            if (r->kind == VRB_WR_CREDIT && r->h == h) {
                r->h = NULL;
                last = q;
                out = true;
            }
        }
        cred_unqueue(c, h);
        rh->owed = false;
        /* Let them complete (DESIGN §3: destroy completes what is
         * outstanding): finalize's barrier then means no credit write is
         * still going to a peer that may deregister its area right after. */
        uint64_t deadline = dchan_verbs_now() + s->pv->DRAIN_TIMEOUT_MS * 1000000ull;
        for (unsigned spins = 0; out && c->retired <= last && c->state == VRB_UP && !s->fatal;
             spins++) {
            dchan_verbs_seal(s, c, s->sq_usable); /* unsignalled at the tail */
            dchan_verbs_poll_send(s);
            if (dchan_verbs_now() > deadline)
                break;
            if (spins > 64)
                sched_yield();
        }
    }
    /* The last reference deregisters and so revokes the rkey: a later put
     * to this buffer fails with a remote access error at its sender and
     * never writes here. */
    dchan_reg_put(rh->seq_reg);
    dchan_reg_put(rh->reg);
    rh->reg = rh->seq_reg = NULL;
    if (rh->c)
        rh->c->nrecv--;
    rh->c = NULL;
}

/* ---- building a put ------------------------------------------------------------------- */

static uint64_t pieces(const struct vrb_state *s, uint64_t len)
{
    return (len + s->max_msg - 1) / s->max_msg;
}

/* WRs writing bytes [0, to) of the gathered message g to raddr, each at
 * most max_msg bytes and max_sge segments; appended to s->wr from n when
 * build, else only counted. Returns the new count. */
static uint32_t add_gather(struct vrb_state *s, uint32_t n, const struct vrb_gather *g, size_t to,
                           uint64_t raddr, uint32_t rkey, bool build)
{
    size_t i = 0, off = 0, pos = 0;
    while (pos < to) {
        struct ibv_sge *sge = build ? &s->sge[(size_t)n * s->max_sge] : NULL;
        uint64_t len = 0;
        uint32_t k = 0;
        while (pos + len < to && k < s->max_sge && len < s->max_msg) {
            uint64_t take = g->seg[i].len - off;
            if (take > to - pos - len)
                take = to - pos - len;
            if (take > s->max_msg - len)
                take = s->max_msg - len;
            if (build)
                sge[k] = (struct ibv_sge){.addr = (uintptr_t)g->seg[i].base + off,
                                          .length = (uint32_t)take,
                                          .lkey = g->lkey[i]};
            k++;
            len += take;
            off += take;
            if (off == g->seg[i].len) {
                i++;
                off = 0;
            }
        }
        if (build) {
            struct ibv_send_wr *wr = &s->wr[n];
            memset(wr, 0, sizeof *wr);
            wr->opcode = IBV_WR_RDMA_WRITE;
            wr->wr.rdma.remote_addr = raddr + pos;
            wr->wr.rdma.rkey = rkey;
            wr->sg_list = sge;
            wr->num_sge = (int)k;
            if (len <= s->max_inline)
                wr->send_flags = IBV_SEND_INLINE;
            if (n)
                s->wr[n - 1].next = wr;
        }
        pos += len;
        n++;
    }
    return n;
}

/* WRs of a put of the gathered message g (not staged). */
static uint64_t gather_count(struct vrb_state *s, const struct vrb_gather *g, size_t size,
                             int detect)
{
    switch (detect) {
    case DCHAN_DETECT_EVENT: {
        uint32_t k = add_gather(s, 0, g, size, 0, 0, false);
        return size <= s->event_split && k == 1 ? 1 : (uint64_t)k + 1;
    }
    case DCHAN_DETECT_FLAG:
        return (uint64_t)add_gather(s, 0, g, size, 0, 0, false) + 1;
    default:
        return (uint64_t)add_gather(s, 0, g, size - 8, 0, 0, false) + 1;
    }
}

static uint64_t wr_count(const struct vrb_state *s, bool in_order, size_t size, int detect)
{
    switch (detect) {
    case DCHAN_DETECT_EVENT:
        return size <= s->event_split && size <= s->max_msg ? 1 : pieces(s, size) + 1;
    case DCHAN_DETECT_FLAG:
        return pieces(s, size) + 1;
    default:
        return in_order ? pieces(s, size) : pieces(s, size - 8) + 1;
    }
}

static uint32_t add_wr(struct vrb_state *s, uint32_t n, enum ibv_wr_opcode op, const void *src,
                       uint64_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, uint32_t imm)
{
    struct ibv_send_wr *wr = &s->wr[n];
    struct ibv_sge *sge = &s->sge[(size_t)n * s->max_sge];
    memset(wr, 0, sizeof *wr);
    wr->opcode = op;
    wr->imm_data = imm;
    wr->wr.rdma.remote_addr = raddr;
    wr->wr.rdma.rkey = rkey;
    if (len) {
        sge->addr = (uintptr_t)src;
        sge->length = (uint32_t)len;
        sge->lkey = lkey;
        wr->sg_list = sge;
        wr->num_sge = 1;
        /* Small writes (sequence words, tails, small puts) are copied into
         * the WQE: no DMA read of the source. */
        if (len <= s->max_inline)
            wr->send_flags = IBV_SEND_INLINE;
    }
    if (n)
        s->wr[n - 1].next = wr;
    return n + 1;
}

static uint32_t add_body(struct vrb_state *s, uint32_t n, const char *src, uint64_t len,
                         uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
    for (uint64_t off = 0; off < len; off += s->max_msg) {
        uint64_t k = len - off < s->max_msg ? len - off : s->max_msg;
        n = add_wr(s, n, IBV_WR_RDMA_WRITE, src + off, k, lkey, raddr + off, rkey, 0);
    }
    return n;
}

static uint32_t build_wrs(struct vrb_state *s, const struct vrb_sh *sh);

/* The WRs of h's put into s->wr; returns how many. The last one carries
 * an immediate in every mode: a receiver asleep on its completion channel
 * wakes for it (a quiet one where the mode detects by polling memory). */
static uint32_t build(struct vrb_state *s, const struct vrb_sh *sh)
{
    uint32_t n = build_wrs(s, sh);
    if (n && s->wr[n - 1].opcode == IBV_WR_RDMA_WRITE) {
        s->wr[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        s->wr[n - 1].imm_data = htonl(VRB_IMM_QUIET);
    }
    return n;
}

static uint32_t build_wrs(struct vrb_state *s, const struct vrb_sh *sh)
{
    const char *src = sh->src;
    size_t size = sh->size;
    uint64_t raddr = sh->raddr + sh->roff; /* the slot */
    uint32_t n = 0;

    if (!src && sh->g) {
        /* Gathered: the same shapes, with SGE lists. */
        const struct vrb_gather *g = sh->g;
        switch (sh->detect) {
        case DCHAN_DETECT_EVENT:
            n = add_gather(s, 0, g, size, raddr, sh->rkey, true);
            if (n == 1 && size <= s->event_split) {
                s->wr[0].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                s->wr[0].imm_data = sh->imm;
                return 1;
            }
            return add_wr(s, n, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, raddr, sh->rkey,
                          sh->imm);
        case DCHAN_DETECT_FLAG:
            n = add_gather(s, 0, g, size, raddr, sh->rkey, true);
            return add_wr(s, n, IBV_WR_RDMA_WRITE, sh->seq_src, 8, sh->seq_lkey, sh->seq_raddr,
                          sh->seq_rkey, 0);
        default:
            /* The body, then the tail (gathered at put time) as one write. */
            n = add_gather(s, 0, g, size - 8, raddr, sh->rkey, true);
            return add_wr(s, n, IBV_WR_RDMA_WRITE, &g->tail, 8,
                          g->tail_reg ? ((struct ibv_mr *)dchan_reg_mr(g->tail_reg))->lkey : 0,
                          raddr + size - 8, sh->rkey, 0);
        }
    }

    switch (sh->detect) {
    case DCHAN_DETECT_EVENT:
        if (size <= s->event_split && size <= s->max_msg)
            return add_wr(s, 0, IBV_WR_RDMA_WRITE_WITH_IMM, src, size, sh->lkey, raddr,
                          sh->rkey, sh->imm);
        n = add_body(s, 0, src, size, sh->lkey, raddr, sh->rkey);
        return add_wr(s, n, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, 0, raddr, sh->rkey,
                      sh->imm);
    case DCHAN_DETECT_FLAG:
        n = add_body(s, 0, src, size, sh->lkey, raddr, sh->rkey);
        return add_wr(s, n, IBV_WR_RDMA_WRITE, sh->seq_src, 8, sh->seq_lkey, sh->seq_raddr,
                      sh->seq_rkey, 0);
    default:
        if (sh->in_order)
            return add_body(s, 0, src, size, sh->lkey, raddr, sh->rkey);
        n = add_body(s, 0, src, size - 8, sh->lkey, raddr, sh->rkey);
        return add_wr(s, n, IBV_WR_RDMA_WRITE, src + size - 8, 8, sh->lkey,
                      raddr + size - 8, sh->rkey, 0);
    }
}

void dchan_verbs_put_resolve(struct vrb_state *s, dchan_handle_t *h, int rc)
{
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    (void)s;
    sh->state = VRB_PUT_IDLE;
    sh->rc = 0;
    dchan_core_put_done(h, rc);
}

/* Posts a signalled 0-byte WRITE (no key is checked) behind unsignalled
 * WRs that nothing signalled follows, so that a completion retires them,
 * if fewer than limit WRs are outstanding. True when one is posted. */
bool dchan_verbs_seal(struct vrb_state *s, struct vrb_conn *c, uint32_t limit)
{
    struct ibv_send_wr wr, *bad;

    if (!c->since_sig || c->posted - c->retired >= limit)
        return false;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uint64_t)c->idx << VRB_WRID_SEQ_BITS | (c->posted & VRB_WRID_SEQ_MASK);
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    c->ring[c->posted % s->sq_depth] = (struct vrb_wrrec){.h = NULL};
    if (ibv_post_send(c->qp, &wr, &bad) != 0)
        return false;
    c->posted++;
    c->since_sig = 0;
    return true;
}

int dchan_verbs_post_put(struct vrb_state *s, dchan_handle_t *h)
{
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    struct vrb_conn *c = sh->c;
    struct ibv_send_wr *bad = NULL;
    uint32_t n = build(s, sh), since_sig = c->since_sig;
    int rc;

    /* Room for all of it, or none is posted: reclaim completed slots
     * once before giving up. */
    if (c->posted - c->retired + n > s->sq_usable) {
        dchan_verbs_poll_send(s);
        if (c->state == VRB_DEAD)
            return DCHAN_ERR_PEER;
        if (c->state != VRB_UP)
            return DCHAN_ERR_AGAIN;
        if (c->posted - c->retired + n > s->sq_usable) {
            /* Unsignalled credit writes at the tail would hold their
             * slots until some later WR is signalled: make one. */
            dchan_verbs_seal(s, c, s->sq_usable);
            return DCHAN_ERR_AGAIN;
        }
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t q = c->posted + i;
        bool last = i == n - 1;
        if (last || ++c->since_sig >= s->sig_every) {
            s->wr[i].send_flags |= IBV_SEND_SIGNALED;
            c->since_sig = 0;
        }
        s->wr[i].wr_id = (uint64_t)c->idx << VRB_WRID_SEQ_BITS | (q & VRB_WRID_SEQ_MASK);
        c->ring[q % s->sq_depth] = (struct vrb_wrrec){.h = h, .last = last};
    }
    rc = ibv_post_send(c->qp, s->wr, &bad);
    if (rc == 0) {
        c->posted += n;
        sh->state = VRB_PUT_POSTED;
        return DCHAN_SUCCESS;
    }
    uint32_t k = bad && bad >= s->wr && bad < s->wr + n ? (uint32_t)(bad - s->wr) : 0;
    if (k == 0) {
        for (uint32_t i = 0; i < n; i++)
            c->ring[(c->posted + i) % s->sq_depth].h = NULL;
        c->since_sig = since_sig; /* nothing was posted */
        return rc == ENOMEM ? DCHAN_ERR_AGAIN
                            : dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_send");
    }
    /* Part of the put went out: it fails, but through its completions, so
     * that its slots are retired in order. The device stops the QP (ERR),
     * and a signalled marker makes sure a completion covers the part (its
     * last WR may be unsignalled: since_sig says so to the seal). */
    for (uint32_t i = k; i < n; i++)
        c->ring[(c->posted + i) % s->sq_depth].h = NULL;
    c->ring[(c->posted + k - 1) % s->sq_depth].last = 1;
    c->posted += k;
    c->since_sig = 1;
    sh->rc = dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_send (part of a put)");
    sh->state = VRB_PUT_POSTED;
    dchan_verbs_data_failed(s, c, true); /* seals when it stops the QP */
    if (c->state == VRB_DEAD)
        return DCHAN_SUCCESS; /* resolved there */
    if (c->since_sig && !dchan_verbs_seal(s, c, s->sq_depth))
        dchan_verbs_conn_dead(s, c, DCHAN_ERR_PROVIDER);
    return DCHAN_SUCCESS;
}

/* ---- sender ----------------------------------------------------------------------------- */

static void gather_free(struct vrb_gather *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->nreg; i++)
        dchan_reg_put(g->reg[i]);
    dchan_reg_put(g->tail_reg);
    dchan_reg_put(g->stage_reg);
    free(g->stage);
    free(g->reg);
    free(g->lkey);
    free(g);
}

struct seg_ref {
    uintptr_t lo, hi;
    size_t idx;
};

static int seg_cmp(const void *a, const void *b)
{
    const struct seg_ref *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Segments closer than this share a registration (local access only: a
 * wider range exposes nothing to peers, it only pins more). */
#define VRB_GATHER_GAP 65536

/* Registers [lo, hi) for local use; its lkey goes to segments [a, b) of ref. */
static int gather_reg(struct dchan_prov *p, struct vrb_gather *g, uintptr_t lo, uintptr_t hi,
                      const struct seg_ref *ref, size_t a, size_t b)
{
    struct dchan_reg *r;
    int rc = dchan_reg_get(p, (void *)lo, hi - lo, DCHAN_ACCESS_SEND, &r);
    if (rc != DCHAN_SUCCESS)
        return rc;
    g->reg[g->nreg++] = r;
    uint32_t lkey = ((struct ibv_mr *)dchan_reg_mr(r))->lkey;
    for (size_t k = a; k < b; k++)
        g->lkey[ref[k].idx] = lkey;
    return DCHAN_SUCCESS;
}

/* A gathered send side: register its segments, and stage it where its
 * WRs would not fit the send queue. */
static int gather_open(struct dchan_prov *p, dchan_handle_t *h, struct vrb_sh *sh, int detect)
{
    struct vrb_state *s = p->state;
    const dchan_iov_t *seg;
    size_t n = dchan_h_segs(h, &seg), size = dchan_h_size(h), total = 0;
    struct vrb_gather *g = calloc(1, sizeof *g);
    struct seg_ref *ref = calloc(n, sizeof *ref);
    int rc = DCHAN_ERR_NO_MEMORY;

    if (!g || !ref)
        goto fail;
    g->seg = seg;
    g->nseg = n;
    g->lkey = calloc(n, sizeof *g->lkey);
    g->reg = calloc(n + 1, sizeof *g->reg);
    if (!g->lkey || !g->reg)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        ref[i] = (struct seg_ref){(uintptr_t)seg[i].base, (uintptr_t)seg[i].base + seg[i].len, i};
        total += seg[i].len;
    }
    qsort(ref, n, sizeof *ref, seg_cmp);
    uintptr_t lo = ref[0].lo, hi = 0;
    for (size_t i = 0; i < n; i++)
        hi = ref[i].hi > hi ? ref[i].hi : hi;
    /* Dense (a subarray of a modest array): one registration. */
    rc = DCHAN_ERR_NO_MEMORY;
    if (hi - lo <= 8 * (uint64_t)total + VRB_GATHER_GAP)
        rc = gather_reg(p, g, lo, hi, ref, 0, n);
    if (rc != DCHAN_SUCCESS) {
        /* Clusters of nearby segments; where one cannot be registered (a
         * hole in between), each of its segments. */
        for (size_t a = 0; a < n;) {
            size_t b = a + 1;
            uintptr_t clo = ref[a].lo, chi = ref[a].hi;
            while (b < n && ref[b].lo <= chi + VRB_GATHER_GAP) {
                chi = ref[b].hi > chi ? ref[b].hi : chi;
                b++;
            }
            if (gather_reg(p, g, clo, chi, ref, a, b) != DCHAN_SUCCESS) {
                for (size_t k = a; k < b; k++)
                    if ((rc = gather_reg(p, g, ref[k].lo, ref[k].hi, ref, k, k + 1)) !=
                        DCHAN_SUCCESS)
                        goto fail;
            }
            a = b;
        }
        rc = DCHAN_SUCCESS;
    }
    if (detect == DCHAN_DETECT_SENTINEL && s->max_inline < 8 &&
        (rc = dchan_reg_get(p, &g->tail, 8, DCHAN_ACCESS_SEND, &g->tail_reg)) != DCHAN_SUCCESS)
        goto fail;
    if (gather_count(s, g, size, detect) > s->sq_usable) {
        /* More WRs than the send queue holds: gather into a buffer of our own. */
        if (posix_memalign(&g->stage, 64, size) != 0) {
            g->stage = NULL;
            rc = DCHAN_ERR_NO_MEMORY;
            goto fail;
        }
        if ((rc = dchan_reg_get(p, g->stage, size, DCHAN_ACCESS_SEND, &g->stage_reg)) !=
            DCHAN_SUCCESS)
            goto fail;
        sh->lkey = ((struct ibv_mr *)dchan_reg_mr(g->stage_reg))->lkey;
        dchan_debug(p->ctx, VRB_NAME, "gathered send side of %zu segments: staged", n);
    }
    free(ref);
    sh->g = g;
    return DCHAN_SUCCESS;

fail:
    free(ref);
    gather_free(g);
    return rc;
}

int dchan_verbs_send_open(dchan_handle_t *h, const unsigned char *wf)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct vrb_state *s = p->state;
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    struct vrb_conn *c = &s->conns[dchan_h_peer(h)];
    size_t size = dchan_h_size(h);
    uint64_t span = (uint64_t)dchan_h_span(h); /* every slot */
    int detect = dchan_h_detect(h);
    int rc;

    for (int i = W_END; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wf[i])
            return DCHAN_ERR_HANDLE;
    sh->raddr = dchan_get_le64(wf + W_ADDR);
    sh->rkey = dchan_get_le32(wf + W_RKEY);
    sh->seq_raddr = dchan_get_le64(wf + W_SEQ_ADDR);
    sh->seq_rkey = dchan_get_le32(wf + W_SEQ_RKEY);
    /* The QP named must be the one the receiver keeps for this rank. */
    if (sh->raddr == 0 || sh->raddr + span < sh->raddr || dchan_get_le32(wf + W_QPN) != c->rqpn)
        return DCHAN_ERR_HANDLE;
    if (detect == DCHAN_DETECT_FLAG ? sh->seq_raddr == 0 || sh->seq_raddr % 8 != 0
                                    : sh->seq_raddr != 0 || sh->seq_rkey != 0)
        return DCHAN_ERR_HANDLE;
    if (wf[W_FLAGS] & ~W_IN_ORDER || (wf[W_FLAGS] && detect != DCHAN_DETECT_SENTINEL))
        return DCHAN_ERR_HANDLE;
    sh->in_order = wf[W_FLAGS] & W_IN_ORDER;
    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    /* A put is posted whole: it must fit the send queue. */
    if (wr_count(s, sh->in_order, size, detect) > s->sq_usable)
        return DCHAN_ERR_SIZE;

    const dchan_iov_t *segs;
    if (dchan_h_segs(h, &segs)) {
        rc = gather_open(p, h, sh, detect);
    } else {
        rc = dchan_reg_get(p, dchan_h_buf(h), size, DCHAN_ACCESS_SEND, &sh->reg);
        if (rc == DCHAN_SUCCESS)
            sh->lkey = ((struct ibv_mr *)dchan_reg_mr(sh->reg))->lkey;
    }
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (detect == DCHAN_DETECT_FLAG && s->max_inline < 8) {
        void *base;
        size_t len;
        /* The 8-byte sequence word goes inline (no key, no DMA read) where
         * the device can; elsewhere its chunk is registered, once for all
         * the words in it. */
        dchan_h_seq_chunk(h, &base, &len);
        rc = dchan_reg_get(p, base, len, DCHAN_ACCESS_SEND, &sh->seq_reg);
        if (rc != DCHAN_SUCCESS)
            goto put_reg;
        sh->seq_lkey = ((struct ibv_mr *)dchan_reg_mr(sh->seq_reg))->lkey;
    }
    sh->c = c;
    sh->imm = htonl(dchan_h_remote_id(h));
    sh->detect = detect;
    sh->state = VRB_PUT_IDLE;
    return DCHAN_SUCCESS;

put_reg:
    dchan_reg_put(sh->reg);
    sh->reg = NULL;
    gather_free(sh->g);
    sh->g = NULL;
    return rc;
}

int dchan_verbs_put(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    struct vrb_conn *c = sh->c;

    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    /* Being rebuilt, or re-issuing flushed puts first: the core drives
     * progress and retries. */
    if (c->state != VRB_UP || c->redo_head)
        return DCHAN_ERR_AGAIN;
    if (d->iov) {
        struct vrb_gather *g = sh->g;
        if (!g)
            return DCHAN_ERR_INVALID_ARG;
        /* The staging buffer and the tail word are free: the previous put
         * completed (or the core would not start this one). */
        if (g->stage) {
            dchan_gather_copy(d, 0, d->size, g->stage);
            sh->src = g->stage;
        } else {
            if (d->detect == DCHAN_DETECT_SENTINEL)
                dchan_gather_copy(d, d->size - 8, d->size, &g->tail);
            sh->src = NULL;
        }
    } else if (!d->src) {
        return DCHAN_ERR_INVALID_ARG; /* in place: only where map_slot maps (never here) */
    } else {
        sh->src = d->src;
    }
    sh->size = d->size;
    sh->roff = d->offset;
    sh->seq_src = d->seq_src;
    sh->detect = d->detect;
    sh->rc = 0;
    return dchan_verbs_post_put(c->s, h);
}

/* Forget h's put: its WRs may still complete, but report to nobody. */
static void detach(struct vrb_state *s, dchan_handle_t *h)
{
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    struct vrb_conn *c = sh->c;

    if (sh->state == VRB_PUT_POSTED) {
        for (uint64_t q = c->retired; q < c->posted; q++)
            if (c->ring[q % s->sq_depth].h == h)
                c->ring[q % s->sq_depth].h = NULL;
    } else if (sh->state == VRB_PUT_REDO) {
        dchan_handle_t **pp = &c->redo_head, *prev = NULL;
        while (*pp && *pp != h) {
            prev = *pp;
            pp = &DCHAN_PROV_PRIV(*pp, struct vrb_sh)->redo_next;
        }
        if (*pp) {
            *pp = sh->redo_next;
            if (c->redo_tail == h)
                c->redo_tail = prev;
        }
    }
    sh->redo_next = NULL;
    sh->state = VRB_PUT_IDLE;
}

void dchan_verbs_put_abandon(dchan_handle_t *h)
{
    detach(state_of(h), h);
}

void dchan_verbs_send_close(dchan_handle_t *h)
{
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    /* The core may release a handle whose put is still posted (it gave up
     * waiting, or the handle failed otherwise): its WRs must then find no
     * handle to report to. */
    if (sh->state != VRB_PUT_IDLE)
        detach(state_of(h), h);
    dchan_reg_put(sh->seq_reg);
    dchan_reg_put(sh->reg);
    sh->reg = sh->seq_reg = NULL;
    gather_free(sh->g);
    sh->g = NULL;
}

/* ---- credit ------------------------------------------------------------------------------ */

int dchan_verbs_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word)
{
    struct vrb_state *s = state_of(h);
    /* The receiver allocated index among its own CREDIT_WORDS: it must
     * fall in this rank's words for it. */
    if (index >= s->cw)
        return DCHAN_ERR_HANDLE;
    *word = &s->carea[(size_t)dchan_h_peer(h) * s->cw + index];
    s->conns[dchan_h_peer(h)].ncredit++;
    return DCHAN_SUCCESS;
}

void dchan_verbs_credit_close(dchan_handle_t *h)
{
    state_of(h)->conns[dchan_h_peer(h)].ncredit--;
}

/* Posts receive handle h's newest credit value as one 8-byte RDMA WRITE on
 * the data QP to its sender. DCHAN_ERR_AGAIN: no room in the send queue. */
static int post_credit(struct vrb_state *s, struct vrb_conn *c, dchan_handle_t *h)
{
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    struct ibv_send_wr wr, *bad;
    struct ibv_sge sge;
    bool inl = s->max_inline >= 8;
    uint32_t since_sig = c->since_sig;
    int rc;

    if (c->posted - c->retired + 1 > s->sq_usable)
        return DCHAN_ERR_AGAIN;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uint64_t)c->idx << VRB_WRID_SEQ_BITS | (c->posted & VRB_WRID_SEQ_MASK);
    /* With an immediate: a sender asleep until its credit comes back wakes. */
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(VRB_IMM_QUIET);
    wr.wr.rdma.remote_addr = c->craddr + (uint64_t)rh->cidx * sizeof(uint64_t);
    wr.wr.rdma.rkey = c->crkey;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    sge.length = sizeof(uint64_t);
    if (inl) {
        /* Copied into the WQE by ibv_post_send: nothing to keep. An
         * unsignalled WR holds its slot until a later signalled one
         * completes, so it obeys the sig_every rule like any other. */
        sge.addr = (uintptr_t)&rh->cval;
        wr.send_flags = IBV_SEND_INLINE;
        if (++c->since_sig >= s->sig_every)
            wr.send_flags |= IBV_SEND_SIGNALED;
    } else {
        /* The staging word stays as it is until the completion: the core
         * does not write this handle's credit again before credit_done. */
        uint64_t *st = &s->cstage[(size_t)c->peer * s->cw + rh->cidx];
        *st = rh->cval;
        sge.addr = (uintptr_t)st;
        sge.lkey = s->cstage_mr->lkey;
        wr.send_flags = IBV_SEND_SIGNALED;
    }
    c->ring[c->posted % s->sq_depth] =
        (struct vrb_wrrec){.h = h, .last = inl ? 0 : 1, .kind = VRB_WR_CREDIT};
    rc = ibv_post_send(c->qp, &wr, &bad);
    if (rc) {
        c->ring[c->posted % s->sq_depth].h = NULL;
        c->since_sig = since_sig; /* nothing was posted */
        return rc == ENOMEM ? DCHAN_ERR_AGAIN
                            : dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_send (credit)");
    }
    if (wr.send_flags & IBV_SEND_SIGNALED)
        c->since_sig = 0;
    c->posted++;
    return DCHAN_SUCCESS;
}

int dchan_verbs_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src)
{
    struct vrb_state *s = state_of(h);
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    struct vrb_conn *c = rh->c;
    bool inl = s->max_inline >= 8;
    int rc;

    if (!c)
        return DCHAN_ERR_STATE;
    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    if (index >= c->rcw)
        return DCHAN_ERR_HANDLE; /* the sender has fewer words (another DCHAN_CREDIT_WORDS) */
    /* The newest value replaces any not yet written: counts are cumulative. */
    rh->cval = *src;
    rh->cidx = index;
    rh->owed = !inl;
    cred_unqueue(c, h);
    if (c->state == VRB_UP) {
        rc = post_credit(s, c, h);
        if (rc == DCHAN_SUCCESS)
            return inl ? DCHAN_PROV_PUT_DONE : DCHAN_SUCCESS;
        if (rc != DCHAN_ERR_AGAIN) {
            rh->owed = false;
            return rc;
        }
    }
    /* Rebuilding, or no room: written from progress, in its turn. */
    cred_queue(s, c, h);
    return inl ? DCHAN_PROV_PUT_DONE : DCHAN_SUCCESS;
}

/* The connection is up: write the queued credit words. */
void dchan_verbs_credit_redo(struct vrb_state *s, struct vrb_conn *c)
{
    while (c->state == VRB_UP && c->cred_head) {
        dchan_handle_t *h = c->cred_head;
        struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
        int rc = post_credit(s, c, h);
        if (rc == DCHAN_ERR_AGAIN)
            break; /* retried from progress when slots retire */
        c->cred_head = rh->cnext;
        rh->cnext = NULL;
        rh->queued = false;
        if (rc != DCHAN_SUCCESS) {
            if (rh->owed) {
                rh->owed = false;
                dchan_core_credit_done(h, rc);
            } else {
                dchan_core_handle_error(h, rc);
            }
        }
    }
}

/* The peer is gone: credit writes to it never complete. */
void dchan_verbs_credit_dead(struct vrb_state *s, struct vrb_conn *c, int rc)
{
    for (uint64_t q = c->retired; q < c->posted; q++) {
        struct vrb_wrrec *r = &c->ring[q % s->sq_depth];
        dchan_handle_t *h = r->h;
        if (r->kind != VRB_WR_CREDIT || !h)
            continue;
        r->h = NULL;
        if (r->last && DCHAN_PROV_PRIV(h, struct vrb_rh)->owed) {
            DCHAN_PROV_PRIV(h, struct vrb_rh)->owed = false;
            dchan_core_credit_done(h, rc);
        }
    }
    while (c->cred_head) {
        dchan_handle_t *h = c->cred_head;
        struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
        c->cred_head = rh->cnext;
        rh->cnext = NULL;
        rh->queued = false;
        if (rh->owed) {
            rh->owed = false;
            dchan_core_credit_done(h, rc);
        }
    }
}

/* ---- completions ------------------------------------------------------------------------ */

static void redo_push(struct vrb_state *s, struct vrb_conn *c, dchan_handle_t *h)
{
    struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
    sh->state = VRB_PUT_REDO;
    sh->redo_next = NULL;
    if (c->redo_tail)
        DCHAN_PROV_PRIV(c->redo_tail, struct vrb_sh)->redo_next = h;
    else
        c->redo_head = h;
    c->redo_tail = h;
    dchan_verbs_att(s, c);
}

/* A credit WR of receive handle h retired: it landed (done), failed with
 * err, or was flushed (neither: written again once the QP is rebuilt). */
static void credit_cqe(struct vrb_state *s, struct vrb_conn *c, dchan_handle_t *h, bool report,
                       int err, bool done)
{
    struct vrb_rh *rh = DCHAN_PROV_PRIV(h, struct vrb_rh);
    if (done || c->state == VRB_DEAD) {
        int rc = err ? err : done ? DCHAN_SUCCESS : DCHAN_ERR_PEER;
        if (report && rh->owed) {
            rh->owed = false;
            dchan_core_credit_done(h, rc);
        } else if (rc != DCHAN_SUCCESS) {
            dchan_core_handle_error(h, rc);
        }
        return;
    }
    cred_queue(s, c, h);
}

/*
 * A data WR completed; it retires every WR posted before it on its QP
 * (RC completes them in order; unsignalled ones have no entry of their
 * own). A put completes with its last WR: successfully when that WR or a
 * later one succeeded, or completed in error after it; with its own error
 * when one of its WRs failed; and is re-issued later when it was flushed.
 */
static void data_cqe(struct vrb_state *s, const struct ibv_wc *wc)
{
    uint32_t idx = (uint32_t)(wc->wr_id >> VRB_WRID_SEQ_BITS);
    if (idx >= (uint32_t)s->nranks)
        return;
    struct vrb_conn *c = &s->conns[idx];
    /* The full sequence number, from its low bits and the oldest WR out. */
    uint64_t seq = c->retired + ((wc->wr_id - c->retired) & VRB_WRID_SEQ_MASK);
    bool ok = wc->status == IBV_WC_SUCCESS, flush = wc->status == IBV_WC_WR_FLUSH_ERR;
    int err = 0;

    if (seq >= c->posted)
        return; /* not ours (a reset removed its WR): never happens in order */
    if (!ok && !flush) {
        char what[64];
        snprintf(what, sizeof what, "put to rank %d", c->peer);
        err = dchan_verbs_rc(s, VRB_WC, wc->status, c->state == VRB_DEAD ? NULL : what);
    }
    for (uint64_t q = c->retired; q <= seq; q++) {
        struct vrb_wrrec *r = &c->ring[q % s->sq_depth];
        if (r->kind >= VRB_WR_GET) {
            /* WRs before seq retire as done (they preceded its success or
             * its error) or flushed (they followed an earlier error). */
            dchan_verbs_get_cqe(s, c, r, q == seq ? ok : ok || err, q == seq ? err : 0);
            r->h = NULL;
            r->kind = VRB_WR_PUT;
            continue;
        }
        dchan_handle_t *h = r->h;
        r->h = NULL;
        if (!h)
            continue;
        if (r->kind == VRB_WR_CREDIT) {
            credit_cqe(s, c, h, r->last != 0, q == seq ? err : 0, ok || err);
            continue;
        }
        struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
        if (q == seq && err && !sh->rc)
            sh->rc = err;
        if (!r->last)
            continue;
        if (ok || err || sh->rc)
            dchan_verbs_put_resolve(s, h, sh->rc);
        else if (c->state == VRB_DEAD)
            dchan_verbs_put_resolve(s, h, DCHAN_ERR_PEER);
        else
            redo_push(s, c, h); /* flushed: not its fault */
    }
    c->retired = seq + 1;
    if (ok)
        c->seen = true;
    else
        dchan_verbs_data_failed(s, c, err != 0);
}

static void ctl_cqe(struct vrb_state *s, const struct ibv_wc *wc)
{
    uint32_t idx = (uint32_t)((wc->wr_id & ~VRB_WRID_CTL) >> VRB_WRID_SEQ_BITS);
    if (idx >= (uint32_t)s->nranks)
        return;
    struct vrb_conn *c = &s->conns[idx];

    c->ctl_out--;
    if ((wc->wr_id & 3) == VRB_CTL_WR_PROBE)
        c->probing = false;
    if (wc->status == IBV_WC_SUCCESS) {
        c->seen = true;
        if (c->ctl_msg)
            dchan_verbs_ctl_flush(s, c);
    } else if (wc->status != IBV_WC_WR_FLUSH_ERR && c->state != VRB_DEAD) {
        char what[64];
        snprintf(what, sizeof what, "control message to rank %d", c->peer);
        dchan_verbs_conn_dead(s, c, dchan_verbs_rc(s, VRB_WC, wc->status, what));
    }
}

int dchan_verbs_poll_send(struct vrb_state *s)
{
    struct ibv_wc wc[VRB_POLL];
    int ne, total = 0;

    do {
        ne = ibv_poll_cq(s->scq, VRB_POLL, wc);
        if (ne < 0) {
            /* A CQ error (overrun, device failure): nothing on it is usable. */
            s->fatal = dchan_verbs_rc(s, VRB_ERRNO, ne == -1 ? EIO : -ne, "ibv_poll_cq (send)");
            return s->fatal;
        }
        for (int i = 0; i < ne; i++) {
            if (wc[i].wr_id & VRB_WRID_CTL)
                ctl_cqe(s, &wc[i]);
            else
                data_cqe(s, &wc[i]);
        }
        total += ne;
    } while (ne == VRB_POLL);
    return total;
}

void dchan_verbs_srq_fill(struct vrb_state *s, bool top_up)
{
    struct ibv_recv_wr wr[VRB_SRQ_BATCH], *bad;

    /* Receives carry no buffer: WRITE WITH IMMEDIATE consumes one only to
     * deliver its immediate. top_up posts until the SRQ is full, which
     * repairs the count after a reset removed completions. */
    while (top_up || s->srq_owed) {
        uint32_t k = top_up || s->srq_owed > VRB_SRQ_BATCH ? VRB_SRQ_BATCH : s->srq_owed;
        for (uint32_t i = 0; i < k; i++) {
            memset(&wr[i], 0, sizeof wr[i]);
            wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
        }
        bad = NULL;
        int rc = ibv_post_srq_recv(s->srq, wr, &bad);
        uint32_t done = rc ? (uint32_t)(bad ? bad - wr : 0) : k;
        s->srq_owed -= done < s->srq_owed ? done : s->srq_owed;
        if (rc) {
            if (!top_up || rc != ENOMEM)
                dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_srq_recv");
            break;
        }
    }
    if (top_up)
        s->srq_owed = 0;
}

int dchan_verbs_poll_recv(struct vrb_state *s)
{
    struct ibv_wc wc[VRB_POLL];
    int ne, n = 0;

    do {
        ne = ibv_poll_cq(s->rcq, VRB_POLL, wc);
        if (ne < 0) {
            s->fatal = dchan_verbs_rc(s, VRB_ERRNO, ne == -1 ? EIO : -ne,
                                      "ibv_poll_cq (receive)");
            return s->fatal;
        }
        for (int i = 0; i < ne; i++) {
            struct vrb_conn *c;
            bool ctl;

            s->srq_owed++; /* every receive completion used one SRQ entry */
            if (!dchan_verbs_qpn_lookup(s, wc[i].qp_num, &c, &ctl))
                continue;
            if (wc[i].status != IBV_WC_SUCCESS) {
                /* The QP went to ERR under an arrival; its sender learns
                 * of it and re-issues. */
                dchan_debug(s->p->ctx, VRB_NAME, "receive from rank %d: %s", c->peer,
                            ibv_wc_status_str(wc[i].status));
                continue;
            }
            c->seen = true;
            if (!(wc[i].wc_flags & IBV_WC_WITH_IMM))
                continue;
            uint32_t imm = ntohl(wc[i].imm_data);
            if (ctl) {
                dchan_verbs_ctl_recv(s, c, imm);
                continue;
            }
            if (imm == VRB_IMM_QUIET)
                continue; /* a wake-up only: what it ends is polled in memory */
            /* O(1) however many handles are armed: the id names the slot. */
            if (!dchan_core_arrival_id(s->p, imm, 0, c->peer, NULL, 0)) {
                dchan_debug(s->p->ctx, VRB_NAME, "arrival for stale handle id %#x from rank %d",
                            imm, c->peer);
                continue;
            }
            n++;
        }
    } while (ne == VRB_POLL);
    if (s->srq_owed >= VRB_SRQ_BATCH)
        dchan_verbs_srq_fill(s, false);
    return n;
}

/* ---- wake-up -------------------------------------------------------------------------------- */

int dchan_verbs_wake_fd(struct dchan_prov *p, int *fd)
{
    struct vrb_state *s = p->state;
    if (!s->wch) {
        dchan_err(p->ctx, VRB_NAME, "no completion channel: no wake-up descriptor");
        return DCHAN_ERR_UNSUPPORTED;
    }
    *fd = s->wch->fd;
    return DCHAN_SUCCESS;
}

/* The classic order: consume old events, request the next one on both
 * CQs, then poll once more, since a completion that came before the
 * request raises no event. */
int dchan_verbs_wake_arm(struct dchan_prov *p)
{
    struct vrb_state *s = p->state;
    struct ibv_cq *cq;
    void *cctx;
    while (ibv_get_cq_event(s->wch, &cq, &cctx) == 0)
        ibv_ack_cq_events(cq, 1);
    int err = ibv_req_notify_cq(s->rcq, 0);
    if (err == 0)
        err = ibv_req_notify_cq(s->scq, 0);
    if (err)
        return dchan_verbs_rc(s, VRB_ERRNO, err, "ibv_req_notify_cq");
    int n = dchan_verbs_progress(p);
    if (n != 0)
        return n < 0 ? n : DCHAN_ERR_AGAIN;
    /* Connections being re-established move on from progress only. */
    return s->att_head ? DCHAN_ERR_AGAIN : DCHAN_SUCCESS;
}

int dchan_verbs_progress(struct dchan_prov *p)
{
    struct vrb_state *s = p->state;
    int n = dchan_verbs_poll_recv(s), m = dchan_verbs_poll_send(s);

    if (s->att_head)
        dchan_verbs_advance(s);
    /* Async events and probes are rare: look every 256 calls, so that a
     * poll costs two empty CQ polls and nothing else. */
    if ((++s->tick & 255) == 0) {
        dchan_verbs_async(s);
        dchan_verbs_keepalive(s);
    }
    if (s->fatal)
        return s->fatal;
    return (n > 0 ? n : 0) + (m > 0 ? m : 0);
}
