/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The provider ops table: the only seam between the core and a transport.
 *
 * The core owns policy: the handle state machine, wire validation, the
 * polling queue, callback dispatch, sequence numbers and overrun checks.
 * A provider only moves bytes and reports what it observed through the
 * dchan_core_* calls at the bottom of this file. Providers are listed in
 * lib/provider.c; an operation a provider does not offer points at one of
 * the dchan_prov_nosys_* stubs, never at NULL.
 */
#ifndef DCHAN_PROVIDER_H
#define DCHAN_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dchan.h"
#include "log.h"
#include "params.h"

struct dchan_prov;
struct dchan_reg;

/* Wire provider ids (a byte in the wire form); never reuse a retired one. */
enum {
    DCHAN_PROV_ID_SELF = 1,
    DCHAN_PROV_ID_MPI = 2,
    DCHAN_PROV_ID_OFI = 3,
    DCHAN_PROV_ID_VERBS = 4,
    DCHAN_PROV_ID_SHM = 5
};

/* Which peers a provider can serve (DESIGN §4): any rank, the ranks on this
 * host (and this rank itself), or only this rank. Without DCHAN_PROVIDER,
 * the core routes each peer to the narrowest provider that serves it. */
enum {
    DCHAN_SCOPE_NET = 0,
    DCHAN_SCOPE_HOST = 1,
    DCHAN_SCOPE_SELF = 2
};

/* Bytes of the wire form a provider may fill with its remote-access fields. */
#define DCHAN_WIRE_PROV_BYTES 64

/* How a provider serves the wake-up descriptor (dchan_info). */
enum {
    DCHAN_SLEEPS_TIMER = 0,  /* a backing-off timer wakes the sleeper to look */
    DCHAN_SLEEPS_EVENT = 1,  /* asleep until an event, no CPU */
    DCHAN_SLEEPS_FABRIC = 2  /* an event where the fabric has a wait object, else the timer */
};

/* Bit for detection mode m (DCHAN_DETECT_*) in dchan_provider_ops.modes. */
#define DCHAN_MODE_BIT(m) (1u << (m))

/* Access of a memory registration. */
enum {
    DCHAN_ACCESS_SEND = 1,        /* local source of writes */
    DCHAN_ACCESS_REMOTE_WRITE = 2 /* target of the peer's writes */
};

/* Bytes a provider may keep inside each handle (see DCHAN_PROV_PRIV). */
#define DCHAN_PROV_PRIV_BYTES 192

/* put: the put completed before returning (no dchan_core_put_done follows). */
#define DCHAN_PROV_PUT_DONE 1

/* One put, as the core decided it. */
struct dchan_put_desc {
    void *priv;         /* the handle's DCHAN_PROV_PRIV area */
    uint32_t remote_id; /* the receiver handle's id, from the wire */
    const void *src; /* the send buffer; NULL when the message was written in
                      * place (dchan_put_ptr gave the mapped slot): signal only */
    size_t size;     /* its size, equal to the receive (slot) size */
    size_t offset;   /* where the slot starts in the receive buffer: slot * size */
    uint32_t slot;   /* the slot of a handle of depth > 1 (0 otherwise) */
    int detect;      /* how the receiver detects the arrival */
    /* SENTINEL: write src[0, size-8), then the tail src[size-8, size) ordered
     * after it (or all of src in one write where the provider guarantees the
     * tail lands last). FLAG: write all of src, then the 8 bytes at seq_src
     * (holding seq) into the receiver's sequence word, ordered after the body.
     * EVENT: write all of src with a completion at the receiver. */
    const uint64_t *seq_src;
    uint64_t seq;
    /* A gathered put (dchan_assoc_local_iov/_subarray) to a provider with
     * ops.gather: src is NULL and the message is the concatenation of
     * iov[0 ... iovcnt) (no empty segment), size bytes in all; the rules
     * above apply to the gathered message (its tail may straddle segments).
     * NULL on every other put. */
    const dchan_iov_t *iov;
    size_t iovcnt;
    /* The same list as vectors (core-internal, for dchan_gather_copy). */
    const struct dchan_gvec *vec;
    size_t nvec;
};

