/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Completion queues, completion channels and asynchronous events.
 *
 * A CQ's ring is in shared memory because completions come from two
 * places: the owner's executor (send completions) and the executor of the
 * remote requester (receive completions for SEND and WRITE WITH IMMEDIATE).
 * Channels and the context's async_fd are abstract-namespace datagram
 * sockets, so whichever process adds an event can signal them, and
 * poll()/epoll on the fd works as with a real device.
 */
#define _GNU_SOURCE
#include "vsim.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

struct event_msg {
	uint32_t type;    /* enum ibv_event_type, or ~0 for a completion event */
	uint32_t id;      /* QPN, CQ id, SRQ id or port */
};

#define COMP_EVENT 0xffffffffu

static socklen_t sock_name(struct sockaddr_un *a, char kind, uint32_t x, uint32_t y)
{
	int n;

	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	/* Abstract namespace: nothing to clean up when a process dies. */
	n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "dchan-vsim.%016llx.%c.%u.%u",
		     (unsigned long long)vsim_reg->nonce, kind, x, y);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int bound_socket(char kind, uint32_t x, uint32_t y)
{
	struct sockaddr_un a;
	socklen_t len = sock_name(&a, kind, x, y);
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if (bind(fd, (struct sockaddr *)&a, len)) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static void send_event(char kind, uint32_t x, uint32_t y, const struct event_msg *m)
{
	static int fd = -1;
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	struct sockaddr_un a;
	socklen_t len = sock_name(&a, kind, x, y);

	pthread_mutex_lock(&lock);
	if (fd < 0)
		fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	pthread_mutex_unlock(&lock);
	/* A full or vanished receiver loses the event, as a dead one would. */
	if (fd < 0 || sendto(fd, m, sizeof(*m), MSG_DONTWAIT | MSG_NOSIGNAL,
			     (struct sockaddr *)&a, len) < 0)
		vsim_dbg("event %c.%u.%u not delivered: %s", kind, x, y, strerror(errno));
}

int vsim_async_socket(uint32_t slot, uint32_t gen)
{
	return bound_socket('a', slot, gen);
}

void vsim_async_post(uint32_t ctx_slot, uint32_t ctx_gen, int type, uint32_t id)
{
	struct event_msg m = { .type = (uint32_t)type, .id = id };

	send_event('a', ctx_slot, ctx_gen, &m);
}

/* ---- completion channels ------------------------------------------------ */

VSIM_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct vsim_channel *ch = calloc(1, sizeof(*ch));

	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	vsim_lock(&vsim_reg->lock);
	ch->id = vsim_reg->next_chan++;
	vsim_unlock(&vsim_reg->lock);
	ch->ch.fd = bound_socket('c', ch->id, 0);
	if (ch->ch.fd < 0) {
		int e = errno;

		free(ch);
		errno = e;
		return NULL;
	}
	ch->ch.context = context;
	return &ch->ch;
}

VSIM_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct vsim_channel *ch = to_vch(channel);

	if (atomic_load(&ch->refs))
		return EBUSY;
	close(channel->fd);
	free(ch);
	return 0;
}

VSIM_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
				 void **cq_context)
{
	struct vsim_context *c = to_vctx(channel->context);
	struct event_msg m;
	struct vsim_cq *q;

	for (;;) {
		ssize_t n = recv(channel->fd, &m, sizeof(m), 0);

		if (n < 0)
			return -1;  /* errno: EAGAIN on a non-blocking fd */
		if (n != (ssize_t)sizeof(m) || m.type != COMP_EVENT)
			continue;
		pthread_mutex_lock(&vsim_proc_lock);
		for (q = c->cqs; q; q = q->next)
			if (q->map.id == m.id && q->ibcq.channel == channel)
				break;
		if (q)
			q->comp_delivered++;
		pthread_mutex_unlock(&vsim_proc_lock);
		/* An event for a CQ destroyed meanwhile is dropped. */
		if (q) {
			*cq = &q->ibcq;
			*cq_context = q->ibcq.cq_context;
			return 0;
		}
	}
}

VSIM_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ---- completion queues -------------------------------------------------- */

VSIM_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
					 struct ibv_comp_channel *channel, int comp_vector)
{
	struct vsim_context *c = to_vctx(context);
	struct vsim_cq *q;
	size_t len;
	int rc, tries;

