/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The executor: one thread per context plays the HCA. It takes each QP's
 * send queue in posting order, checks what the hardware checks (local keys,
 * reachability of the peer, PSNs, remote keys and bounds, a posted receive),
 * places the data into the peer process with process_vm_writev (or reads it
 * with process_vm_readv) in the order the placement mode asks for, and
 * writes the completions.
 *
 * The final aligned 8-byte word of an RDMA WRITE (WITH IMM), the word a
 * sentinel or flag poller reads, is the exception: the kernel's copy moves
 * bytes ("rep movsb"), can be preempted in the middle of a word, and a
 * poller then sees the word half old, half new, where an HCA writes an
 * aligned word whole. That word is handed to the responder's own process,
 * which stores it with one atomic 8-byte store, and the requester waits for
 * the store (see "the final word" below).
 *
 * Ordering rules kept in every mode:
 *  - the WRs of one QP are executed, placed and completed in posting order,
 *    so write-after-write across messages holds;
 *  - a message is fully placed, final word included, before its receive
 *    completion is pushed.
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

static int flush_words(struct vsim_context *me, struct vsim_words *pw);

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
 * A send completion, if the WR asked for one (errors always do): returns 1
 * and fills e. It also retires, when polled, the unsignaled WRs executed
 * before it.
 */
static int send_cqe(struct vsim_qp *qp, const struct vsim_swqe *w, enum ibv_wc_status st,
		    uint32_t vendor_err, int force, struct vsim_cqe *e)
{
	if (!force && st == IBV_WC_SUCCESS && !qp->sq_sig_all && !(w->flags & IBV_SEND_SIGNALED)) {
		qp->unsignaled++;
		return 0;
	}
	memset(e, 0, sizeof(*e));
	e->wc.wr_id = w->wr_id;
	e->wc.status = st;
	e->wc.opcode = wc_opcode(w->opcode);
	e->wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : vendor_err;
	e->wc.byte_len = (uint32_t)w->length;
	e->wc.qp_num = qp->ibqp.qp_num;
	e->sq_qp = (uintptr_t)qp;
	e->sq_retire = qp->unsignaled + 1;
	qp->unsignaled = 0;
	return 1;
}

void vsim_send_cqe(struct vsim_qp *qp, const struct vsim_swqe *w, enum ibv_wc_status st,
		   uint32_t vendor_err, int force)
{
	struct vsim_cqe e;

	if (send_cqe(qp, w, st, vendor_err, force, &e))
		vsim_cq_push(qp->scq->shm, &e);
}

static void recv_cqe(struct vsim_cqe *e, struct vsim_qp_shm *ps, uint32_t opcode,
		     const struct vsim_rwqe *r, enum ibv_wc_status st, uint64_t len,
		     uint32_t imm, int solicited, uint32_t src_qpn, uint16_t slid)
{
	memset(e, 0, sizeof(*e));
	e->wc.wr_id = r->wr_id;
	e->wc.status = st;
	e->wc.opcode = opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM :
							      IBV_WC_RECV;
	e->wc.qp_num = ps->h.id;
	if (st == IBV_WC_SUCCESS) {
		e->wc.byte_len = (uint32_t)len;
		e->wc.src_qp = src_qpn;
		e->wc.slid = slid;
		if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM || opcode == IBV_WR_SEND_WITH_IMM) {
			e->wc.imm_data = imm;
			e->wc.wc_flags = IBV_WC_WITH_IMM;
		}
	}
	e->solicited = (uint32_t)solicited;
}

static void push_recv_cqe(struct vsim_cq_shm *rcq, struct vsim_qp_shm *ps, uint32_t opcode,
			  const struct vsim_rwqe *r, enum ibv_wc_status st, uint64_t len,
			  uint32_t imm, int solicited, uint32_t src_qpn, uint16_t slid)
{
	struct vsim_cqe e;

	recv_cqe(&e, ps, opcode, r, st, len, imm, solicited, src_qpn, slid);
	vsim_cq_push(rcq, &e);
}