/* count pieces of len bytes, each stride bytes after the one before. */
struct dchan_gvec {
    const char *base;
    size_t len, count;
    ptrdiff_t stride;
};

/* Sender: the segments of a gathered send side (valid until send_close)
 * and how many; 0 for a contiguous one. */
size_t dchan_h_segs(const dchan_handle_t *h, const dchan_iov_t **segs);
/* Gathered puts: copy bytes [from, to) of d's message into dst. */
void dchan_gather_copy(const struct dchan_put_desc *d, size_t from, size_t to, void *dst);
/* Gathered puts: the segments of bytes [*from, to) of d's message, at most
 * max of them, into out; *from moves past what they cover. Returns how many. */
size_t dchan_gather_slice(const struct dchan_put_desc *d, size_t *from, size_t to,
                          dchan_iov_t *out, size_t max);

/*
 * Get (DESIGN §7). A source handle has its buffer (dchan_h_buf, size bytes)
 * and two control words (dchan_h_ctl): [0] the published word, which the
 * source's owner writes, [1] the taken word, which the getter writes; each
 * holds (tag << 32) | count. A getter reads the source's buffer into its
 * own, reads the published word and writes the taken word.
 */
struct dchan_get_ops {
    /* Source: make the buffer readable and the control words accessible
     * by the peer; write the wire fields (zeroed by the core). */
    int (*src_open)(dchan_handle_t *h, unsigned char *wire_fields);
    void (*src_close)(dchan_handle_t *h);
    /* Source: the published word was just bumped (dchan_ready); tell the
     * getter where it cannot read the word itself. */
    int (*src_publish)(dchan_handle_t *h);
    /* Getter: import the wire fields (DCHAN_ERR_HANDLE for bad ones). */
    int (*get_open)(dchan_handle_t *h, const unsigned char *wire_fields);
    void (*get_close)(dchan_handle_t *h);
    /* Getter: the source's published word now (0 when it is gone). */
    int (*get_peek)(dchan_handle_t *h, uint64_t *published);
    /* Getter: read the whole source into dchan_h_buf(h). DCHAN_PROV_PUT_DONE:
     * done before returning; DCHAN_SUCCESS: dchan_core_get_done follows. */
    int (*get)(dchan_handle_t *h);
    /* Getter: write v into the source's taken word, after the data is here. */
    int (*get_ack)(dchan_handle_t *h, uint64_t v);
};

/* Get: the source's control words (2). */
uint64_t *dchan_h_ctl(const dchan_handle_t *h);
/* Get: is h a live source handle? (for in-process lookups by id) */
bool dchan_h_is_source(const dchan_handle_t *h);
/* Getter: the read in flight completed (rc 0) or failed. */
void dchan_core_get_done(dchan_handle_t *h, int rc);

/* What a provider can tell without a context. */
struct dchan_probe {
    char desc[256];
    unsigned modes;
    int default_detect;
};

struct dchan_provider_ops {
    const char *name; /* as in DCHAN_PROVIDER */
    uint8_t wire_id;  /* DCHAN_PROV_ID_* */
    unsigned modes;   /* DCHAN_MODE_BIT() of each detection mode offered */
    unsigned scope;   /* DCHAN_SCOPE_* */
    /* Credit words the provider keeps for one peer: 0, exactly
     * CREDIT_WORDS (an area laid out at open); else up to this many, the
     * CREDIT_WORDS first and more as the peer's channels need them. */
    uint32_t credit_words_max;

    /* Without a context: is the provider usable on this machine? Fills a
     * description (library, device, version) and the detection modes it
     * would offer, for dchan_info. */
    int (*probe)(struct dchan_probe *out);

    /* Open local resources; may refuse (the next provider is tried). Sets
     * p->modes/p->default_detect if they depend on the fabric found, and
     * p->addr/p->addr_len to the endpoint address peers need. Local only:
     * it must not communicate, since other ranks may have refused. */
    int (*open)(struct dchan_prov *p);
    /* Collective, after every rank opened: addrs holds nranks entries of
     * addr_len bytes in rank order. */
    int (*connect)(struct dchan_prov *p, const void *addrs, size_t addr_len);
    /* Release everything; handles are already destroyed. Collective. */
    void (*close)(struct dchan_prov *p);