	if (cqe < 1 || cqe > VSIM_MAX_CQE || comp_vector < 0 ||
	    comp_vector >= context->num_comp_vectors ||
	    (channel && channel->context != context)) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	len = sizeof(struct vsim_cq_shm) + (size_t)cqe * sizeof(struct vsim_cqe);
	for (tries = 0; tries < 16; tries++) {
		rc = vsim_obj_create(VSIM_OBJ_CQ, vsim_alloc_obj_id(), len, &q->map);
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
	q->shm->cap = (uint32_t)cqe;
	q->shm->chan_id = channel ? to_vch(channel)->id : 0;
	vsim_obj_publish(&q->map);

	q->ibcq.context = context;
	q->ibcq.channel = channel;
	q->ibcq.cq_context = cq_context;
	q->ibcq.handle = q->map.id;
	q->ibcq.cqe = cqe;
	pthread_mutex_init(&q->ibcq.mutex, NULL);
	pthread_cond_init(&q->ibcq.cond, NULL);
	if (channel)
		atomic_fetch_add(&to_vch(channel)->refs, 1);

	pthread_mutex_lock(&vsim_proc_lock);
	q->next = c->cqs;
	c->cqs = q;
	pthread_mutex_unlock(&vsim_proc_lock);
	return &q->ibcq;
}

VSIM_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq;
	(void)cqe;
	return EOPNOTSUPP;
}

static void unlink_cq(struct vsim_context *c, struct vsim_cq *q)
{
	struct vsim_cq **pp;

	pthread_mutex_lock(&vsim_proc_lock);
	for (pp = &c->cqs; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&vsim_proc_lock);
}

void vsim_cq_free(struct vsim_cq *q)
{
	vsim_lock(&q->shm->h.lock);
	atomic_store(&q->shm->h.destroyed, 1);
	vsim_unlock(&q->shm->h.lock);
	vsim_obj_unlink(VSIM_OBJ_CQ, q->map.id);
	vsim_map_release(&q->map);
	if (q->ibcq.channel)
		atomic_fetch_sub(&to_vch(q->ibcq.channel)->refs, 1);
	unlink_cq(to_vctx(q->ibcq.context), q);
	pthread_cond_destroy(&q->ibcq.cond);
	pthread_mutex_destroy(&q->ibcq.mutex);
	free(q);
}

VSIM_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct vsim_cq *q = to_vcq(ibcq);

	if (atomic_load(&q->refs))
		return EBUSY;
	/* As libibverbs does: wait until every event handed out is acked. */
	pthread_mutex_lock(&ibcq->mutex);
	while (ibcq->comp_events_completed != q->comp_delivered ||
	       ibcq->async_events_completed != q->async_delivered)
		pthread_cond_wait(&ibcq->cond, &ibcq->mutex);
	pthread_mutex_unlock(&ibcq->mutex);
	vsim_cq_free(q);
	return 0;
}

/*
 * Adds a completion. Returns -1 when the CQ is gone or full; a full CQ is
 * an overrun, reported as IBV_EVENT_CQ_ERR to its owner and by poll_cq.
 */
int vsim_cq_push(struct vsim_cq_shm *s, const struct vsim_cqe *e)
{
	uint32_t chan = 0;

	vsim_lock(&s->h.lock);
	if (atomic_load(&s->h.destroyed)) {
		vsim_unlock(&s->h.lock);
		return -1;
	}
	if (atomic_load(&s->count) == s->cap) {
		int first = !atomic_exchange(&s->overflow, 1);

		vsim_unlock(&s->h.lock);
		if (first) {
			vsim_log("CQ %u overrun (%u entries): completion lost", s->h.id, s->cap);
			vsim_async_post(s->h.owner.ctx_slot, s->h.owner.ctx_gen,
					IBV_EVENT_CQ_ERR, s->h.id);
		}
		return -1;
	}
	s->ring[(s->head + atomic_load(&s->count)) % s->cap] = *e;
	/* Release: a poller that sees the count sees the entry (and the data
	 * placed before it was pushed). */
	atomic_fetch_add_explicit(&s->count, 1, memory_order_release);
	if (s->armed == 1 || (s->armed == 2 && (e->solicited || e->wc.status != IBV_WC_SUCCESS))) {
		s->armed = 0;
		chan = s->chan_id;
	}
	vsim_unlock(&s->h.lock);
	if (chan) {
		struct event_msg m = { .type = COMP_EVENT, .id = s->h.id };

		send_event('c', chan, 0, &m);
	}
	return 0;
}

/* Drops every completion of one QP (destroy or reset), as mlx5 does. */
void vsim_cq_clean(struct vsim_cq_shm *s, uint32_t qpn)
{
	uint32_t i, n, kept = 0;

	vsim_lock(&s->h.lock);
	n = atomic_load(&s->count);
	for (i = 0; i < n; i++) {
		struct vsim_cqe *e = &s->ring[(s->head + i) % s->cap];

		if (e->wc.qp_num == qpn)
			continue;
		if (kept != i)
			s->ring[(s->head + kept) % s->cap] = *e;
		kept++;
	}
	atomic_store(&s->count, kept);
	vsim_unlock(&s->h.lock);
}

