/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The verbs provider (rdma-core libibverbs): internals shared by its files.
 *
 *   verbs_init.c  device, port and GID choice, open/connect/close, limits,
 *                 parameters, the error mapping, the ops table
 *   verbs_conn.c  queue pair state changes and the recovery protocol
 *   verbs_rma.c   registrations, handles, puts (gathered ones too),
 *                 completions, progress
 *   verbs_get.c   get: sources, getters, RDMA READ, pushed published words
 *
 * Every peer (this rank included) gets two RC queue pairs, created in open()
 * and connected in connect() from the address allgather: a data QP that
 * carries the puts, and a control QP that carries only 0-byte writes (the
 * recovery messages and liveness probes). The control QP uses no memory key,
 * so no put can break it; when a data QP fails, the two sides agree over it
 * on a new epoch, from which both derive the new PSNs. Both kinds share one
 * send CQ, one shared receive queue and one receive CQ.
 *
 * Credit (DESIGN §7): every rank registers one credit area of nranks x
 * CREDIT_WORDS 8-byte words for remote write and publishes its address and
 * rkey with its QPNs. A receiver returns credit with an 8-byte RDMA WRITE on
 * the data QP to the sender, into word [receiver * CREDIT_WORDS + index].
 *
 * Get (DESIGN §7, verbs_get.c): every rank also registers a get area of
 * nranks x VRB_GET_SLOTS words for remote write, published likewise. A
 * source pushes its published word into a slot of the getter's area that
 * the source's rank allocates (word [source rank * VRB_GET_SLOTS + slot]),
 * so that the getter's peek is a load; the getter pulls the data with RDMA
 * READ and writes the taken word into the source's control words.
 */
#ifndef DCHAN_VERBS_H
#define DCHAN_VERBS_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider.h"

#define VRB_NAME "verbs"

/* Receives posted to the SRQ in one call. */
#define VRB_SRQ_BATCH 16
/* Send CQ entries polled in one call. */
#define VRB_POLL 32
/* Control QP send queue depth: a recovery message and a probe at most are
 * outstanding per epoch; the rest is slack. */
#define VRB_CTL_DEPTH 8
/* A side whose data QP failed without its own error waits this long for
 * the peer's RESYNC before it starts the recovery itself. */
#define VRB_PASSIVE_NS 1000000000ull

/* wr_id of a send WR: bit 63 tells control WRs, bits 40..62 the connection,
 * bits 0..39 the data WR sequence number (or the control WR kind). */
#define VRB_WRID_CTL (1ull << 63)
#define VRB_WRID_SEQ_BITS 40
#define VRB_WRID_SEQ_MASK ((1ull << VRB_WRID_SEQ_BITS) - 1)
enum { VRB_CTL_WR_MSG = 1, VRB_CTL_WR_PROBE = 2 };

/* SGEs per WR asked of a QP at most (gathered puts): every WQE slot of the
 * send queue is sized for it, on two QPs per peer, so more costs memory at
 * scale for little (a WR more per 8 segments). And slots per peer in the
 * get area (live sources from one rank to another at once). */
#define VRB_MAX_SGE 8
#define VRB_GET_SLOTS 128
/* A pushed word is (serial << 32) | count; this count says "destroyed". */
#define VRB_GET_GONE 0xffffffffu

/* Control messages: the type in the top byte of the immediate, the low 24
 * bits of an epoch below it. */
enum { VRB_MSG_RESYNC = 1, VRB_MSG_READY = 2 };

/* A connection's state (see verbs_conn.c for the protocol). */
enum vrb_cstate {
    VRB_UP,    /* data QP in RTS at 'epoch' and the peer's too */
    VRB_DRAIN, /* data QP in ERR: waiting for its WRs to complete */
    VRB_WAIT,  /* rebuilt at 'epoch', RESYNC sent, waiting for the peer */
    VRB_DEAD   /* the peer is unreachable: DCHAN_ERR_PEER for good */
};

/* What one posted data WR belongs to. */
enum {
    VRB_WR_PUT = 0,
    VRB_WR_CREDIT = 1,
    VRB_WR_GET = 2,  /* a getter's RDMA READ of the source's buffer */
    VRB_WR_GACK = 3, /* a getter's write of the taken word */
    VRB_WR_PUSH = 4  /* a source's write of its published word (h NULL, slot in last) */
};
struct vrb_wrrec {
    dchan_handle_t *h; /* NULL: nothing to report (detached, or a marker) */
    uint32_t last;     /* PUT, GET: the last WR, its completion completes the operation;
                        * CREDIT: the core waits for dchan_core_credit_done; PUSH: the slot */
    uint32_t kind;     /* VRB_WR_*; h is a send handle for PUT, a receive one for CREDIT,
                        * a getter for GET and GACK */
};

