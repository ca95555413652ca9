/* SPDX-License-Identifier: BSD-3-Clause */
/* Core-private structures: contexts, handles, polling queue. */
#ifndef DCHAN_CORE_H
#define DCHAN_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "boot.h"
#include "dchan.h"
#include "log.h"
#include "params.h"
#include "provider.h"
#include "seqslots.h"
#include "wire.h"

struct pollfd;

#define DCHAN_CTX_MAGIC 0x58544344u  /* "DCTX" */
#define DCHAN_H_MAGIC 0x4c444844u    /* "DHDL" */
#define DCHAN_H_DEAD 0x44414544u     /* "DEAD": destroyed, kept in quarantine */
#define DCHAN_MAX_PROVS 4

/* Receive handle ids: 24-bit slot index and the low 8 bits of the slot's
 * 32-bit generation (what fits a 32-bit immediate); never 0. The wire also
 * carries the whole generation, for checks that can use it. */
#define DCHAN_ID_INDEX_BITS 24
#define DCHAN_ID_INDEX_MASK ((1u << DCHAN_ID_INDEX_BITS) - 1)
#define DCHAN_ID_MAKE(index, gen) (((uint32_t)(gen) << DCHAN_ID_INDEX_BITS) | (uint32_t)(index))
#define DCHAN_ID_INDEX(id) ((id) & DCHAN_ID_INDEX_MASK)
#define DCHAN_ID_GEN(id) ((id) >> DCHAN_ID_INDEX_BITS)

enum { DCHAN_FAST_SEND = 1, DCHAN_FAST_RECV = 2 }; /* dchan_handle.fast */

enum dchan_role {
    DCHAN_ROLE_RECV = 1,
    DCHAN_ROLE_SEND = 2,
    DCHAN_ROLE_SOURCE = 3, /* dchan_create_source: published for remote read */
    DCHAN_ROLE_GETTER = 4  /* dchan_assoc_remote: reads a source */
};

/* Receiver states (DESIGN §3) are counts of slots, modulo 2^32:
 *   n_rel <= n_fired <= n_arr <= n_rel + depth
 * slots [n_rel, n_fired) are held by the application (callback ran, not
 * released), [n_fired, n_arr) arrived with the callback due, and
 * [n_arr, n_rel + depth) are armed: the sender may write them. With depth
 * 1 these are the three states of a CkDirect channel. */
#define DCHAN_R_HELD(h) ((uint32_t)((h)->n_fired - (h)->n_rel))
#define DCHAN_R_DUE(h) ((uint32_t)((h)->n_arr - (h)->n_fired))
#define DCHAN_R_ARMED(h) ((uint32_t)((h)->n_rel + (h)->depth - (h)->n_arr))

/* Count n's slot among k: n mod k. Depth is 1 or a power of two on nearly
 * every handle, and a division costs tens of cycles on a path that takes
 * several per message. */
static inline uint32_t dchan_slot_of(uint32_t n, uint32_t k)
{
    return (k & (k - 1)) == 0 ? n & (k - 1) : n % k;
}

