/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * verbs provider: get (DESIGN §7, lib/get.c).
 *
 * A source registers its buffer for remote read and its taken word
 * (dchan_h_ctl()[1]) for remote write, each with an MR of its own, so that
 * destroying the source revokes both keys at once. Its published word
 * travels the other way: the source's rank owns VRB_GET_SLOTS words in the
 * getter rank's get area (verbs_init.c) and gives each source one of them;
 * at creation, at each dchan_ready and at destroy it RDMA-WRITEs
 * (serial << 32) | count into that word, on the data QP to the getter. The
 * serial (per pair of ranks, never 0) tells a slot's successive owners
 * apart, and count VRB_GET_GONE says the source was destroyed. The getter's
 * peek is a load of the word: its own serial gives the count; a word of an
 * older source (or none yet) means the first push is still on its way
 * (nothing new); VRB_GET_GONE or a newer serial means the source is gone.
 * Writes of one QP land in order, so a slot never goes back to an older
 * value. A push that cannot be posted (rebuilding, full send queue) is
 * kept per slot, newest value only, and written from progress.
 *
 * The getter pulls the buffer with RDMA READ, split at max_msg and posted
 * in batches that leave room in the send queue; the QPs serve as many
 * READs at once as both devices allow (verbs_conn.c). When the last READ
 * completes, the core calls get_ack, which writes the taken word into the
 * source's control word with one 8-byte RDMA WRITE: posted after the READ
 * completed, so the source's buffer is never reused under the READ. READs
 * flushed by a rebuild are read again from the start; a READ that fails on
 * its own (the source's key revoked: destroyed) ends the get with
 * DCHAN_ERR_PEER; a dead peer fails everything with DCHAN_ERR_PEER.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "verbs.h"
#include "wire.h"

/* Remote-access fields of a source's wire (DCHAN_WIRE_PROV_BYTES, little-endian). */
enum {
    G_ADDR = 0,    /* 8: the source buffer */
    G_RKEY = 8,    /* 4: its rkey (remote read) */
    G_QPN = 12,    /* 4: the source's data QP serving the getter */
    G_CTL = 16,    /* 8: the taken word */
    G_CKEY = 24,   /* 4: its rkey (remote write) */
    G_SLOT = 28,   /* 4: the slot of the getter's get area the source pushes into */
    G_SERIAL = 32, /* 4: the source's serial */
    G_END = 36     /* the rest is zero */
};

static struct vrb_state *state_of(const dchan_handle_t *h)
{
    return dchan_h_prov(h)->state;
}

static bool bit(const uint64_t *m, uint32_t i)
{
    return m[i / 64] >> (i % 64) & 1;
}

static void set_bit(uint64_t *m, uint32_t i, bool v)
{
    if (v)
        m[i / 64] |= 1ull << (i % 64);
    else
        m[i / 64] &= ~(1ull << (i % 64));
}

/* Posts the n WRs of wr on c's data QP, recording each as kind for h (the
 * last one with 'last'); the last one signalled, the others as the
 * sig_every rule says. DCHAN_ERR_AGAIN: no room, nothing posted. */
static int post(struct vrb_state *s, struct vrb_conn *c, struct ibv_send_wr *wr, uint32_t n,
                dchan_handle_t *h, uint32_t kind, uint32_t last, bool sig_last)
{
    struct ibv_send_wr *bad = NULL;
    uint32_t since_sig = c->since_sig;

    if (c->posted - c->retired + n > s->sq_usable)
        return DCHAN_ERR_AGAIN;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t q = c->posted + i;
        if ((i == n - 1 && sig_last) || ++c->since_sig >= s->sig_every) {
            wr[i].send_flags |= IBV_SEND_SIGNALED;
            c->since_sig = 0;
        }
        wr[i].wr_id = (uint64_t)c->idx << VRB_WRID_SEQ_BITS | (q & VRB_WRID_SEQ_MASK);
        wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
        c->ring[q % s->sq_depth] =
            (struct vrb_wrrec){.h = h, .last = i == n - 1 ? last : 0, .kind = kind};
    }
    int rc = ibv_post_send(c->qp, wr, &bad);
    if (rc == 0) {
        c->posted += n;
        return DCHAN_SUCCESS;
    }
    uint32_t k = bad && bad >= wr && bad < wr + n ? (uint32_t)(bad - wr) : 0;
    for (uint32_t i = k; i < n; i++)
        c->ring[(c->posted + i) % s->sq_depth].h = NULL;
    if (k == 0) {
        c->since_sig = since_sig; /* nothing was posted */
        return rc == ENOMEM ? DCHAN_ERR_AGAIN
                            : dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_send (get)");
    }
    /* Part went out (READ batches only): its completions retire it; the
     * QP is stopped so that they come, and the rest is read again. */
    c->ring[(c->posted + k - 1) % s->sq_depth].last = 0;
    c->posted += k;
    c->since_sig = 1;
    dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_send (part of a get)");
    dchan_verbs_data_failed(s, c, true);
    return (int)k; /* > 0: k WRs posted */
}