struct vrb_state;

struct vrb_conn {
    struct vrb_state *s;
    int peer;
    uint32_t idx;
    struct ibv_qp *qp;  /* data */
    struct ibv_qp *ctl; /* control */
    uint32_t rqpn, rctl; /* the peer's data and control QPs for this rank */
    struct ibv_ah_attr ah;
    enum ibv_mtu mtu;
    bool in_order; /* RDMA WRITEs into this QP land in address order */

    uint8_t state;   /* enum vrb_cstate */
    bool initiator;  /* this side starts the recovery (it saw a real error) */
    bool peer_ready; /* the peer rebuilt at 'target' already (its RESYNC came) */
    uint32_t epoch;  /* of the data QP's current incarnation */
    uint32_t target; /* DRAIN: the epoch to rebuild at */
    uint64_t drain_ns;

    /* Data send queue: WRs [retired, posted) are outstanding. since_sig
     * counts the WRs posted after the last signalled one: while it is not 0
     * the newest WRs retire only with a later signalled WR. */
    uint64_t posted, retired;
    uint32_t since_sig;
    struct vrb_wrrec *ring;
    /* Puts flushed by a failure that was not theirs, re-issued in order
     * once the connection is up again. */
    dchan_handle_t *redo_head, *redo_tail;
    /* Receive handles from this peer whose credit word must be (re)written
     * once the data QP is up and has room (value in their vrb_rh). */
    dchan_handle_t *cred_head;

    /* The peer's credit area: where this rank's words start, how many
     * there are (the peer's CREDIT_WORDS), its key. */
    uint64_t craddr;
    uint32_t rcw, crkey;

    /* Control QP. */
    uint32_t ctl_out;   /* WRs not completed */
    uint32_t ctl_msg;   /* message waiting for room (immediate, host order), 0: none */
    bool probing;       /* a probe is outstanding */
    bool seen;          /* a sign of life since the last probe round */
    uint64_t alive_ns;  /* when the peer was last known alive */
    uint32_t nrecv;     /* receive handles from this peer (probed when silent) */
    uint32_t ncredit;   /* credited send handles to it (they wait on it too) */
    uint32_t nget;      /* sources for it and getters from it (they wait on it too) */

    /* Get, source side: this rank's slots in the peer's get area (address
     * of slot 0, key), which are in use, which must be written (again)
     * from gval, and the serial of the next source for this peer. */
    uint64_t garaddr;
    uint32_t grkey;
    uint32_t gserial, gnext;
    uint64_t gused[VRB_GET_SLOTS / 64], gpend[VRB_GET_SLOTS / 64];
    uint64_t *gval; /* VRB_GET_SLOTS words of s->gstage */
    /* Get, getter side: getters whose READ or taken word waits for the
     * connection (rebuilding, or a full send queue). */
    dchan_handle_t *get_head;
    /* RDMA READs this side may have outstanding towards the peer (the
     * smaller of its initiator limit and the peer's responder limit). */
    uint8_t rd_atom;

    struct vrb_conn *att_next; /* on the attention list */
    bool on_att;
};

struct vrb_state {
    struct dchan_prov *p;
    const struct dchan_params *pv; /* validated by dchan_init (or the probe's) */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *scq, *rcq;
    struct ibv_comp_channel *wch; /* wake-up: both CQs report to it once armed */
    struct ibv_srq *srq;
    struct ibv_device_attr dev;
    struct ibv_port_attr port;
    uint8_t port_num;
    int gid_index;
    union ibv_gid gid;
    bool roce;
    char devname[64];
    int rank, nranks;
    struct vrb_conn *conns;

    /* Limits, from the device and the parameters. */
    uint32_t sq_depth;  /* granted by ibv_create_qp */
    uint32_t sq_usable; /* WRs a put may find outstanding: one slot kept for a marker */
    uint32_t sig_every; /* a signalled WR at least this often */
    uint32_t srq_depth;
    uint32_t max_inline;
    uint64_t max_msg;
    uint64_t event_split;
    uint8_t timeout, retry_cnt, min_rnr, sl, tclass;
    bool trust_in_order;
    uint64_t keepalive_ns;
    int fatal; /* a device-wide failure: progress returns it */