int vsim_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
	struct vsim_cq_shm *s = to_vcq(ibcq)->shm;
	uint32_t k, i;

	/* A thread of ours that polls serves our mailbox on the way: a
	 * requester waiting for a final word needs no wake-up then. */
	vsim_mbox_poll(to_vctx(ibcq->context));
	if (atomic_load_explicit(&s->overflow, memory_order_relaxed))
		return -EOVERFLOW;
	/* The common empty poll takes no lock. */
	if (n <= 0 || atomic_load_explicit(&s->count, memory_order_acquire) == 0)
		return 0;
	vsim_lock(&s->h.lock);
	k = atomic_load(&s->count);
	if (k > (uint32_t)n)
		k = (uint32_t)n;
	for (i = 0; i < k; i++) {
		struct vsim_cqe *e = &s->ring[s->head];

		wc[i] = e->wc;
		/* Polling a send CQE frees its send queue slots, including
		 * those of the unsignaled WRs before it. Done under the CQ
		 * lock so a concurrent destroy cannot free the QP between. */
		if (e->sq_qp)
			atomic_fetch_sub(&((struct vsim_qp *)(uintptr_t)e->sq_qp)->outstanding,
					 e->sq_retire);
		s->head = (s->head + 1) % s->cap;
	}
	atomic_fetch_sub(&s->count, k);
	vsim_unlock(&s->h.lock);
	return (int)k;
}

int vsim_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vsim_cq_shm *s = to_vcq(ibcq)->shm;

	/* Arming a CQ without a channel is harmless and signals nothing. */
	vsim_lock(&s->h.lock);
	s->armed = solicited_only ? 2 : 1;
	vsim_unlock(&s->h.lock);
	return 0;
}

/* ---- asynchronous events ------------------------------------------------ */

static int qp_event(uint32_t t)
{
	return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR ||
	       t == IBV_EVENT_QP_ACCESS_ERR || t == IBV_EVENT_COMM_EST ||
	       t == IBV_EVENT_SQ_DRAINED || t == IBV_EVENT_PATH_MIG ||
	       t == IBV_EVENT_PATH_MIG_ERR || t == IBV_EVENT_QP_LAST_WQE_REACHED;
}

VSIM_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	struct vsim_context *c = to_vctx(context);
	struct event_msg m;

	for (;;) {
		ssize_t n = recv(context->async_fd, &m, sizeof(m), 0);
		int found = 0;

		if (n < 0)
			return -1;
		if (n != (ssize_t)sizeof(m))
			continue;
		event->event_type = (enum ibv_event_type)m.type;
		pthread_mutex_lock(&vsim_proc_lock);
		if (qp_event(m.type)) {
			struct vsim_qp *q;

			for (q = c->qps; q; q = q->next)
				if (q->ibqp.qp_num == m.id) {
					q->async_delivered++;
					event->element.qp = &q->ibqp;
					found = 1;
					break;
				}
		} else if (m.type == IBV_EVENT_CQ_ERR) {
			struct vsim_cq *q;

			for (q = c->cqs; q; q = q->next)
				if (q->map.id == m.id) {
					q->async_delivered++;
					event->element.cq = &q->ibcq;
					found = 1;
					break;
				}
		} else if (m.type == IBV_EVENT_SRQ_ERR || m.type == IBV_EVENT_SRQ_LIMIT_REACHED) {
			struct vsim_srq *q;

			for (q = c->srqs; q; q = q->next)
				if (q->map.id == m.id) {
					q->async_delivered++;
					event->element.srq = &q->ibsrq;
					found = 1;
					break;
				}
		} else {
			event->element.port_num = (int)m.id;
			found = 1;
		}
		pthread_mutex_unlock(&vsim_proc_lock);
		if (found)
			return 0;
		/* The object was destroyed after the event was raised. */
	}
}

VSIM_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	uint32_t t = event->event_type;

	if (qp_event(t)) {
		struct ibv_qp *qp = event->element.qp;

		pthread_mutex_lock(&qp->mutex);
		qp->events_completed++;
		pthread_cond_signal(&qp->cond);
		pthread_mutex_unlock(&qp->mutex);
	} else if (t == IBV_EVENT_CQ_ERR) {
		struct ibv_cq *cq = event->element.cq;

		pthread_mutex_lock(&cq->mutex);
		cq->async_events_completed++;
		pthread_cond_signal(&cq->cond);
		pthread_mutex_unlock(&cq->mutex);
	} else if (t == IBV_EVENT_SRQ_ERR || t == IBV_EVENT_SRQ_LIMIT_REACHED) {
		struct ibv_srq *srq = event->element.srq;

		pthread_mutex_lock(&srq->mutex);
		srq->events_completed++;
		pthread_cond_signal(&srq->cond);
		pthread_mutex_unlock(&srq->mutex);
	}
}
