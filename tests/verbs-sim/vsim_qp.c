/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RC queue pairs and shared receive queues: creation, the state machine,
 * posting receives and sends, queries and destruction.
 *
 * Posting only queues work: the send queue is process-local and executed
 * by the context's executor thread (vsim_exec.c), as an HCA would. Receive
 * queues are shared so that the remote requester can consume them.
 */
#define _GNU_SOURCE
#include "vsim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Not in the rdma-core 44 header; the values of later releases. */
#define VSIM_IN_ORDER_RETURN_CAPS 1u
#define VSIM_IN_ORDER_WHOLE_MSG 1
#define VSIM_IN_ORDER_ALIGNED_128 2

static void qp_list_add(struct vsim_context *c, struct vsim_qp *qp)
{
	pthread_mutex_lock(&c->lock);
	pthread_mutex_lock(&vsim_proc_lock);
	qp->next = c->qps;
	c->qps = qp;
	pthread_mutex_unlock(&vsim_proc_lock);
	pthread_mutex_unlock(&c->lock);
}

/* Caller holds c->lock. */
static void qp_list_del(struct vsim_context *c, struct vsim_qp *qp)
{
	struct vsim_qp **pp;

	pthread_mutex_lock(&vsim_proc_lock);
	for (pp = &c->qps; *pp; pp = &(*pp)->next)
		if (*pp == qp) {
			*pp = qp->next;
			break;
		}
	pthread_mutex_unlock(&vsim_proc_lock);
}

/* ---- create ------------------------------------------------------------- */

VSIM_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *ibpd, struct ibv_qp_init_attr *a)
{
	struct vsim_context *c = to_vctx(ibpd->context);
	struct ibv_qp_cap *cap = &a->cap;
	struct vsim_qp *qp;
	uint32_t rq_cap;
	size_t len;
	int rc = 0, tries;

	if (a->qp_type != IBV_QPT_RC) {
		/* UC, UD, XRC and raw packet QPs are not emulated. */
		vsim_dbg("create_qp: QP type %d not emulated (RC only)", a->qp_type);
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!a->send_cq || !a->recv_cq || a->send_cq->context != ibpd->context ||
	    a->recv_cq->context != ibpd->context ||
	    (a->srq && a->srq->context != ibpd->context) ||
	    cap->max_send_wr > VSIM_MAX_QP_WR || cap->max_send_sge > vsim_cfg.max_sge ||
	    cap->max_inline_data > VSIM_MAX_INLINE ||
	    (!a->srq && (cap->max_recv_wr > VSIM_MAX_QP_WR || cap->max_recv_sge > vsim_cfg.max_sge))) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->sq_cap = cap->max_send_wr;
	qp->sq = calloc(qp->sq_cap ? qp->sq_cap : 1, sizeof(*qp->sq));
	if (!qp->sq) {
		rc = ENOMEM;
		goto free_qp;
	}
	rq_cap = a->srq ? 0 : cap->max_recv_wr;
	len = sizeof(struct vsim_qp_shm) + (size_t)rq_cap * sizeof(struct vsim_rwqe);
	for (tries = 0; tries < 64; tries++) {
		rc = vsim_obj_create(VSIM_OBJ_QP, vsim_alloc_qpn(), len, &qp->map);
		if (rc != EEXIST)
			break;
	}
	if (rc)
		goto free_sq;

	qp->shm = qp->map.addr;
	qp->shm->h.owner.ctx_slot = c->slot;
	qp->shm->h.owner.ctx_gen = c->gen;
	qp->shm->dev_kind = c->dev->kind;
	qp->shm->node = vsim_cfg.node;
	atomic_store(&qp->shm->state, IBV_QPS_RESET);
	qp->shm->pd_id = to_vpd(ibpd)->id;
	qp->shm->srq_id = a->srq ? to_vsrq(a->srq)->map.id : 0;
	qp->shm->recv_cq_id = to_vcq(a->recv_cq)->map.id;
	qp->shm->rq_cap = rq_cap;
	qp->shm->rq_max_sge = a->srq ? 0 : cap->max_recv_sge;
	vsim_obj_publish(&qp->map);

	qp->ctx = c;
	qp->pd = to_vpd(ibpd);
	qp->scq = to_vcq(a->send_cq);
	qp->rcq = to_vcq(a->recv_cq);
	qp->srq = a->srq ? to_vsrq(a->srq) : NULL;
	qp->sq_sig_all = a->sq_sig_all;
	pthread_mutex_init(&qp->sq_lock, NULL);
	/* Exactly what was asked for is granted; real HCAs may round up,
	 * so callers must use the values written back here. */
	if (a->srq) {
		cap->max_recv_wr = 0;
		cap->max_recv_sge = 0;
	}
	qp->cap = *cap;

	qp->ibqp.context = ibpd->context;
	qp->ibqp.qp_context = a->qp_context;
	qp->ibqp.pd = ibpd;
	qp->ibqp.send_cq = a->send_cq;
	qp->ibqp.recv_cq = a->recv_cq;
	qp->ibqp.srq = a->srq;
	qp->ibqp.handle = qp->map.id;
	qp->ibqp.qp_num = qp->map.id;
	qp->ibqp.state = IBV_QPS_RESET;
	qp->ibqp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&qp->ibqp.mutex, NULL);
	pthread_cond_init(&qp->ibqp.cond, NULL);

	atomic_fetch_add(&qp->pd->refs, 1);
	atomic_fetch_add(&qp->scq->refs, 1);
	atomic_fetch_add(&qp->rcq->refs, 1);
	if (qp->srq)
		atomic_fetch_add(&qp->srq->refs, 1);
	qp_list_add(c, qp);
	vsim_dbg("created QP %u on %s", qp->ibqp.qp_num, c->dev->ibdev.name);
	return &qp->ibqp;