    uint32_t srq_owed; /* receives consumed and not posted again */

    /* This rank's credit area: nranks x cw words, word [r * cw + i] written
     * by rank r only. Without inline data, credit writes are sent from
     * cstage (the same layout, indexed by sender), registered for local use. */
    uint64_t *carea, *cstage;
    struct ibv_mr *carea_mr, *cstage_mr;
    size_t carea_len;
    uint32_t cw;

    /* Get: this rank's get area (word [r * VRB_GET_SLOTS + i] written by
     * rank r only) and the staging copy of the words it pushes (the same
     * layout, indexed by getter), registered for local use. */
    uint64_t *garea, *gstage;
    struct ibv_mr *garea_mr, *gstage_mr;
    size_t garea_len;
    uint8_t rd_init, rd_resp; /* max_qp_init_rd_atom, max_qp_rd_atom (capped) */

    /* Local QPN -> connection index * 2 + (1 for the control QP). */
    uint32_t *qpn_key, *qpn_val;
    uint32_t qpn_mask;

    /* Scratch for building one put, sized for the largest: WR n uses
     * sge[n * max_sge ...]. */
    struct ibv_send_wr *wr;
    struct ibv_sge *sge;
    uint32_t wr_cap;
    uint32_t max_sge; /* SGEs per send WR, as every data QP granted */

    struct vrb_conn *att_head; /* connections that need progress to act */
    uint32_t tick, ka_cursor;
    unsigned char *addr;
};

/* Per-handle state kept in the core's handle (DCHAN_PROV_PRIV). */
enum { VRB_PUT_IDLE, VRB_PUT_POSTED, VRB_PUT_REDO };

struct vrb_sh {
    struct vrb_conn *c;
    struct dchan_reg *reg, *seq_reg;
    uint64_t raddr, seq_raddr;
    uint64_t roff; /* the put in flight: its slot's offset in the receive buffer */
    uint32_t rkey, seq_rkey, lkey, seq_lkey;
    uint32_t imm; /* the receiver's handle id, network order */
    bool in_order; /* SENTINEL: one write suffices (the receiver said so) */
    uint8_t state;
    int rc; /* this put's own failure, reported at its last WR */
    /* The put in flight, to re-issue it after a recovery. */
    const void *src;
    size_t size;
    const uint64_t *seq_src;
    int detect;
    dchan_handle_t *redo_next;
    /* A gathered send side (dchan_assoc_local_iov/_subarray); NULL otherwise. */
    struct vrb_gather *g;
};

/* A gathered send side: its segments, the local key of each, and what
 * registered them. A layout that needs more WRs than the send queue holds
 * is gathered into 'stage' and sent as a contiguous put instead. */
struct vrb_gather {
    const dchan_iov_t *seg;
    size_t nseg;
    uint32_t *lkey;
    struct dchan_reg **reg;
    size_t nreg;
    uint64_t tail; /* SENTINEL: the gathered tail, sent as one 8-byte write */
    struct dchan_reg *tail_reg; /* where the tail cannot go inline */
    void *stage;
    struct dchan_reg *stage_reg;
};

/* Get: a source's and a getter's state (verbs_get.c). */
struct vrb_src {
    struct vrb_conn *c;
    struct ibv_mr *mr, *cmr; /* the buffer (remote read), the control words */
    uint32_t slot, serial;
};

struct vrb_gh {
    struct vrb_conn *c;
    struct ibv_mr *mr; /* the getter's buffer, local write */
    uint64_t raddr, caddr;
    uint32_t rkey, ckey;
    uint32_t slot, serial;
    uint64_t ack;      /* the taken word to write (also: the last one taken) */
    uint64_t *ackw;    /* without inline data: where it is sent from, */
    struct ibv_mr *ackmr; /* registered for local use */
    size_t rpos;       /* bytes of the READ posted so far */
    uint32_t out;      /* its WRs posted and not retired */
    bool flushed;      /* one of them was flushed: read again once rebuilt */
    bool seen;         /* the source's own serial appeared in the slot */
    bool reading;      /* a READ is posted */
    bool want_read;    /* a READ waits for the connection */
    bool want_ack;     /* the taken word waits for the connection */
    bool queued;       /* on c->get_head */
    int rc;            /* the READ's own failure, reported at its last WR */
    dchan_handle_t *next;
};

