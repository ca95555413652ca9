/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpi: two-sided emulation on a private duplicate of the bootstrap
 * communicator (EVENT only). A receive handle of depth k owns k persistent
 * receives, one per slot, each into its own slot of the user buffer, all
 * from the sender's rank with a tag unique to the handle; slot s is started
 * when the core arms it. Slots are armed in the order puts fill them, and
 * MPI matches messages of one (source, tag, communicator) in the order they
 * were sent against receives in the order they were started, so the n-th
 * put lands in slot n mod k. A put is an MPI_Isend with that tag (not a
 * persistent send: Open MPI completes small Isends inline, which its
 * persistent requests cannot).
 *
 * Credit is a message on a second duplicate, so it never matches data: the
 * receiver sends the 8-byte cumulative count with tag = the credit index
 * (unique per sender and receiver rank; MPI matches on the source too), the
 * sender keeps a persistent receive posted for it and copies each count it
 * receives into a per-peer table of words that the core reads.
 *
 * Progress tests the started requests together: the put in flight, the
 * credit receive and credit send, and, per receive handle, only the
 * receive of the next slot expected, so that arrivals of one handle are
 * reported in slot order.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "provider.h"
#include "wire.h"

/* What a started request is for. */
enum {
    W_RECV,   /* receive handle: the receive of its next slot */
    W_SEND,   /* send handle: the put in flight */
    W_CSEND,  /* receive handle: the credit count in flight */
    W_CRECV,  /* send handle: the receive waiting for the next count */
    W_ORPHAN, /* a credit send that outlived its handle */
    /* get (see "get" below) */
    W_GPUBS,  /* source: a published count in flight */
    W_GREQR,  /* source: the receive waiting for the getter's request */
    W_GDATAS, /* source: the data in flight */
    W_GREQS,  /* getter: its request in flight */
    W_GPUBR,  /* getter: the receive waiting for the next published count */
    W_GDATAR, /* getter: the receive of the data */
};

/* One request that may sit in the started list. */
struct mpi_wait {
    MPI_Request *rq;   /* where the request lives while it is not listed */
    dchan_handle_t *h; /* owner; NULL for W_ORPHAN */
    int pos;           /* index in the started list, -1 when not there */
    int kind;
};

struct mpi_state {
    MPI_Comm comm;  /* data */
    MPI_Comm ccomm; /* credit: a message there never matches a put */
    int tag_ub;
    /* started requests, tested together by progress */
    MPI_Request *reqs;
    struct mpi_wait **w;
    struct mpi_wait **fired;
    int *done;
    MPI_Status *st;
    int nreq, cap;
    int nwait; /* requests that may be started at once: nreq never exceeds it */
    /* per sender-side peer: CREDIT_WORDS counts received, allocated at the
     * first credited channel to it; they outlive send handles, so that a
     * sender associating again goes on from the last count */
    uint64_t **credit;
    uint32_t cwords;
    int nranks;
    /* get: per receiver rank, the next triple of tags a source to it takes
     * (see "get" below), and the sources alive on this rank */
    uint32_t *gnext;
    struct mpi_g *glive;
    struct dchan_waketimer wt; /* wake-up (see mpi_wake_arm) */
};

/* A receive handle's slots and its credit send. Not in the handle: a
 * credit send may outlive it (W_ORPHAN), and 64 requests would not fit. */
struct mpi_rx {
    struct mpi_wait cw;
    MPI_Request creq;
    uint64_t cbuf;    /* the count in flight: the core's copy dies with the handle */
    uint64_t active;  /* started slots, a bit each */
    uint32_t next;    /* the slot the next arrival fills */
    uint32_t nactive; /* started slots */
    uint32_t depth;
    MPI_Request reqs[]; /* persistent receive of each slot */
};

struct mpi_h {
    struct mpi_wait w; /* W_RECV or W_SEND */
    struct dchan_prov *p; /* the handle's provider and peer, for the per-message calls */
    int peer;
    MPI_Request req;   /* the put in flight */
    MPI_Datatype type;
    int count;
    int tag;
    bool recv;
    struct mpi_rx *rx; /* receive handle */
    /* send handle, credited */
    struct mpi_wait cw; /* W_CRECV */
    MPI_Request creq;   /* persistent receive of the counts */
    uint64_t cin;       /* where it lands */
    uint64_t *cword;    /* the table word the core reads */
    bool copen;
};

/* MPI error classes to our codes; the MPI detail goes to the log. */
static int mpi_rc(struct dchan_prov *p, int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0, cls = MPI_ERR_OTHER;
    if (err == MPI_SUCCESS)
        return DCHAN_SUCCESS;
    MPI_Error_class(err, &cls);
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS)
        msg[0] = '\0';
    dchan_warn(p->ctx, "mpi", "%s: %s", what, msg);
    switch (cls) {
    case MPI_ERR_TRUNCATE:
        return DCHAN_ERR_SIZE;
    case MPI_ERR_NO_MEM:
        return DCHAN_ERR_NO_MEMORY;
    case MPI_ERR_RANK:
        return DCHAN_ERR_PEER;
    default:
        return DCHAN_ERR_PROVIDER;
    }
}

static void library_version(char *out, size_t len)
{
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(v, &n);
    v[strcspn(v, ",\n")] = '\0';
    snprintf(out, len, "%.100s", v);
}

static int mpi_probe(struct dchan_probe *out)
{
    char v[128];
    library_version(v, sizeof v);
    snprintf(out->desc, sizeof out->desc, "%.100s; in programs that initialise MPI", v);
    out->modes = DCHAN_MODE_BIT(DCHAN_DETECT_EVENT);
    out->default_detect = DCHAN_DETECT_EVENT;
    return DCHAN_SUCCESS;
}

static int needed_mpi_level(int dchan_level)
{
    switch (dchan_level) {
    case DCHAN_THREAD_FUNNELED:
        return MPI_THREAD_FUNNELED;
    case DCHAN_THREAD_SERIALIZED:
        return MPI_THREAD_SERIALIZED;
    case DCHAN_THREAD_MULTIPLE:
        return MPI_THREAD_MULTIPLE;
    default:
        return MPI_THREAD_SINGLE;
    }
}

