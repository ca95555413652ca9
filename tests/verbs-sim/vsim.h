/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * verbs-sim: a test-only, user-space libibverbs.so.1 that emulates RC queue
 * pairs between processes of one machine. See README.md for the model.
 *
 * Internal header. Objects come in two halves:
 *  - a process-local half that embeds the public ibv_* struct the caller
 *    sees (struct vsim_qp embeds struct ibv_qp, ...);
 *  - a shared half in a file of the fabric directory (QP, CQ, SRQ) or a
 *    slot of the fabric registry (contexts, MRs), which other processes map
 *    so that they can deliver data, receive completions and errors.
 *
 * Lock order (never take an earlier lock while holding a later one):
 *   vsim_context.lock  ->  vsim_qp.sq_lock
 *   vsim_context.lock  ->  one QP shm lock  ->  SRQ shm lock  ->  CQ shm lock
 *                                            ->  registry lock
 * At most one QP shm lock is held at a time, so two executors working on
 * the two ends of a connection cannot deadlock.
 *
 * A requester hands the final word of an RDMA WRITE to the responder's
 * process (struct vsim_mbox) and waits for it while holding ctx->lock and
 * the responder QP's shm lock. Serving a mailbox (vsim_exec.c: svc_main,
 * the context's own thread for it, and vsim_mbox_poll) takes no lock at
 * all, so the wait cannot close a cycle, whatever the responder's other
 * threads are blocked on.
 */
#ifndef DCHAN_VSIM_H
#define DCHAN_VSIM_H

#include <infiniband/verbs.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/uio.h>

#define VSIM_EXPORT __attribute__((visibility("default")))

/* Device limits (reported by ibv_query_device and enforced). */
enum {
	VSIM_MAX_CTX = 256,       /* open contexts in one fabric */
	VSIM_MAX_MR = 16384,      /* registered MRs in one fabric */
	VSIM_MAX_SGE = 16,
	VSIM_MAX_INLINE = 256,
	VSIM_MAX_QP_WR = 16384,
	VSIM_MAX_CQE = 65535,
	VSIM_MAX_RD_ATOM = 16,
	VSIM_MAX_QP = 1 << 16,
	VSIM_MAX_CQ = 1 << 16,
	VSIM_MAX_SRQ = 1 << 12,
	VSIM_MAX_PD = 1 << 16,
	VSIM_GID_TBL_LEN = 2,     /* RoCE: link-local + IPv4-mapped; IB: 1 used */
	VSIM_MAX_MSG = 1U << 31,
};

enum vsim_placement {
	VSIM_PLACE_INORDER,
	VSIM_PLACE_REVERSE,
	VSIM_PLACE_TORN,
	VSIM_PLACE_DELAYED,
};

enum vsim_devkind {
	VSIM_DEV_IB = 0,
	VSIM_DEV_ROCE = 1,
};

/* Settings read once from the environment (see README.md). */
struct vsim_config {
	enum vsim_placement placement;
	uint64_t stall_ns;        /* pause after an early tail (reverse, torn) */
	uint64_t delay_ns;        /* lag of placement (delayed) */
	size_t chunk;             /* placement granularity */
	uint64_t seed;
	unsigned node;            /* simulated host: LID node+1, GIDs */
	uint32_t max_sge;         /* SGEs per WR the devices offer (<= VSIM_MAX_SGE) */
	int debug;
	int ndev;
	enum vsim_devkind devs[2];
	char fabric[80];
	char dir[PATH_MAX];       /* fabric directory */
};
extern struct vsim_config vsim_cfg;
void vsim_config_load(void);