struct vrb_rh {
    struct vrb_conn *c;
    struct dchan_reg *reg, *seq_reg;
    /* Credit: the newest value handed to credit_write and its word. */
    uint64_t cval;
    uint32_t cidx;
    bool owed;   /* credit_write returned DCHAN_SUCCESS: dchan_core_credit_done is due */
    bool queued; /* on c->cred_head */
    dchan_handle_t *cnext;
};

/* verbs_init.c */
enum { VRB_ERRNO, VRB_WC };
/* The one mapping of native failures (an errno value, or an ibv_wc_status)
 * to DCHAN_ERR_*; logs the native detail with 'what'. */
int dchan_verbs_rc(struct vrb_state *s, int kind, int value, const char *what);
uint64_t dchan_verbs_now(void);
bool dchan_verbs_qpn_lookup(const struct vrb_state *s, uint32_t qpn, struct vrb_conn **c,
                            bool *ctl);

/* verbs_conn.c */
int dchan_verbs_qp_connect(struct vrb_state *s, struct vrb_conn *c, struct ibv_qp *qp,
                           uint32_t rqpn, uint32_t epoch);
int dchan_verbs_conn_start(struct vrb_state *s, struct vrb_conn *c);
void dchan_verbs_att(struct vrb_state *s, struct vrb_conn *c);
void dchan_verbs_data_failed(struct vrb_state *s, struct vrb_conn *c, bool own_error);
void dchan_verbs_ctl_recv(struct vrb_state *s, struct vrb_conn *c, uint32_t imm);
void dchan_verbs_ctl_flush(struct vrb_state *s, struct vrb_conn *c);
void dchan_verbs_conn_dead(struct vrb_state *s, struct vrb_conn *c, int rc);
void dchan_verbs_advance(struct vrb_state *s);
void dchan_verbs_async(struct vrb_state *s);
void dchan_verbs_keepalive(struct vrb_state *s);

/* verbs_rma.c */
int dchan_verbs_post_put(struct vrb_state *s, dchan_handle_t *h);
void dchan_verbs_put_resolve(struct vrb_state *s, dchan_handle_t *h, int rc);
int dchan_verbs_poll_recv(struct vrb_state *s);
int dchan_verbs_poll_send(struct vrb_state *s);
void dchan_verbs_srq_fill(struct vrb_state *s, bool top_up);
bool dchan_verbs_seal(struct vrb_state *s, struct vrb_conn *c, uint32_t limit);
void dchan_verbs_credit_redo(struct vrb_state *s, struct vrb_conn *c);
void dchan_verbs_credit_dead(struct vrb_state *s, struct vrb_conn *c, int rc);
int dchan_verbs_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access, void **mr);
void dchan_verbs_mr_dereg(struct dchan_prov *p, void *mr);
int dchan_verbs_recv_open(dchan_handle_t *h, unsigned char *wire_fields);
void dchan_verbs_recv_close(dchan_handle_t *h);
int dchan_verbs_send_open(dchan_handle_t *h, const unsigned char *wire_fields);
int dchan_verbs_put(dchan_handle_t *h, const struct dchan_put_desc *d);
void dchan_verbs_put_abandon(dchan_handle_t *h);
void dchan_verbs_send_close(dchan_handle_t *h);
int dchan_verbs_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word);
void dchan_verbs_credit_close(dchan_handle_t *h);
int dchan_verbs_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src);
int dchan_verbs_progress(struct dchan_prov *p);
int dchan_verbs_wake_fd(struct dchan_prov *p, int *fd);
int dchan_verbs_wake_arm(struct dchan_prov *p);

/* verbs_get.c */
extern const struct dchan_get_ops dchan_verbs_get_ops;
/* A GET, GACK or PUSH WR retired: ok, failed with its own error err, or
 * flushed (neither). */
void dchan_verbs_get_cqe(struct vrb_state *s, struct vrb_conn *c, struct vrb_wrrec *r, bool ok,
                         int err);
/* The connection is up: post what waited (pushes, READs, taken words). */
void dchan_verbs_get_redo(struct vrb_state *s, struct vrb_conn *c);
bool dchan_verbs_get_pending(const struct vrb_conn *c);
/* The peer is gone: fail what waits or is posted. */
void dchan_verbs_get_dead(struct vrb_state *s, struct vrb_conn *c, int rc);
/* Immediate data of the last WRITE of a SENTINEL or FLAG put and of a
 * credit write: names no handle (no id is 0), only makes a receive
 * completion, which wakes a peer asleep on its completion channel. */
#define VRB_IMM_QUIET 0u

#endif /* DCHAN_VERBS_H */