free_sq:
	free(qp->sq);
free_qp:
	free(qp);
	errno = rc;
	return NULL;
}

/* ---- error, flush, reset ------------------------------------------------ */

/*
 * Moves a QP's shared half to ERR and flushes its receive queue into its
 * receive CQ (NULL: the QP uses an SRQ, which is not flushed). On the first
 * entry into ERR it raises the async events and wakes the owner's executor,
 * which flushes the send queue. Caller holds s->h.lock.
 */
void vsim_qp_shm_enter_error(struct vsim_qp_shm *s, struct vsim_cq_shm *rcq, int async_type)
{
	uint32_t old = atomic_exchange(&s->state, IBV_QPS_ERR);

	if (rcq) {
		while (s->rq_count) {
			struct vsim_rwqe *r = &s->rq[s->rq_head];
			struct vsim_cqe e;

			memset(&e, 0, sizeof(e));
			e.wc.wr_id = r->wr_id;
			e.wc.status = IBV_WC_WR_FLUSH_ERR;
			e.wc.opcode = IBV_WC_RECV;
			e.wc.qp_num = s->h.id;
			vsim_cq_push(rcq, &e);
			s->rq_head = (s->rq_head + 1) % s->rq_cap;
			s->rq_count--;
		}
	}
	if (old != IBV_QPS_ERR) {
		if (async_type >= 0)
			vsim_async_post(s->h.owner.ctx_slot, s->h.owner.ctx_gen, async_type,
					s->h.id);
		/* With an SRQ, the owner learns its QP will take no more
		 * receives from this event (IB spec "last WQE reached"). */
		if (s->srq_id)
			vsim_async_post(s->h.owner.ctx_slot, s->h.owner.ctx_gen,
					IBV_EVENT_QP_LAST_WQE_REACHED, s->h.id);
		vsim_ring(s->h.owner.ctx_slot, s->h.owner.ctx_gen);
	}
}

/* Completes every queued send WR with a flush error. Caller holds ctx->lock. */
void vsim_flush_sq_locked(struct vsim_qp *qp)
{
	uint32_t t;

	pthread_mutex_lock(&qp->sq_lock);
	t = qp->tail;
	pthread_mutex_unlock(&qp->sq_lock);
	while (qp->exec != t) {
		vsim_send_cqe(qp, &qp->sq[qp->exec % qp->sq_cap], IBV_WC_WR_FLUSH_ERR, 0, 1);
		pthread_mutex_lock(&qp->sq_lock);
		qp->exec++;
		pthread_mutex_unlock(&qp->sq_lock);
	}
	qp->next_try_ns = qp->first_try_ns = 0;
	qp->retries = qp->rnr_retries = 0;
}