/* The requester's QP goes to ERR after an error completion. */
static int fail(struct vsim_qp *qp, const struct vsim_swqe *w, enum ibv_wc_status st,
		uint32_t verr)
{
	vsim_dbg("QP %u: WR %#llx completes with %s", qp->ibqp.qp_num,
		 (unsigned long long)w->wr_id, ibv_wc_status_str(st));
	/* The WRs before it succeeded: their final words land first. */
	if (flush_words(qp->ctx, &qp->pend))
		vsim_dbg("QP %u: final words of earlier WRs were dropped", qp->ibqp.qp_num);
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

/* ---- the final word: stored whole by the responder's process ------------- */

/*
 * process_vm_writev copies with the kernel's byte copy ("rep movsb" on
 * CPUs with FSRM), which can be interrupted and preempted in the middle of
 * an aligned word: a poller in the responder then sees the word half
 * written, for as long as the writer is off its core. An HCA writes an
 * aligned word whole. So the final aligned word of an RDMA WRITE, the one
 * a sentinel or flag poller reads, does not go through the kernel copy:
 * the requester hands (address, value) to the responder's process through
 * the mailbox of the responder QP's context in the registry, and that
 * process stores it with one 8-byte atomic store. The requester waits for
 * the store before anything of its own that must come after it, so every
 * ordering rule of the placement modes still holds:
 *  - in "reverse" and "torn" the word is stored where the mode puts the
 *    tail (early), before the rest is copied, and the requester waits;
 *  - in order (and when a delayed write lands), and for a message that is
 *    just one word in any mode, the word is the last thing of its message
 *    placed. Its store, and the completions of the WR (send
 *    CQE, receive CQE), may wait within one pass of the executor over the
 *    QP, until eight words are collected or something must come after
 *    them: a copy other than the body of a later WRITE (or one that would
 *    overwrite a pending word), an error, or the end of the pass. One
 *    hand-off then stores them in posting order, and the completions
 *    follow. So a poller still sees every earlier message whole when it
 *    sees a final word, and a completion still means the data is there.
 *    The words keep their MRs busy until stored.
 *
 * Who stores: a thread per context that serves its mailbox (svc_main) and
 * does nothing else, and any thread of the process that polls one of the
 * context's CQs (vsim_mbox_poll), or waits for a hand-off of its own, or
 * whose executor is about to sleep: that saves wake-ups. None of them
 * takes a lock: requesters wait while holding locks the responder's
 * executor or application may be blocked on (ctx->lock, the responder QP's
 * shm lock), so the executor alone could not be relied on to serve.
 */

/*
 * Both sides sleep on futexes, and do not yield while they wait: where
 * other processes hog the CPUs, a thread that yields runs again only after
 * their time slices (milliseconds), while one that sleeps and is woken runs
 * at once. A waiting requester checks the responder's liveness this often:
 */
enum { LIVENESS_NS = 10000000 };

/* Is the page of 'addr' mapped? An unmapped page under a live MR is
 * reported as for CMA (EFAULT), not faulted on. */
static int word_mapped(uint64_t addr)
{
	long page = sysconf(_SC_PAGESIZE);
	unsigned char v;

	return !mincore((void *)(uintptr_t)(addr & ~(uint64_t)(page - 1)), 1, &v);
}

#if defined(__SANITIZE_THREAD__)
#define VSIM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define VSIM_TSAN 1
#endif
#endif

#ifdef VSIM_TSAN
/*
 * Under ThreadSanitizer the word is stored the way the process's other
 * RDMA data arrives, unseen by the tool: what orders it against the
 * application's accesses (the requester's wait, a completion, the
 * application's own atomics) runs through another process, which the tool
 * cannot follow, so an instrumented store would be reported as a race with
 * every access to the buffer. An aligned volatile 8-byte store is one
 * instruction on the 64-bit targets we build for.
 */
__attribute__((no_sanitize("thread"))) static void word_store(uint64_t *p, uint64_t v)
{
	atomic_thread_fence(memory_order_release);
	*(volatile uint64_t *)p = v;
}
#else
static void word_store(uint64_t *p, uint64_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELEASE);
}
#endif

static int store_word(uint64_t addr, uint64_t value)
{
	if ((addr & 7) || !word_mapped(addr))
		return EFAULT;
	word_store((uint64_t *)(uintptr_t)addr, value);
	return 0;
}

static void futex_wake(_Atomic uint32_t *w, int n)
{
	/* Not FUTEX_PRIVATE: the other side is in another process. */
	syscall(SYS_futex, w, FUTEX_WAKE, n, NULL, NULL, 0);
}