/* ---- source: pushing the published word ------------------------------------------------- */

/* Writes the pending slots of c; false when one must wait for room. */
static bool push_pending(struct vrb_state *s, struct vrb_conn *c)
{
    for (uint32_t w = 0; w < VRB_GET_SLOTS / 64; w++) {
        while (c->gpend[w]) {
            uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(c->gpend[w]);
            struct ibv_send_wr wr;
            struct ibv_sge sge;
            bool inl = s->max_inline >= 8;

            if (c->state != VRB_UP)
                return false;
            memset(&wr, 0, sizeof wr);
            /* With an immediate: a getter asleep on its completion channel wakes. */
            wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(VRB_IMM_QUIET);
            wr.wr.rdma.remote_addr = c->garaddr + (uint64_t)slot * sizeof(uint64_t);
            wr.wr.rdma.rkey = c->grkey;
            sge.addr = (uintptr_t)&c->gval[slot];
            sge.length = sizeof(uint64_t);
            sge.lkey = s->gstage_mr->lkey;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            /* Inline: copied now. Otherwise sent from gval, which holds the
             * slot's newest value, the only one that matters. */
            if (inl)
                wr.send_flags = IBV_SEND_INLINE;
            int rc = post(s, c, &wr, 1, NULL, VRB_WR_PUSH, slot, !inl);
            if (rc == DCHAN_ERR_AGAIN) {
                dchan_verbs_seal(s, c, s->sq_usable);
                dchan_verbs_att(s, c);
                return false;
            }
            set_bit(c->gpend, slot, false);
            if (rc < 0) /* the connection is broken: written again once rebuilt */
                set_bit(c->gpend, slot, true);
            if (rc != DCHAN_SUCCESS)
                return false;
        }
    }
    return true;
}

static int push(struct vrb_state *s, struct vrb_conn *c, uint32_t slot, uint64_t v)
{
    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    c->gval[slot] = v;
    set_bit(c->gpend, slot, true);
    if (c->state != VRB_UP || c->redo_head || !push_pending(s, c))
        dchan_verbs_att(s, c);
    return DCHAN_SUCCESS;
}

static uint64_t pushed_word(const dchan_handle_t *h, const struct vrb_src *sr)
{
    uint32_t count = (uint32_t)__atomic_load_n(&dchan_h_ctl(h)[0], __ATOMIC_ACQUIRE);
    return (uint64_t)sr->serial << 32 | count;
}