/* Forgets queued work without completions (reset, destroy); acknowledged
 * delayed placements still land first. Caller holds ctx->lock. */
void vsim_qp_drop_work(struct vsim_qp *qp)
{
	pthread_mutex_lock(&qp->sq_lock);
	qp->tail = qp->exec = 0;
	atomic_store(&qp->outstanding, 0);
	qp->unsignaled = 0;
	pthread_mutex_unlock(&qp->sq_lock);
	qp->next_try_ns = qp->first_try_ns = 0;
	qp->retries = qp->rnr_retries = 0;
	vsim_fifo_land_all(qp);
	vsim_map_release(&qp->peer);
	vsim_map_release(&qp->peer_rcq);
	vsim_map_release(&qp->peer_srq);
	vsim_cq_clean(qp->scq->shm, qp->ibqp.qp_num);
	vsim_cq_clean(qp->rcq->shm, qp->ibqp.qp_num);
}

/* ---- modify ------------------------------------------------------------- */

/*
 * The RC rows of the IB QP state table: which attributes a transition
 * requires and which it allows. Transitions through SQD/SQE are not
 * emulated.
 */
static int rc_transition(enum ibv_qp_state cur, enum ibv_qp_state next, int *req, int *opt)
{
	*req = *opt = 0;
	if (next == IBV_QPS_RESET)
		return 0;
	if (next == IBV_QPS_ERR)
		return cur == IBV_QPS_RESET ? -1 : 0;
	switch (cur) {
	case IBV_QPS_RESET:
		if (next != IBV_QPS_INIT)
			return -1;
		*req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		return 0;
	case IBV_QPS_INIT:
		if (next == IBV_QPS_INIT) {
			*opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
			return 0;
		}
		if (next != IBV_QPS_RTR)
			return -1;
		*req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		*opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
		return 0;
	case IBV_QPS_RTR:
		if (next != IBV_QPS_RTS)
			return -1;
		*req = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		       IBV_QP_MAX_QP_RD_ATOMIC;
		*opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
		       IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE;
		return 0;
	case IBV_QPS_RTS:
		if (next != IBV_QPS_RTS)
			return -1;
		*opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
		       IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER;
		return 0;
	case IBV_QPS_ERR:
		return -1;  /* ERR leaves only through RESET */
	default:
		return -1;
	}
}

static int check_av(struct vsim_qp *qp, const struct ibv_ah_attr *ah)
{
	enum vsim_devkind kind = qp->ctx->dev->kind;
	union ibv_gid g;

	if (ah->port_num != 1)
		return EINVAL;
	if (kind == VSIM_DEV_ROCE) {
		/* RoCE has no LIDs: every packet carries a GRH. */
		if (!ah->is_global)
			return EINVAL;
	} else if (ah->dlid == 0 || ah->dlid >= 0xc000) {
		return EINVAL;  /* unicast LIDs only */
	}
	if (ah->is_global &&
	    vsim_port_gid(kind, vsim_cfg.node, ah->grh.sgid_index, &g))
		return EINVAL;
	return 0;
}

