/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The executor: one thread per context plays the HCA. It takes each QP's
 * send queue in posting order, checks what the hardware checks (local keys,
 * reachability of the peer, PSNs, remote keys and bounds, a posted receive),
 * places the data into the peer process with process_vm_writev (or reads it
 * with process_vm_readv) in the order the placement mode asks for, and
 * writes the completions.
 *
 * Ordering rules kept in every mode:
 *  - the WRs of one QP are executed, placed and completed in posting order,
 *    so write-after-write across messages holds;
 *  - a message is fully placed before its receive completion is pushed.
 * In "delayed" mode a write is acknowledged (send CQE) at transmission and
 * placed later from a snapshot of its data; the placements wait in a
 * per-QP FIFO, so a later write (a tail or flag) still lands after it.
 */
#define _GNU_SOURCE
#include "vsim.h"

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

enum { X_DONE, X_RETRY, X_ERROR, X_WAIT };
enum { TO_PEER, FROM_PEER };

/* vendor_err values, to tell the simulation's reasons apart in logs. */
enum {
	VERR_LOCAL = 0x51,
	VERR_REMOTE = 0x52,
	VERR_RNR = 0x53,
	VERR_TRANSPORT = 0x54,
};

struct seg {
	uint64_t addr;
	uint64_t len;
};

static uint64_t rng_next(struct vsim_context *c)
{
	/* xorshift64*: reproducible with DCHAN_VSIM_SEED. */
	c->rng ^= c->rng >> 12;
	c->rng ^= c->rng << 25;
	c->rng ^= c->rng >> 27;
	return c->rng * 0x2545f4914f6cdd1dULL;
}

/* ---- completions -------------------------------------------------------- */

static enum ibv_wc_opcode wc_opcode(uint32_t op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	default:
		return IBV_WC_SEND;
	}
}

/*
 * A send completion, if the WR asked for one (errors always do). It also
 * retires, when polled, the unsignaled WRs executed before it.
 */
void vsim_send_cqe(struct vsim_qp *qp, const struct vsim_swqe *w, enum ibv_wc_status st,
		   uint32_t vendor_err, int force)
{
	struct vsim_cqe e;

	if (!force && st == IBV_WC_SUCCESS && !qp->sq_sig_all && !(w->flags & IBV_SEND_SIGNALED)) {
		qp->unsignaled++;
		return;
	}
	memset(&e, 0, sizeof(e));
	e.wc.wr_id = w->wr_id;
	e.wc.status = st;
	e.wc.opcode = wc_opcode(w->opcode);
	e.wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : vendor_err;
	e.wc.byte_len = (uint32_t)w->length;
	e.wc.qp_num = qp->ibqp.qp_num;
	e.sq_qp = (uintptr_t)qp;
	e.sq_retire = qp->unsignaled + 1;
	qp->unsignaled = 0;
	vsim_cq_push(qp->scq->shm, &e);
}

static void push_recv_cqe(struct vsim_cq_shm *rcq, struct vsim_qp_shm *ps, uint32_t opcode,
			  const struct vsim_rwqe *r, enum ibv_wc_status st, uint64_t len,
			  uint32_t imm, int solicited, uint32_t src_qpn, uint16_t slid)
{
	struct vsim_cqe e;

	memset(&e, 0, sizeof(e));
	e.wc.wr_id = r->wr_id;
	e.wc.status = st;
	e.wc.opcode = opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM :
							     IBV_WC_RECV;
	e.wc.qp_num = ps->h.id;
	if (st == IBV_WC_SUCCESS) {
		e.wc.byte_len = (uint32_t)len;
		e.wc.src_qp = src_qpn;
		e.wc.slid = slid;
		if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_SEND_WITH_IMM) {
			e.wc.imm_data = imm;
			e.wc.wc_flags = IBV_WC_WITH_IMM;
		}
	}
	e.solicited = (uint32_t)solicited;
	vsim_cq_push(rcq, &e);
}

/* The requester's QP goes to ERR after an error completion. */
static int fail(struct vsim_qp *qp, const struct vsim_swqe *w, enum ibv_wc_status st,
		uint32_t verr)
{
	vsim_dbg("QP %u: WR %#llx completes with %s", qp->ibqp.qp_num,
		 (unsigned long long)w->wr_id, ibv_wc_status_str(st));
	/* The QP is in ERR before the completion can be seen, as on an HCA:
	 * whoever polls the error may query the state at once. (The receive
	 * queue's flushes are another work queue's: no order between them.) */
	vsim_lock(&qp->shm->h.lock);
	vsim_qp_shm_enter_error(qp->shm, qp->shm->srq_id ? NULL : qp->rcq->shm, -1);
	vsim_unlock(&qp->shm->h.lock);
	vsim_send_cqe(qp, w, st, verr, 1);
	return X_ERROR;
}