#define vsim_log(...) vsim_log_impl(0, __VA_ARGS__)
#define vsim_dbg(...) do { if (vsim_cfg.debug) vsim_log_impl(1, __VA_ARGS__); } while (0)
void vsim_log_impl(int debug, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

uint64_t vsim_now_ns(void);
void vsim_sleep_ns(uint64_t ns);

/* ---- the fabric registry (one shared file per fabric) ------------------- */

struct vsim_owner {
	int32_t pid;
	uint32_t ctx_slot;
	uint32_t ctx_gen;
	uint32_t pad;
	uint64_t starttime;       /* guards against pid reuse */
};

/*
 * One hand-off of the final aligned words of RDMA WRITEs (one, or those of
 * a body and the flag after it) to the responder's process, which stores
 * each whole, in order (see vsim_exec.c). 'word' is the futex
 * word: a ticket, bumped by every claim, and the phase below; every change
 * is a compare-and-swap on the exact (ticket, phase), so a party that gave
 * up on an entry can never disturb its next use.
 */
enum {
	VSIM_MB_FREE,             /* claimable */
	VSIM_MB_CLAIMED,          /* a requester is filling it */
	VSIM_MB_FULL,             /* waiting for the servicer */
	VSIM_MB_BUSY,             /* the servicer is storing */
	VSIM_MB_DONE,             /* stored (or refused: result); the requester frees it */
	VSIM_MB_PHASE_BITS = 3,
	VSIM_MBOX_SLOTS = 8,      /* hand-offs in flight towards one context */
	VSIM_MB_WORDS = 8,        /* words in one hand-off, stored in order */
};
#define VSIM_MB_WORD(ticket, phase) (((uint32_t)(ticket) << VSIM_MB_PHASE_BITS) | (phase))
#define VSIM_MB_TICKET(w) ((uint32_t)(w) >> VSIM_MB_PHASE_BITS)
#define VSIM_MB_PHASE(w) ((uint32_t)(w) & ((1U << VSIM_MB_PHASE_BITS) - 1))

struct vsim_mbox {
	_Atomic uint32_t word;
	_Atomic uint32_t gen;     /* the context generation it is meant for */
	_Atomic uint32_t n;       /* words */
	_Atomic int32_t result;   /* 0, or EFAULT: a page is not mapped */
	_Atomic uint32_t sleeper; /* the requester sleeps on 'word': wake it */
	_Atomic int32_t req_pid;  /* the requester, to reclaim a dead one's entry */
	_Atomic uint64_t req_start;
	_Atomic uint64_t addr[VSIM_MB_WORDS];   /* aligned addresses in the responder */
	_Atomic uint64_t value[VSIM_MB_WORDS];
};

struct vsim_ctx_slot {
	uint32_t used;
	uint32_t gen;
	struct vsim_owner owner;
	_Atomic uint32_t doorbell;  /* futex word: wakes the context's executor */
	_Atomic uint32_t mbox_bell; /* futex word: wakes the mailbox servicer */
	_Atomic uint32_t serving;   /* the mailbox servicer runs */
	_Atomic uint32_t svc_asleep; /* ... and sleeps on mbox_bell: wake it */
	_Atomic uint64_t handoffs;  /* words stored for requesters (debug) */
	struct vsim_mbox mbox[VSIM_MBOX_SLOTS];
};

struct vsim_mr_slot {
	uint32_t used;
	uint32_t key;             /* lkey == rkey */
	struct vsim_owner owner;
	uint64_t pd_id;
	uint64_t addr;            /* virtual address in the owner */
	uint64_t length;
	uint64_t iova;            /* what lkeys/rkeys address */
	uint32_t access;
	_Atomic uint32_t busy;    /* placements in progress (dereg waits) */
};

struct vsim_registry {
	uint64_t magic;
	uint64_t nonce;           /* names this fabric's sockets */
	pthread_mutex_t lock;     /* robust, process-shared */
	uint32_t next_qpn;
	uint32_t next_obj;
	uint32_t next_chan;
	uint32_t mr_hint;
	uint64_t next_pd;
	uint32_t mr_tag;
	uint32_t pad;
	struct vsim_ctx_slot ctx[VSIM_MAX_CTX];
	struct vsim_mr_slot mr[VSIM_MAX_MR];
};

extern struct vsim_registry *vsim_reg;
int vsim_fabric_attach(void);
void vsim_lock(pthread_mutex_t *m);
void vsim_unlock(pthread_mutex_t *m);
int vsim_mutex_init_shared(pthread_mutex_t *m);
void vsim_self_owner(struct vsim_owner *o);
int vsim_owner_alive(const struct vsim_owner *o);
void vsim_sweep_dead(void);
void vsim_ring(uint32_t ctx_slot, uint32_t ctx_gen);

/* ---- shared objects (one file each in the fabric directory) ------------- */

enum { VSIM_OBJ_QP = 1, VSIM_OBJ_CQ = 2, VSIM_OBJ_SRQ = 3 };

struct vsim_shm_hdr {
	uint64_t magic;
	uint32_t kind;
	uint32_t id;              /* QPN, or CQ/SRQ id */
	_Atomic uint32_t destroyed;
	uint32_t pad;
	struct vsim_owner owner;
	pthread_mutex_t lock;
};

/* A completion as stored in a CQ ring. */
struct vsim_cqe {
	struct ibv_wc wc;
	uint64_t sq_qp;           /* send CQEs: the local struct vsim_qp * */
	uint32_t sq_retire;       /* send queue slots this CQE frees */
	uint32_t solicited;
};

struct vsim_cq_shm {
	struct vsim_shm_hdr h;
	uint32_t cap;
	uint32_t head;
	_Atomic uint32_t count;
	uint32_t armed;           /* 0, 1 = next, 2 = next solicited */
	uint32_t chan_id;         /* 0: no completion channel */
	_Atomic uint32_t overflow;
	struct vsim_cqe ring[];
};

/* A receive work request as stored in a RQ or SRQ ring. */
struct vsim_rwqe {
	uint64_t wr_id;
	uint32_t num_sge;
	uint32_t pad;
	struct ibv_sge sge[VSIM_MAX_SGE];
};

struct vsim_srq_shm {
	struct vsim_shm_hdr h;
	uint64_t pd_id;
	uint32_t cap;
	uint32_t max_sge;
	uint32_t head;
	uint32_t count;
	uint32_t limit;           /* armed SRQ limit, 0 = not armed */
	uint32_t pad;
	struct vsim_rwqe ring[];
};

struct vsim_qp_shm {
	struct vsim_shm_hdr h;
	/* Where the QP lives: its port's addresses derive from these. */
	uint32_t dev_kind;
	uint32_t node;
	_Atomic uint32_t state;   /* enum ibv_qp_state */
	uint32_t epoch;           /* bumped by every reset */
	uint32_t access;          /* qp_access_flags */
	uint32_t srq_id;          /* 0: own receive queue */
	uint64_t pd_id;
	uint32_t recv_cq_id;
	/* Responder side, set at RTR. */
	uint32_t dest_qpn;
	uint32_t path_mtu;
	uint32_t rq_psn;
	uint32_t min_rnr_timer;
	uint16_t dlid;
	uint8_t is_global;
	uint8_t pad;
	union ibv_gid dgid;
	/* The receive queue (unused with an SRQ). */
	uint32_t rq_cap;
	uint32_t rq_max_sge;
	uint32_t rq_head;
	uint32_t rq_count;
	struct vsim_rwqe rq[];
};

/* A mapping of one shared object file. */
struct vsim_map {
	void *addr;
	size_t len;
	uint32_t id;
};

int vsim_obj_create(int kind, uint32_t id, size_t len, struct vsim_map *m);
void vsim_obj_publish(struct vsim_map *m);
int vsim_obj_open(int kind, uint32_t id, struct vsim_map *m);
void vsim_obj_unlink(int kind, uint32_t id);
void vsim_map_release(struct vsim_map *m);
uint32_t vsim_alloc_qpn(void);
uint32_t vsim_alloc_obj_id(void);

/* Port addressing, derived from (device kind, node). */
uint16_t vsim_port_lid(enum vsim_devkind kind, unsigned node);
int vsim_port_gid(enum vsim_devkind kind, unsigned node, unsigned index,
		  union ibv_gid *gid);

/* ---- process-local objects ---------------------------------------------- */

struct vsim_device {
	struct ibv_device ibdev;
	enum vsim_devkind kind;
	int index;
	uint64_t guid;
};

struct vsim_qp;
struct vsim_cq;
struct vsim_srq;

struct vsim_context {
	struct verbs_context vctx;     /* ibv_context is its last member */
	struct vsim_device *dev;
	uint32_t slot, gen;            /* registry context slot */
	pthread_mutex_t lock;          /* object lists; held by the executor */
	struct vsim_qp *qps;
	struct vsim_cq *cqs;
	struct vsim_srq *srqs;
	pthread_t exec;
	int exec_started;
	atomic_int stop;
	pthread_t svc;                 /* serves the mailbox (hand-offs) */
	int svc_started;
	atomic_int svc_stop;
	atomic_uint mbox_seen;         /* mailbox bell at the last vsim_mbox_poll */
	uint64_t rng;
	int placement;
	struct vsim_context *next;     /* all open contexts of the process */
};

struct vsim_pd {
	struct ibv_pd ibpd;
	uint64_t id;
	atomic_int refs;
};

struct vsim_mr {
	struct ibv_mr ibmr;
	uint32_t slot;
	uint64_t pinned;
};

struct vsim_cq {
	struct ibv_cq ibcq;
	struct vsim_map map;
	struct vsim_cq_shm *shm;
	atomic_int refs;               /* QPs using it */
	uint32_t comp_delivered;
	uint32_t async_delivered;
	struct vsim_cq *next;
};

struct vsim_channel {
	struct ibv_comp_channel ch;
	uint32_t id;
	atomic_int refs;
};

struct vsim_srq {
	struct ibv_srq ibsrq;
	struct vsim_map map;
	struct vsim_srq_shm *shm;
	atomic_int refs;
	uint32_t max_wr;
	uint32_t async_delivered;
	struct vsim_srq *next;
};

/* A send work request, copied at post time. */
struct vsim_swqe {
	uint64_t wr_id;
	uint32_t opcode;               /* enum ibv_wr_opcode */
	uint32_t flags;                /* enum ibv_send_flags */
	uint32_t imm;                  /* network order, as posted */
	uint32_t rkey;
	uint64_t raddr;
	uint64_t length;
	uint32_t num_sge;
	uint32_t is_inline;
	struct ibv_sge sge[VSIM_MAX_SGE];
	uint8_t inl[VSIM_MAX_INLINE];
};

/*
 * Final words of RDMA WRITEs for one responder, not stored yet, and the
 * completions that must wait for them (vsim_exec.c).
 */
enum { VSIM_PEND_CQES = 2 * VSIM_MB_WORDS };
struct vsim_words {
	struct vsim_owner to;
	uint32_t n, nbusy, ncqe;
	uint64_t addr[VSIM_MB_WORDS];
	uint64_t value[VSIM_MB_WORDS];
	uint32_t busy[VSIM_MB_WORDS];  /* MR slots held busy until then */
	struct vsim_cqe cqe[VSIM_PEND_CQES];
	struct vsim_cq_shm *cq[VSIM_PEND_CQES];
	struct vsim_qp_shm *recv_of[VSIM_PEND_CQES];  /* receive CQEs: the responder QP */
};

/* A delayed placement: acknowledged to the requester, not yet landed. */
struct vsim_inflight {
	struct vsim_inflight *next;
	uint64_t due_ns;
	uint32_t opcode;
	uint32_t imm;
	uint32_t solicited;
	uint32_t src_qpn;
	uint16_t slid;
	uint32_t rkey;
	uint64_t raddr;
	uint64_t length;
	int has_rwqe;
	struct vsim_rwqe rwqe;
	unsigned char *data;           /* snapshot taken at transmission */
};

struct vsim_qp {
	struct ibv_qp ibqp;
	struct vsim_context *ctx;
	struct vsim_map map;
	struct vsim_qp_shm *shm;
	struct vsim_cq *scq, *rcq;
	struct vsim_srq *srq;
	struct vsim_pd *pd;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	/* Requester attributes. */
	uint8_t port_num;
	uint16_t pkey_index;
	uint8_t timeout, retry_cnt, rnr_retry;
	uint8_t max_rd_atomic, max_dest_rd_atomic;
	uint32_t sq_psn;          /* the executor advances it: atomic accesses */
	struct ibv_ah_attr ah;
	/* The send queue: slots [retired, tail) are in use; [exec, tail) wait. */
	pthread_mutex_t sq_lock;
	struct vsim_swqe *sq;
	uint32_t sq_cap;
	uint32_t tail, exec;
	atomic_uint outstanding;       /* posted and not yet retired by a poll */
	uint32_t unsignaled;           /* executed since the last send CQE */
	/* Retry state of the WQE at 'exec'. */
	uint64_t next_try_ns;
	uint64_t first_try_ns;
	uint32_t retries, rnr_retries;
	/* Delayed placements, in posting order. */
	struct vsim_inflight *fifo, *fifo_tail;
	/* Final words placed in this executor pass and not stored yet. */
	struct vsim_words pend;
	/* The connected peer, mapped on first use. */
	struct vsim_map peer;
	struct vsim_map peer_rcq;
	struct vsim_map peer_srq;
	uint32_t async_delivered;
	struct vsim_qp *next;
};

static inline struct vsim_context *to_vctx(struct ibv_context *c)
{
	return (struct vsim_context *)((char *)c - offsetof(struct vsim_context, vctx.context));
}
#define VSIM_CONTAINER(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define to_vqp(p) VSIM_CONTAINER(p, struct vsim_qp, ibqp)
#define to_vcq(p) VSIM_CONTAINER(p, struct vsim_cq, ibcq)
#define to_vpd(p) VSIM_CONTAINER(p, struct vsim_pd, ibpd)
#define to_vmr(p) VSIM_CONTAINER(p, struct vsim_mr, ibmr)
#define to_vsrq(p) VSIM_CONTAINER(p, struct vsim_srq, ibsrq)
#define to_vch(p) VSIM_CONTAINER(p, struct vsim_channel, ch)

/* Devices and contexts (vsim_device.c). */
extern pthread_mutex_t vsim_proc_lock;
extern struct vsim_context *vsim_contexts;
int vsim_query_port_full(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a);

/* Memory (vsim_mr.c). */
struct vsim_mr_ref {
	uint32_t slot;
	uint64_t va;              /* translated start address in the owner */
	uint32_t access;
};
enum { VSIM_KEY_OK, VSIM_KEY_BAD };
int vsim_mr_lookup(uint32_t key, const struct vsim_owner *owner, uint64_t pd_id,
		   uint64_t iova, uint64_t len, unsigned need, int mark_busy,
		   struct vsim_mr_ref *ref);
void vsim_mr_unbusy(uint32_t slot);

/* Completion queues, channels, async events (vsim_cq.c). */
int vsim_cq_push(struct vsim_cq_shm *cq, const struct vsim_cqe *e);
void vsim_cq_clean(struct vsim_cq_shm *cq, uint32_t qpn);
int vsim_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc);
int vsim_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
int vsim_async_socket(uint32_t slot, uint32_t gen);
void vsim_async_post(uint32_t ctx_slot, uint32_t ctx_gen, int type, uint32_t id);