VSIM_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
	struct vsim_qp *qp = to_vqp(ibqp);
	struct vsim_qp_shm *s = qp->shm;
	struct vsim_context *c = qp->ctx;
	enum ibv_qp_state cur, next;
	const int known = IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS |
			  IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_ALT_PATH |
			  IBV_QP_MIN_RNR_TIMER | IBV_QP_SQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_PATH_MIG_STATE | IBV_QP_DEST_QPN;
	const unsigned qp_access_ok = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				      IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	int req, opt, rc = 0;

	pthread_mutex_lock(&c->lock);  /* the executor is between passes */
	cur = (enum ibv_qp_state)atomic_load(&s->state);
	next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if ((mask & ~known) || rc_transition(cur, next, &req, &opt) ||
	    (mask & req) != req || (mask & ~(req | opt | IBV_QP_STATE))) {
		rc = EINVAL;
		goto out;
	}
	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) {
		rc = EINVAL;
		goto out;
	}
	/* Check every value before changing anything. */
	if (((mask & IBV_QP_ACCESS_FLAGS) && (attr->qp_access_flags & ~qp_access_ok)) ||
	    ((mask & IBV_QP_PORT) && attr->port_num != 1) ||
	    ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) ||
	    ((mask & IBV_QP_PATH_MTU) &&
	     (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096)) ||
	    ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > VSIM_MAX_RD_ATOM) ||
	    ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > VSIM_MAX_RD_ATOM) ||
	    ((mask & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31) ||
	    ((mask & IBV_QP_TIMEOUT) && attr->timeout > 31) ||
	    ((mask & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7) ||
	    ((mask & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7) ||
	    ((mask & IBV_QP_DEST_QPN) && attr->dest_qp_num > 0xffffff) ||
	    ((mask & IBV_QP_RQ_PSN) && attr->rq_psn > 0xffffff) ||
	    ((mask & IBV_QP_SQ_PSN) && attr->sq_psn > 0xffffff)) {
		rc = EINVAL;
		goto out;
	}
	if (mask & IBV_QP_AV) {
		rc = check_av(qp, &attr->ah_attr);
		if (rc)
			goto out;
	}
	if (mask & IBV_QP_ALT_PATH)
		vsim_dbg("modify_qp: alternate path ignored (no path migration)");

	if (next == IBV_QPS_RESET) {
		vsim_qp_drop_work(qp);
		vsim_lock(&s->h.lock);
		s->rq_head = s->rq_count = 0;
		s->epoch++;
		s->dest_qpn = 0;
		s->rq_psn = 0;
		s->access = 0;
		atomic_store(&s->state, IBV_QPS_RESET);
		vsim_unlock(&s->h.lock);
		__atomic_store_n(&qp->sq_psn, 0, __ATOMIC_RELAXED);
		memset(&qp->ah, 0, sizeof(qp->ah));
		goto done;
	}
	if (next == IBV_QPS_ERR) {
		vsim_lock(&s->h.lock);
		vsim_qp_shm_enter_error(s, s->srq_id ? NULL : qp->rcq->shm, -1);
		vsim_unlock(&s->h.lock);
		vsim_flush_sq_locked(qp);
		goto done;
	}

	vsim_lock(&s->h.lock);
	if (mask & IBV_QP_ACCESS_FLAGS)
		s->access = attr->qp_access_flags;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		s->min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_PATH_MTU)
		s->path_mtu = attr->path_mtu;
	if (mask & IBV_QP_RQ_PSN)
		s->rq_psn = attr->rq_psn;
	if (mask & IBV_QP_DEST_QPN)
		s->dest_qpn = attr->dest_qp_num;
	if (mask & IBV_QP_AV) {
		s->dlid = attr->ah_attr.dlid;
		s->is_global = attr->ah_attr.is_global;
		s->dgid = attr->ah_attr.grh.dgid;
		qp->ah = attr->ah_attr;
	}
	atomic_store(&s->state, next);
	vsim_unlock(&s->h.lock);

	if (mask & IBV_QP_PORT)
		qp->port_num = attr->port_num;
	if (mask & IBV_QP_PKEY_INDEX)
		qp->pkey_index = attr->pkey_index;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		qp->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		qp->max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_SQ_PSN)
		__atomic_store_n(&qp->sq_psn, attr->sq_psn, __ATOMIC_RELAXED);
	if (mask & IBV_QP_RETRY_CNT)
		qp->retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		qp->rnr_retry = attr->rnr_retry;
	if (mask & IBV_QP_TIMEOUT) {
		qp->timeout = attr->timeout;
		if (attr->timeout == 0)
			vsim_log("QP %u: timeout 0 disables the transport timer; a dead peer "
				 "hangs its requester forever, as on hardware", ibqp->qp_num);
	}
	if (mask & IBV_QP_DEST_QPN) {
		/* Reconnected: forget the old peer's mappings. */
		vsim_map_release(&qp->peer);
		vsim_map_release(&qp->peer_rcq);
		vsim_map_release(&qp->peer_srq);
	}