/* ---- moving bytes ------------------------------------------------------- */

/* The iovecs covering bytes [off, off+n) of a segment list. */
static int slice(const struct seg *s, int ns, uint64_t off, uint64_t n, struct iovec *iov)
{
	int i, k = 0;

	for (i = 0; i < ns && n; i++) {
		uint64_t take;

		if (off >= s[i].len) {
			off -= s[i].len;
			continue;
		}
		take = s[i].len - off;
		if (take > n)
			take = n;
		iov[k].iov_base = (void *)(uintptr_t)(s[i].addr + off);
		iov[k].iov_len = take;
		k++;
		n -= take;
		off = 0;
	}
	return k;
}

/* Copies message bytes [off, off+n) between us and process 'pid'. */
static int xfer(pid_t pid, int dir, const struct seg *loc, int nloc, const struct seg *rem,
		int nrem, uint64_t off, uint64_t n)
{
	struct iovec liov[VSIM_MAX_SGE], riov[VSIM_MAX_SGE];
	int nl, nr;
	ssize_t r;

	if (!n)
		return 0;
	nl = slice(loc, nloc, off, n, liov);
	nr = slice(rem, nrem, off, n, riov);
	if (dir == TO_PEER)
		r = process_vm_writev(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0);
	else
		r = process_vm_readv(pid, liov, (unsigned long)nl, riov, (unsigned long)nr, 0);
	if (r < 0)
		return errno;
	/* A short count means the next page faulted. */
	return (uint64_t)r == n ? 0 : EFAULT;
}

/* Start of the last aligned 8-byte word of [base, base+len), as an offset. */
static uint64_t tail_offset(uint64_t base, uint64_t len)
{
	uint64_t w = (base + len - 1) & ~7ULL;

	return w > base ? w - base : 0;
}

static int place_torn(struct vsim_context *c, pid_t pid, int dir, const struct seg *loc,
		      int nloc, const struct seg *rem, int nrem, uint64_t base, uint64_t len)
{
	struct { uint64_t off, end; } *ch = NULL, t;
	uint64_t maxb, off = 0;
	size_t n = 0, cap = 0, i, tail = 0;
	int rc = 0;

	/* Chunks of random size whose boundaries are 8-byte aligned in the
	 * destination: an aligned word is never split, as on hardware. */
	maxb = 2 * (uint64_t)vsim_cfg.chunk;
	if (maxb > len / 2)
		maxb = len / 2;
	if (maxb < 8)
		maxb = 8;
	while (off < len) {
		uint64_t size = 8 * (1 + rng_next(c) % (maxb / 8));
		uint64_t end = ((base + off + size) & ~7ULL);

		if (end <= base + off)
			end = ((base + off + 8) & ~7ULL);
		end = end - base > len ? len : end - base;
		if (n == cap) {
			void *p = realloc(ch, (cap = cap ? 2 * cap : 64) * sizeof(*ch));

			if (!p) {
				free(ch);
				return ENOMEM;
			}
			ch = p;
		}
		ch[n].off = off;
		ch[n].end = end;
		n++;
		off = end;
	}
	for (i = n - 1; i > 0; i--) {
		size_t j = (size_t)(rng_next(c) % (i + 1));

		t = ch[i], ch[i] = ch[j], ch[j] = t;
	}
	/* The chunk holding the last byte never lands last, so polling the
	 * tail of a torn write always sees it early. */
	for (i = 0; i < n; i++)
		if (ch[i].end == len)
			tail = i;
	if (n > 1 && tail == n - 1) {
		size_t j = (size_t)(rng_next(c) % (n - 1));

		t = ch[tail], ch[tail] = ch[j], ch[j] = t;
		tail = j;
	}
	for (i = 0; i < n && !rc; i++) {
		rc = xfer(pid, dir, loc, nloc, rem, nrem, ch[i].off, ch[i].end - ch[i].off);
		if (!rc && i == tail && i + 1 < n)
			vsim_sleep_ns(vsim_cfg.stall_ns);
	}
	free(ch);
	return rc;
}

/*
 * Places one message in the order the mode asks for. Pauses stretch the
 * window in which the tail is visible and the body is not: without them a
 * reversed copy finishes too fast for a poller to notice.
 */