/* Serves the mailbox of a context (slot s, generation gen): every full
 * entry meant for it is stored, in order, and acknowledged. Takes no lock.
 * Returns how many entries it served. */
static int mbox_service(struct vsim_ctx_slot *s, uint32_t gen)
{
	int i, served = 0;

	for (i = 0; i < VSIM_MBOX_SLOTS; i++) {
		struct vsim_mbox *m = &s->mbox[i];
		uint32_t w = atomic_load_explicit(&m->word, memory_order_acquire);
		uint32_t n, k;
		int res = 0;

		if (VSIM_MB_PHASE(w) != VSIM_MB_FULL ||
		    atomic_load_explicit(&m->gen, memory_order_relaxed) != gen)
			continue;
		/* The exact ticket: an entry whose requester gave up on it and
		 * that someone refilled is not ours to take with old fields. */
		if (!atomic_compare_exchange_strong(&m->word, &w,
						    VSIM_MB_WORD(VSIM_MB_TICKET(w), VSIM_MB_BUSY)))
			continue;
		n = atomic_load_explicit(&m->n, memory_order_relaxed);
		for (k = 0; k < n && k < VSIM_MB_WORDS; k++) {
			int r = store_word(atomic_load_explicit(&m->addr[k], memory_order_relaxed),
					   atomic_load_explicit(&m->value[k],
								memory_order_relaxed));

			if (r && !res)
				res = r;
		}
		atomic_store_explicit(&m->result, res, memory_order_relaxed);
		atomic_fetch_add_explicit(&s->handoffs, n, memory_order_relaxed);
		atomic_store(&m->word, VSIM_MB_WORD(VSIM_MB_TICKET(w), VSIM_MB_DONE));
		if (atomic_load(&m->sleeper))
			futex_wake(&m->word, 1);
		served++;
	}
	return served;
}

/* From vsim_poll_cq: a thread of ours that polls serves our mailbox on the
 * way, when a requester rang since the last look. */
void vsim_mbox_poll(struct vsim_context *c)
{
	struct vsim_ctx_slot *s = &vsim_reg->ctx[c->slot];
	uint32_t bell = atomic_load(&s->mbox_bell);

	if (bell != atomic_load_explicit(&c->mbox_seen, memory_order_relaxed)) {
		atomic_store_explicit(&c->mbox_seen, bell, memory_order_relaxed);
		mbox_service(s, c->gen);
	}
}

/* Empties a context slot's mailbox for a new user (registry lock held). A
 * requester still waiting on an entry sees its ticket gone and gives up. */
void vsim_mbox_reset(struct vsim_ctx_slot *s)
{
	int i;

	atomic_store(&s->serving, 0);
	atomic_store(&s->svc_asleep, 0);
	atomic_store(&s->handoffs, 0);
	for (i = 0; i < VSIM_MBOX_SLOTS; i++) {
		uint32_t w = atomic_load(&s->mbox[i].word);

		atomic_store(&s->mbox[i].word, VSIM_MB_WORD(VSIM_MB_TICKET(w) + 1, VSIM_MB_FREE));
		futex_wake(&s->mbox[i].word, INT_MAX);
	}
}

static void *svc_main(void *arg)
{
	struct vsim_context *c = arg;
	struct vsim_ctx_slot *s = &vsim_reg->ctx[c->slot];

	while (!atomic_load(&c->svc_stop)) {
		uint32_t seq = atomic_load(&s->mbox_bell);

		if (mbox_service(s, c->gen))
			continue;
		/* Sleeps unless a requester rang since 'seq' was read; one
		 * that rings sees svc_asleep and wakes us. */
		atomic_store(&s->svc_asleep, 1);
		syscall(SYS_futex, &s->mbox_bell, FUTEX_WAIT, seq, NULL, NULL, 0);
		atomic_store(&s->svc_asleep, 0);
	}
	return NULL;
}