static int mpi_open(struct dchan_prov *p)
{
    int init = 0, fini = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    if (!init || fini) {
        snprintf(p->desc, sizeof p->desc, "MPI is not initialised by the program");
        return DCHAN_ERR_UNSUPPORTED;
    }
    /* The mpi bootstrap checks this too; a PMIx or external bootstrap in a
     * program that initialised MPI does not. Every MPI call of this
     * provider is made inside a dchan call, from the threads the dchan
     * level allows, so MPI at that level is enough. */
    MPI_Query_thread(&provided);
    if (provided < needed_mpi_level(dchan_ctx_thread_level(p->ctx))) {
        snprintf(p->desc, sizeof p->desc,
                 "MPI's thread level %d is below the %d that dchan's thread level needs",
                 provided, needed_mpi_level(dchan_ctx_thread_level(p->ctx)));
        return DCHAN_ERR_UNSUPPORTED;
    }
    struct mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    s->comm = MPI_COMM_NULL;
    s->ccomm = MPI_COMM_NULL;
    dchan_waketimer_init(p->ctx, &s->wt);
    p->state = s;
    p->default_detect = DCHAN_DETECT_EVENT;
    p->addr_len = 0;
    return DCHAN_SUCCESS;
}

static int mpi_connect(struct dchan_prov *p, const void *addrs, size_t len)
{
    struct mpi_state *s = p->state;
    const MPI_Comm *boot = dchan_ctx_boot_mpi_comm(p->ctx);
    int rank = -1, size = -1, flag = 0, *ub = NULL, rc;

    rc = MPI_Comm_dup(boot ? *boot : MPI_COMM_WORLD, &s->comm);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    rc = MPI_Comm_dup(s->comm, &s->ccomm);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(s->ccomm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm, &rank);
    MPI_Comm_size(s->comm, &size);
    if (rank != dchan_ctx_rank(p->ctx) || size != dchan_ctx_nranks(p->ctx)) {
        /* Bootstrapped by PMIx or externally with another numbering. */
        snprintf(p->desc, sizeof p->desc,
                 "MPI_COMM_WORLD rank %d of %d does not match the bootstrap's %d of %d", rank,
                 size, dchan_ctx_rank(p->ctx), dchan_ctx_nranks(p->ctx));
        return DCHAN_ERR_UNSUPPORTED;
    }
    MPI_Comm_get_attr(s->comm, MPI_TAG_UB, &ub, &flag);
    s->tag_ub = flag && ub ? *ub : 32767;
    s->nranks = size;
    s->cwords = (uint32_t)dchan_ctx_params(p->ctx)->CREDIT_WORDS;
    s->credit = calloc((size_t)size, sizeof *s->credit);
    s->gnext = calloc((size_t)size, sizeof *s->gnext);
    if (!s->credit || !s->gnext)
        return DCHAN_ERR_NO_MEMORY;
    if (s->cwords - 1 > (uint32_t)s->tag_ub)
        dchan_warn(p->ctx, "mpi",
                   "MPI_TAG_UB %d is below DCHAN_CREDIT_WORDS %u: credited channels beyond "
                   "the %d-th from one rank are refused",
                   s->tag_ub, s->cwords, s->tag_ub + 1);
    {
        char v[128];
        library_version(v, sizeof v);
        snprintf(p->desc, sizeof p->desc, "%.100s, two-sided emulation, tags up to %d", v,
                 s->tag_ub);
    }
    return DCHAN_SUCCESS;
}

/* dchan_finalize after MPI_Finalize: release without calling MPI. */
static int mpi_gone(void)
{
    int fini = 0;
    MPI_Finalized(&fini);
    return fini;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int mpi_progress(struct dchan_prov *p);

static void mpi_close(struct dchan_prov *p)
{
    struct mpi_state *s = p->state;
    if (!s)
        return;
    if (!mpi_gone()) {
        /* Only orphaned credit sends can be left: give them the drain
         * time, then leave them to MPI (and their buffers with them). */
        uint64_t deadline = now_ns() + dchan_ctx_params(p->ctx)->DRAIN_TIMEOUT_MS * 1000000ull;
        while (s->nreq > 0 && now_ns() < deadline)
            if (mpi_progress(p) < 0)
                break;
        if (s->nreq > 0)
            dchan_warn(p->ctx, "mpi", "%d credit messages still in flight at close", s->nreq);
        for (int i = 0; i < s->nreq; i++)
            MPI_Request_free(&s->reqs[i]);
        if (s->ccomm != MPI_COMM_NULL)
            MPI_Comm_free(&s->ccomm);
        if (s->comm != MPI_COMM_NULL)
            MPI_Comm_free(&s->comm);
    } else {
        for (int i = 0; i < s->nreq; i++)
            if (s->w[i]->kind == W_ORPHAN)
                free((char *)s->w[i] - offsetof(struct mpi_rx, cw));
    }
    if (s->credit)
        for (int i = 0; i < s->nranks; i++)
            free(s->credit[i]);
    free(s->credit);
    free(s->gnext);
    free(s->reqs);
    free(s->w);
    free(s->fired);
    free(s->done);
    free(s->st);
    dchan_waketimer_close(&s->wt);
    free(s);
    p->state = NULL;
}

/* Sizes beyond INT_MAX bytes go as a derived datatype. */
static int make_type(size_t size, MPI_Datatype *type, int *count)
{
    const size_t chunk = (size_t)1 << 30;
    MPI_Datatype big;
    if (size <= INT_MAX) {
        *type = MPI_BYTE;
        *count = (int)size;
        return MPI_SUCCESS;
    }
    int rc = MPI_Type_contiguous((int)chunk, MPI_BYTE, &big);
    if (rc != MPI_SUCCESS)
        return rc;
    if (size % chunk == 0) {
        *type = big;
        *count = (int)(size / chunk);
    } else {
        int lens[2] = {(int)(size / chunk), (int)(size % chunk)};
        MPI_Aint displ[2] = {0, (MPI_Aint)(size / chunk * chunk)};
        MPI_Datatype types[2] = {big, MPI_BYTE};
        rc = MPI_Type_create_struct(2, lens, displ, types, type);
        MPI_Type_free(&big);
        if (rc != MPI_SUCCESS)
            return rc;
        *count = 1;
    }
    return MPI_Type_commit(type);
}

/* A gathered send side: one hindexed type over the segments' absolute
 * addresses (sent from MPI_BOTTOM), committed once at association; pieces
 * above 1 GiB are split so that every block length fits an int. */
static int make_gather_type(const dchan_iov_t *segs, size_t nseg, MPI_Datatype *type, int *count)
{
    const size_t piece = (size_t)1 << 30;
    size_t n = 0;
    for (size_t i = 0; i < nseg; i++)
        n += (segs[i].len + piece - 1) / piece;
    if (n > INT_MAX)
        return MPI_ERR_COUNT;
    int *lens = malloc(n * sizeof *lens);
    MPI_Aint *displ = malloc(n * sizeof *displ);
    int rc = MPI_ERR_NO_MEM;
    if (lens && displ) {
        size_t k = 0;
        for (size_t i = 0; i < nseg; i++)
            for (size_t off = 0; off < segs[i].len; off += piece, k++) {
                size_t left = segs[i].len - off;
                lens[k] = (int)(left < piece ? left : piece);
                MPI_Get_address((const char *)segs[i].base + off, &displ[k]);
            }
        rc = MPI_Type_create_hindexed((int)n, lens, displ, MPI_BYTE, type);
        if (rc == MPI_SUCCESS)
            rc = MPI_Type_commit(type);
        *count = 1;
    }
    free(lens);
    free(displ);
    return rc;
}

static void free_type(struct mpi_h *m)
{
    if (m->type != MPI_BYTE && m->type != MPI_DATATYPE_NULL)
        MPI_Type_free(&m->type);
}

/* Room for n more started requests, reserved when a handle is made so
 * that starting a request never allocates. */
static int reserve(struct mpi_state *s, int n)
{
    int need = s->nwait + n;
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 64;
        while (cap < need)
            cap *= 2;
        MPI_Request *r = realloc(s->reqs, (size_t)cap * sizeof *r);
        if (r)
            s->reqs = r;
        struct mpi_wait **w = realloc(s->w, (size_t)cap * sizeof *w);
        if (w)
            s->w = w;
        struct mpi_wait **f = realloc(s->fired, (size_t)cap * sizeof *f);
        if (f)
            s->fired = f;
        int *d = realloc(s->done, (size_t)cap * sizeof *d);
        if (d)
            s->done = d;
        MPI_Status *st = realloc(s->st, (size_t)cap * sizeof *st);
        if (st)
            s->st = st;
        if (!r || !w || !f || !d || !st)
            return DCHAN_ERR_NO_MEMORY;
        s->cap = cap;
    }
    s->nwait = need;
    return DCHAN_SUCCESS;
}