static int place(struct vsim_context *c, pid_t pid, int dir, const struct seg *loc, int nloc,
		 const struct seg *rem, int nrem, uint64_t len, int mode)
{
	uint64_t base = dir == TO_PEER ? rem[0].addr : loc[0].addr;
	uint64_t tail, end, chunk = vsim_cfg.chunk;
	int rc;

	if (!len)
		return 0;
	tail = tail_offset(base, len);
	switch (mode) {
	case VSIM_PLACE_REVERSE:
		rc = xfer(pid, dir, loc, nloc, rem, nrem, tail, len - tail);
		if (rc || !tail)
			return rc;
		vsim_sleep_ns(vsim_cfg.stall_ns);
		for (end = tail; end; ) {
			uint64_t a = (base + end - 1) / chunk * chunk;
			uint64_t start = a > base ? a - base : 0;

			rc = xfer(pid, dir, loc, nloc, rem, nrem, start, end - start);
			if (rc)
				return rc;
			end = start;
		}
		return 0;
	case VSIM_PLACE_TORN:
		return place_torn(c, pid, dir, loc, nloc, rem, nrem, base, len);
	default:
		/* In order: the body, then the last word on its own, so the
		 * final bytes are the last to become visible. */
		rc = xfer(pid, dir, loc, nloc, rem, nrem, 0, tail);
		return rc ? rc : xfer(pid, dir, loc, nloc, rem, nrem, tail, len - tail);
	}
}

static int local_mapped(const struct seg *s, int n)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned char v;
	int i;

	for (i = 0; i < n; i++) {
		uint64_t a = s[i].addr & ~(uint64_t)(page - 1);

		for (; a < s[i].addr + s[i].len; a += (uint64_t)page)
			if (mincore((void *)(uintptr_t)a, 1, &v))
				return 0;
	}
	return 1;
}

/* ---- the peer ----------------------------------------------------------- */

static struct vsim_qp_shm *peer_qp(struct vsim_qp *qp)
{
	uint32_t dq = qp->shm->dest_qpn;
	struct vsim_qp_shm *ps = qp->peer.addr;

	if (ps && qp->peer.id == dq && !atomic_load(&ps->h.destroyed))
		return ps;
	/* Not mapped yet, or destroyed: a new QP may have that number now. */
	vsim_map_release(&qp->peer);
	vsim_map_release(&qp->peer_rcq);
	vsim_map_release(&qp->peer_srq);
	if (vsim_obj_open(VSIM_OBJ_QP, dq, &qp->peer))
		return NULL;
	return qp->peer.addr;
}

static struct vsim_cq_shm *peer_rcq(struct vsim_qp *qp, struct vsim_qp_shm *ps)
{
	if (qp->peer_rcq.addr && qp->peer_rcq.id == ps->recv_cq_id)
		return qp->peer_rcq.addr;
	vsim_map_release(&qp->peer_rcq);
	if (vsim_obj_open(VSIM_OBJ_CQ, ps->recv_cq_id, &qp->peer_rcq))
		return NULL;
	return qp->peer_rcq.addr;
}

static struct vsim_srq_shm *peer_srq(struct vsim_qp *qp, struct vsim_qp_shm *ps)
{
	if (qp->peer_srq.addr && qp->peer_srq.id == ps->srq_id)
		return qp->peer_srq.addr;
	vsim_map_release(&qp->peer_srq);
	if (vsim_obj_open(VSIM_OBJ_SRQ, ps->srq_id, &qp->peer_srq))
		return NULL;
	return qp->peer_srq.addr;
}

static int gid_of(enum vsim_devkind kind, unsigned node, const union ibv_gid *g)
{
	union ibv_gid p;
	unsigned i;

	for (i = 0; i < VSIM_GID_TBL_LEN; i++)
		if (!vsim_port_gid(kind, node, i, &p) && !memcmp(&p, g, sizeof(p)))
			return 1;
	return 0;
}

/*
 * Would a packet from qp reach ps and be accepted? What real hardware does
 * with a misaddressed or out-of-sequence packet (drop it, NAK it, treat it
 * as a duplicate) ends, for the requester, in a transport retry error;
 * the simulation reports every case that way. Caller holds ps->h.lock.
 */
