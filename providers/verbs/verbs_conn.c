/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * verbs provider: queue pair state changes, recovery of a failed data QP,
 * peer death, async events and liveness probes.
 *
 * Recovery protocol. An error completion moves an RC QP to ERR and flushes
 * everything behind it; a remote access error moves the responder's QP to
 * ERR too. Neither side can fix the connection alone, and the data QP can
 * carry nothing while in ERR, so the two sides talk over the control QP,
 * which only ever carries 0-byte writes (no memory key a put could break):
 *
 *  1. A side that sees an error completion of its own ("initiator") or a
 *     fatal QP event moves its data QP to ERR (if the device did not) and
 *     waits until every WR it posted there has completed (DRAIN).
 *  2. It then resets the QP and brings it back to RTS at epoch e+1 with the
 *     same QPNs and PSNs derived from (epoch, QPN), and sends RESYNC(e+1)
 *     (WAIT). A passive side (its WRs were only flushed, or its QP was the
 *     responder of the peer's bad request) does not rebuild on its own: it
 *     drains and waits for the RESYNC, so that its reset comes after the
 *     initiator's, when nothing of the old epoch is in flight towards it.
 *  3. A side receiving RESYNC(n) for a newer epoch moves its data QP to ERR,
 *     drains, rebuilds at n and answers READY(n); both are then UP. Two
 *     initiators at once meet at the same epoch: each answers the other's
 *     RESYNC with READY.
 *  4. Puts flushed but not at fault are re-issued, in their order, once UP;
 *     the put whose WR failed gets the error on its handle. Credit words
 *     whose write was flushed are written again (the newest value).
 * A control message that cannot be delivered (transport retries exhausted)
 * means the peer is gone: every handle to and from it gets DCHAN_ERR_PEER.
 * A passive side that hears nothing for VRB_PASSIVE_NS starts the recovery
 * itself.
 *
 * What is guaranteed: the put whose WR failed with an error of its own gets
 * it on its handle (error_fn, then every later call). Every other put of
 * that QP that had not completed is re-issued once, whole and in posting
 * order, before any new put to that peer; its handle sees nothing. A put
 * completed before the failure is not sent again. A flushed SENTINEL or
 * FLAG put never landed its tail or word (they go last), and a flushed
 * EVENT put never delivered its immediate, so a re-issue cannot make an
 * arrival appear twice; the exception is hardware losing the ACK of a
 * message the responder completed just before the QP failed, where the
 * receiver may see that put again (reported as DCHAN_ERR_OVERRUN for
 * EVENT; the same bytes rewritten for FLAG and SENTINEL). New puts to a peer
 * being rebuilt return DCHAN_ERR_AGAIN, so the core keeps progressing.
 */
#include "config.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "verbs.h"

/* The PSN of a QP's first packet in an epoch: both ends compute it from
 * what both know, and each epoch starts elsewhere in the 24-bit PSN space,
 * so that packets of the broken incarnation still in the fabric are
 * refused as out of sequence. */
static uint32_t psn_of(uint32_t epoch, uint32_t qpn)
{
    uint32_t x = epoch * 0x9e3779b9u ^ (qpn + 0x7f4a7c15u) * 0x85ebca6bu;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    return x & 0xffffff;
}

static int modify(struct vrb_state *s, struct ibv_qp *qp, struct ibv_qp_attr *a, int mask,
                  const char *what)
{
    int rc = ibv_modify_qp(qp, a, mask);
    return rc ? dchan_verbs_rc(s, VRB_ERRNO, rc, what) : DCHAN_SUCCESS;
}

/* RESET -> INIT -> RTR -> RTS towards the peer's QP rqpn. */
int dchan_verbs_qp_connect(struct vrb_state *s, struct vrb_conn *c, struct ibv_qp *qp,
                           uint32_t rqpn, uint32_t epoch)
{
    struct ibv_qp_attr a;
    int rc;

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RESET;
    rc = modify(s, qp, &a, IBV_QP_STATE, "ibv_modify_qp (RESET)");
    if (rc != DCHAN_SUCCESS)
        return rc;

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = s->port_num;
    /* Remote writes, and reads for get; each MR limits them further (only
     * sources' buffers and control words are readable). */
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    rc = modify(s, qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
                "ibv_modify_qp (INIT)");
    if (rc != DCHAN_SUCCESS)
        return rc;

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTR;
    a.ah_attr = c->ah;
    a.path_mtu = c->mtu;
    a.dest_qp_num = rqpn;
    a.rq_psn = psn_of(epoch, rqpn);
    /* READs served at once: what the device offers (the peer's initiator
     * depth keeps to what this rank published). */
    a.max_dest_rd_atomic = s->rd_resp ? s->rd_resp : 1;
    a.min_rnr_timer = s->min_rnr;
    rc = modify(s, qp, &a,
                IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                "ibv_modify_qp (RTR)");
    if (rc != DCHAN_SUCCESS)
        return rc;

    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = psn_of(epoch, qp->qp_num);
    a.timeout = s->timeout;
    a.retry_cnt = s->retry_cnt;
    a.rnr_retry = 7; /* forever: an empty SRQ is refilled, never fatal */
    a.max_rd_atomic = c->rd_atom ? c->rd_atom : 1;
    return modify(s, qp, &a,
                  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                      IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
                  "ibv_modify_qp (RTS)");
}

/* Whether RDMA WRITEs into this QP land in address order (the call
 * describes the receiving side), so that SENTINEL puts to this rank can be
 * single writes; receive handles say so in their wire. Only where rdma-core
 * can tell, and never for relaxed-ordering memory, which is never used. */
static bool query_in_order(struct vrb_state *s, struct vrb_conn *c)
{
#ifdef HAVE_IBV_QUERY_QP_DATA_IN_ORDER
    return s->trust_in_order && ibv_query_qp_data_in_order(c->qp, IBV_WR_RDMA_WRITE, 0) == 1;
#else
    (void)s;
    (void)c;
    return false;
#endif
}

int dchan_verbs_conn_start(struct vrb_state *s, struct vrb_conn *c)
{
    int rc = dchan_verbs_qp_connect(s, c, c->qp, c->rqpn, 0);
    if (rc == DCHAN_SUCCESS)
        rc = dchan_verbs_qp_connect(s, c, c->ctl, c->rctl, 0);
    if (rc != DCHAN_SUCCESS)
        return rc;
    c->state = VRB_UP;
    c->epoch = 0;
    c->in_order = query_in_order(s, c);
    return DCHAN_SUCCESS;
}

void dchan_verbs_att(struct vrb_state *s, struct vrb_conn *c)
{
    if (c->on_att)
        return;
    c->on_att = true;
    c->att_next = s->att_head;
    s->att_head = c;
}

/* ---- peer death ------------------------------------------------------------------- */

void dchan_verbs_conn_dead(struct vrb_state *s, struct vrb_conn *c, int rc)
{
    struct ibv_qp_attr a;

    if (c->state == VRB_DEAD)
        return;
    dchan_warn(s->p->ctx, VRB_NAME, "rank %d is unreachable (%s): its channels are closed",
               c->peer, dchan_strerror(rc));
    c->state = VRB_DEAD;
    c->ctl_msg = 0;
    /* Stop both QPs; their outstanding WRs complete flushed and find
     * nothing to report. */
    memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(c->qp, &a, IBV_QP_STATE);
    ibv_modify_qp(c->ctl, &a, IBV_QP_STATE);
    dchan_core_peer_error(s->p, c->peer, rc);
    /* Get WRs first, then puts; credit WRs are dchan_verbs_credit_dead's. */
    dchan_verbs_get_dead(s, c, rc);
    for (uint64_t q = c->retired; q < c->posted; q++) {
        struct vrb_wrrec *r = &c->ring[q % s->sq_depth];
        dchan_handle_t *h = r->h;
        if (r->kind != VRB_WR_PUT)
            continue;
        r->h = NULL;
        if (h && r->last)
            dchan_verbs_put_resolve(s, h, rc);
    }
    while (c->redo_head) {
        dchan_handle_t *h = c->redo_head;
        c->redo_head = DCHAN_PROV_PRIV(h, struct vrb_sh)->redo_next;
        dchan_verbs_put_resolve(s, h, rc);
    }
    c->redo_tail = NULL;
    dchan_verbs_credit_dead(s, c, rc);
}

/* ---- control messages ---------------------------------------------------------------- */

void dchan_verbs_ctl_flush(struct vrb_state *s, struct vrb_conn *c)
{
    struct ibv_send_wr wr, *bad;
    int rc;

    if (!c->ctl_msg || c->state == VRB_DEAD)
        return;
    if (c->ctl_out >= VRB_CTL_DEPTH) {
        dchan_verbs_att(s, c); /* retried from progress when a slot frees */
        return;
    }
    memset(&wr, 0, sizeof wr);
    wr.wr_id = VRB_WRID_CTL | (uint64_t)c->idx << VRB_WRID_SEQ_BITS | VRB_CTL_WR_MSG;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM; /* 0 bytes: no key is checked */
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(c->ctl_msg);
    rc = ibv_post_send(c->ctl, &wr, &bad);
    if (rc == ENOMEM) {
        dchan_verbs_att(s, c);
        return;
    }
    if (rc) {
        dchan_verbs_conn_dead(s, c, dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_post_send (control)"));
        return;
    }
    c->ctl_out++;
    c->ctl_msg = 0;
}

/* Only the newest message matters: a READY or RESYNC not yet sent is
 * superseded by the next one. */
static void ctl_send(struct vrb_state *s, struct vrb_conn *c, uint32_t type, uint32_t epoch)
{
    c->ctl_msg = type << 24 | (epoch & 0xffffff);
    dchan_verbs_ctl_flush(s, c);
}

static void conn_up(struct vrb_state *s, struct vrb_conn *c)
{
    unsigned n = 0;
    for (dchan_handle_t *h = c->redo_head; h; h = DCHAN_PROV_PRIV(h, struct vrb_sh)->redo_next)
        n++;
    c->state = VRB_UP;
    if (c->redo_head || c->cred_head || dchan_verbs_get_pending(c))
        dchan_verbs_att(s, c);
    dchan_info(s->p->ctx, VRB_NAME,
               "connection to rank %d rebuilt at epoch %u; re-issuing %u flushed put(s)",
               c->peer, c->epoch, n);
}

/* Stops the data QP so that every WR on it completes, and waits for that. */
static void enter_drain(struct vrb_state *s, struct vrb_conn *c, uint32_t target, bool initiator,
                        bool peer_ready)
{
    if (c->state != VRB_DRAIN) {
        struct ibv_qp_attr a;
        memset(&a, 0, sizeof a);
        a.qp_state = IBV_QPS_ERR;
        int rc = ibv_modify_qp(c->qp, &a, IBV_QP_STATE);
        if (rc) {
            dchan_verbs_conn_dead(s, c, dchan_verbs_rc(s, VRB_ERRNO, rc, "ibv_modify_qp (ERR)"));
            return;
        }
        dchan_info(s->p->ctx, VRB_NAME, "connection to rank %d failed at epoch %u: rebuilding",
                   c->peer, c->epoch);
        c->state = VRB_DRAIN;
        c->drain_ns = dchan_verbs_now();
        c->target = target;
        c->initiator = initiator;
        c->peer_ready = peer_ready;
        /* Unsignalled WRs at the tail (credit writes) must complete too:
         * a signalled WR behind them, flushed, covers them. */
        if (c->since_sig && !dchan_verbs_seal(s, c, s->sq_depth)) {
            dchan_verbs_conn_dead(s, c, DCHAN_ERR_PROVIDER);
            return;
        }
    } else {
        if ((int32_t)(target - c->target) > 0)
            c->target = target;
        c->initiator |= initiator;
        c->peer_ready |= peer_ready;
    }
    dchan_verbs_att(s, c);
}

void dchan_verbs_data_failed(struct vrb_state *s, struct vrb_conn *c, bool own_error)
{
    switch (c->state) {
    case VRB_UP:
    case VRB_WAIT:
        enter_drain(s, c, c->epoch + 1, own_error, false);
        break;
    case VRB_DRAIN:
        c->initiator |= own_error;
        break;
    default:
        break;
    }
}

void dchan_verbs_ctl_recv(struct vrb_state *s, struct vrb_conn *c, uint32_t imm)
{
    uint32_t type = imm >> 24, d = ((imm & 0xffffff) - (c->epoch & 0xffffff)) & 0xffffff;
    /* The 24-bit epoch, widened around the current one. */
    uint32_t ep = c->epoch + (d < 0x800000 ? d : d - 0x1000000);
    int32_t ahead = (int32_t)(ep - c->epoch);

    switch (c->state) {
    case VRB_UP:
        if (type == VRB_MSG_RESYNC && ahead > 0)
            enter_drain(s, c, ep, false, true);
        else if (type == VRB_MSG_RESYNC && ahead == 0)
            ctl_send(s, c, VRB_MSG_READY, ep); /* we met there already */
        break;
    case VRB_DRAIN:
        if (type == VRB_MSG_RESYNC && (int32_t)(ep - c->target) >= 0) {
            c->target = ep;
            c->peer_ready = true;
            dchan_verbs_att(s, c);
        }
        break;
    case VRB_WAIT:
        if (type == VRB_MSG_RESYNC && ahead > 0) {
            enter_drain(s, c, ep, false, true);
        } else if (ahead == 0) {
            /* The peer is in RTS at our epoch: a RESYNC of its own (both
             * started) wants our READY; a READY answers ours. */
            if (type == VRB_MSG_RESYNC)
                ctl_send(s, c, VRB_MSG_READY, ep);
            conn_up(s, c);
        }
        break;
    default:
        break;
    }
}

/* DRAIN is over: reset, reconnect at the target epoch, tell the peer. */
static void rebuild(struct vrb_state *s, struct vrb_conn *c)
{
    /* A reset removes the QP's completions from the receive CQ: take the
     * arrivals that are there first. */
    dchan_verbs_poll_recv(s);
    if (c->state != VRB_DRAIN)
        return;
    uint32_t ep = c->target;
    int rc = dchan_verbs_qp_connect(s, c, c->qp, c->rqpn, ep);
    if (rc != DCHAN_SUCCESS) {
        dchan_verbs_conn_dead(s, c, rc);
        return;
    }
    c->epoch = ep;
    c->since_sig = 0;
    c->in_order = query_in_order(s, c);
    /* Receive completions the reset removed had consumed SRQ entries. */
    dchan_verbs_srq_fill(s, true);
    if (c->peer_ready) {
        ctl_send(s, c, VRB_MSG_READY, ep);
        conn_up(s, c);
    } else {
        ctl_send(s, c, VRB_MSG_RESYNC, ep);
        c->state = VRB_WAIT;
    }
}

static void redo(struct vrb_state *s, struct vrb_conn *c)
{
    while (c->state == VRB_UP && c->redo_head) {
        dchan_handle_t *h = c->redo_head;
        struct vrb_sh *sh = DCHAN_PROV_PRIV(h, struct vrb_sh);
        c->redo_head = sh->redo_next;
        if (!c->redo_head)
            c->redo_tail = NULL;
        sh->redo_next = NULL;
        sh->state = VRB_PUT_IDLE;
        int rc = dchan_verbs_post_put(s, h);
        if (rc == DCHAN_ERR_AGAIN && c->state != VRB_DEAD) {
            /* No room yet: back at the head, in its place. */
            sh->state = VRB_PUT_REDO;
            sh->redo_next = c->redo_head;
            c->redo_head = h;
            if (!c->redo_tail)
                c->redo_tail = h;
            break;
        }
        if (rc != DCHAN_SUCCESS)
            dchan_verbs_put_resolve(s, h, rc);
    }
}

/* One connection that needs attention; false when it no longer does. */
static bool step(struct vrb_state *s, struct vrb_conn *c)
{
    if (c->state == VRB_DRAIN) {
        if (c->posted != c->retired)
            return true;
        if (!c->initiator && !c->peer_ready) {
            if (dchan_verbs_now() - c->drain_ns < VRB_PASSIVE_NS)
                return true;
            c->initiator = true; /* the peer never started: do it here */
        }
        rebuild(s, c);
    }
    if (c->state == VRB_UP && c->redo_head)
        redo(s, c);
    if (c->state == VRB_UP && c->cred_head)
        dchan_verbs_credit_redo(s, c);
    if (c->state == VRB_UP && dchan_verbs_get_pending(c))
        dchan_verbs_get_redo(s, c);
    if (c->ctl_msg)
        dchan_verbs_ctl_flush(s, c);
    if (c->state == VRB_DEAD)
        return false;
    return c->state == VRB_DRAIN || c->ctl_msg ||
           (c->state == VRB_UP && (c->redo_head || c->cred_head || dchan_verbs_get_pending(c)));
}

void dchan_verbs_advance(struct vrb_state *s)
{
    struct vrb_conn *list = s->att_head;
    s->att_head = NULL;
    while (list) {
        struct vrb_conn *c = list;
        list = c->att_next;
        c->on_att = false;
        if (step(s, c))
            dchan_verbs_att(s, c);
    }
}

/* ---- async events ------------------------------------------------------------------------ */

static bool qp_in_error(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    /* Unknown counts as broken: acting on a healthy QP costs a rebuild,
     * ignoring a broken one a hang. */
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0)
        return true;
    return a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_SQE;
}

void dchan_verbs_async(struct vrb_state *s)
{
    struct ibv_async_event ev;

    while (ibv_get_async_event(s->ctx, &ev) == 0) {
        struct vrb_conn *c;
        bool ctl;

        switch (ev.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
            if (!dchan_verbs_qpn_lookup(s, ev.element.qp->qp_num, &c, &ctl))
                break;
            /* Events are read late (every 256 progress calls): one raised
             * before a rebuild that already happened is stale. */
            if (!qp_in_error(ev.element.qp))
                break;
            dchan_info(s->p->ctx, VRB_NAME, "%s on the %s QP to rank %d",
                       ibv_event_type_str(ev.event_type), ctl ? "control" : "data", c->peer);
            if (ctl)
                dchan_verbs_conn_dead(s, c, DCHAN_ERR_PROVIDER);
            else
                /* A request or access error here is the peer's WR, which
                 * failed there too: the peer starts the recovery. */
                dchan_verbs_data_failed(s, c, ev.event_type == IBV_EVENT_QP_FATAL);
            break;
        case IBV_EVENT_CQ_ERR:
        case IBV_EVENT_SRQ_ERR:
        case IBV_EVENT_DEVICE_FATAL:
            dchan_err(s->p->ctx, VRB_NAME, "%s on %s: every channel is closed",
                      ibv_event_type_str(ev.event_type), s->devname);
            s->fatal = DCHAN_ERR_PROVIDER;
            for (int r = 0; r < s->nranks; r++)
                dchan_verbs_conn_dead(s, &s->conns[r], DCHAN_ERR_PROVIDER);
            break;
        case IBV_EVENT_PORT_ERR:
            dchan_warn(s->p->ctx, VRB_NAME, "port %u of %s went down", s->port_num,
                       s->devname);
            break;
        case IBV_EVENT_PORT_ACTIVE:
            dchan_info(s->p->ctx, VRB_NAME, "port %u of %s is active", s->port_num,
                       s->devname);
            break;
        default:
            break;
        }
        ibv_ack_async_event(&ev);
    }
}

/* ---- liveness probes ---------------------------------------------------------------------- */

/* A rank that only receives from a peer (or only waits for its credit)
 * would never notice its death: a 0-byte RDMA WRITE on the control QP costs
 * the peer's CPU nothing and fails with a transport error when the peer is
 * gone. A few connections per call, round robin, so that the cost does not
 * grow with the job. */
void dchan_verbs_keepalive(struct vrb_state *s)
{
    if (!s->keepalive_ns)
        return;
    uint64_t now = dchan_verbs_now();
    for (int k = 0; k < 4 && k < s->nranks; k++) {
        struct vrb_conn *c = &s->conns[s->ka_cursor++ % (uint32_t)s->nranks];
        struct ibv_send_wr wr, *bad;

        if (c->seen) {
            /* Completions and messages from it since the last look. */
            c->seen = false;
            c->alive_ns = now;
            continue;
        }
        if (!(c->nrecv || c->ncredit || c->nget) || c->state != VRB_UP || c->probing || c->ctl_out >= VRB_CTL_DEPTH ||
            now - c->alive_ns < s->keepalive_ns)
            continue;
        memset(&wr, 0, sizeof wr);
        wr.wr_id = VRB_WRID_CTL | (uint64_t)c->idx << VRB_WRID_SEQ_BITS | VRB_CTL_WR_PROBE;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        if (ibv_post_send(c->ctl, &wr, &bad) == 0) {
            c->ctl_out++;
            c->probing = true;
            c->alive_ns = now;
        }
    }
}
