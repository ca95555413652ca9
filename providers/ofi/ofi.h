/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * ofi provider internals, shared by ofi_init.c (selection, endpoint,
 * progress), ofi_mr.c (registrations and the wire's remote-access fields)
 * and ofi_rma.c (channels and puts).
 */
#ifndef DCHAN_OFI_H
#define DCHAN_OFI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "provider.h"

#define OFI_NAME "ofi"
/* The libfabric API this provider is written against: mr_mode bits (1.5). */
#define OFI_API_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)

extern const struct dchan_provider_ops dchan_ofi_ops;

/* The libfabric functions dchan calls directly, loaded at first use
 * (ofi_dl.c); the rest of libfabric's API is inline calls through the
 * function tables of its objects. */
struct dchan_ofi_fns {
    __typeof__(fi_getinfo) *getinfo;
    __typeof__(fi_freeinfo) *freeinfo;
    __typeof__(fi_dupinfo) *dupinfo;
    __typeof__(fi_fabric) *fabric;
    __typeof__(fi_strerror) *strerror;
    __typeof__(fi_version) *version;
};
extern struct dchan_ofi_fns dchan_ofi_fn;
/* Loads libfabric once per process; 0, or -1 with *why saying what failed.
 * The first context to ask (ctx may be NULL) logs the signals put back. */
int dchan_ofi_load(const dchan_ctx_t *ctx, const char **why);
/* fi_strerror (where libfabric is loaded). */
const char *dchan_ofi_strerror(int fi_err);

/* How the last write of a put is ordered after the others (DESIGN §3). */
enum ofi_order {
    OFI_ORD_STREAM = 1, /* the provider guarantees it: issue back to back */
    OFI_ORD_FENCE,      /* FI_FENCE | FI_DELIVERY_COMPLETE on the last write */
    OFI_ORD_COMPLETION  /* FI_DELIVERY_COMPLETE on the others, last one after */
};

/* A registration, as handed to the core's registration cache. */
struct ofi_mr {
    struct fid_mr *mr; /* NULL once closed by ofi_close */
    void *desc;        /* fi_mr_desc, for FI_MR_LOCAL */
    uint64_t key;      /* remote key (not FI_MR_RAW) */
    uint64_t raw_base; /* FI_MR_RAW: base address for the peer's fi_mr_map_raw */
    struct ofi_mr *prev, *next; /* live registrations, closed at ofi_close */
    bool busy;                  /* fi_close said FI_EBUSY: retried after the endpoint */
    size_t raw_len;
    uint8_t raw[]; /* FI_MR_RAW: the raw key */
};

/* Registrations of the get protocol, beside DCHAN_ACCESS_SEND and
 * DCHAN_ACCESS_REMOTE_WRITE (the registration cache keys on the value). */
enum {
    OFI_ACCESS_READ_INTO = 0x100,  /* getter: read into, and write the taken word from */
    OFI_ACCESS_REMOTE_READ = 0x200, /* source: its buffer, read by the getter */
    OFI_ACCESS_REMOTE_RW = 0x400    /* sources' control words (a slab of them) */
};

/* OFI_OP_GREAD: a read of a source's data; OFI_OP_GPEEK: of its published
 * word; OFI_OP_GACK: the write of its taken word (ofi_get.c). */
enum { OFI_OP_PUT = 0, OFI_OP_CREDIT, OFI_OP_GREAD, OFI_OP_GPEEK, OFI_OP_GACK };

/* One posted write; its address is the operation context. */
struct ofi_op {
    struct fi_context2 fctx; /* first: FI_CONTEXT/FI_CONTEXT2 providers write here */
    dchan_handle_t *h;       /* sender handle (a receive handle for a credit write);
                              * NULL once abandoned or closed */
    struct ofi_orphan *orphan;
    struct ofi_op *next_free;
    int peer; /* for log lines, even once abandoned */
    bool after_loss; /* posted while the connection to peer was known lost */
    uint8_t kind;    /* OFI_OP_* */
};

/* A receive posted for providers with FI_RX_CQ_DATA. */
struct ofi_rx {
    struct fi_context2 fctx;
};

struct ofi_gather;

/* What an abandoned put (or a closed getter) still holds until its
 * operations complete. */
struct ofi_orphan {
    struct dchan_reg *regs[2];
    uint64_t keys[2]; /* fi_mr_map_raw keys to unmap */
    unsigned nkeys;
    struct ofi_gather *g; /* a gathered send side's registrations */
    void *mem;            /* a getter's control words */
    unsigned outstanding;
    struct ofi_orphan *next;
};

/* A peer's credit area, from its address (ofi_init.c). */
struct ofi_cpeer {
    uint64_t raddr; /* target address of its word 0: virtual, or offset 0 */
    uint64_t key;
    size_t words; /* its CREDIT_WORDS: the stride of its area */
    bool raw_mapped;
};

struct ofi_state {
    struct fi_info *info; /* the chosen one, alone */
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_av *av;
    struct fid_cq *cq;
    struct fid_ep *ep;
    fi_addr_t *peers;
    /* Per peer: a write to it died with its connection (dchan_ofi_reset)
     * and none has completed since. */
    bool *conn_lost;
    int nranks;

    /* memory registration */
    uint64_t mr_mode;  /* what the provider asked for */
    bool mr_local;     /* register send buffers (FI_MR_LOCAL or DCHAN_OFI_MR_LOCAL) */
    size_t key_size;   /* mr_key_size */
    uint64_t next_key; /* requested keys when the provider lets us choose */
    struct ofi_mr *mrs;

    /* transfers */
    size_t cq_data;      /* bytes of remote CQ data used: 0, 4 or 8 */
    size_t max_msg;      /* largest single write (or read) */
    size_t iov_limit;    /* local segments per write (tx_attr->iov_limit) */
    bool can_read;       /* FI_READ and FI_REMOTE_READ granted: get is offered */
    enum ofi_order ord_event, ord_tail;
    bool dc_last;        /* FI_DELIVERY_COMPLETE on the last write of every put */
    bool word_at_target; /* the polled word must be written by the target: see ofi_open */
    struct ofi_op *ops;  /* contexts of posted writes, at most the tx queue depth */
    size_t nops;
    struct ofi_op *free_ops;
    struct ofi_rx *rx; /* FI_RX_CQ_DATA receives */
    size_t nrx;
    dchan_handle_t *pend_head, *pend_tail; /* puts with writes left to post */
    dchan_handle_t *retry_head, *retry_tail; /* puts to post again, see ofi_rma.c */
    dchan_handle_t *gpend_head; /* getters with reads or writes left to post (ofi_get.c) */
    bool progressing;           /* inside dchan_ofi_progress */
    /* get sources' control words, as getters see them (ofi_get.c) */
    struct ofi_cslab *cslabs;
    struct ofi_cent *cfree_head, *cfree_tail; /* reused oldest first */
    dchan_handle_t *src_head;                 /* live sources */
    struct ofi_orphan *orphans;

    /* credit (DESIGN §7): this rank's area, word [r * credit_words + i]
     * written by rank r only, registered for remote write, and each peer's
     * area as it published it */
    uint64_t *credit_area;
    size_t credit_words;
    struct ofi_mr *credit_mr;
    struct ofi_cpeer *cpeer;
    bool credit_inject; /* fi_inject_write: the provider orders write after write */
    bool credit_atomic; /* else fi_inject_atomic FI_MAX: counts in any order */
    /* Sources of credit writes with a completion, one per operation
     * context (registered where FI_MR_LOCAL asks for it). */
    uint64_t *csrc;
    struct ofi_mr *csrc_mr;
    void *csrc_desc;

    /* wake-up: the CQ's wait fd (FI_WAIT_FD), or -1; where the fabric has
     * none, the core's backing-off timer wakes the sleeper to look */
    int wait_fd;
    struct dchan_waketimer wt;

    unsigned char *addr; /* what peers need: see ofi_init.c */
    size_t addr_len;
    bool same_host_only; /* shm: every rank must be on this host */
};

/* Sender per-handle state (DCHAN_PROV_PRIV). */
struct ofi_sh {
    struct dchan_reg *buf_reg, *seq_reg; /* local registrations, when needed */
    void *buf_desc, *seq_desc;
    fi_addr_t dest;
    uint64_t raddr, rkey;         /* receive buffer: target address of byte 0, key */
    uint64_t seq_raddr, seq_rkey; /* FLAG: the receiver's sequence word */
    uint64_t cq_data;             /* EVENT: the receive handle's id (and generation) */
    bool dc_last;    /* FI_DELIVERY_COMPLETE on this handle's last writes (send_open) */
    bool quiet_data; /* OFI_CQ_QUIET as remote CQ data on the SENTINEL/FLAG last write */
    /* the put in flight */
    size_t off;  /* its slot's offset in the receive buffer */
    size_t bulk; /* bytes [0, bulk) go as plain writes, then the last write */
    size_t next; /* next byte of the bulk to post */
    uint32_t outstanding;
    int err;
    uint8_t phase;      /* OFI_PH_* */
    uint8_t raw_mapped; /* 1: rkey, 2: seq_rkey came from fi_mr_map_raw */
    uint8_t backoff;    /* retries of this put so far */
    bool pending;       /* on the pending list (pend_next) */
    bool queued;        /* on the retry list (pend_next) */
    bool unsent;        /* a write of this attempt found its connection gone */
    uint64_t retry_at;       /* queued: post again from then on */
    uint64_t retry_deadline; /* past it, the put fails instead */
    dchan_handle_t *pend_next;
    struct ofi_gather *g; /* a gathered send side (dchan_h_segs), else NULL */
    bool gathered;        /* the put in flight comes from g's segments */
};

enum { OFI_PH_IDLE = 0, OFI_PH_BULK, OFI_PH_LAST };

/* A gathered send side: its segments, their local descriptors, and where
 * the last put's writes stand in them. */
struct ofi_gather {
    const dchan_iov_t *segs; /* the core's list, valid until send_close */
    size_t nseg;
    void **desc;             /* per segment (FI_MR_LOCAL), else NULL */
    struct dchan_reg **regs; /* behind desc */
    size_t nregs;
    size_t event_bulk; /* EVENT: where the last write starts (see gather_open) */
    size_t pos, seg, off; /* cursor: message byte pos is byte off of segment seg */
    uint64_t bounce;      /* SENTINEL: a tail that straddles segments, copied */
    struct dchan_reg *bounce_reg;
    void *bounce_desc;
    char *stage; /* segments too many and small: gathered here, sent contiguous */
    struct dchan_reg *stage_reg;
    void *stage_desc;
};

/* Remote CQ data that names no handle (no handle id is 0): it only takes
 * a write through the target's own progress (shm, see ofi_open). */
#define OFI_CQ_QUIET 0

/* Receiver per-handle state. */
struct ofi_rh {
    struct dchan_reg *buf_reg, *seq_reg;
    struct ofi_op *credit_op; /* a credit write in flight */
};

/* Getter per-handle state (ofi_get.c). */
/* A source's control words as its getter reads and writes them: the
 * provider's copy of the core's two words, and who they belong to. */
struct ofi_cent {
    uint64_t pub;   /* the published word (copied at creation and publish) */
    uint64_t taken; /* the taken word (written by the getter, copied back) */
    uint64_t ident; /* the source's id << 32 | generation; 0: free */
    struct ofi_cent *next_free;
};
#define OFI_CENT_READ (3 * sizeof(uint64_t)) /* what a getter reads */
#define OFI_CSLAB_BYTES 4096                  /* one registration */
struct ofi_cslab {
    struct ofi_cslab *next;
    struct ofi_cent *ent; /* OFI_CSLAB_BYTES, page-aligned */
    struct ofi_mr *mr;
};

struct ofi_gwords {
    uint64_t pub, rtaken, ident; /* landing place of reads of the source's words */
    uint64_t taken;              /* source of the write of its taken word */
};
struct ofi_gh {
    fi_addr_t dest;
    uint64_t raddr, rkey;         /* the source's buffer */
    uint64_t ctl_raddr, ctl_rkey; /* its two control words */
    struct dchan_reg *buf_reg, *w_reg; /* FI_MR_LOCAL */
    void *buf_desc, *w_desc;
    struct ofi_gwords *w;
    uint64_t pub;        /* the published word as last read */
    uint32_t taken;      /* the count last written to the taken word */
    uint32_t outstanding; /* operations in flight */
    uint32_t reading;     /* of them, reads of the data */
    size_t next;          /* next byte of the data to read */
    int err;              /* the get in flight failed */
    uint8_t phase;        /* OFI_GPH_* */
    uint8_t raw_mapped;
    uint8_t backoff;      /* reposts after a lost connection, this get */
    uint64_t retry_at;    /* post nothing before then (a connection to reconnect) */
    uint64_t retry_deadline; /* past it, a lost connection is an error */
    bool peeking;         /* a read of the published word in flight */
    bool acking;          /* the taken word's write in flight */
    bool redo;            /* a data read broke with its connection: check, read again */
    bool peek_due, ack_due; /* to post when there is room */
    bool pending;         /* on gpend (gpend_next) */
    dchan_handle_t *gpend_next;
};
enum { OFI_GPH_IDLE = 0, OFI_GPH_DATA, OFI_GPH_CHECK };

/* Source per-handle state. */
struct ofi_srch {
    struct dchan_reg *buf_reg;
    struct ofi_cent *e;
    struct ofi_cslab *slab;
    uint64_t taken; /* last copied to the core's taken word */
    dchan_handle_t *prev, *next; /* on src_head */
};

/* The wire's provider fields (ofi_mr.c). */
#define OFI_WIRE_VERSION 1
#define OFI_WIRE_RAW 0x1u
#define OFI_WIRE_SEQ 0x2u
#define OFI_WIRE_RAW_BYTES 28
struct ofi_wire {
    uint8_t flags;
    uint64_t buf_addr, buf_key; /* key, or the raw base address with OFI_WIRE_RAW */
    uint64_t seq_addr, seq_key;
    uint8_t buf_raw_len, seq_raw_len;
    uint8_t raw[OFI_WIRE_RAW_BYTES]; /* the buffer's raw key, then the sequence word's */
};
void dchan_ofi_wire_pack(const struct ofi_wire *w, unsigned char *out);
/* DCHAN_ERR_HANDLE for fields no dchan receiver writes. */
int dchan_ofi_wire_unpack(const unsigned char *in, bool raw, bool flag, bool virt,
                          struct ofi_wire *w);

/* ofi_init.c */
int dchan_ofi_rc(struct dchan_prov *p, int fi_err, const char *what);
bool dchan_ofi_unreachable(int fi_err);
bool dchan_ofi_unsent(int fi_err);
bool dchan_ofi_reset(int fi_err);
int dchan_ofi_post_rx(struct ofi_state *st, struct ofi_rx *rx);

/* ofi_mr.c */
int dchan_ofi_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access, void **mr);
void dchan_ofi_mr_dereg(struct dchan_prov *p, void *mr);
void dchan_ofi_mr_close_all(struct ofi_state *st);