static const char *unreachable(struct vsim_qp *qp, struct vsim_qp_shm *ps)
{
	enum vsim_devkind kind = qp->ctx->dev->kind;
	uint32_t st;

	if (atomic_load(&ps->h.destroyed))
		return "the destination QP was destroyed";
	if (!vsim_owner_alive(&ps->h.owner))
		return "the destination process is gone";
	if (ps->dev_kind != (uint32_t)kind)
		return "the destination is on another fabric (IB vs RoCE)";
	if (kind == VSIM_DEV_IB) {
		if (qp->ah.dlid != vsim_port_lid(kind, ps->node))
			return "the DLID is not the destination port's LID";
		if (qp->ah.is_global && !gid_of(kind, ps->node, &qp->ah.grh.dgid))
			return "the DGID is not the destination port's GID";
	} else if (!gid_of(kind, ps->node, &qp->ah.grh.dgid)) {
		return "the DGID is not the destination port's GID";
	}
	st = atomic_load(&ps->state);
	if (st != IBV_QPS_RTR && st != IBV_QPS_RTS)
		return "the destination QP is not in RTR or RTS";
	if (ps->dest_qpn != qp->ibqp.qp_num)
		return "the destination QP is connected to another QP";
	if (kind == VSIM_DEV_IB ? ps->dlid != vsim_port_lid(kind, vsim_cfg.node) :
				  !gid_of(kind, vsim_cfg.node, &ps->dgid))
		return "the destination QP's path does not lead back here";
	if (ps->rq_psn != qp->sq_psn)
		return "PSN mismatch (sq_psn differs from the responder's rq_psn)";
	return NULL;
}

static int transport_retry(struct vsim_qp *qp, const struct vsim_swqe *w, uint64_t now,
			   uint64_t *retry_at, const char *why)
{
	if (!qp->first_try_ns) {
		qp->first_try_ns = now;
		vsim_dbg("QP %u -> %u: %s; retrying", qp->ibqp.qp_num, qp->shm->dest_qpn, why);
	}
	if (qp->timeout == 0) {  /* infinite, as the IB spec says */
		*retry_at = now + 10000000ULL;
		return X_RETRY;
	}
	/* timeout x (retry_cnt + 1) after the first transmission. */
	if (qp->retries > qp->retry_cnt) {
		vsim_dbg("QP %u: giving up after %u retries: %s", qp->ibqp.qp_num,
			 qp->retry_cnt, why);
		return fail(qp, w, IBV_WC_RETRY_EXC_ERR, VERR_TRANSPORT);
	}
	qp->retries++;
	*retry_at = now + (4096ULL << qp->timeout);
	return X_RETRY;
}

/* The responder's min_rnr_timer encoding (IB spec), in microseconds x 100. */
static uint64_t rnr_ns(uint32_t code)
{
	static const uint32_t t[32] = {
		65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192,
		256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288,
		16384, 24576, 32768, 49152,
	};

	return (uint64_t)t[code & 31] * 10000ULL;
}

static int rnr_retry(struct vsim_qp *qp, const struct vsim_swqe *w, uint64_t now,
		     uint32_t timer, uint64_t *retry_at)
{
	/* rnr_retry 7 means retry forever. */
	if (qp->rnr_retry != 7 && qp->rnr_retries >= qp->rnr_retry)
		return fail(qp, w, IBV_WC_RNR_RETRY_EXC_ERR, VERR_RNR);
	qp->rnr_retries++;
	*retry_at = now + rnr_ns(timer);
	return X_RETRY;
}

/* Puts a receive WQE back (the message could not be taken after all). */
static void rq_unpop(struct vsim_qp_shm *ps, struct vsim_srq_shm *srq, const struct vsim_rwqe *r)
{
	if (!ps->srq_id) {
		ps->rq_head = (ps->rq_head + ps->rq_cap - 1) % ps->rq_cap;
		ps->rq[ps->rq_head] = *r;
		ps->rq_count++;
	} else if (srq) {
		vsim_lock(&srq->h.lock);
		if (srq->count < srq->cap) {
			srq->head = (srq->head + srq->cap - 1) % srq->cap;
			srq->ring[srq->head] = *r;
			srq->count++;
		}
		vsim_unlock(&srq->h.lock);
	}
}

/* The responder's side of a request it refuses: its QP goes to ERR and its
 * owner gets an affiliated async event. Caller holds ps->h.lock. */
static void responder_error(struct vsim_qp *qp, struct vsim_qp_shm *ps, int event)
{
	vsim_qp_shm_enter_error(ps, ps->srq_id ? NULL : peer_rcq(qp, ps), event);
}

static uint32_t packets(struct vsim_qp *qp, uint64_t len)
{
	uint64_t mtu = 1ULL << (qp->shm->path_mtu + 7);

	return len ? (uint32_t)((len + mtu - 1) / mtu) : 1;
}

/* ---- executing one send WR ---------------------------------------------- */