int vsim_svc_start(struct vsim_context *c)
{
	sigset_t all, old;
	int rc;

	atomic_store(&c->svc_stop, 0);
	/* The thread takes no signals: they belong to the application. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&c->svc, NULL, svc_main, c);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (!rc) {
		c->svc_started = 1;
		atomic_store(&vsim_reg->ctx[c->slot].serving, 1);
	}
	return rc;
}

void vsim_svc_stop(struct vsim_context *c)
{
	struct vsim_ctx_slot *s = &vsim_reg->ctx[c->slot];
	int i;

	if (!c->svc_started)
		return;
	atomic_store(&c->svc_stop, 1);
	atomic_fetch_add(&s->mbox_bell, 1);
	futex_wake(&s->mbox_bell, INT_MAX);
	pthread_join(c->svc, NULL);
	c->svc_started = 0;
	atomic_store(&s->serving, 0);
	/* Requesters still waiting take their entries back and copy. */
	for (i = 0; i < VSIM_MBOX_SLOTS; i++)
		futex_wake(&s->mbox[i].word, INT_MAX);
	vsim_dbg("context slot %u stored %llu final words for requesters", c->slot,
		 (unsigned long long)atomic_load(&s->handoffs));
}

/*
 * Can the context 'to' names take a hand-off? 0: yes. ENOTCONN: its process
 * is alive but nothing serves the mailbox (the context is closing or
 * closed). ESRCH: the process is gone. The liveness check costs a system
 * call: only with 'alive'.
 */
static int svc_state(struct vsim_ctx_slot *s, const struct vsim_owner *to, int alive)
{
	if (__atomic_load_n(&s->used, __ATOMIC_RELAXED) &&
	    __atomic_load_n(&s->gen, __ATOMIC_RELAXED) == to->ctx_gen && atomic_load(&s->serving))
		return !alive || vsim_owner_alive(to) ? 0 : ESRCH;
	return vsim_owner_alive(to) ? ENOTCONN : ESRCH;
}

/* Claims a free mailbox entry of s; sets its ticket. */
static struct vsim_mbox *mbox_claim(struct vsim_ctx_slot *s, uint32_t *ticket)
{
	int i;

	for (i = 0; i < VSIM_MBOX_SLOTS; i++) {
		struct vsim_mbox *m = &s->mbox[i];
		uint32_t w = atomic_load(&m->word);

		if (VSIM_MB_PHASE(w) == VSIM_MB_FREE &&
		    atomic_compare_exchange_strong(&m->word, &w,
						   VSIM_MB_WORD(VSIM_MB_TICKET(w) + 1,
								VSIM_MB_CLAIMED))) {
			*ticket = VSIM_MB_TICKET(w) + 1;
			return m;
		}
	}
	return NULL;
}

/*
 * All entries taken: free the acknowledged ones whose requester died before
 * it could free them. (Only DONE entries: their requester fields are
 * those of their ticket. One that died while filling an entry leaves it
 * taken until the slot's next user.)
 */
static void mbox_reclaim(struct vsim_ctx_slot *s)
{
	int i;

	for (i = 0; i < VSIM_MBOX_SLOTS; i++) {
		struct vsim_mbox *m = &s->mbox[i];
		uint32_t w = atomic_load(&m->word);
		struct vsim_owner o;

		if (VSIM_MB_PHASE(w) != VSIM_MB_DONE)
			continue;
		memset(&o, 0, sizeof(o));
		o.pid = atomic_load(&m->req_pid);
		o.starttime = atomic_load(&m->req_start);
		if (!vsim_owner_alive(&o))
			atomic_compare_exchange_strong(&m->word, &w,
						       VSIM_MB_WORD(VSIM_MB_TICKET(w) + 1,
								    VSIM_MB_FREE));
	}
}

/*
 * Has the responder's process store the words of pw (at its addresses), in
 * order, and waits until it has. Returns 0, EFAULT (a page is not mapped), ESRCH
 * (the process is gone: the caller drops the words, as for a responder that
 * dies during CMA) or ENOTCONN (the process lives but its context no longer
 * serves the mailbox: the caller writes the words by CMA).
 */