static void unreserve(struct mpi_state *s, int n)
{
    s->nwait -= n;
}

static void started_add(struct mpi_state *s, struct mpi_wait *w)
{
    s->reqs[s->nreq] = *w->rq;
    s->w[s->nreq] = w;
    w->pos = s->nreq++;
}

/* Out of the list; MPI's current handle goes back to its owner. */
static void started_remove(struct mpi_state *s, struct mpi_wait *w)
{
    int i = w->pos, last = --s->nreq;
    *w->rq = s->reqs[i];
    w->pos = -1;
    if (i != last) {
        s->reqs[i] = s->reqs[last];
        s->w[i] = s->w[last];
        s->w[i]->pos = i;
    }
}

/* ---- receiver -------------------------------------------------------------------- */

static void rx_free_reqs(struct mpi_rx *rx)
{
    for (uint32_t i = 0; i < rx->depth; i++)
        if (rx->reqs[i] != MPI_REQUEST_NULL)
            MPI_Request_free(&rx->reqs[i]);
}

static int mpi_recv_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    uint32_t id = dchan_h_id(h), depth = dchan_h_depth(h);
    size_t size = dchan_h_size(h);
    int rc = MPI_SUCCESS;

    /* The tag is the handle's slot, plus its generation where the tag space
     * allows, so that a stale sender is less likely to match a new handle. */
    uint32_t idx = id & 0xffffffu, gen = id >> 24;
    if (s->tag_ub >= INT_MAX)
        m->tag = (int)(((gen & 0x7fu) << 24) | idx);
    else if (idx < (uint32_t)s->tag_ub)
        m->tag = (int)idx + 1;
    else
        return DCHAN_ERR_NO_MEMORY; /* more live handles than this MPI's tags */
    m->recv = true;
    m->p = p;
    m->peer = dchan_h_peer(h);
    m->type = MPI_DATATYPE_NULL;
    m->req = MPI_REQUEST_NULL;
    m->rx = calloc(1, sizeof *m->rx + depth * sizeof(MPI_Request));
    if (!m->rx)
        return DCHAN_ERR_NO_MEMORY;
    struct mpi_rx *rx = m->rx;
    rx->depth = depth;
    rx->creq = MPI_REQUEST_NULL;
    rx->cw = (struct mpi_wait){.rq = &rx->creq, .h = h, .pos = -1, .kind = W_CSEND};
    for (uint32_t i = 0; i < depth; i++)
        rx->reqs[i] = MPI_REQUEST_NULL;
    m->w = (struct mpi_wait){.rq = &rx->reqs[0], .h = h, .pos = -1, .kind = W_RECV};
    /* The head receive and a credit send. */
    if (reserve(s, 2) != DCHAN_SUCCESS) {
        free(rx);
        m->rx = NULL;
        return DCHAN_ERR_NO_MEMORY;
    }
    rc = make_type(size, &m->type, &m->count);
    for (uint32_t i = 0; i < depth && rc == MPI_SUCCESS; i++)
        rc = MPI_Recv_init((char *)dchan_h_buf(h) + (size_t)i * size, m->count, m->type,
                           dchan_h_peer(h), m->tag, s->comm, &rx->reqs[i]);
    if (rc != MPI_SUCCESS) {
        rx_free_reqs(rx);
        free_type(m);
        free(rx);
        m->rx = NULL;
        unreserve(s, 2);
        return mpi_rc(p, rc, "MPI_Recv_init");
    }
    dchan_put_le32(wire_fields, (uint32_t)m->tag);
    return DCHAN_SUCCESS;
}

static int mpi_recv_arm(dchan_handle_t *h, uint32_t slot)
{
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    struct dchan_prov *p = m->p;
    struct mpi_rx *rx = m->rx;
    if (slot >= rx->depth)
        return DCHAN_ERR_INVALID_ARG;
    if (rx->active & (1ull << slot))
        return DCHAN_SUCCESS;
    int rc = MPI_Start(&rx->reqs[slot]);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Start (receive)");
    rx->active |= 1ull << slot;
    if (rx->nactive++ == 0) {
        /* Nothing outstanding: this slot is the next to fill. */
        rx->next = slot;
        m->w.rq = &rx->reqs[slot];
        started_add(p->state, &m->w);
    }
    return DCHAN_SUCCESS;
}