    /* Memory registration used by the core's registration cache. */
    int (*mr_reg)(struct dchan_prov *p, void *addr, size_t len, unsigned access, void **mr);
    void (*mr_dereg)(struct dchan_prov *p, void *mr);

    /* Memory for dchan_alloc and for the core's receive-side sequence
     * words: memory peers of this provider write more cheaply than any
     * other (a shared segment, pre-registered memory). align is a power of
     * two. DCHAN_ERR_NO_MEMORY when exhausted. mem_free gets only what
     * mem_alloc returned. */
    int (*mem_alloc)(struct dchan_prov *p, size_t size, size_t align, void **ptr);
    void (*mem_free)(struct dchan_prov *p, void *ptr);

    /* Receiver: the handle's buffer (and, for FLAG, its sequence word) are
     * set; register them and write the remote-access fields into
     * wire_fields (DCHAN_WIRE_PROV_BYTES, zeroed by the core). */
    int (*recv_open)(dchan_handle_t *h, unsigned char *wire_fields);
    /* Receiver: detection of slot (0 ... depth-1) was re-armed by the core;
     * provide what the next arrival into it needs (e.g. post a receive).
     * Called for every slot at create, then for the released slot at each
     * ready_mark, so slots are armed in the order puts fill them. */
    int (*recv_arm)(dchan_handle_t *h, uint32_t slot);
    /* Receiver: cancel what recv_arm posted, release registrations. */
    void (*recv_close)(dchan_handle_t *h);

    /* Sender: validate and import the remote-access fields of a wire whose
     * core fields are valid; register the send buffer. Returns
     * DCHAN_ERR_HANDLE for fields that cannot be right. */
    int (*send_open)(dchan_handle_t *h, const unsigned char *wire_fields);
    /* Sender: start one put. DCHAN_ERR_AGAIN: resources busy, the core
     * drives progress and retries. DCHAN_PROV_PUT_DONE: the put completed
     * locally before returning. DCHAN_SUCCESS: it is under way, and the
     * provider later reports local completion with dchan_core_put_done. */
    int (*put)(dchan_handle_t *h, const struct dchan_put_desc *d);
    /* Sender: the put in flight could not complete within the drain time;
     * give up on it (cancel, or let it finish in the background). */
    void (*put_abandon)(dchan_handle_t *h);
    /* Sender: release what send_open took; no put is in flight. */
    void (*send_close)(dchan_handle_t *h);
    /* Sender: the address of the receiver's memory at offset in its buffer
     * when it is mapped in this process (a put there is a plain store), or
     * DCHAN_ERR_UNSUPPORTED. For dchan_put_ptr, and for the credit of a
     * SENTINEL channel, read from the slots' tails: memory of another
     * process must stay mapped until the provider closes. */
    int (*map_slot)(dchan_handle_t *h, size_t offset, void **ptr);

    /* Credit (DESIGN §7). Each rank offers every peer an area of
     * CREDIT_WORDS 8-byte words that only that peer writes: a receiver
     * returns the credit of its channel from this rank into the word whose
     * index the wire carries (the receiver allocates indices, per sender).
     * Sender: the local word for index of h's receiver (valid until
     * credit_close), which the receiver's credit_write updates. */
    int (*credit_open)(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word);
    void (*credit_close)(dchan_handle_t *h);
    /* Receiver: write the 8 bytes at src into word index of the sender's
     * area for this rank, ordered after every earlier credit_write of the
     * handle. DCHAN_PROV_PUT_DONE: done, src is free; DCHAN_SUCCESS: under
     * way, dchan_core_credit_done follows, and src stays untouched until
     * then; DCHAN_ERR_AGAIN: busy, the core retries from progress. */
    int (*credit_write)(dchan_handle_t *h, uint32_t index, const uint64_t *src);
    /* Receiver, optional (NULL: nothing to do): a message arrived on h,
     * whose credit_write follows at its release. A provider that writes
     * the word with a store asks for its line now (dchan_prefetch_owned):
     * the sender has read it since, so the store misses, and stores leave
     * a core in order, so the stores of the put that usually follows (the
     * arrival it signals) would wait for that line. */
    void (*credit_prefetch)(dchan_handle_t *h);