static int execute(struct vsim_qp *qp, const struct vsim_swqe *w, uint64_t now, uint64_t *retry_at)
{
	struct vsim_context *c = qp->ctx;
	int is_read = w->opcode == IBV_WR_RDMA_READ;
	int is_send = w->opcode == IBV_WR_SEND || w->opcode == IBV_WR_SEND_WITH_IMM;
	int needs_rwqe = is_send || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
	int delayed = c->placement == VSIM_PLACE_DELAYED && !is_read;
	struct seg loc[VSIM_MAX_SGE], rem[VSIM_MAX_SGE];
	uint32_t busy[VSIM_MAX_SGE];
	int nloc = 0, nrem = 0, nbusy = 0, relaxed = 0, have_rwqe = 0, rc, i, mode;
	struct vsim_cq_shm *rcq = NULL;
	struct vsim_srq_shm *srq = NULL;
	struct vsim_inflight *f = NULL;
	struct vsim_rwqe rwqe;
	struct vsim_qp_shm *ps;
	struct vsim_owner self;
	const char *why;
	uint32_t npk;

	/* A read must see the writes before it on this QP: let delayed
	 * placements land first. */
	if (is_read && qp->fifo)
		return X_WAIT;
	if (w->length > VSIM_MAX_MSG)
		return fail(qp, w, IBV_WC_LOC_LEN_ERR, VERR_LOCAL);

	/* Local keys: owned by us, in the QP's PD, covering the SGE. */
	if (w->is_inline) {
		loc[0].addr = (uintptr_t)w->inl;
		loc[0].len = w->length;
		nloc = w->length ? 1 : 0;
	} else {
		vsim_self_owner(&self);
		for (i = 0; i < (int)w->num_sge; i++) {
			struct vsim_mr_ref ref;

			if (!w->sge[i].length)
				continue;
			if (vsim_mr_lookup(w->sge[i].lkey, &self, qp->pd->id, w->sge[i].addr,
					   w->sge[i].length,
					   is_read ? IBV_ACCESS_LOCAL_WRITE : 0, 0,
					   &ref) != VSIM_KEY_OK)
				return fail(qp, w, IBV_WC_LOC_PROT_ERR, VERR_LOCAL);
			loc[nloc].addr = ref.va;
			loc[nloc].len = w->sge[i].length;
			nloc++;
		}
	}

	ps = peer_qp(qp);
	if (!ps)
		return transport_retry(qp, w, now, retry_at, "no QP with that number");
	vsim_lock(&ps->h.lock);
	why = unreachable(qp, ps);
	if (!why && needs_rwqe) {
		rcq = peer_rcq(qp, ps);
		srq = ps->srq_id ? peer_srq(qp, ps) : NULL;
		if (!rcq || (ps->srq_id && !srq))
			why = "the destination's receive queues are gone";
	}
	if (why) {
		vsim_unlock(&ps->h.lock);
		return transport_retry(qp, w, now, retry_at, why);
	}

	/* The responder's checks for RDMA: access rights and the rkey range.
	 * A zero-length RDMA operation checks no key (IB spec). */
	if ((is_read || !is_send) && w->length) {
		unsigned need = is_read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
		struct vsim_mr_ref ref;

		if (!(ps->access & need)) {
			/* The QP does not allow the operation at all: an
			 * invalid request, not a key violation. */
			vsim_dbg("QP %u -> %u: responder QP access flags %#x refuse the operation",
				 qp->ibqp.qp_num, ps->h.id, ps->access);
			responder_error(qp, ps, IBV_EVENT_QP_REQ_ERR);
			vsim_unlock(&ps->h.lock);
			return fail(qp, w, IBV_WC_REM_INV_REQ_ERR, VERR_REMOTE);
		}
		if (vsim_mr_lookup(w->rkey, &ps->h.owner, ps->pd_id, w->raddr, w->length, need,
				   1, &ref) != VSIM_KEY_OK) {
			vsim_dbg("QP %u -> %u: rkey %#x [%#llx, +%llu) refused", qp->ibqp.qp_num,
				 ps->h.id, w->rkey, (unsigned long long)w->raddr,
				 (unsigned long long)w->length);
			responder_error(qp, ps, IBV_EVENT_QP_ACCESS_ERR);
			vsim_unlock(&ps->h.lock);
			return fail(qp, w, IBV_WC_REM_ACCESS_ERR, VERR_REMOTE);
		}
		busy[nbusy++] = ref.slot;
		rem[0].addr = ref.va;
		rem[0].len = w->length;
		nrem = 1;
		relaxed = !!(ref.access & IBV_ACCESS_RELAXED_ORDERING);
	}

	if (needs_rwqe) {
		if (vsim_rq_pop(ps, srq, &rwqe)) {
			uint32_t timer = ps->min_rnr_timer;

			for (i = 0; i < nbusy; i++)
				vsim_mr_unbusy(busy[i]);
			vsim_unlock(&ps->h.lock);
			return rnr_retry(qp, w, now, timer, retry_at);
		}
		have_rwqe = 1;
	}

	if (is_send) {
		/* Scatter into the receive WQE: its lkeys belong to the
		 * responder, in the responder QP's PD, with local write. */
		uint64_t left = w->length;
		enum ibv_wc_status rst = IBV_WC_SUCCESS;

		for (i = 0; i < (int)rwqe.num_sge && left; i++) {
			const struct ibv_sge *s = &rwqe.sge[i];
			uint64_t take = s->length < left ? s->length : left;
			struct vsim_mr_ref ref;

			if (!take)
				continue;
			if (vsim_mr_lookup(s->lkey, &ps->h.owner, ps->pd_id, s->addr, take,
					   IBV_ACCESS_LOCAL_WRITE, 1, &ref) != VSIM_KEY_OK) {
				rst = IBV_WC_LOC_PROT_ERR;
				break;
			}
			busy[nbusy++] = ref.slot;
			rem[nrem].addr = ref.va;
			rem[nrem].len = take;
			nrem++;
			left -= take;
		}
		if (rst == IBV_WC_SUCCESS && left)
			rst = IBV_WC_LOC_LEN_ERR;
		if (rst != IBV_WC_SUCCESS) {
			/* The responder completes the receive in error and its
			 * QP goes to ERR; the requester sees the NAK. */
			push_recv_cqe(rcq, ps, w->opcode, &rwqe, rst, 0, 0, 0, 0, 0);
			vsim_qp_shm_enter_error(ps, ps->srq_id ? NULL : rcq, -1);
			for (i = 0; i < nbusy; i++)
				vsim_mr_unbusy(busy[i]);
			vsim_unlock(&ps->h.lock);
			return fail(qp, w, rst == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR :
				    IBV_WC_REM_OP_ERR, VERR_REMOTE);
		}
	}

	if (!delayed) {
		mode = relaxed ? VSIM_PLACE_TORN : c->placement;
		rc = place(c, ps->h.owner.pid, is_read ? FROM_PEER : TO_PEER, loc, nloc, rem, nrem,
			   w->length, mode);
	} else {
		/* Transmission: take a snapshot (the requester may reuse its
		 * buffer once it sees the completion) and land it later. */
		struct seg snap;

		f = calloc(1, sizeof(*f));
		rc = f ? 0 : ENOMEM;
		if (!rc && w->length) {
			f->data = malloc(w->length);
			rc = f->data ? 0 : ENOMEM;
			snap.addr = (uintptr_t)f->data;
			snap.len = w->length;
			if (!rc)
				rc = xfer(getpid(), FROM_PEER, &snap, 1, loc, nloc, 0, w->length);
		}
	}
	for (i = 0; i < nbusy; i++)
		vsim_mr_unbusy(busy[i]);
	if (rc) {
		if (have_rwqe)
			rq_unpop(ps, srq, &rwqe);
		if (f) {
			free(f->data);
			free(f);
		}
		if (rc == ESRCH) {
			vsim_unlock(&ps->h.lock);
			return transport_retry(qp, w, now, retry_at,
					       "the destination process is gone");
		}
		if (rc == EFAULT && local_mapped(loc, nloc) && !delayed) {
			vsim_log("QP %u -> %u: responder memory under a live MR is no "
				 "longer mapped", qp->ibqp.qp_num, ps->h.id);
			responder_error(qp, ps, IBV_EVENT_QP_ACCESS_ERR);
			vsim_unlock(&ps->h.lock);
			return fail(qp, w, IBV_WC_REM_ACCESS_ERR, VERR_REMOTE);
		}
		vsim_unlock(&ps->h.lock);
		if (rc != EFAULT)
			vsim_log("QP %u: cannot move data: %s", qp->ibqp.qp_num, strerror(rc));
		return fail(qp, w, IBV_WC_LOC_PROT_ERR, VERR_LOCAL);
	}

	npk = packets(qp, w->length);
	ps->rq_psn = (ps->rq_psn + npk) & 0xffffff;
	qp->sq_psn = (qp->sq_psn + npk) & 0xffffff;
	if (!delayed && have_rwqe)
		push_recv_cqe(rcq, ps, w->opcode, &rwqe, IBV_WC_SUCCESS, w->length, w->imm,
			      !!(w->flags & IBV_SEND_SOLICITED), qp->ibqp.qp_num,
			      vsim_port_lid(c->dev->kind, vsim_cfg.node));
	if (delayed) {
		f->due_ns = now + vsim_cfg.delay_ns;
		if (qp->fifo_tail && f->due_ns < qp->fifo_tail->due_ns)
			f->due_ns = qp->fifo_tail->due_ns;
		f->opcode = w->opcode;
		f->imm = w->imm;
		f->solicited = !!(w->flags & IBV_SEND_SOLICITED);
		f->src_qpn = qp->ibqp.qp_num;
		f->slid = vsim_port_lid(c->dev->kind, vsim_cfg.node);
		f->rkey = w->rkey;
		f->raddr = w->raddr;
		f->length = w->length;
		f->has_rwqe = have_rwqe;
		if (have_rwqe)
			f->rwqe = rwqe;
		if (qp->fifo_tail)
			qp->fifo_tail->next = f;
		else
			qp->fifo = f;
		qp->fifo_tail = f;
	}
	vsim_unlock(&ps->h.lock);
	/* In delayed mode this completion comes before the data lands. */
	vsim_send_cqe(qp, w, IBV_WC_SUCCESS, 0, 0);
	return X_DONE;
}