static void mpi_recv_close(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    struct mpi_rx *rx = m->rx;
    bool gone = mpi_gone();

    if (m->w.pos >= 0)
        started_remove(s, &m->w);
    if (!gone) {
        for (uint32_t i = 0; i < rx->depth; i++)
            if (rx->active & (1ull << i))
                MPI_Cancel(&rx->reqs[i]);
        for (uint32_t i = 0; i < rx->depth; i++)
            if (rx->active & (1ull << i))
                MPI_Wait(&rx->reqs[i], MPI_STATUS_IGNORE);
        rx_free_reqs(rx);
        free_type(m);
    }
    rx->active = 0;
    rx->nactive = 0;
    unreserve(s, 1);
    m->rx = NULL;
    if (rx->cw.pos >= 0 && !gone) {
        /* The core gave up waiting for the credit send: MPI still reads
         * rx->cbuf, so rx lives on until progress sees the send complete. */
        rx->cw.kind = W_ORPHAN;
        rx->cw.h = NULL;
        return;
    }
    if (rx->cw.pos >= 0)
        started_remove(s, &rx->cw);
    unreserve(s, 1);
    free(rx);
}

/* Receiver: send the count; MPI keeps messages of one (source, tag,
 * communicator) in order, so counts arrive in the order they were sent. */
static int mpi_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_rx *rx = DCHAN_PROV_PRIV(h, struct mpi_h)->rx;
    int done = 0, rc;

    if (index > (uint32_t)s->tag_ub) {
        dchan_warn(p->ctx, "mpi", "credit index %u needs a tag above MPI_TAG_UB %d", index,
                   s->tag_ub);
        return DCHAN_ERR_UNSUPPORTED;
    }
    if (rx->cw.pos >= 0)
        return DCHAN_ERR_AGAIN; /* the core sends one at a time: not expected */
    /* Our own copy: the send may outlive the handle (see mpi_recv_close). */
    rx->cbuf = *src;
    rc = MPI_Isend(&rx->cbuf, 1, MPI_UINT64_T, dchan_h_peer(h), (int)index, s->ccomm, &rx->creq);
    if (rc == MPI_SUCCESS)
        rc = MPI_Test(&rx->creq, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Isend (credit)");
    if (done)
        return DCHAN_PROV_PUT_DONE; /* went inline, as small sends mostly do */
    started_add(s, &rx->cw);
    return DCHAN_SUCCESS;
}

/* ---- sender ------------------------------------------------------------------------ */

static int mpi_send_open(dchan_handle_t *h, const unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    uint32_t tag = dchan_get_le32(wire_fields);
    int rc;

    for (int i = 4; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wire_fields[i])
            return DCHAN_ERR_HANDLE;
    if (tag > (uint32_t)s->tag_ub)
        return DCHAN_ERR_HANDLE;
    m->tag = (int)tag;
    m->recv = false;
    m->p = p;
    m->peer = dchan_h_peer(h);
    m->type = MPI_DATATYPE_NULL;
    m->req = MPI_REQUEST_NULL;
    m->w = (struct mpi_wait){.rq = &m->req, .h = h, .pos = -1, .kind = W_SEND};
    if (reserve(s, 1) != DCHAN_SUCCESS)
        return DCHAN_ERR_NO_MEMORY;
    const dchan_iov_t *segs;
    size_t nseg = dchan_h_segs(h, &segs);
    rc = nseg ? make_gather_type(segs, nseg, &m->type, &m->count)
              : make_type(dchan_h_size(h), &m->type, &m->count);
    if (rc != MPI_SUCCESS) {
        free_type(m);
        unreserve(s, 1);
        return mpi_rc(p, rc, "MPI_Type_create");
    }
    return DCHAN_SUCCESS;
}

static int mpi_put(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct mpi_h *m = d->priv;
    struct dchan_prov *p = m->p;
    struct mpi_state *s = p->state;
    int done = 0;
    (void)h;
    /* d->offset is not needed: the receiver posted each slot's receive at
     * its own address, in the order puts fill them. */
    /* A gathered put: the type holds the segments' absolute addresses. */
    int rc = MPI_Isend(d->iov ? MPI_BOTTOM : d->src, m->count, m->type, m->peer, m->tag, s->comm,
                       &m->req);
    if (rc == MPI_SUCCESS)
        rc = MPI_Test(&m->req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Isend");
    if (done)
        return DCHAN_PROV_PUT_DONE; /* sent inline: nothing to track */
    started_add(s, &m->w);
    return DCHAN_SUCCESS;
}

static void mpi_put_abandon(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    if (m->w.pos < 0)
        return;
    started_remove(p->state, &m->w);
    /* Freeing a started request lets MPI finish it on its own. */
    if (!mpi_gone())
        MPI_Request_free(&m->req);
    m->req = MPI_REQUEST_NULL;
}

static void mpi_send_close(dchan_handle_t *h)
{
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    if (!mpi_gone()) {
        if (m->req != MPI_REQUEST_NULL)
            MPI_Request_free(&m->req);
        free_type(m);
    }
    unreserve(dchan_h_prov(h)->state, 1);
}

/* The larger count wins: the values of a credit word only grow, across
 * the channels that use it in turn (lib/handle.c, cid_free), so one that
 * arrives after a larger one is stale. */
static void credit_apply(uint64_t *word, uint64_t v)
{
    if (v > __atomic_load_n(word, __ATOMIC_RELAXED))
        __atomic_store_n(word, v, __ATOMIC_RELEASE);
}

/* Take every count that already arrived, then leave the receive posted
 * and listed for the next one. The receive is started on entry. */
static int crecv_drain(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    for (;;) {
        MPI_Status st;
        int flag = 0, count = -1;
        int rc = MPI_Test(&m->creq, &flag, &st);
        if (rc != MPI_SUCCESS)
            return mpi_rc(p, rc, "credit receive");
        if (!flag)
            break;
        MPI_Get_count(&st, MPI_UINT64_T, &count);
        if (count == 1)
            credit_apply(m->cword, m->cin);
        if ((rc = MPI_Start(&m->creq)) != MPI_SUCCESS)
            return mpi_rc(p, rc, "MPI_Start (credit receive)");
    }
    started_add(p->state, &m->cw);
    return DCHAN_SUCCESS;
}

static int mpi_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    int peer = dchan_h_peer(h), rc;

    if (index >= s->cwords)
        return DCHAN_ERR_HANDLE;
    if (index > (uint32_t)s->tag_ub) {
        dchan_warn(p->ctx, "mpi", "credit index %u needs a tag above MPI_TAG_UB %d", index,
                   s->tag_ub);
        return DCHAN_ERR_UNSUPPORTED;
    }
    if (!s->credit[peer] && !(s->credit[peer] = calloc(s->cwords, sizeof(uint64_t))))
        return DCHAN_ERR_NO_MEMORY;
    if (reserve(s, 1) != DCHAN_SUCCESS)
        return DCHAN_ERR_NO_MEMORY;
    m->cword = &s->credit[peer][index];
    m->creq = MPI_REQUEST_NULL;
    m->cw = (struct mpi_wait){.rq = &m->creq, .h = h, .pos = -1, .kind = W_CRECV};
    rc = MPI_Recv_init(&m->cin, 1, MPI_UINT64_T, peer, (int)index, s->ccomm, &m->creq);
    if (rc == MPI_SUCCESS)
        rc = MPI_Start(&m->creq);
    if (rc != MPI_SUCCESS) {
        if (m->creq != MPI_REQUEST_NULL)
            MPI_Request_free(&m->creq);
        unreserve(s, 1);
        return mpi_rc(p, rc, "MPI_Recv_init (credit)");
    }
    /* Counts sent while no send handle listened are waiting: take them now,
     * so that the core reads the latest at once. */
    if ((rc = crecv_drain(h)) != DCHAN_SUCCESS) {
        if (m->cw.pos >= 0)
            started_remove(s, &m->cw);
        MPI_Cancel(&m->creq);
        MPI_Wait(&m->creq, MPI_STATUS_IGNORE);
        MPI_Request_free(&m->creq);
        unreserve(s, 1);
        return rc;
    }
    m->copen = true;
    *word = m->cword;
    return DCHAN_SUCCESS;
}