struct dchan_handle {
    /* First: providers find it at the handle's address (dchan_h_priv). */
    _Alignas(16) unsigned char priv[DCHAN_PROV_PRIV_BYTES];
    uint32_t magic;
    uint8_t role;   /* enum dchan_role */
    uint8_t detect; /* resolved DCHAN_DETECT_* */
    bool credit;    /* credited channel (DESIGN §7) */
    bool in_pollq;  /* receiver: on the polling queue (ReadyPollQ) */
    bool on_fire;   /* receiver: on the fire list */
    bool inflight;  /* sender: a put has not completed locally */
    bool on_errq;   /* on the error list, error_fn not called yet */
    int error;      /* sticky asynchronous error, 0 when healthy */
    dchan_ctx_t *ctx;
    struct dchan_prov *prov;
    void *buf;
    size_t size;
    int peer;    /* receiver: sender rank; sender: receiver rank */
    uint32_t id;  /* receiver: own id; sender: the receiver handle's id */
    uint32_t gen; /* the whole generation behind id */
    uint64_t oob;
    dchan_arrival_fn fn;
    void *arg;
    /* detection (receiver) and sequencing (both, FLAG) */
    uint64_t *seq_word;      /* FLAG: sequence word (receiver) or source (sender) */
    struct dchan_seqslot slot;
    /* FLAG: last sequence word seen (receiver) or sent (sender): an epoch
     * chosen at assoc_local in the high 32 bits, a count in the low 32, so
     * that a sender may associate again and start counting from 1. */
    uint64_t seq;
    const volatile uint64_t *probe; /* SENTINEL/FLAG: the word the scan reads */
    uint64_t idle;           /* value of *probe meaning "nothing new" */
    const void *pf;          /* FLAG: what the scan prefetches (dchan_scan_pollq), or NULL */
    uint32_t pq_pos;         /* index in ctx->pq while in_pollq (scan modes) */
    dchan_handle_t *fire_next, *fire_prev;
    dchan_handle_t *errq_next;
    dchan_handle_t *all_next, *all_prev; /* every live handle, for finalize */
    dchan_wire_t wire;                   /* receiver: what dchan_handle_export gives */
    /* depth and credit (DESIGN §7) */
    uint32_t depth;                /* slots of size bytes in buf */
    uint32_t n_arr, n_fired, n_rel; /* receiver: see DCHAN_R_* */
    uint32_t n_put;                /* sender: puts made; the next goes to n_put % depth */
    uint32_t ctag;                 /* both: the channel's credit words are (ctag << 32) + releases */
    uint64_t crel;                 /* receiver: releases so far, not wrapping */
    uint64_t cgranted;             /* sender: releases the receiver reported, not wrapping */
    uint16_t cidx;                 /* both: index of the credit word */
    bool cbusy, cdirty, on_credq;  /* receiver: a credit write in flight / owed / queued */
    const volatile uint64_t *cword; /* sender: the word the receiver writes */
    const char *ctail;             /* sender, SENTINEL into mapped slots: slot 0's tail, or NULL */
    uint64_t csrc;                 /* receiver: what the credit write in flight carries */
    dchan_handle_t *credq_next;    /* receiver: on ctx->credq, owed a retry */
    uint64_t stall_ns;             /* sender: when puts began to be refused, 0: they are not */
    bool in_place;                 /* sender: dchan_put_ptr gave the mapped slot of the next put */
    bool cwant;                    /* sender: a put or dchan_credits found no credit (wake-up) */
    bool on_look;                  /* sender: on ctx->look_head (its credit is looked for) */
    bool chint;                    /* sender: its last credit came with a record (a hint) */
    bool gwant;                    /* getter: dchan_get found no new version (wake-up) */
    bool arm_op;                   /* receiver: the provider has a recv_arm to call */
    /* The per-message calls may take their short paths: no lock in the
     * context, and a contiguous send side (DCHAN_FAST_SEND) or a receive
     * handle (DCHAN_FAST_RECV); 0: they may not. */
    uint8_t fast;
    dchan_handle_t *look_next;
    struct dchan_put_desc pd;      /* sender: what every put tells the provider (dchan_put) */
    uint64_t n_inplace;            /* sender: puts of messages written through dchan_put_ptr */
    /* sender: dchan_set_completion (lib/strided.c): a callback per put
     * completed locally; n_done - n_cdone of them are due (on the fire list) */
    dchan_arrival_fn cfn;
    void *carg;
    uint32_t n_done, n_cdone;
    /* sender: a gathered send side (dchan_assoc_local_iov/_subarray): its
     * non-empty segments; stage: where the core gathers them for a provider
     * without a gather of its own (h->buf then points there) */
    dchan_iov_t *segs;
    size_t nseg;
    void *stage;
    struct dchan_gvec *vecs; /* the same as runs of equal length and stride, or NULL */
    size_t nvec;
    /* get (lib/get.c). Source: gctl[0] the published word, gctl[1] the
     * taken word (each (tag << 32) | count, tag = gen); n_pub versions
     * published; on srcq until the current one was taken; n_done counts
     * done callbacks due. Getter: n_got versions taken; n_done counts
     * arrival callbacks due. */
    uint64_t *gctl;
    uint32_t n_pub, n_got;
    bool on_srcq;
    dchan_handle_t *srcq_next;
    /* dchan_handle_stats (struct_size unused here) */
    dchan_handle_stats_t hstats;
};
_Static_assert(offsetof(struct dchan_handle, priv) == 0, "dchan_h_priv");

/* A block of dchan_alloc (or of the core's own use: sequence chunks). */
struct dchan_mem {
    uintptr_t addr;
    size_t size;
    struct dchan_prov *prov; /* NULL: the heap */
    bool internal;
};
#define DCHAN_ALLOC_ALIGN 64