/* Queue pairs and SRQs (vsim_qp.c). */
int vsim_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int vsim_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int vsim_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
void vsim_qp_shm_enter_error(struct vsim_qp_shm *s, struct vsim_cq_shm *rcq,
			     int async_type);
int vsim_rq_pop(struct vsim_qp_shm *qs, struct vsim_srq_shm *srq, struct vsim_rwqe *out);
void vsim_flush_sq_locked(struct vsim_qp *qp);
void vsim_qp_drop_work(struct vsim_qp *qp);
int vsim_context_release_objects(struct vsim_context *c);
void vsim_cq_free(struct vsim_cq *q);

/* The executor (vsim_exec.c). */
int vsim_exec_start(struct vsim_context *ctx);
void vsim_exec_stop(struct vsim_context *ctx);
void vsim_exec_kick(struct vsim_context *ctx);
void vsim_mbox_reset(struct vsim_ctx_slot *s);
void vsim_mbox_poll(struct vsim_context *ctx);
int vsim_svc_start(struct vsim_context *ctx);
void vsim_svc_stop(struct vsim_context *ctx);
void vsim_fifo_land_all(struct vsim_qp *qp);
void vsim_send_cqe(struct vsim_qp *qp, const struct vsim_swqe *w, enum ibv_wc_status st,
		   uint32_t vendor_err, int force);

#endif