done:
	if (mask & IBV_QP_STATE)
		ibqp->state = next;
out:
	pthread_mutex_unlock(&c->lock);
	if (!rc && next == IBV_QPS_RTS)
		vsim_exec_kick(c);
	return rc;
}

/* ---- query -------------------------------------------------------------- */

VSIM_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask,
			     struct ibv_qp_init_attr *init)
{
	struct vsim_qp *qp = to_vqp(ibqp);
	struct vsim_qp_shm *s = qp->shm;

	(void)mask;  /* like most providers, everything is returned */
	memset(attr, 0, sizeof(*attr));
	vsim_lock(&s->h.lock);
	attr->qp_state = (enum ibv_qp_state)atomic_load(&s->state);
	attr->path_mtu = (enum ibv_mtu)s->path_mtu;
	attr->rq_psn = s->rq_psn;
	attr->dest_qp_num = s->dest_qpn;
	attr->qp_access_flags = s->access;
	attr->min_rnr_timer = (uint8_t)s->min_rnr_timer;
	vsim_unlock(&s->h.lock);
	attr->cur_qp_state = attr->qp_state;
	attr->path_mig_state = IBV_MIG_MIGRATED;
	attr->sq_psn = __atomic_load_n(&qp->sq_psn, __ATOMIC_RELAXED);
	attr->cap = qp->cap;
	attr->ah_attr = qp->ah;
	attr->pkey_index = qp->pkey_index;
	attr->max_rd_atomic = qp->max_rd_atomic;
	attr->max_dest_rd_atomic = qp->max_dest_rd_atomic;
	attr->port_num = qp->port_num;
	attr->timeout = qp->timeout;
	attr->retry_cnt = qp->retry_cnt;
	attr->rnr_retry = qp->rnr_retry;
	ibqp->state = attr->qp_state;
	if (init) {
		memset(init, 0, sizeof(*init));
		init->qp_context = ibqp->qp_context;
		init->send_cq = ibqp->send_cq;
		init->recv_cq = ibqp->recv_cq;
		init->srq = ibqp->srq;
		init->cap = qp->cap;
		init->qp_type = IBV_QPT_RC;
		init->sq_sig_all = qp->sq_sig_all;
	}
	return 0;
}

/*
 * Whole-message order holds only in the inorder placement; every other
 * placement (reverse, torn, and delayed, which promises nothing about a
 * late message) answers "not in order", so callers take the safe path.
 */
VSIM_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *ibqp, enum ibv_wr_opcode op,
					   uint32_t flags)
{
	struct vsim_context *c = to_vctx(ibqp->context);

	if (flags & ~VSIM_IN_ORDER_RETURN_CAPS)
		return 0;
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_RDMA_READ:
		break;
	default:
		return 0;
	}
	if (c->placement != VSIM_PLACE_INORDER)
		return 0;
	return (flags & VSIM_IN_ORDER_RETURN_CAPS) ?
	       (VSIM_IN_ORDER_WHOLE_MSG | VSIM_IN_ORDER_ALIGNED_128) : 1;
}

/* ---- destroy ------------------------------------------------------------ */

static void qp_free(struct vsim_qp *qp)
{
	struct vsim_qp_shm *s = qp->shm;

	vsim_lock(&s->h.lock);
	atomic_store(&s->h.destroyed, 1);
	atomic_store(&s->state, IBV_QPS_RESET);
	vsim_unlock(&s->h.lock);
	vsim_qp_drop_work(qp);
	vsim_obj_unlink(VSIM_OBJ_QP, qp->map.id);
	vsim_map_release(&qp->map);
	atomic_fetch_sub(&qp->pd->refs, 1);
	atomic_fetch_sub(&qp->scq->refs, 1);
	atomic_fetch_sub(&qp->rcq->refs, 1);
	if (qp->srq)
		atomic_fetch_sub(&qp->srq->refs, 1);
	pthread_mutex_destroy(&qp->sq_lock);
	pthread_cond_destroy(&qp->ibqp.cond);
	pthread_mutex_destroy(&qp->ibqp.mutex);
	free(qp->sq);
	free(qp);
}