static int vrb_src_open(dchan_handle_t *h, unsigned char *wf)
{
    struct vrb_state *s = state_of(h);
    struct vrb_src *sr = DCHAN_PROV_PRIV(h, struct vrb_src);
    struct vrb_conn *c = &s->conns[dchan_h_peer(h)];
    uint64_t *ctl = dchan_h_ctl(h);
    uint32_t slot = VRB_GET_SLOTS;

    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    if (!s->rd_resp) {
        dchan_info(s->p->ctx, VRB_NAME, "%s serves no RDMA READ: no get", s->devname);
        return DCHAN_ERR_UNSUPPORTED;
    }
    /* Round robin: a slot a source just left is taken last. */
    for (uint32_t k = 0; k < VRB_GET_SLOTS; k++) {
        uint32_t i = (c->gnext + k) % VRB_GET_SLOTS;
        if (!bit(c->gused, i)) {
            slot = i;
            break;
        }
    }
    if (slot == VRB_GET_SLOTS) {
        dchan_warn(s->p->ctx, VRB_NAME, "more than %u live sources for rank %d", VRB_GET_SLOTS,
                   c->peer);
        return DCHAN_ERR_NO_MEMORY;
    }
    /* Readable buffer (no local write asked: it may be read-only memory),
     * writable taken word; nothing else. */
    sr->mr = ibv_reg_mr(s->pd, dchan_h_buf(h), dchan_h_size(h), IBV_ACCESS_REMOTE_READ);
    if (!sr->mr)
        return dchan_verbs_rc(s, VRB_ERRNO, errno ? errno : ENOMEM, "ibv_reg_mr (get source)");
    sr->cmr = ibv_reg_mr(s->pd, &ctl[1], sizeof(uint64_t),
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!sr->cmr) {
        int rc = dchan_verbs_rc(s, VRB_ERRNO, errno ? errno : ENOMEM, "ibv_reg_mr (taken word)");
        ibv_dereg_mr(sr->mr);
        sr->mr = NULL;
        return rc;
    }
    if (++c->gserial == 0)
        c->gserial = 1;
    sr->serial = c->gserial;
    sr->slot = slot;
    sr->c = c;
    set_bit(c->gused, slot, true);
    c->gnext = (slot + 1) % VRB_GET_SLOTS;
    c->nget++;
    dchan_put_le64(wf + G_ADDR, (uintptr_t)dchan_h_buf(h));
    dchan_put_le32(wf + G_RKEY, sr->mr->rkey);
    dchan_put_le32(wf + G_QPN, c->qp->qp_num);
    dchan_put_le64(wf + G_CTL, (uintptr_t)&ctl[1]);
    dchan_put_le32(wf + G_CKEY, sr->cmr->rkey);
    dchan_put_le32(wf + G_SLOT, slot);
    dchan_put_le32(wf + G_SERIAL, sr->serial);
    /* Published at creation: version 1 goes to the getter's slot now. */
    return push(s, c, slot, pushed_word(h, sr));
}

static int vrb_src_publish(dchan_handle_t *h)
{
    struct vrb_src *sr = DCHAN_PROV_PRIV(h, struct vrb_src);
    return push(state_of(h), sr->c, sr->slot, pushed_word(h, sr));
}

static void vrb_src_close(dchan_handle_t *h)
{
    struct vrb_state *s = state_of(h);
    struct vrb_src *sr = DCHAN_PROV_PRIV(h, struct vrb_src);
    struct vrb_conn *c = sr->c;
    if (!c)
        return;
    /* Gone, in the getter's slot (after every earlier push); the slot is
     * free again at once, since a later owner's serial says gone too. */
    push(s, c, sr->slot, (uint64_t)sr->serial << 32 | VRB_GET_GONE);
    set_bit(c->gused, sr->slot, false);
    /* Revoked: a READ or taken word still coming fails at the getter. */
    ibv_dereg_mr(sr->cmr);
    ibv_dereg_mr(sr->mr);
    sr->mr = sr->cmr = NULL;
    c->nget--;
    sr->c = NULL;
}

/* ---- getter --------------------------------------------------------------------------------- */

static void gh_queue(struct vrb_state *s, dchan_handle_t *h)
{
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    if (!gh->queued) {
        gh->queued = true;
        gh->next = gh->c->get_head;
        gh->c->get_head = h;
    }
    dchan_verbs_att(s, gh->c);
}