/* A delayed placement lands (in FIFO order, after the ones before it). The
 * responder accepted and acknowledged it already, so, as on hardware, it
 * lands and completes successfully even if the responder QP went to the
 * error state or was reset since: only a responder that is gone drops it. */
static void land(struct vsim_qp *qp, struct vsim_inflight *f)
{
	struct vsim_qp_shm *ps = qp->peer.addr;
	struct seg loc, rem[VSIM_MAX_SGE] = { { 0, 0 } };
	uint32_t busy[VSIM_MAX_SGE];
	int nrem = 0, nbusy = 0, relaxed = 0, ok = 1, i;
	struct vsim_cq_shm *rcq;

	if (!ps)
		return;
	vsim_lock(&ps->h.lock);
	if (atomic_load(&ps->h.destroyed) || !vsim_owner_alive(&ps->h.owner))
		goto out;
	if (f->opcode == IBV_WR_RDMA_WRITE || f->opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
		struct vsim_mr_ref ref;

		if (f->length) {
			/* The MR may have been deregistered meanwhile: on
			 * hardware the data would already be in place; here
			 * it is dropped rather than written into freed memory. */
			ok = vsim_mr_lookup(f->rkey, &ps->h.owner, ps->pd_id, f->raddr, f->length,
					    IBV_ACCESS_REMOTE_WRITE, 1, &ref) == VSIM_KEY_OK;
			if (ok) {
				busy[nbusy++] = ref.slot;
				rem[nrem].addr = ref.va;
				rem[nrem++].len = f->length;
				relaxed = !!(ref.access & IBV_ACCESS_RELAXED_ORDERING);
			}
		}
	} else {
		uint64_t left = f->length;

		for (i = 0; i < (int)f->rwqe.num_sge && left && ok; i++) {
			const struct ibv_sge *s = &f->rwqe.sge[i];
			uint64_t take = s->length < left ? s->length : left;
			struct vsim_mr_ref ref;

			if (!take)
				continue;
			ok = vsim_mr_lookup(s->lkey, &ps->h.owner, ps->pd_id, s->addr, take,
					    IBV_ACCESS_LOCAL_WRITE, 1, &ref) == VSIM_KEY_OK;
			if (ok) {
				busy[nbusy++] = ref.slot;
				rem[nrem].addr = ref.va;
				rem[nrem++].len = take;
				left -= take;
			}
		}
	}
	if (ok && f->length) {
		loc.addr = (uintptr_t)f->data;
		loc.len = f->length;
		ok = !place(qp->ctx, ps->h.owner.pid, TO_PEER, &loc, 1, rem, nrem, f->length,
			    relaxed ? VSIM_PLACE_TORN : VSIM_PLACE_INORDER);
	}
	for (i = 0; i < nbusy; i++)
		vsim_mr_unbusy(busy[i]);
	if (!ok)
		vsim_dbg("QP %u: a delayed placement into QP %u was dropped", qp->ibqp.qp_num,
			 ps->h.id);
	if (f->has_rwqe && (rcq = peer_rcq(qp, ps)))
		push_recv_cqe(rcq, ps, f->opcode, &f->rwqe, IBV_WC_SUCCESS, f->length, f->imm,
			      f->solicited, f->src_qpn, f->slid);
out:
	vsim_unlock(&ps->h.lock);
}