VSIM_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
	struct vsim_qp *qp = to_vqp(ibqp);
	struct vsim_context *c = qp->ctx;

	/* Every async event handed out for the QP must be acked first. */
	pthread_mutex_lock(&ibqp->mutex);
	while (ibqp->events_completed != qp->async_delivered)
		pthread_cond_wait(&ibqp->cond, &ibqp->mutex);
	pthread_mutex_unlock(&ibqp->mutex);

	pthread_mutex_lock(&c->lock);
	qp_list_del(c, qp);
	qp_free(qp);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* ---- receive queues ----------------------------------------------------- */

static void flush_recv(struct vsim_cq_shm *rcq, uint32_t qpn, uint64_t wr_id)
{
	struct vsim_cqe e;

	memset(&e, 0, sizeof(e));
	e.wc.wr_id = wr_id;
	e.wc.status = IBV_WC_WR_FLUSH_ERR;
	e.wc.opcode = IBV_WC_RECV;
	e.wc.qp_num = qpn;
	vsim_cq_push(rcq, &e);
}

int vsim_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct vsim_qp *qp = to_vqp(ibqp);
	struct vsim_qp_shm *s = qp->shm;
	int rc = 0;

	vsim_lock(&s->h.lock);
	if (s->srq_id || atomic_load(&s->state) == IBV_QPS_RESET) {
		rc = EINVAL;
		*bad = wr;
		goto out;
	}
	for (; wr; wr = wr->next) {
		struct vsim_rwqe *r;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->rq_max_sge) {
			rc = EINVAL;
			break;
		}
		/* In ERR the HCA completes new receives with a flush error. */
		if (atomic_load(&s->state) == IBV_QPS_ERR) {
			flush_recv(qp->rcq->shm, ibqp->qp_num, wr->wr_id);
			continue;
		}
		if (s->rq_count == s->rq_cap) {
			rc = ENOMEM;
			break;
		}
		r = &s->rq[(s->rq_head + s->rq_count) % s->rq_cap];
		r->wr_id = wr->wr_id;
		r->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge)
			memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(r->sge[0]));
		s->rq_count++;
	}
	if (rc)
		*bad = wr;
out:
	vsim_unlock(&s->h.lock);
	return rc;
}

/*
 * Takes the next receive WQE for a message arriving at QP 's' (its own RQ
 * or its SRQ). Caller holds s->h.lock. Returns -1 when none is posted.
 */
int vsim_rq_pop(struct vsim_qp_shm *s, struct vsim_srq_shm *srq, struct vsim_rwqe *out)
{
	if (!s->srq_id) {
		if (!s->rq_count)
			return -1;
		*out = s->rq[s->rq_head];
		s->rq_head = (s->rq_head + 1) % s->rq_cap;
		s->rq_count--;
		return 0;
	}
	if (!srq)
		return -1;
	vsim_lock(&srq->h.lock);
	if (atomic_load(&srq->h.destroyed) || !srq->count) {
		vsim_unlock(&srq->h.lock);
		return -1;
	}
	*out = srq->ring[srq->head];
	srq->head = (srq->head + 1) % srq->cap;
	srq->count--;
	if (srq->limit && srq->count < srq->limit) {
		/* The limit event fires once per arming. */
		srq->limit = 0;
		vsim_async_post(srq->h.owner.ctx_slot, srq->h.owner.ctx_gen,
				IBV_EVENT_SRQ_LIMIT_REACHED, srq->h.id);
	}
	vsim_unlock(&srq->h.lock);
	return 0;
}