static void gh_unqueue(dchan_handle_t *h)
{
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    if (!gh->queued)
        return;
    for (dchan_handle_t **pp = &gh->c->get_head; *pp;
         pp = &DCHAN_PROV_PRIV(*pp, struct vrb_gh)->next)
        if (*pp == h) {
            *pp = gh->next;
            break;
        }
    gh->next = NULL;
    gh->queued = false;
}

static int vrb_get_open(dchan_handle_t *h, const unsigned char *wf)
{
    struct vrb_state *s = state_of(h);
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    struct vrb_conn *c = &s->conns[dchan_h_peer(h)];
    uint64_t size = dchan_h_size(h);

    for (int i = G_END; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wf[i])
            return DCHAN_ERR_HANDLE;
    gh->raddr = dchan_get_le64(wf + G_ADDR);
    gh->rkey = dchan_get_le32(wf + G_RKEY);
    gh->caddr = dchan_get_le64(wf + G_CTL);
    gh->ckey = dchan_get_le32(wf + G_CKEY);
    gh->slot = dchan_get_le32(wf + G_SLOT);
    gh->serial = dchan_get_le32(wf + G_SERIAL);
    /* The QP named must be the one the source keeps for this rank. */
    if (gh->raddr == 0 || gh->raddr + size < gh->raddr || gh->caddr == 0 || gh->caddr % 8 ||
        gh->slot >= VRB_GET_SLOTS || gh->serial == 0 || dchan_get_le32(wf + G_QPN) != c->rqpn)
        return DCHAN_ERR_HANDLE;
    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    if (!c->rd_atom) {
        dchan_info(s->p->ctx, VRB_NAME, "no RDMA READ towards rank %d: no get", c->peer);
        return DCHAN_ERR_UNSUPPORTED;
    }
    /* Written by READ responses only: local write, no remote access. */
    gh->mr = ibv_reg_mr(s->pd, dchan_h_buf(h), size, IBV_ACCESS_LOCAL_WRITE);
    if (!gh->mr)
        return dchan_verbs_rc(s, VRB_ERRNO, errno ? errno : ENOMEM, "ibv_reg_mr (get buffer)");
    if (s->max_inline < 8) {
        void *w = NULL;
        if (posix_memalign(&w, 64, 64) != 0) {
            ibv_dereg_mr(gh->mr);
            return DCHAN_ERR_NO_MEMORY;
        }
        gh->ackw = w;
        gh->ackmr = ibv_reg_mr(s->pd, w, sizeof(uint64_t), 0);
        if (!gh->ackmr) {
            int rc = dchan_verbs_rc(s, VRB_ERRNO, errno ? errno : ENOMEM, "ibv_reg_mr (taken word)");
            free(w);
            gh->ackw = NULL;
            ibv_dereg_mr(gh->mr);
            gh->mr = NULL;
            return rc;
        }
    }
    gh->ack = (uint64_t)dchan_h_gen(h) << 32; /* nothing taken yet */
    gh->c = c;
    c->nget++;
    return DCHAN_SUCCESS;
}

static void vrb_get_close(dchan_handle_t *h)
{
    struct vrb_state *s = state_of(h);
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    struct vrb_conn *c = gh->c;
    if (!c)
        return;
    gh_unqueue(h);
    /* WRs still out complete for nobody. */
    uint64_t last = 0;
    bool acks = false;
    for (uint64_t q = c->retired; q < c->posted; q++) {
        struct vrb_wrrec *r = &c->ring[q % s->sq_depth];
        if ((r->kind == VRB_WR_GET || r->kind == VRB_WR_GACK) && r->h == h) {
            if (r->kind == VRB_WR_GACK) {
                last = q;
                acks = true;
            }
            r->h = NULL;
        }
    }
    /* Destroy completes what is outstanding (DESIGN §3): the taken word
     * lands before this returns, so a getter that leaves right after
     * (exits, finalizes) never leaves its source waiting for it. */
    uint64_t until = dchan_verbs_now() + s->pv->DRAIN_TIMEOUT_MS * 1000000ull;
    for (unsigned spins = 0; acks && c->retired <= last && c->state == VRB_UP && !s->fatal;
         spins++) {
        dchan_verbs_seal(s, c, s->sq_usable); /* unsignalled at the tail */
        dchan_verbs_poll_send(s);
        if (dchan_verbs_now() > until)
            break;
        if (spins > 64)
            sched_yield();
    }
    /* Deregistered: a READ still under way can no longer write into the buffer. */
    ibv_dereg_mr(gh->mr);
    if (gh->ackmr)
        ibv_dereg_mr(gh->ackmr);
    free(gh->ackw);
    gh->mr = gh->ackmr = NULL;
    gh->ackw = NULL;
    c->nget--;
    gh->c = NULL;
}