/* One entry of the polling queue: what a scan needs, densely packed. */
struct dchan_pq_ent {
    const volatile uint64_t *probe;
    uint64_t idle;
    dchan_handle_t *h;
};

/* A receiver rank's entry of ctx->csend: n words' send handles. */
struct dchan_csend_row {
    dchan_handle_t **h;
    uint32_t n;
};

struct dchan_ctx {
    uint32_t magic;
    int rank, nranks;
    uint64_t job_key;
    int detect; /* requested mode, DCHAN_DETECT_AUTO for "each provider's default" */
    int thread_level;
    int log_level;
    dchan_error_fn error_fn;
    void *error_arg;
    struct dchan_params params;
    struct dchan_boot boot;
    unsigned instance; /* per-process context counter, for log lines */

    struct dchan_prov *provs[DCHAN_MAX_PROVS];
    int nprovs;
    struct dchan_prov *polled[DCHAN_MAX_PROVS]; /* those with a progress to call */
    int npolled;
    struct dchan_prov *net;   /* provider for ranks on other hosts */
    struct dchan_prov *local; /* provider for other ranks on this host */
    struct dchan_prov *self;  /* provider for this rank's own channels */
    struct dchan_prov **route; /* per rank: the provider that serves it */
    uint64_t *host;            /* per rank: host identity */
    char prov_name[48];        /* what dchan_provider_name reports */
    char refusal[256];         /* "name: why; ..." of the providers that could
                                * not open here, for the error when none could */
    bool declined;             /* the last provider refused by this rank's settings */
    struct dchan_mem *mem;     /* dchan_alloc blocks, sorted by address */
    size_t nmem, mem_cap;
    struct dchan_prov *mem_prov; /* where they come from; NULL: the heap */

    /* receive handles by id */
    dchan_handle_t **htab;
    uint32_t *hgen; /* generation of each slot; its low byte is never 0 */
    uint32_t *hfree; /* stack of free indices */
    uint32_t hfree_len, htab_cap, hlive;

    /* polling queue of scanned handles (SENTINEL, FLAG) */
    struct dchan_pq_ent *pq;
    uint32_t pq_len, pq_cap;
    uint32_t nscan; /* live receive handles in a scanned mode: pq_cap >= nscan */

    dchan_handle_t *fire_head, *fire_tail; /* arrivals whose callback is due */
    dchan_handle_t *errq_head, *errq_tail; /* errors whose error_fn is due */
    dchan_handle_t *all_head;              /* every live handle */
    uint64_t nlive;

    struct dchan_seqpool recv_seq, send_seq;

    /* Credit words (DESIGN §7): per sender rank, the indices of its credit
     * area this rank's receive handles use (allocated on first need). */
    struct dchan_credit_ids **cids;
    /* And the other way: per receiver rank, the send handles of this rank
     * by the index of their word in its credit area (dchan_core_arrival_id_hint). */
    struct dchan_csend_row *csend;
    dchan_handle_t *credq_head; /* receive handles whose credit write must be retried */
    dchan_handle_t *srcq_head;  /* sources whose current version was not taken yet */
    dchan_handle_t *look_head;  /* send handles whose puts used up the credit known */

    dchan_handle_t *qt_head, *qt_tail; /* quarantine of destroyed handles */
    uint64_t qt_len;

    /* Ranks of this host watched for death (lib/peers.c), and the dead. */
    struct pollfd *watch; /* pidfds of the live ones */
    int *watch_rank;
    int nwatch;
    unsigned watch_tick;
    uint64_t watch_period_ns, watch_next_ns;
    uint8_t *dead; /* per rank */
    int ndead;
    uint64_t barrier_death_ns; /* when a barrier first saw a death, or 0 */

    /* Wake-up descriptor (lib/wakeup.c). wake_armed: a dchan_wakeup_arm
     * succeeded and no progress ran since; asleep: the same, as in-process
     * senders read it (dchan_core_wake). */
    int wake_epfd, wake_efd; /* -1 until dchan_wakeup_fd */
    bool wake_armed;
    bool cwant; /* some send handle has cwant set: dchan_wakeup_arm looks at them */
    bool gwant; /* some getter has gwant set: likewise */
    uint32_t src_serial; /* sources created, for the tags of their words (lib/get.c) */
    int asleep;
    pthread_t wake_thread; /* the thread that armed: only its progress disarms */
    dchan_ctx_t *reg_next; /* live contexts (dchan_ctx_registered) */