VSIM_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *ibpd, struct ibv_srq_init_attr *a)
{
	struct vsim_context *c = to_vctx(ibpd->context);
	struct vsim_srq *q;
	size_t len;
	int rc = 0, tries;

	if (a->attr.max_wr < 1 || a->attr.max_wr > VSIM_MAX_QP_WR ||
	    a->attr.max_sge > vsim_cfg.max_sge) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	len = sizeof(struct vsim_srq_shm) + (size_t)a->attr.max_wr * sizeof(struct vsim_rwqe);
	for (tries = 0; tries < 16; tries++) {
		rc = vsim_obj_create(VSIM_OBJ_SRQ, vsim_alloc_obj_id(), len, &q->map);
		if (rc != EEXIST)
			break;
	}
	if (rc) {
		free(q);
		errno = rc;
		return NULL;
	}
	q->shm = q->map.addr;
	q->shm->h.owner.ctx_slot = c->slot;
	q->shm->h.owner.ctx_gen = c->gen;
	q->shm->pd_id = to_vpd(ibpd)->id;
	q->shm->cap = a->attr.max_wr;
	q->shm->max_sge = a->attr.max_sge;
	vsim_obj_publish(&q->map);
	q->max_wr = a->attr.max_wr;
	/* The limit is armed only by ibv_modify_srq. */
	a->attr.srq_limit = 0;

	q->ibsrq.context = ibpd->context;
	q->ibsrq.srq_context = a->srq_context;
	q->ibsrq.pd = ibpd;
	q->ibsrq.handle = q->map.id;
	pthread_mutex_init(&q->ibsrq.mutex, NULL);
	pthread_cond_init(&q->ibsrq.cond, NULL);
	atomic_fetch_add(&to_vpd(ibpd)->refs, 1);

	pthread_mutex_lock(&vsim_proc_lock);
	q->next = c->srqs;
	c->srqs = q;
	pthread_mutex_unlock(&vsim_proc_lock);
	return &q->ibsrq;
}

VSIM_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
	struct vsim_srq *q = to_vsrq(ibsrq);

	/* Resizing (IBV_SRQ_MAX_WR) is not supported, as on many HCAs. */
	if (mask & ~IBV_SRQ_LIMIT)
		return EINVAL;
	if (mask & IBV_SRQ_LIMIT) {
		if (attr->srq_limit > q->max_wr)
			return EINVAL;
		vsim_lock(&q->shm->h.lock);
		q->shm->limit = attr->srq_limit;
		vsim_unlock(&q->shm->h.lock);
	}
	return 0;
}

VSIM_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct vsim_srq *q = to_vsrq(ibsrq);

	vsim_lock(&q->shm->h.lock);
	attr->max_wr = q->shm->cap;
	attr->max_sge = q->shm->max_sge;
	attr->srq_limit = q->shm->limit;
	vsim_unlock(&q->shm->h.lock);
	return 0;
}

static void srq_free(struct vsim_srq *q)
{
	struct vsim_context *c = to_vctx(q->ibsrq.context);
	struct vsim_srq **pp;

	vsim_lock(&q->shm->h.lock);
	atomic_store(&q->shm->h.destroyed, 1);
	vsim_unlock(&q->shm->h.lock);
	vsim_obj_unlink(VSIM_OBJ_SRQ, q->map.id);
	vsim_map_release(&q->map);
	pthread_mutex_lock(&vsim_proc_lock);
	for (pp = &c->srqs; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&vsim_proc_lock);
	atomic_fetch_sub(&to_vpd(q->ibsrq.pd)->refs, 1);
	pthread_cond_destroy(&q->ibsrq.cond);
	pthread_mutex_destroy(&q->ibsrq.mutex);
	free(q);
}

VSIM_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vsim_srq *q = to_vsrq(ibsrq);

	if (atomic_load(&q->refs))
		return EBUSY;
	pthread_mutex_lock(&ibsrq->mutex);
	while (ibsrq->events_completed != q->async_delivered)
		pthread_cond_wait(&ibsrq->cond, &ibsrq->mutex);
	pthread_mutex_unlock(&ibsrq->mutex);
	srq_free(q);
	return 0;
}