    /* Poll completions; report them through dchan_core_*. Returns >= 0
     * (events seen) or a negative code for a failure of the whole provider. */
    int (*progress)(struct dchan_prov *p);

    /* Wake-up descriptor (DESIGN §7, lib/wakeup.c). wake_fd: once, at the
     * first dchan_wakeup_fd: a descriptor that becomes readable when the
     * provider has work for progress, which the core adds to the context's
     * epoll set; -1: none (the provider signals through dchan_core_wake).
     * wake_arm: the process is about to sleep: tell the peers (a flag they
     * read after their signalling store), then look for work that came
     * before: DCHAN_SUCCESS (anything later makes the descriptor readable)
     * or DCHAN_ERR_AGAIN. Reports found there go through dchan_core_* as
     * in progress. wake_disarm: awake again, after a wake_arm that
     * succeeded; the hot path must not pay for a wake-up from then on. */
    int (*wake_fd)(struct dchan_prov *p, int *fd);
    int (*wake_arm)(struct dchan_prov *p);
    void (*wake_disarm)(struct dchan_prov *p);
    /* For dchan_info: DCHAN_SLEEPS_* */
    int sleeps;
    /* Puts of gathered send sides come as segment lists (dchan_put_desc.iov);
     * false: the core gathers them into a staging buffer first. */
    bool gather;
    /* Get (dchan_create_source); NULL where the provider offers none. */
    const struct dchan_get_ops *get;
};

/* A provider instance inside one context. */
struct dchan_prov {
    const struct dchan_provider_ops *ops;
    dchan_ctx_t *ctx;
    void *state;          /* the provider's own */
    unsigned modes;       /* offered here (may narrow ops->modes) */
    int default_detect;   /* what DCHAN_DETECT_AUTO resolves to */
    const void *addr;     /* endpoint address, set by open */
    size_t addr_len;
    struct dchan_regcache *regs;
    int opened, connected;
    int forced; /* named by DCHAN_PROVIDER or attr.provider: fallbacks are acceptable */
    int declined; /* open refused because the settings ask for it (DCHAN_SHM_CMA=0) */
    char desc[160];       /* what was chosen and why, for DCHAN_LOG=info */
};

/* Providers compiled into this build, in automatic selection order. */
extern const struct dchan_provider_ops *const dchan_providers[];
extern const size_t dchan_num_providers;
const struct dchan_provider_ops *dchan_provider_lookup(const char *name);

/* Shared stubs for operations a provider does not offer. */
int dchan_prov_nosys_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access,
                            void **mr);
void dchan_prov_nosys_mr_dereg(struct dchan_prov *p, void *mr);
int dchan_prov_nosys_mem_alloc(struct dchan_prov *p, size_t size, size_t align, void **ptr);
void dchan_prov_nosys_mem_free(struct dchan_prov *p, void *ptr);
int dchan_prov_noop_recv_arm(dchan_handle_t *h, uint32_t slot);
void dchan_prov_noop_put_abandon(dchan_handle_t *h);
int dchan_prov_nosys_map_slot(dchan_handle_t *h, size_t offset, void **ptr);
void dchan_prov_noop_credit_close(dchan_handle_t *h);
int dchan_prov_nosys_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word);
int dchan_prov_nosys_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src);
int dchan_prov_noop_progress(struct dchan_prov *p);
int dchan_prov_nowake_fd(struct dchan_prov *p, int *fd);     /* *fd = -1 */
int dchan_prov_noop_wake_arm(struct dchan_prov *p);         /* DCHAN_SUCCESS */
void dchan_prov_noop_wake_disarm(struct dchan_prov *p);

/* ---- what the core offers providers ---------------------------------- */

/* Handle accessors. */
struct dchan_prov *dchan_h_prov(const dchan_handle_t *h);
/* DCHAN_PROV_PRIV_BYTES, 16-aligned, zeroed at open: the handle's first
 * bytes (core.h), so that provider paths find them without a call. */