    bool locking; /* DCHAN_THREAD_MULTIPLE */
    pthread_mutex_t lock;
    bool finalizing;
    uint64_t epoch_state; /* FLAG epochs for send handles */
    dchan_stats_t stats;
};

static inline void dchan_ctx_lock(dchan_ctx_t *ctx)
{
    if (ctx->locking)
        pthread_mutex_lock(&ctx->lock);
}

static inline void dchan_ctx_unlock(dchan_ctx_t *ctx)
{
    if (ctx->locking)
        pthread_mutex_unlock(&ctx->lock);
}

/* Validation of the public pointers. */
static inline bool dchan_ctx_ok(const dchan_ctx_t *ctx)
{
    return ctx && ctx->magic == DCHAN_CTX_MAGIC;
}

/* Peers that died (lib/peers.c). pids: every rank's pid from the bootstrap, 0
 * where it means nothing here (another kernel or PID namespace). */
int dchan_peers_watch_init(dchan_ctx_t *ctx, const int64_t *pids);
void dchan_peers_watch_fini(dchan_ctx_t *ctx);
/* Look now (and schedule the next look); from dchan_peers_poll. */
void dchan_peers_check_now(dchan_ctx_t *ctx);
void dchan_peers_tick(dchan_ctx_t *ctx);
/* rank is gone: DCHAN_ERR_PEER on all its handles, collectives stop waiting. */
void dchan_peers_lost(dchan_ctx_t *ctx, int rank);

/* From every poll loop: a counter on the hot path, a clock read every
 * DCHAN_WATCH_TICKS polls, a system call every DCHAN_PEER_CHECK_MS. */
#define DCHAN_WATCH_TICKS 32
static inline void dchan_peers_poll(dchan_ctx_t *ctx)
{
    if (ctx->nwatch && ++ctx->watch_tick >= DCHAN_WATCH_TICKS)
        dchan_peers_tick(ctx);
}

/* Provider-side progress of every provider of a context, without callbacks. */
int dchan_core_poll_providers(dchan_ctx_t *ctx);
/* Drive provider progress until h's put completed locally or timeout_ms
 * ran out (DCHAN_ERR_TIMEOUT), or the receiver died (DCHAN_ERR_PEER); in
 * both, the put stays in flight: the caller decides whether to abandon it. */
int dchan_core_drain_put(dchan_handle_t *h, uint64_t timeout_ms);

uint64_t dchan_now_ns(void);

/* lib/wakeup.c: back from a sleep (first progress after a successful arm);
 * free the descriptors at finalize. */
void dchan_wake_disarm(dchan_ctx_t *ctx);
void dchan_wake_fini(dchan_ctx_t *ctx);
/* Live contexts, so that the wake-up calls can tell a finalised one. */
void dchan_ctx_register(dchan_ctx_t *ctx);
void dchan_ctx_unregister(dchan_ctx_t *ctx);
bool dchan_ctx_registered(const dchan_ctx_t *ctx);
/* Credited send handles that found no credit and have some now (lib/handle.c). */
bool dchan_credit_returned(dchan_ctx_t *ctx);
void dchan_credit_look(dchan_ctx_t *ctx);
/* Getters that found no new version and have one now, or lost their
 * source (lib/get.c). */
bool dchan_get_published(dchan_ctx_t *ctx);

/* lib/memory.c */
void dchan_core_mem_init(dchan_ctx_t *ctx);
int dchan_core_mem_alloc(dchan_ctx_t *ctx, size_t size, size_t align, bool internal, void **ptr);
int dchan_core_mem_free(dchan_ctx_t *ctx, void *ptr, bool internal);
void dchan_core_mem_fini(dchan_ctx_t *ctx);
/* Does [ptr, ptr + len) start inside a dchan_alloc block and run past its end? */
bool dchan_core_mem_overflows(const dchan_ctx_t *ctx, const void *ptr, size_t len);
/* Credit (lib/handle.c): retry owed credit writes; free the index tables. */
void dchan_credq_run(dchan_ctx_t *ctx);
void dchan_credit_ids_fini(dchan_ctx_t *ctx);
/* Get (lib/get.c): sources whose version was taken run done_fn; a source's
 * dchan_ready; destroy of a source or getter (lock held). */
void dchan_get_scan(dchan_ctx_t *ctx);
int dchan_source_ready(dchan_handle_t *h);
void dchan_get_release(dchan_handle_t *h);

#endif /* DCHAN_CORE_H */