int vsim_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct vsim_srq_shm *s = to_vsrq(ibsrq)->shm;
	int rc = 0;

	vsim_lock(&s->h.lock);
	for (; wr; wr = wr->next) {
		struct vsim_rwqe *r;

		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_sge) {
			rc = EINVAL;
			break;
		}
		if (s->count == s->cap) {
			rc = ENOMEM;
			break;
		}
		r = &s->ring[(s->head + s->count) % s->cap];
		r->wr_id = wr->wr_id;
		r->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge)
			memcpy(r->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(r->sge[0]));
		s->count++;
	}
	if (rc)
		*bad = wr;
	vsim_unlock(&s->h.lock);
	return rc;
}

/* ---- posting sends ------------------------------------------------------ */

int vsim_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct vsim_qp *qp = to_vqp(ibqp);
	const unsigned flags_ok = IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED |
				  IBV_SEND_INLINE;
	uint32_t state = atomic_load(&qp->shm->state);
	int rc = 0, posted = 0;

	/* The IB spec: posting to a send queue before RTS is an immediate
	 * error; in ERR the WR is accepted and completes flushed. */
	if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR) {
		*bad = wr;
		return EINVAL;
	}
	pthread_mutex_lock(&qp->sq_lock);
	for (; wr; wr = wr->next) {
		struct vsim_swqe *w;
		uint64_t len = 0;
		int i;

		switch (wr->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_SEND:
		case IBV_WR_SEND_WITH_IMM:
		case IBV_WR_RDMA_READ:
			break;
		default:
			/* Atomics, invalidation, MW binds, TSO: not emulated. */
			rc = EINVAL;
			goto out;
		}
		if ((wr->send_flags & ~flags_ok) || wr->num_sge < 0 ||
		    (uint32_t)wr->num_sge > qp->cap.max_send_sge ||
		    (wr->num_sge && !wr->sg_list)) {
			rc = EINVAL;
			goto out;
		}
		for (i = 0; i < wr->num_sge; i++)
			len += wr->sg_list[i].length;
		if ((wr->send_flags & IBV_SEND_INLINE) &&
		    (wr->opcode == IBV_WR_RDMA_READ || len > qp->cap.max_inline_data)) {
			rc = EINVAL;
			goto out;
		}
		if (atomic_load(&qp->outstanding) >= qp->sq_cap) {
			rc = ENOMEM;
			goto out;
		}
		w = &qp->sq[qp->tail % qp->sq_cap];
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->flags = wr->send_flags;
		w->imm = wr->imm_data;
		w->rkey = wr->wr.rdma.rkey;
		w->raddr = wr->wr.rdma.remote_addr;
		w->length = len;
		w->num_sge = (uint32_t)wr->num_sge;
		w->is_inline = !!(wr->send_flags & IBV_SEND_INLINE);
		if (w->is_inline) {
			uint64_t off = 0;

			/* Inline data is copied now: the buffer is free on return. */
			for (i = 0; i < wr->num_sge; i++) {
				memcpy(w->inl + off, (void *)(uintptr_t)wr->sg_list[i].addr,
				       wr->sg_list[i].length);
				off += wr->sg_list[i].length;
			}
		} else if (wr->num_sge) {
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(w->sge[0]));
		}
		atomic_fetch_add(&qp->outstanding, 1);
		qp->tail++;
		posted++;
	}
out:
	pthread_mutex_unlock(&qp->sq_lock);
	if (rc)
		*bad = wr;
	if (posted)
		vsim_exec_kick(qp->ctx);
	return rc;
}

/* ---- close_device cleanup ----------------------------------------------- */

int vsim_context_release_objects(struct vsim_context *c)
{
	int n = 0;

	pthread_mutex_lock(&c->lock);
	while (c->qps) {
		struct vsim_qp *qp = c->qps;

		qp_list_del(c, qp);
		qp_free(qp);
		n++;
	}
	pthread_mutex_unlock(&c->lock);
	while (c->srqs) {
		srq_free(c->srqs);
		n++;
	}
	while (c->cqs) {
		vsim_cq_free(c->cqs);
		n++;
	}
	if (n)
		vsim_dbg("close_device released %d objects the caller had not destroyed", n);
	return n;
}