static inline void *dchan_h_priv(dchan_handle_t *h)
{
    return (void *)h;
}
void *dchan_h_buf(const dchan_handle_t *h);
size_t dchan_h_size(const dchan_handle_t *h); /* of one slot */
/* Slots of the handle (1 ... DCHAN_MAX_DEPTH); the receive buffer is
 * depth * size bytes: register and publish all of it. */
uint32_t dchan_h_depth(const dchan_handle_t *h);
size_t dchan_h_span(const dchan_handle_t *h); /* depth * size */
int dchan_h_peer(const dchan_handle_t *h);   /* the other end's rank */
int dchan_h_detect(const dchan_handle_t *h);
uint32_t dchan_h_id(const dchan_handle_t *h); /* receiver: id carried in the wire */
/* FLAG: the receiver's sequence word, or the sender's 8-byte source of
 * sequence values, and the page-aligned chunk holding it (register the
 * chunk, not the word: the cache then serves every handle in it). */
uint64_t *dchan_h_seq_word(const dchan_handle_t *h);
void dchan_h_seq_chunk(const dchan_handle_t *h, void **base, size_t *len);
/* Sender: the receiver handle's id, from the wire. */
uint32_t dchan_h_remote_id(const dchan_handle_t *h);
/* The whole 32-bit generation behind the id (own, or the receiver's). */
uint32_t dchan_h_gen(const dchan_handle_t *h);
/* Receiver: the index of its credit word (UINT32_MAX without credit). */
uint32_t dchan_h_credit_index(const dchan_handle_t *h);

/* The provider's per-handle state; fails to compile when type does not fit. */
#define DCHAN_PROV_PRIV(h, type)                                                           \
    ((type *)dchan_h_priv(h) +                                                             \
     0 * sizeof(char[sizeof(type) <= DCHAN_PROV_PRIV_BYTES ? 1 : -1]))

/* Provider-side context queries. */
int dchan_ctx_rank(const dchan_ctx_t *ctx);
int dchan_ctx_nranks(const dchan_ctx_t *ctx);
int dchan_ctx_thread_level(const dchan_ctx_t *ctx);
uint64_t dchan_ctx_job_key(const dchan_ctx_t *ctx);
/* Is rank on this rank's host (same kernel and namespaces, or the same
 * DCHAN_HOST)? Known from the bootstrap before any provider opens. */
int dchan_ctx_same_host(const dchan_ctx_t *ctx, int rank);
/* The MPI communicator the bootstrap uses (MPI_Comm *), or NULL. */
const void *dchan_ctx_boot_mpi_comm(const dchan_ctx_t *ctx);
/* Receiver handle by wire id; NULL when there is none (stale, destroyed). */
dchan_handle_t *dchan_ctx_recv_handle(dchan_ctx_t *ctx, uint32_t id);

/* Completion reports. May be called only from the provider's progress,
 * put or recv_arm; they never run user callbacks. */
/* Receiver, EVENT: data for this handle has fully arrived. */
void dchan_core_arrival(dchan_handle_t *h);
/* Receiver, EVENT, for a notice that names its handle by wire id: the
 * arrival on the live EVENT handle of p with that id (and that whole
 * generation, that sender rank, unless gen is 0 or peer -1). data, len:
 * when data is not NULL, len bytes carried with the notice, which are the
 * body: copied into the buffer first, refused with DCHAN_ERR_SIZE on the
 * handle unless len is its size, and with DCHAN_ERR_OVERRUN while the
 * application still holds the last arrival (its data stays intact). False
 * when id names no such handle: a late write for a destroyed one. */
bool dchan_core_arrival_id(struct dchan_prov *p, uint32_t id, uint32_t gen, int peer,
                           const void *data, size_t len);
/* The same (gen 0, peer -1), for a notice that also carries a copy of the
 * value its sender last wrote with credit_write to this rank's credit
 * word index: the credit of the send handle whose word that is, known
 * without a load of the word's line, which then stays with the writer. A
 * copy, never the credit itself: the word is written all the same, and a
 * value that no send handle of that sender and index can have changes
 * nothing. */
bool dchan_core_arrival_id_hint(struct dchan_prov *p, uint32_t id, const void *data, size_t len,
                                uint32_t index, uint64_t value);