static void mpi_credit_close(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    if (!m->copen)
        return;
    m->copen = false;
    if (m->cw.pos >= 0)
        started_remove(s, &m->cw);
    unreserve(s, 1);
    if (mpi_gone())
        return;
    if (m->creq != MPI_REQUEST_NULL) {
        MPI_Status st;
        int cancelled = 1, count = -1;
        MPI_Cancel(&m->creq);
        if (MPI_Wait(&m->creq, &st) == MPI_SUCCESS) {
            MPI_Test_cancelled(&st, &cancelled);
            /* Matched before the cancel: the count is news for the next
             * handle on this word. */
            if (!cancelled && MPI_Get_count(&st, MPI_UINT64_T, &count) == MPI_SUCCESS &&
                count == 1)
                credit_apply(m->cword, m->cin);
        }
        MPI_Request_free(&m->creq);
    }
}

/* ---- progress ------------------------------------------------------------------------ */

/* A receive handle's head slot completed (or failed): report it, then take
 * the slots behind it that completed too, and list the next one. */
static void recv_done(struct dchan_prov *p, dchan_handle_t *h, const MPI_Status *st, int err)
{
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    struct mpi_rx *rx = m->rx;
    MPI_Status st2;
    for (;;) {
        int drc = err == MPI_SUCCESS ? DCHAN_SUCCESS : mpi_rc(p, err, "receive completion");
        if (drc == DCHAN_SUCCESS) {
            int count = -1;
            MPI_Get_count(st, m->type, &count);
            drc = count == m->count ? DCHAN_SUCCESS : DCHAN_ERR_SIZE;
        }
        rx->active &= ~(1ull << rx->next);
        rx->nactive--;
        rx->next = rx->next + 1 == rx->depth ? 0 : rx->next + 1;
        if (drc != DCHAN_SUCCESS) {
            dchan_core_handle_error(h, drc);
            return;
        }
        dchan_core_arrival(h);
        if (rx->nactive == 0)
            return;
        /* Slots are started in ring order from next: it is started. */
        if (!(rx->active & (1ull << rx->next)))
            return;
        int flag = 0;
        m->w.rq = &rx->reqs[rx->next];
        err = MPI_Test(m->w.rq, &flag, &st2);
        if (err == MPI_SUCCESS && !flag) {
            started_add(p->state, &m->w);
            return;
        }
        st = &st2;
    }
}

static void get_fired(struct dchan_prov *p, struct mpi_wait *w, const MPI_Status *st, int err);

static void fired(struct dchan_prov *p, struct mpi_wait *w, const MPI_Status *st, int err)
{
    struct mpi_state *s = p->state;
    dchan_handle_t *h = w->h;
    int drc;

    switch (w->kind) {
    case W_RECV:
        recv_done(p, h, st, err);
        break;
    case W_SEND:
        dchan_core_put_done(h, mpi_rc(p, err, "send completion"));
        break;
    case W_CSEND:
        dchan_core_credit_done(h, mpi_rc(p, err, "credit send completion"));
        break;
    case W_ORPHAN:
        unreserve(s, 1);
        free((char *)w - offsetof(struct mpi_rx, cw));
        break;
    case W_GPUBS:
    case W_GREQR:
    case W_GDATAS:
    case W_GREQS:
    case W_GPUBR:
    case W_GDATAR:
        get_fired(p, w, st, err);
        break;
    case W_CRECV: {
        struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
        int count = -1;
        if ((drc = mpi_rc(p, err, "credit receive")) != DCHAN_SUCCESS) {
            dchan_core_handle_error(h, drc);
            break;
        }
        MPI_Get_count(st, MPI_UINT64_T, &count);
        if (count == 1)
            credit_apply(m->cword, m->cin);
        if ((err = MPI_Start(&m->creq)) != MPI_SUCCESS) {
            dchan_core_handle_error(h, mpi_rc(p, err, "MPI_Start (credit receive)"));
            break;
        }
        /* Listed again, not tested again: a test of a receive that has not
         * matched makes MPI progress, a whole poll on the path from the
         * credit to the next put. A later count is taken by the next poll. */
        started_add(p->state, &m->cw);
        break;
    }
    }
}