static int handoff(struct vsim_context *me, const struct vsim_words *pw)
{
	const struct vsim_owner *to = &pw->to;
	struct vsim_ctx_slot *s;
	struct vsim_owner self;
	struct vsim_mbox *m;
	uint32_t t, e, k;
	int rc;

	if (to->ctx_slot >= VSIM_MAX_CTX)
		return ENOTCONN;
	s = &vsim_reg->ctx[to->ctx_slot];
	rc = svc_state(s, to, 0);
	if (rc)
		return rc;
	while (!(m = mbox_claim(s, &t))) {
		/* VSIM_MBOX_SLOTS hand-offs already in flight towards it. */
		mbox_reclaim(s);
		rc = svc_state(s, to, 1);
		if (rc)
			return rc;
		vsim_sleep_ns(20000);
	}
	vsim_self_owner(&self);
	atomic_store_explicit(&m->req_pid, self.pid, memory_order_relaxed);
	atomic_store_explicit(&m->req_start, self.starttime, memory_order_relaxed);
	atomic_store_explicit(&m->gen, to->ctx_gen, memory_order_relaxed);
	for (k = 0; k < pw->n; k++) {
		atomic_store_explicit(&m->addr[k], pw->addr[k], memory_order_relaxed);
		atomic_store_explicit(&m->value[k], pw->value[k], memory_order_relaxed);
	}
	atomic_store_explicit(&m->n, pw->n, memory_order_relaxed);
	atomic_store_explicit(&m->result, 0, memory_order_relaxed);
	e = VSIM_MB_WORD(t, VSIM_MB_CLAIMED);
	if (!atomic_compare_exchange_strong_explicit(&m->word, &e, VSIM_MB_WORD(t, VSIM_MB_FULL),
						     memory_order_release, memory_order_relaxed))
		return svc_state(s, to, 1) == ESRCH ? ESRCH : ENOTCONN;  /* reset meanwhile */
	atomic_fetch_add(&s->mbox_bell, 1);
	if (atomic_load(&s->svc_asleep))
		futex_wake(&s->mbox_bell, 1);

	for (;;) {
		uint32_t w = atomic_load_explicit(&m->word, memory_order_acquire);
		struct timespec ts = { 0, LIVENESS_NS };

		if (w == VSIM_MB_WORD(t, VSIM_MB_DONE)) {
			rc = atomic_load_explicit(&m->result, memory_order_relaxed);
			atomic_compare_exchange_strong(&m->word, &w, VSIM_MB_WORD(t, VSIM_MB_FREE));
			return rc;
		}
		if (VSIM_MB_TICKET(w) != t)
			return svc_state(s, to, 1) == ESRCH ? ESRCH : ENOTCONN;  /* reset */
		/* Serve our own mailbox before we sleep: the responder may
		 * be waiting on us just the same (not needed for progress,
		 * our mailbox thread does it too, but it saves a wake-up). */
		if (me)
			vsim_mbox_poll(me);
		atomic_store(&m->sleeper, 1);
		rc = (int)syscall(SYS_futex, &m->word, FUTEX_WAIT, w, &ts, NULL, 0);
		atomic_store(&m->sleeper, 0);
		if (rc == 0 || errno != ETIMEDOUT) {
			/* Woken, or the word moved: look again. A context that
			 * stops serving wakes us too (vsim_svc_stop). */
			if (atomic_load(&s->serving) ||
			    VSIM_MB_PHASE(atomic_load(&m->word)) != VSIM_MB_FULL)
				continue;
		}
		rc = svc_state(s, to, 1);
		if (!rc)
			continue;
		/* Nobody will serve it: take it back, unless the servicer
		 * already took it (then it finishes, or died doing so). */
		e = VSIM_MB_WORD(t, VSIM_MB_FULL);
		if (atomic_compare_exchange_strong(&m->word, &e, VSIM_MB_WORD(t, VSIM_MB_FREE)))
			return rc;
		e = VSIM_MB_WORD(t, VSIM_MB_BUSY);
		if (rc == ESRCH &&
		    atomic_compare_exchange_strong(&m->word, &e, VSIM_MB_WORD(t, VSIM_MB_FREE)))
			return rc;
	}
}

/*
 * Stores the words pw holds (all for one responder) and then pushes the
 * completions that waited for them, and empties it. Where nothing serves
 * the responder's mailbox any more but the process lives (its context is
 * closing), the words are copied by CMA instead; where the process is
 * gone, they are dropped (its WRs were acknowledged: they complete, as on
 * an HCA whose responder died after the ACK). Releases the MRs the words
 * held busy.
 */