/* Receiver, SENTINEL or FLAG, for a notice that names its handle by wire
 * id and carries the word that signals an arrival: value is stored, with
 * one aligned 8-byte store, into the tail of slot (SENTINEL) or the
 * handle's sequence word (FLAG), where the next scan finds it as if the
 * sender had stored it. For providers whose own write of that word is a
 * copy another process can see half done (Cross Memory Attach: the
 * kernel's byte copy can be preempted), which would show a word that is
 * neither the sentinel nor the tail. data, len: when data is not NULL,
 * the body carried with the notice (all of the slot but its tail, or all
 * of it for FLAG), copied into the slot first; any other len is
 * DCHAN_ERR_SIZE on the handle, and nothing is written. Nothing is
 * stored on a handle in error, nor in a slot the application still holds
 * (DCHAN_ERR_OVERRUN is raised on the handle instead). False when id
 * names no live SENTINEL or FLAG receive handle of p, or slot is not one
 * of its slots. */
bool dchan_core_signal_id(struct dchan_prov *p, uint32_t id, uint32_t slot, uint64_t value,
                          const void *data, size_t len);
/* Sender: the put in flight completed locally (rc 0) or failed (rc < 0). */
void dchan_core_put_done(dchan_handle_t *h, int rc);
/* Receiver: may data be written into slot of r now? For providers that
 * place data themselves (self, shared memory): DCHAN_SUCCESS, or
 * DCHAN_ERR_OVERRUN (raised on r) when the application still holds what
 * arrived there. */
int dchan_core_recv_writable(dchan_handle_t *r, uint32_t slot);
/* Receiver: a credit_write that returned DCHAN_SUCCESS completed (rc 0)
 * or failed. */
void dchan_core_credit_done(dchan_handle_t *h, int rc);
/* Wake-up: make the context's descriptor readable if the process armed
 * it and has not woken since (for work created inside this process: self
 * puts, another thread's). Only from inside a dchan call on ctx, under its
 * lock where it has one: that is what lets it make no fence (one load
 * when nobody sleeps). */
void dchan_core_wake(dchan_ctx_t *ctx);
/* A wake-up for providers that cannot sleep until an event: a one-shot
 * timer from DCHAN_WAKE_TIMER_MIN_US after activity, doubling at each
 * empty look up to DCHAN_WAKE_TIMER_MAX_US (lib/wakeup.c). */
struct dchan_waketimer {
    int fd;
    uint64_t cur_us, min_us, max_us;
};
void dchan_waketimer_init(dchan_ctx_t *ctx, struct dchan_waketimer *t); /* no fd yet */
int dchan_waketimer_fd(dchan_ctx_t *ctx, struct dchan_waketimer *t, int *fd);
/* Arm for the next look; stop: nothing can come (no timer). */
int dchan_waketimer_arm(struct dchan_waketimer *t, bool stop);
static inline void dchan_waketimer_activity(struct dchan_waketimer *t)
{
    t->cur_us = 0;
}
void dchan_waketimer_close(struct dchan_waketimer *t);


/* Ask for the line of p in a state this core may write: a plain load
 * would fetch it shared, then need a second transfer to own it. */
static inline void dchan_prefetch_owned(const void *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p)); /* a no-op where unknown */
#else
    __builtin_prefetch(p, 1);
#endif
}

/* Either side: an asynchronous failure on one handle (it enters the error
 * state; error_fn is called from the next progress). */
void dchan_core_handle_error(dchan_handle_t *h, int rc);
/* A failure of everything bound to one peer of this provider. */
void dchan_core_peer_error(struct dchan_prov *p, int peer, int rc);

/* Registration cache: one registration per (address, length, access) and
 * provider, reference counted. */
int dchan_reg_get(struct dchan_prov *p, void *addr, size_t len, unsigned access,
                  struct dchan_reg **r);
void dchan_reg_put(struct dchan_reg *r);
void *dchan_reg_mr(const struct dchan_reg *r);

/* Every parameter of lib/params.def, parsed and validated by dchan_init
 * (a malformed value never reaches a provider). */
const struct dchan_params *dchan_ctx_params(const dchan_ctx_t *ctx);

#endif /* DCHAN_PROVIDER_H */