static int mpi_progress(struct dchan_prov *p)
{
    struct mpi_state *s = p->state;
    int n = 0, rc, j = 0;

    if (s->nreq == 0)
        return 0;
    if (s->nreq == 1) {
        /* One request (a pingpong, one channel): MPI_Test looks again after
         * its own progress, for one progress per idle poll. */
        int flag = 0;
        rc = MPI_Test(&s->reqs[0], &flag, &s->st[0]);
        if (rc == MPI_SUCCESS && !flag)
            return 0;
        if (rc == MPI_SUCCESS) {
            /* Its owner gets it back, the list is empty again. */
            struct mpi_wait *w = s->w[0];
            *w->rq = s->reqs[0];
            w->pos = -1;
            s->w[0] = NULL;
            s->nreq = 0;
            dchan_waketimer_activity(&s->wt);
            fired(p, w, &s->st[0], MPI_SUCCESS);
            return 1;
        }
        n = flag;
        s->done[0] = 0;
        if (rc != MPI_SUCCESS) {
            /* Report it through the completion path, like Testsome would. */
            s->st[0].MPI_ERROR = rc;
            rc = MPI_ERR_IN_STATUS;
            n = 1;
        }
    } else {
        rc = MPI_Testsome(s->nreq, s->reqs, &n, s->done, s->st);
        /* Open MPI's Testsome looks at the requests first and makes progress
         * last, without looking again: what that progress completed would
         * only be seen by the next dchan_progress. Look again at once. */
        if (rc == MPI_SUCCESS && n == 0)
            rc = MPI_Testsome(s->nreq, s->reqs, &n, s->done, s->st);
    }
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)
        return mpi_rc(p, rc, "MPI_Testsome");
    if (n == MPI_UNDEFINED || n == 0)
        return 0;
    dchan_waketimer_activity(&s->wt); /* the next sleep looks again soon */
    /* Give each completed request back to its owner (persistent ones stay
     * allocated), then compact the list in one pass. */
    for (int k = 0; k < n; k++) {
        int i = s->done[k];
        struct mpi_wait *w = s->w[i];
        *w->rq = s->reqs[i];
        w->pos = -1;
        s->fired[k] = w;
        s->w[i] = NULL;
    }
    for (int i = 0; i < s->nreq; i++) {
        if (!s->w[i])
            continue;
        s->reqs[j] = s->reqs[i];
        s->w[j] = s->w[i];
        s->w[j]->pos = j;
        j++;
    }
    s->nreq = j;
    /* Reports may list requests again (the next slot, the credit
     * receive), so the list is whole before the first one. */
    for (int k = 0; k < n; k++) {
        int err = rc == MPI_ERR_IN_STATUS ? s->st[k].MPI_ERROR : MPI_SUCCESS;
        fired(p, s->fired[k], &s->st[k], err);
    }
    return n;
}

/* ---- wake-up ------------------------------------------------------------------------- */

/* MPI has no descriptor to sleep on, and under MPI_THREAD_SINGLE no helper
 * thread may block in MPI for us: a one-shot timer wakes the sleeper to
 * look, from min_us after activity, doubling while the looks find nothing,
 * up to max_us. With nothing posted (no receive, no credit), nothing can
 * complete: no timer, a real sleep. */
static int mpi_wake_fd(struct dchan_prov *p, int *fd)
{
    struct mpi_state *s = p->state;
    return dchan_waketimer_fd(p->ctx, &s->wt, fd);
}

static int mpi_wake_arm(struct dchan_prov *p)
{
    struct mpi_state *s = p->state;
    int n = mpi_progress(p);
    if (n != 0)
        return n < 0 ? n : DCHAN_ERR_AGAIN;
    return dchan_waketimer_arm(&s->wt, s->nreq == 0);
}

/* ---- get ----------------------------------------------------------------------------- */

/*
 * An emulation of get by messages on the credit communicator, with tags
 * above the credit words', three per source: the source sends each
 * published count (tag t), the getter asks for a version (t + 1), the
 * source sends the buffer (t + 2). The getter keeps a receive posted for
 * the counts, so dchan_get knows without a round trip whether a version is
 * new; the source learns that a version was taken when the send of its
 * buffer completed (the data has left it). A get costs a round trip; a
 * destroyed source sends the count 0.
 *
 * The source picks t and sends it in the wire: the next triple in turn
 * for its receiver's rank (skipping those of live sources to it), so that
 * a new source does not take the triple of one just destroyed for as long
 * as the tag space lasts. A getter of the destroyed source may still have
 * receives posted on t and t + 2, which MPI would match before the new
 * getter's (t from the source's slot, reused at once, let a stale getter
 * take a new pair's counts and data). A getter that learns its source is
 * gone posts nothing more on t and drops the read in flight.
 */
enum { G_OUT = 0, G_IN = 1, G_DATA = 2 }; /* source: publish, request, data;
                                         * getter: request, publish, data */

struct mpi_g {
    struct mpi_wait w[3];
    MPI_Request rq[3];
    MPI_Datatype type;
    int count, tag;
    uint64_t out, in, pub, sent;
    struct mpi_g *next, *prev; /* source: in mpi_state's glive */
};

/* Triples of tags above the credit words, below MPI_TAG_UB. */
static uint32_t get_triples(const struct mpi_state *s)
{
    if (s->cwords > (uint32_t)s->tag_ub)
        return 0;
    uint64_t n = ((uint64_t)s->tag_ub + 1 - s->cwords) / 3;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* Source: the next triple for peer that no live source to peer holds. */
static int get_tag_alloc(struct mpi_state *s, int peer, int *tag)
{
    uint32_t n = get_triples(s);
    if (n == 0)
        return DCHAN_ERR_UNSUPPORTED;
    for (uint32_t tries = 0; tries < n; tries++) {
        int t = (int)(s->cwords + 3u * (s->gnext[peer]++ % n));
        bool used = false;
        for (struct mpi_g *g = s->glive; g && !used; g = g->next)
            used = g->tag == t && dchan_h_peer(g->w[0].h) == peer;
        if (!used) {
            *tag = t;
            return DCHAN_SUCCESS;
        }
    }
    return DCHAN_ERR_NO_MEMORY; /* every triple held by a live source */
}

/* Getter: the source's triple, from the wire. */
static int get_tag_check(const struct mpi_state *s, uint32_t t)
{
    uint32_t n = get_triples(s);
    if (t < s->cwords || (t - s->cwords) % 3 != 0 || (t - s->cwords) / 3 >= n)
        return DCHAN_ERR_HANDLE;
    return DCHAN_SUCCESS;
}

/* Take a listed request off the list and wait for it. */
static void get_finish(struct mpi_state *s, struct mpi_wait *w)
{
    if (w->pos >= 0)
        started_remove(s, w);
    if (*w->rq != MPI_REQUEST_NULL)
        MPI_Wait(w->rq, MPI_STATUS_IGNORE);
}

/* Cancel a (persistent or not) receive and free it. */
static void get_cancel(struct mpi_state *s, struct mpi_wait *w)
{
    if (w->pos >= 0)
        started_remove(s, w);
    if (*w->rq == MPI_REQUEST_NULL)
        return;
    MPI_Cancel(w->rq);
    MPI_Wait(w->rq, MPI_STATUS_IGNORE);
    if (*w->rq != MPI_REQUEST_NULL)
        MPI_Request_free(w->rq);
}

static int get_common_open(dchan_handle_t *h, int in_kind, int tag)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    bool src = in_kind == W_GREQR;
    int in_tag = src ? tag + 1 : tag;
    int rc;
    g->tag = tag;
    for (int i = 0; i < 3; i++) {
        g->rq[i] = MPI_REQUEST_NULL;
        g->w[i] = (struct mpi_wait){.rq = &g->rq[i], .h = h, .pos = -1};
    }
    g->w[G_OUT].kind = src ? W_GPUBS : W_GREQS;
    g->w[G_IN].kind = in_kind;
    g->w[G_DATA].kind = src ? W_GDATAS : W_GDATAR;
    g->type = MPI_DATATYPE_NULL;
    if (reserve(s, 3) != DCHAN_SUCCESS)
        return DCHAN_ERR_NO_MEMORY;
    rc = make_type(dchan_h_size(h), &g->type, &g->count);
    if (rc == MPI_SUCCESS)
        rc = MPI_Recv_init(&g->in, 1, MPI_UINT64_T, dchan_h_peer(h), in_tag, s->ccomm,
                           &g->rq[G_IN]);
    if (rc == MPI_SUCCESS)
        rc = MPI_Start(&g->rq[G_IN]);
    if (rc != MPI_SUCCESS) {
        if (g->rq[G_IN] != MPI_REQUEST_NULL)
            MPI_Request_free(&g->rq[G_IN]);
        if (g->type != MPI_BYTE && g->type != MPI_DATATYPE_NULL)
            MPI_Type_free(&g->type);
        unreserve(s, 3);
        return mpi_rc(p, rc, "get set-up");
    }
    started_add(s, &g->w[G_IN]);
    return DCHAN_SUCCESS;
}