static int flush_words(struct vsim_context *me, struct vsim_words *pw)
{
	uint32_t k;
	int rc;

	if (!pw->n && !pw->ncqe)
		return 0;
	rc = pw->n ? handoff(me, pw) : 0;
	if (rc == ENOTCONN) {
		vsim_dbg("the context of process %d serves no hand-offs: %u words copied",
			 (int)pw->to.pid, pw->n);
		rc = 0;
		for (k = 0; k < pw->n && !rc; k++) {
			struct seg l = { (uintptr_t)&pw->value[k], 8 }, r = { pw->addr[k], 8 };

			rc = xfer(pw->to.pid, TO_PEER, &l, 1, &r, 1, 0, 8);
		}
	}
	for (k = 0; k < pw->nbusy; k++)
		vsim_mr_unbusy(pw->busy[k]);
	/* A responder QP destroyed meanwhile gets no receive completion. */
	for (k = 0; k < pw->ncqe; k++)
		if (!pw->recv_of[k] || !atomic_load(&pw->recv_of[k]->h.destroyed))
			vsim_cq_push(pw->cq[k], &pw->cqe[k]);
	pw->n = pw->nbusy = pw->ncqe = 0;
	return rc;
}

/*
 * A completion of a WR whose data is placed: pushed now, or, while final
 * words are pending, after them (in order with the other completions that
 * wait). recv_of: the responder QP, for a receive completion.
 */
static void post_cqe(struct vsim_context *me, struct vsim_words *pw, struct vsim_cq_shm *cq,
		     const struct vsim_cqe *e, struct vsim_qp_shm *recv_of)
{
	if (!pw->n) {
		vsim_cq_push(cq, e);
		return;
	}
	if (pw->ncqe == VSIM_PEND_CQES && flush_words(me, pw))
		vsim_dbg("final words were dropped (the responder is gone)");
	if (!pw->n) {
		vsim_cq_push(cq, e);
		return;
	}
	pw->cqe[pw->ncqe] = *e;
	pw->cq[pw->ncqe] = cq;
	pw->recv_of[pw->ncqe++] = recv_of;
}

/*
 * One message's placement: what moves where, and which word, if any, the
 * responder's process stores itself (word < len). 'pend' holds the QP's
 * final words not stored yet; 'defer' lets this message's join them.
 */
struct plan {
	struct vsim_context *me;
	const struct vsim_owner *peer;
	int dir;
	const struct seg *loc, *rem;
	int nloc, nrem;
	uint64_t word, len;
	struct vsim_words *pend;
	int defer;
	uint32_t mr_slot;         /* the MR the word is in (defer) */
};

/*
 * The final word of an RDMA WRITE goes through the responder when it is a
 * whole aligned word inside the message; a shorter message, or one whose
 * last aligned word reaches past its end, is copied as before.
 */
static void plan_init(struct plan *p, struct vsim_context *me, const struct vsim_owner *peer,
		      int dir, const struct seg *loc, int nloc, const struct seg *rem, int nrem,
		      uint64_t len, int is_write)
{
	memset(p, 0, sizeof(*p));
	p->me = me;
	p->peer = peer;
	p->dir = dir;
	p->loc = loc;
	p->nloc = nloc;
	p->rem = rem;
	p->nrem = nrem;
	p->word = p->len = len;
	if (is_write && dir == TO_PEER && nrem == 1 && len >= 8 && rem[0].len == len &&
	    !((rem[0].addr + len) & 7))
		p->word = len - 8;
}

static int same_owner(const struct vsim_owner *a, const struct vsim_owner *b)
{
	return a->pid == b->pid && a->starttime == b->starttime && a->ctx_slot == b->ctx_slot &&
	       a->ctx_gen == b->ctx_gen;
}

/* The final word: its value is the source's last 8 bytes, read from our
 * own memory (the WR's segments, or the snapshot of a delayed write). */