static int vrb_get_peek(dchan_handle_t *h, uint64_t *v)
{
    struct vrb_state *s = state_of(h);
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    if (!gh->c || gh->c->state == VRB_DEAD) {
        *v = 0; /* gone: the core reports DCHAN_ERR_PEER */
        return DCHAN_SUCCESS;
    }
    uint64_t w = __atomic_load_n(&s->garea[(size_t)dchan_h_peer(h) * VRB_GET_SLOTS + gh->slot],
                                 __ATOMIC_ACQUIRE);
    uint32_t serial = (uint32_t)(w >> 32), count = (uint32_t)w;
    if (serial == gh->serial) {
        gh->seen = true;
        *v = count == VRB_GET_GONE ? 0 : (uint64_t)dchan_h_gen(h) << 32 | count;
    } else if (gh->seen || (serial && (int32_t)(serial - gh->serial) > 0)) {
        *v = 0; /* a later source's word: this one is gone */
    } else {
        *v = gh->ack; /* the first push is on its way: nothing new yet */
    }
    return DCHAN_SUCCESS;
}

/* Posts the next batch of READs of h; DCHAN_ERR_AGAIN: no room now. */
static int read_more(struct vrb_state *s, dchan_handle_t *h)
{
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    struct vrb_conn *c = gh->c;
    size_t size = dchan_h_size(h);
    uint64_t room = s->sq_usable - (c->posted - c->retired);
    /* Half the queue at most, so that puts keep room beside a long read. */
    uint64_t cap = s->sq_usable / 2 ? s->sq_usable / 2 : 1;
    uint32_t n = 0;

    if (c->state != VRB_UP || c->redo_head)
        return DCHAN_ERR_AGAIN;
    if (room > cap)
        room = cap;
    if (room > s->wr_cap)
        room = s->wr_cap;
    for (size_t pos = gh->rpos; pos < size && n < room; n++) {
        uint64_t k = size - pos < s->max_msg ? size - pos : s->max_msg;
        struct ibv_sge *sge = &s->sge[(size_t)n * s->max_sge];
        struct ibv_send_wr *wr = &s->wr[n];
        memset(wr, 0, sizeof *wr);
        sge->addr = (uintptr_t)dchan_h_buf(h) + pos;
        sge->length = (uint32_t)k;
        sge->lkey = gh->mr->lkey;
        wr->opcode = IBV_WR_RDMA_READ;
        wr->sg_list = sge;
        wr->num_sge = 1;
        wr->wr.rdma.remote_addr = gh->raddr + pos;
        wr->wr.rdma.rkey = gh->rkey;
        pos += k;
    }
    if (n == 0)
        return DCHAN_ERR_AGAIN;
    size_t before = gh->rpos, end = before;
    for (uint32_t i = 0; i < n; i++)
        end += s->wr[i].sg_list->length;
    /* The WR that ends the buffer is the last: its completion ends the get. */
    int rc = post(s, c, s->wr, n, h, VRB_WR_GET, end == size, true);
    if (rc == DCHAN_ERR_AGAIN)
        return rc;
    if (rc < 0)
        return rc;
    uint32_t k = rc == DCHAN_SUCCESS ? n : (uint32_t)rc;
    gh->out += k;
    gh->reading = true;
    if (k == n) {
        gh->rpos = end;
    } else {
        gh->flushed = true; /* the QP stopped under a part: read again */
    }
    return DCHAN_SUCCESS;
}