/*
 * Lands every delayed placement now, in order. Used when the requester QP
 * is reset or destroyed: data the responder already acknowledged must
 * still arrive. Caller holds ctx->lock.
 */
void vsim_fifo_land_all(struct vsim_qp *qp)
{
	while (qp->fifo) {
		struct vsim_inflight *f = qp->fifo;

		land(qp, f);
		qp->fifo = f->next;
		free(f->data);
		free(f);
	}
	qp->fifo_tail = NULL;
}

/* ---- the executor loop -------------------------------------------------- */

/* When the next delayed placement of this QP is due. */
static uint64_t fifo_due(const struct vsim_qp *qp, uint64_t t)
{
	return qp->fifo && qp->fifo->due_ns < t ? qp->fifo->due_ns : t;
}

/* Runs one QP as far as it can; returns when it next needs attention. */
static uint64_t qp_progress(struct vsim_qp *qp)
{
	uint64_t now = vsim_now_ns();
	int budget = 64;

	while (qp->fifo && qp->fifo->due_ns <= now) {
		struct vsim_inflight *f = qp->fifo;

		land(qp, f);
		qp->fifo = f->next;
		if (!qp->fifo)
			qp->fifo_tail = NULL;
		free(f->data);
		free(f);
		now = vsim_now_ns();
	}

	switch (atomic_load(&qp->shm->state)) {
	case IBV_QPS_ERR:
		vsim_flush_sq_locked(qp);
		return fifo_due(qp, UINT64_MAX);
	case IBV_QPS_RTS:
		break;
	default:
		return fifo_due(qp, UINT64_MAX);
	}
	while (budget-- > 0) {
		uint64_t retry_at = 0;
		struct vsim_swqe *w;
		int r;

		pthread_mutex_lock(&qp->sq_lock);
		w = qp->exec != qp->tail ? &qp->sq[qp->exec % qp->sq_cap] : NULL;
		pthread_mutex_unlock(&qp->sq_lock);
		if (!w)
			return fifo_due(qp, UINT64_MAX);
		if (qp->next_try_ns > now)
			return fifo_due(qp, qp->next_try_ns);
		if (atomic_load(&qp->shm->state) != IBV_QPS_RTS)
			return 0;  /* went to ERR under us: flush on the next pass */
		r = execute(qp, w, now, &retry_at);
		if (r == X_WAIT)
			return fifo_due(qp, UINT64_MAX);
		if (r == X_RETRY) {
			qp->next_try_ns = retry_at;
			return fifo_due(qp, retry_at);
		}
		pthread_mutex_lock(&qp->sq_lock);
		qp->exec++;
		pthread_mutex_unlock(&qp->sq_lock);
		qp->next_try_ns = qp->first_try_ns = 0;
		qp->retries = qp->rnr_retries = 0;
		if (r == X_ERROR) {
			vsim_flush_sq_locked(qp);
			return fifo_due(qp, UINT64_MAX);
		}
		now = vsim_now_ns();
	}
	return 0;  /* budget used up: come back at once */
}