static int put_word(const struct plan *p)
{
	struct iovec liov[VSIM_MAX_SGE], dst;
	struct vsim_words one;
	uint64_t v, addr = p->rem[0].addr + p->word;
	int nl, rc;

	dst.iov_base = &v;
	dst.iov_len = 8;
	nl = slice(p->loc, p->nloc, p->word, 8, liov);
	/* Not memcpy: the buffer may have been unmapped under its MR. */
	if (process_vm_readv(getpid(), &dst, 1, liov, (unsigned long)nl, 0) != 8)
		return EFAULT;
	if (p->defer && p->peer->pid != getpid()) {
		struct vsim_words *pw = p->pend;

		if (pw->n && (!same_owner(&pw->to, p->peer) || pw->n == VSIM_MB_WORDS)) {
			rc = flush_words(p->me, pw);
			if (rc)
				return rc;
		}
		pw->to = *p->peer;
		pw->addr[pw->n] = addr;
		pw->value[pw->n++] = v;
		/* The MR stays busy until the word is stored. */
		atomic_fetch_add(&vsim_reg->mr[p->mr_slot].busy, 1);
		pw->busy[pw->nbusy++] = p->mr_slot;
		return 0;
	}
	rc = p->pend ? flush_words(p->me, p->pend) : 0;
	if (rc)
		return rc;
	if (p->peer->pid == getpid())
		return store_word(addr, v);  /* a loopback: we are the responder */
	memset(&one, 0, sizeof(one));
	one.to = *p->peer;
	one.n = 1;
	one.addr[0] = addr;
	one.value[0] = v;
	return flush_words(p->me, &one);
}

/*
 * Must the words pending go before copying [off, off+n) of this message?
 * Not for the body of a write whose own final word joins them (in order):
 * nothing may read it before that word, which is stored after theirs;
 * unless the copy overwrites one of them, which must land first.
 */
static int must_flush(const struct plan *p, uint64_t off, uint64_t n)
{
	const struct vsim_words *pw = p->pend;
	uint64_t a = p->rem[0].addr + off;
	uint32_t k;

	if (!pw || (!pw->n && !pw->ncqe))
		return 0;
	if (!p->defer || p->word == p->len || off + n > p->word)
		return 1;
	for (k = 0; k < pw->n; k++)
		if (pw->addr[k] + 8 > a && pw->addr[k] < a + n)
			return 1;
	return 0;
}

/* Moves message bytes [off, off+n): the final word, if in the range, last
 * and through the responder. */
static int move(const struct plan *p, uint64_t off, uint64_t n)
{
	uint64_t copy = off + n <= p->word || off > p->word ? n : p->word - off;
	int rc = 0;

	if (copy && must_flush(p, off, copy))
		rc = flush_words(p->me, p->pend);
	if (!rc)
		rc = xfer(p->peer->pid, p->dir, p->loc, p->nloc, p->rem, p->nrem, off, copy);
	return rc || copy == n ? rc : put_word(p);
}