static int vrb_get(dchan_handle_t *h)
{
    struct vrb_state *s = state_of(h);
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    struct vrb_conn *c = gh->c;

    if (c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    gh->rc = 0;
    gh->rpos = 0;
    gh->out = 0;
    gh->flushed = false;
    gh->want_read = false;
    int rc = read_more(s, h);
    if (rc == DCHAN_ERR_AGAIN) {
        /* Rebuilding, or no room: posted from progress. */
        gh->want_read = true;
        gh->reading = true;
        gh_queue(s, h);
        return DCHAN_SUCCESS;
    }
    if (rc == DCHAN_SUCCESS && gh->rpos < dchan_h_size(h)) {
        gh->want_read = true; /* the rest when the send queue has room */
        gh_queue(s, h);
    }
    return rc;
}

static int post_ack(struct vrb_state *s, dchan_handle_t *h)
{
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    struct vrb_conn *c = gh->c;
    struct ibv_send_wr wr;
    struct ibv_sge sge;

    if (c->state != VRB_UP || c->redo_head)
        return DCHAN_ERR_AGAIN;
    memset(&wr, 0, sizeof wr);
    /* With an immediate: a source asleep until its version is taken wakes. */
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data = htonl(VRB_IMM_QUIET);
    wr.wr.rdma.remote_addr = gh->caddr;
    wr.wr.rdma.rkey = gh->ckey;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    sge.length = sizeof(uint64_t);
    if (gh->ackw) {
        *gh->ackw = gh->ack;
        sge.addr = (uintptr_t)gh->ackw;
        sge.lkey = gh->ackmr->lkey;
    } else {
        sge.addr = (uintptr_t)&gh->ack;
        wr.send_flags = IBV_SEND_INLINE;
    }
    int rc = post(s, c, &wr, 1, h, VRB_WR_GACK, 0, gh->ackw != NULL);
    if (rc == DCHAN_ERR_AGAIN)
        dchan_verbs_seal(s, c, s->sq_usable);
    return rc;
}

static int vrb_get_ack(dchan_handle_t *h, uint64_t v)
{
    struct vrb_state *s = state_of(h);
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    if (!gh->c || gh->c->state == VRB_DEAD)
        return DCHAN_ERR_PEER;
    gh->ack = v;
    int rc = post_ack(s, h);
    if (rc == DCHAN_ERR_AGAIN) {
        gh->want_ack = true;
        gh_queue(s, h);
        return DCHAN_SUCCESS;
    }
    return rc;
}

/* ---- completions and recovery -------------------------------------------------------------- */

/* The READs of h are all retired: end the get, or read again. */
static void read_settled(struct vrb_state *s, struct vrb_conn *c, dchan_handle_t *h)
{
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    if (gh->out)
        return;
    if (gh->rc) {
        gh->reading = false;
        dchan_core_get_done(h, gh->rc);
    } else if (gh->flushed) {
        /* Not its fault: from the start once the connection is back. */
        gh->flushed = false;
        gh->rpos = 0;
        gh->want_read = true;
        gh_queue(s, h);
    } else if (gh->rpos == dchan_h_size(h)) {
        gh->reading = false;
        dchan_core_get_done(h, DCHAN_SUCCESS);
    } else {
        gh->want_read = true; /* the next batch */
        gh_queue(s, h);
    }
    (void)c;
}

void dchan_verbs_get_cqe(struct vrb_state *s, struct vrb_conn *c, struct vrb_wrrec *r, bool ok,
                         int err)
{
    dchan_handle_t *h = r->h;
    bool flushed = !ok && !err;

    if (r->kind == VRB_WR_PUSH) {
        /* Flushed: written again (the newest value) once rebuilt. */
        if (flushed && c->state != VRB_DEAD) {
            set_bit(c->gpend, r->last, true);
            dchan_verbs_att(s, c);
        }
        return;
    }
    if (!h)
        return; /* its getter was closed */
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    /* A key the source revoked (destroyed) or a peer that is unreachable:
     * the source is gone for this getter. */
    int rc = err == DCHAN_ERR_HANDLE ? DCHAN_ERR_PEER : err;
    if (r->kind == VRB_WR_GACK) {
        if (rc)
            dchan_core_handle_error(h, rc);
        else if (flushed && c->state != VRB_DEAD) {
            gh->want_ack = true;
            gh_queue(s, h);
        }
        return;
    }
    /* VRB_WR_GET */
    if (gh->out)
        gh->out--;
    if (rc && !gh->rc)
        gh->rc = rc;
    if (flushed)
        gh->flushed = true;
    if (c->state == VRB_DEAD && !gh->rc && !ok)
        gh->rc = DCHAN_ERR_PEER;
    read_settled(s, c, h);
}

bool dchan_verbs_get_pending(const struct vrb_conn *c)
{
    if (c->get_head)
        return true;
    for (uint32_t w = 0; w < VRB_GET_SLOTS / 64; w++)
        if (c->gpend[w])
            return true;
    return false;
}

void dchan_verbs_get_redo(struct vrb_state *s, struct vrb_conn *c)
{
    if (!push_pending(s, c))
        return;
    dchan_handle_t *list = c->get_head;
    c->get_head = NULL;
    while (list) {
        dchan_handle_t *h = list;
        struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
        list = gh->next;
        gh->next = NULL;
        gh->queued = false;
        int rc = DCHAN_SUCCESS;
        if (gh->want_ack) {
            rc = post_ack(s, h);
            if (rc == DCHAN_SUCCESS)
                gh->want_ack = false;
            else if (rc != DCHAN_ERR_AGAIN) {
                gh->want_ack = false;
                dchan_core_handle_error(h, rc);
            }
        }
        if (gh->want_read && !gh->out && rc != DCHAN_ERR_AGAIN) {
            rc = read_more(s, h);
            if (rc == DCHAN_SUCCESS)
                gh->want_read = gh->rpos < dchan_h_size(h);
            else if (rc != DCHAN_ERR_AGAIN) {
                gh->want_read = false;
                gh->reading = false;
                dchan_core_get_done(h, rc);
            }
        }
        /* A READ batch still out posts the next one when it retires. */
        if (gh->want_ack || (gh->want_read && !gh->out))
            gh_queue(s, h);
    }
}

/* A getter's READ ends with rc, once, whether it was out or waiting. */
static void read_fail(dchan_handle_t *h, int rc)
{
    struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
    gh->out = 0;
    gh->want_read = false;
    if (gh->reading) {
        gh->reading = false;
        dchan_core_get_done(h, rc);
    }
}

void dchan_verbs_get_dead(struct vrb_state *s, struct vrb_conn *c, int rc)
{
    memset(c->gpend, 0, sizeof c->gpend);
    /* WRs out complete flushed later and report to nobody. */
    for (uint64_t q = c->retired; q < c->posted; q++) {
        struct vrb_wrrec *r = &c->ring[q % s->sq_depth];
        if (r->kind == VRB_WR_GET && r->h)
            read_fail(r->h, rc);
        if (r->kind >= VRB_WR_GET) {
            r->h = NULL;
            r->kind = VRB_WR_PUT;
        }
    }
    while (c->get_head) {
        dchan_handle_t *h = c->get_head;
        struct vrb_gh *gh = DCHAN_PROV_PRIV(h, struct vrb_gh);
        c->get_head = gh->next;
        gh->next = NULL;
        gh->queued = false;
        gh->want_ack = false;
        read_fail(h, rc);
    }
}

const struct dchan_get_ops dchan_verbs_get_ops = {
    .src_open = vrb_src_open,
    .src_close = vrb_src_close,
    .src_publish = vrb_src_publish,
    .get_open = vrb_get_open,
    .get_close = vrb_get_close,
    .get_peek = vrb_get_peek,
    .get = vrb_get,
    .get_ack = vrb_get_ack,
};