static void get_common_close(dchan_handle_t *h)
{
    struct mpi_state *s = dchan_h_prov(h)->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    if (!mpi_gone()) {
        get_cancel(s, &g->w[G_IN]);
        if (g->type != MPI_BYTE && g->type != MPI_DATATYPE_NULL)
            MPI_Type_free(&g->type);
    } else {
        for (int i = 0; i < 3; i++)
            if (g->w[i].pos >= 0)
                started_remove(s, &g->w[i]);
    }
    unreserve(s, 3);
}

/* Source: send the published word as it is now. */
static int mpi_src_publish(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    get_finish(s, &g->w[G_OUT]); /* the previous count: long delivered */
    g->out = __atomic_load_n(&dchan_h_ctl(h)[0], __ATOMIC_ACQUIRE);
    int rc = MPI_Isend(&g->out, 1, MPI_UINT64_T, dchan_h_peer(h), g->tag, s->ccomm,
                       &g->rq[G_OUT]);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Isend (published count)");
    started_add(s, &g->w[G_OUT]);
    return DCHAN_SUCCESS;
}

static void glive_remove(struct mpi_state *s, struct mpi_g *g)
{
    if (g->prev)
        g->prev->next = g->next;
    else
        s->glive = g->next;
    if (g->next)
        g->next->prev = g->prev;
    g->next = g->prev = NULL;
}

static int mpi_src_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    int tag = 0;
    struct mpi_state *s = dchan_h_prov(h)->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    int rc = get_tag_alloc(s, dchan_h_peer(h), &tag);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if ((rc = get_common_open(h, W_GREQR, tag)) != DCHAN_SUCCESS)
        return rc;
    g->prev = NULL;
    g->next = s->glive;
    if (s->glive)
        s->glive->prev = g;
    s->glive = g;
    if ((rc = mpi_src_publish(h)) != DCHAN_SUCCESS) {
        glive_remove(s, g);
        get_common_close(h);
        return rc;
    }
    dchan_put_le32(wire_fields, (uint32_t)tag);
    return DCHAN_SUCCESS;
}

static void mpi_src_close(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    if (!mpi_gone()) {
        /* The data in flight, for at most the drain time; then MPI finishes it. */
        uint64_t deadline = now_ns() + dchan_ctx_params(p->ctx)->DRAIN_TIMEOUT_MS * 1000000ull;
        if (g->w[G_DATA].pos >= 0)
            started_remove(s, &g->w[G_DATA]);
        while (g->rq[G_DATA] != MPI_REQUEST_NULL) {
            int flag = 0;
            MPI_Test(&g->rq[G_DATA], &flag, MPI_STATUS_IGNORE);
            if (!flag && now_ns() > deadline)
                MPI_Request_free(&g->rq[G_DATA]);
        }
        /* Gone: the count 0 (the core zeroed the word). */
        get_finish(s, &g->w[G_OUT]);
        g->out = 0;
        MPI_Send(&g->out, 1, MPI_UINT64_T, dchan_h_peer(h), g->tag, s->ccomm);
    }
    get_common_close(h);
    if (!mpi_gone()) {
        /* Requests that arrived unanswered would wait unmatched for the
         * next source to take this triple: take them now. */
        for (;;) {
            int flag = 0;
            uint64_t req;
            if (MPI_Iprobe(dchan_h_peer(h), g->tag + 1, s->ccomm, &flag, MPI_STATUS_IGNORE) !=
                    MPI_SUCCESS || !flag)
                break;
            MPI_Recv(&req, 1, MPI_UINT64_T, dchan_h_peer(h), g->tag + 1, s->ccomm,
                     MPI_STATUS_IGNORE);
        }
    }
    glive_remove(s, g);
}

static int mpi_get_open(dchan_handle_t *h, const unsigned char *wire_fields)
{
    struct mpi_state *s = dchan_h_prov(h)->state;
    uint32_t tag = dchan_get_le32(wire_fields);
    for (int i = 4; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wire_fields[i])
            return DCHAN_ERR_HANDLE;
    if (get_tag_check(s, tag) != DCHAN_SUCCESS)
        return DCHAN_ERR_HANDLE;
    DCHAN_PROV_PRIV(h, struct mpi_g)->pub = 0;
    return get_common_open(h, W_GPUBR, (int)tag);
}

/* Getter: a count of another generation than the source's (0 when it was
 * destroyed) means the source is gone for good. */
static bool src_gone(dchan_handle_t *h, uint64_t count)
{
    return (uint32_t)(count >> 32) != dchan_h_gen(h);
}

static void mpi_get_close(dchan_handle_t *h)
{
    struct mpi_state *s = dchan_h_prov(h)->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    if (!mpi_gone()) {
        get_cancel(s, &g->w[G_DATA]);
        get_finish(s, &g->w[G_OUT]);
    }
    get_common_close(h);
}

/* Getter: take every count that arrived; the receive stays listed. */
static int pub_drain(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    int rc = MPI_SUCCESS;
    /* Not listed: its completion is being reported, which sets pub. */
    if (g->w[G_IN].pos < 0)
        return DCHAN_SUCCESS;
    started_remove(s, &g->w[G_IN]);
    for (;;) {
        int flag = 0;
        if ((rc = MPI_Test(&g->rq[G_IN], &flag, MPI_STATUS_IGNORE)) != MPI_SUCCESS || !flag)
            break;
        g->pub = g->in; /* counts of one source arrive in order */
        if (src_gone(h, g->in)) {
            MPI_Request_free(&g->rq[G_IN]); /* nothing more comes: not re-posted */
            return DCHAN_SUCCESS;
        }
        if ((rc = MPI_Start(&g->rq[G_IN])) != MPI_SUCCESS)
            break;
    }
    started_add(s, &g->w[G_IN]);
    return rc == MPI_SUCCESS ? DCHAN_SUCCESS : mpi_rc(p, rc, "published count receive");
}