/* ofi_rma.c */
int dchan_ofi_recv_open(dchan_handle_t *h, unsigned char *wire_fields);
void dchan_ofi_recv_close(dchan_handle_t *h);
int dchan_ofi_send_open(dchan_handle_t *h, const unsigned char *wire_fields);
int dchan_ofi_put(dchan_handle_t *h, const struct dchan_put_desc *d);
void dchan_ofi_put_abandon(dchan_handle_t *h);
void dchan_ofi_send_close(dchan_handle_t *h);
int dchan_ofi_progress(struct dchan_prov *p);
void dchan_ofi_orphans_release(struct ofi_state *st);
int dchan_ofi_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word);
int dchan_ofi_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src);
int dchan_ofi_fill_key(struct dchan_prov *p, const struct ofi_mr *m, struct ofi_wire *w,
                       uint64_t *key, uint8_t *raw_len);
struct ofi_op *dchan_ofi_op_of(const struct ofi_state *st, void *ctx);
void dchan_ofi_op_free(struct ofi_state *st, struct ofi_op *op);
/* The op at the head of the free pool, taken by a write or read just posted. */
void dchan_ofi_op_take(struct ofi_state *st, struct ofi_op *op, dchan_handle_t *h, int kind,
                       int peer);
void dchan_ofi_orphan_release(struct ofi_state *st, struct ofi_orphan *o);
/* The remote keys a wire names for a handle: the buffer's (*bkey) and,
 * with word, its word's (*wkey: the FLAG sequence word, a source's control
 * words); *mapped says which came from fi_mr_map_raw (1: bkey, 2: wkey).
 * On failure what was mapped stays in *mapped for keys_unmap. */
int dchan_ofi_keys_map(struct dchan_prov *p, const struct ofi_wire *w, bool raw, bool word,
                       uint64_t *bkey, uint64_t *wkey, uint8_t *mapped);
void dchan_ofi_keys_unmap(struct ofi_state *st, uint64_t bkey, uint64_t wkey, uint8_t *mapped);
/* Hand the mapped keys to an orphan, which unmaps them once its writes end. */
void dchan_ofi_keys_orphan(struct ofi_orphan *o, uint64_t bkey, uint64_t wkey, uint8_t *mapped);

/* ofi_get.c */
extern const struct dchan_get_ops dchan_ofi_get_ops;
void dchan_ofi_get_op_done(struct dchan_prov *p, struct ofi_op *op, int fi_err, int rc);
void dchan_ofi_get_pending(struct dchan_prov *p);
void dchan_ofi_get_sources(struct dchan_prov *p);
void dchan_ofi_cslabs_free(struct ofi_state *st);

#endif