static void *exec_main(void *arg)
{
	struct vsim_context *c = arg;
	_Atomic uint32_t *db = &vsim_reg->ctx[c->slot].doorbell;

	while (!atomic_load(&c->stop)) {
		uint32_t seq = atomic_load(db);
		uint64_t next = UINT64_MAX, now;
		struct timespec ts, *tsp = NULL;
		struct vsim_qp *qp;

		pthread_mutex_lock(&c->lock);
		for (qp = c->qps; qp; qp = qp->next) {
			uint64_t d = qp_progress(qp);

			if (d < next)
				next = d;
		}
		pthread_mutex_unlock(&c->lock);
		now = vsim_now_ns();
		if (next <= now)
			continue;
		if (next != UINT64_MAX) {
			ts.tv_sec = (time_t)((next - now) / 1000000000ULL);
			ts.tv_nsec = (long)((next - now) % 1000000000ULL);
			tsp = &ts;
		}
		/* Sleeps unless the doorbell moved since 'seq' was read. */
		syscall(SYS_futex, db, FUTEX_WAIT, seq, tsp, NULL, 0);
	}
	return NULL;
}

int vsim_exec_start(struct vsim_context *c)
{
	sigset_t all, old;
	int rc;

	/* The thread takes no signals: they belong to the application. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&c->exec, NULL, exec_main, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!rc)
		c->exec_started = 1;
	return rc;
}

void vsim_exec_kick(struct vsim_context *c)
{
	vsim_ring(c->slot, c->gen);
}

void vsim_exec_stop(struct vsim_context *c)
{
	if (!c->exec_started)
		return;
	atomic_store(&c->stop, 1);
	vsim_exec_kick(c);
	pthread_join(c->exec, NULL);
	c->exec_started = 0;
}