static int mpi_get_peek(dchan_handle_t *h, uint64_t *v)
{
    int rc = pub_drain(h);
    *v = DCHAN_PROV_PRIV(h, struct mpi_g)->pub;
    return rc;
}

static int mpi_get(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    int peer = dchan_h_peer(h);
    get_finish(s, &g->w[G_OUT]);
    int rc = MPI_Irecv(dchan_h_buf(h), g->count, g->type, peer, g->tag + 2, s->ccomm,
                       &g->rq[G_DATA]);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Irecv (get)");
    started_add(s, &g->w[G_DATA]);
    g->out = g->pub; /* the version asked for, which is the taken word to come */
    rc = MPI_Isend(&g->out, 1, MPI_UINT64_T, peer, g->tag + 1, s->ccomm, &g->rq[G_OUT]);
    if (rc != MPI_SUCCESS) {
        get_cancel(s, &g->w[G_DATA]);
        return mpi_rc(p, rc, "MPI_Isend (get request)");
    }
    started_add(s, &g->w[G_OUT]);
    return DCHAN_SUCCESS;
}

static int mpi_get_ack(dchan_handle_t *h, uint64_t v)
{
    return DCHAN_SUCCESS; /* the source knew when its send completed */
}

static void get_fired(struct dchan_prov *p, struct mpi_wait *w, const MPI_Status *st, int err)
{
    struct mpi_state *s = p->state;
    dchan_handle_t *h = w->h;
    struct mpi_g *g = DCHAN_PROV_PRIV(h, struct mpi_g);
    int drc = mpi_rc(p, err, "get message");

    switch (w->kind) {
    case W_GPUBS:
    case W_GREQS:
        if (drc != DCHAN_SUCCESS)
            dchan_core_handle_error(h, drc);
        break;
    case W_GREQR: /* a request: send the buffer, listen for the next */
        if (drc == DCHAN_SUCCESS && g->rq[G_DATA] == MPI_REQUEST_NULL) {
            g->sent = g->in;
            err = MPI_Isend(dchan_h_buf(h), g->count, g->type, dchan_h_peer(h), g->tag + 2,
                            s->ccomm, &g->rq[G_DATA]);
            if ((drc = mpi_rc(p, err, "MPI_Isend (get data)")) == DCHAN_SUCCESS)
                started_add(s, &g->w[G_DATA]);
        }
        if (drc == DCHAN_SUCCESS && (err = MPI_Start(&g->rq[G_IN])) == MPI_SUCCESS)
            started_add(s, &g->w[G_IN]);
        else if (drc == DCHAN_SUCCESS)
            drc = mpi_rc(p, err, "MPI_Start (get request)");
        if (drc != DCHAN_SUCCESS)
            dchan_core_handle_error(h, drc);
        break;
    case W_GDATAS: /* the data left: that version is taken */
        if (drc == DCHAN_SUCCESS)
            __atomic_store_n(&dchan_h_ctl(h)[1], g->sent, __ATOMIC_RELEASE);
        else
            dchan_core_handle_error(h, drc);
        break;
    case W_GPUBR:
        if (drc == DCHAN_SUCCESS && src_gone(h, g->in)) {
            /* Nothing more comes on this triple: post nothing more on it,
             * and a read in flight gets no answer (or one that may be
             * torn): it fails as the source's end. */
            g->pub = g->in;
            MPI_Request_free(&g->rq[G_IN]);
            if (g->rq[G_DATA] != MPI_REQUEST_NULL) {
                get_cancel(s, &g->w[G_DATA]);
                dchan_core_get_done(h, DCHAN_ERR_PEER);
            }
            break;
        }
        if (drc == DCHAN_SUCCESS) {
            g->pub = g->in;
            if ((err = MPI_Start(&g->rq[G_IN])) != MPI_SUCCESS)
                drc = mpi_rc(p, err, "MPI_Start (published count)");
            else
                started_add(s, &g->w[G_IN]);
        }
        if (drc != DCHAN_SUCCESS)
            dchan_core_handle_error(h, drc);
        break;
    case W_GDATAR: {
        int count = -1;
        if (drc == DCHAN_SUCCESS) {
            MPI_Get_count(st, g->type, &count);
            drc = count == g->count ? DCHAN_SUCCESS : DCHAN_ERR_SIZE;
        }
        dchan_core_get_done(h, drc);
        break;
    }
    }
}

static const struct dchan_get_ops mpi_get_ops = {
    .src_open = mpi_src_open,
    .src_close = mpi_src_close,
    .src_publish = mpi_src_publish,
    .get_open = mpi_get_open,
    .get_close = mpi_get_close,
    .get_peek = mpi_get_peek,
    .get = mpi_get,
    .get_ack = mpi_get_ack,
};

const struct dchan_provider_ops dchan_mpi_ops = {
    .name = "mpi",
    .wire_id = DCHAN_PROV_ID_MPI,
    .scope = DCHAN_SCOPE_NET,
    .modes = DCHAN_MODE_BIT(DCHAN_DETECT_EVENT),
    .probe = mpi_probe,
    .open = mpi_open,
    .connect = mpi_connect,
    .close = mpi_close,
    .mr_reg = dchan_prov_nosys_mr_reg,
    .mr_dereg = dchan_prov_nosys_mr_dereg,
    .mem_alloc = dchan_prov_nosys_mem_alloc,
    .mem_free = dchan_prov_nosys_mem_free,
    .recv_open = mpi_recv_open,
    .recv_arm = mpi_recv_arm,
    .recv_close = mpi_recv_close,
    .send_open = mpi_send_open,
    .put = mpi_put,
    .put_abandon = mpi_put_abandon,
    .send_close = mpi_send_close,
    .map_slot = dchan_prov_nosys_map_slot,
    .credit_open = mpi_credit_open,
    .credit_close = mpi_credit_close,
    .credit_write = mpi_credit_write,
    .progress = mpi_progress,
    .wake_fd = mpi_wake_fd,
    .wake_arm = mpi_wake_arm,
    .wake_disarm = dchan_prov_noop_wake_disarm,
    .sleeps = DCHAN_SLEEPS_TIMER,
    .gather = true, /* an MPI hindexed datatype over the segments */
    .get = &mpi_get_ops, /* an emulation by messages (see "get" above) */
};