static int place_torn(struct vsim_context *c, const struct plan *p, uint64_t base, uint64_t len)
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
			void *q = realloc(ch, (cap = cap ? 2 * cap : 64) * sizeof(*ch));

			if (!q) {
				free(ch);
				return ENOMEM;
			}
			ch = q;
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
		rc = move(p, ch[i].off, ch[i].end - ch[i].off);
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
static int place(struct vsim_context *c, const struct plan *p, uint64_t len, int mode)
{
	uint64_t base = p->dir == TO_PEER ? p->rem[0].addr : p->loc[0].addr;
	uint64_t tail, end, chunk = vsim_cfg.chunk;
	int rc;

	if (!len)
		return 0;
	tail = tail_offset(base, len);
	switch (mode) {
	case VSIM_PLACE_REVERSE:
		rc = move(p, tail, len - tail);
		if (rc || !tail)
			return rc;
		vsim_sleep_ns(vsim_cfg.stall_ns);
		for (end = tail; end; ) {
			uint64_t a = (base + end - 1) / chunk * chunk;
			uint64_t start = a > base ? a - base : 0;

			rc = move(p, start, end - start);
			if (rc)
				return rc;
			end = start;
		}
		return 0;
	case VSIM_PLACE_TORN:
		return place_torn(c, p, base, len);
	default:
		/* In order: the body, then the last word on its own, so the
		 * final bytes are the last to become visible. */
		rc = move(p, 0, tail);
		return rc ? rc : move(p, tail, len - tail);
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
	/* Not mapped yet, or destroyed: a new QP may have that number now.
	 * What is pending for the old one goes first (its maps go away). */
	if (flush_words(qp->ctx, &qp->pend))
		vsim_dbg("QP %u: final words were dropped", qp->ibqp.qp_num);
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
	/* Completions of earlier WRs come before the flushes. */
	if (flush_words(qp->ctx, &qp->pend))
		vsim_dbg("QP %u: final words were dropped", qp->ibqp.qp_num);
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
			 * QP goes to ERR; the requester sees the NAK. Earlier
			 * WRs' completions come first. */
			if (flush_words(c, &qp->pend))
				vsim_dbg("QP %u: final words were dropped", qp->ibqp.qp_num);
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
		struct plan p;

		mode = relaxed ? VSIM_PLACE_TORN : c->placement;
		plan_init(&p, c, &ps->h.owner, is_read ? FROM_PEER : TO_PEER, loc, nloc, rem,
			  nrem, w->length, !is_read && !is_send);
		p.pend = &qp->pend;
		/* A message that is one word has no order of its own. */
		p.defer = (mode == VSIM_PLACE_INORDER || !p.word) && nbusy;
		p.mr_slot = nbusy ? busy[0] : 0;
		rc = place(c, &p, w->length, mode);
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
	__atomic_store_n(&qp->sq_psn, (qp->sq_psn + npk) & 0xffffff, __ATOMIC_RELAXED);
	if (!delayed && have_rwqe) {
		/* After the data, final words included (post_cqe). */
		struct vsim_cqe e;

		recv_cqe(&e, ps, w->opcode, &rwqe, IBV_WC_SUCCESS, w->length, w->imm,
			 !!(w->flags & IBV_SEND_SOLICITED), qp->ibqp.qp_num,
			 vsim_port_lid(c->dev->kind, vsim_cfg.node));
		post_cqe(c, &qp->pend, rcq, &e, ps);
	}
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
	/* In delayed mode this completion comes before the data lands; else
	 * after it, final words included. */
	{
		struct vsim_cqe e;

		if (send_cqe(qp, w, IBV_WC_SUCCESS, 0, 0, &e))
			post_cqe(c, &qp->pend, qp->scq->shm, &e, NULL);
	}
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
		struct plan p;

		loc.addr = (uintptr_t)f->data;
		loc.len = f->length;
		plan_init(&p, qp->ctx, &ps->h.owner, TO_PEER, &loc, 1, rem, nrem, f->length,
			  f->opcode == IBV_WR_RDMA_WRITE ||
			  f->opcode == IBV_WR_RDMA_WRITE_WITH_IMM);
		p.pend = &qp->pend;
		p.defer = (!relaxed || !p.word) && nbusy;
		p.mr_slot = nbusy ? busy[0] : 0;
		ok = !place(qp->ctx, &p, f->length, relaxed ? VSIM_PLACE_TORN : VSIM_PLACE_INORDER);
	}
	for (i = 0; i < nbusy; i++)
		vsim_mr_unbusy(busy[i]);
	if (!ok)
		vsim_dbg("QP %u: a delayed placement into QP %u was dropped", qp->ibqp.qp_num,
			 ps->h.id);
	if (f->has_rwqe && (rcq = peer_rcq(qp, ps))) {
		/* After the data, final words included (post_cqe). */
		struct vsim_cqe e;

		recv_cqe(&e, ps, f->opcode, &f->rwqe, IBV_WC_SUCCESS, f->length, f->imm,
			 f->solicited, f->src_qpn, f->slid);
		post_cqe(qp->ctx, &qp->pend, rcq, &e, ps);
	}
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
	if (flush_words(qp->ctx, &qp->pend))
		vsim_dbg("QP %u: final words of delayed placements were dropped",
			 qp->ibqp.qp_num);
}

/* ---- the executor loop -------------------------------------------------- */

/* When the next delayed placement of this QP is due. */
static uint64_t fifo_due(const struct vsim_qp *qp, uint64_t t)
{
	return qp->fifo && qp->fifo->due_ns < t ? qp->fifo->due_ns : t;
}

/* Runs one QP as far as it can; returns when it next needs attention. */
static uint64_t qp_run(struct vsim_qp *qp)
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
	if (flush_words(qp->ctx, &qp->pend))
		vsim_dbg("QP %u: final words of delayed placements were dropped",
			 qp->ibqp.qp_num);

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

/* One pass over a QP. The final words it left pending are stored before it
 * ends: nothing waits past the pass. */
static uint64_t qp_progress(struct vsim_qp *qp)
{
	uint64_t next = qp_run(qp);

	if (flush_words(qp->ctx, &qp->pend))
		vsim_dbg("QP %u: final words were dropped (the responder is gone)",
			 qp->ibqp.qp_num);
	return next;
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
		/* Our mailbox before we sleep (its thread serves it anyway). */
		vsim_mbox_poll(c);
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
