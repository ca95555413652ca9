/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpi: two-sided emulation on a private duplicate of the bootstrap
 * communicator (EVENT only). Each receive handle owns a persistent receive
 * into the user buffer, started at ready_mark, with a tag unique to the
 * handle on its receiver; a put is an MPI_Isend with that tag (not a
 * persistent send: Open MPI completes small Isends inline, which its
 * persistent requests cannot). Progress tests the started requests and
 * reports completions.
 */
#include "config.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "provider.h"
#include "wire.h"

struct mpi_state {
    MPI_Comm comm;
    int tag_ub;
    /* started requests, tested together by progress */
    MPI_Request *reqs;
    dchan_handle_t **owner;
    int *done;
    MPI_Status *st;
    int nreq, cap;
    int nhandles; /* handles with a request: nreq never exceeds it */
};

struct mpi_h {
    MPI_Request req; /* persistent receive or send */
    MPI_Datatype type;
    int count;
    int tag;
    int pos;   /* index in the started list, -1 when not started */
    bool recv; /* a receive handle's request */
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

static int mpi_open(struct dchan_prov *p)
{
    int init = 0, fini = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    if (!init || fini) {
        snprintf(p->desc, sizeof p->desc, "MPI is not initialised by the program");
        return DCHAN_ERR_UNSUPPORTED;
    }
    struct mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    s->comm = MPI_COMM_NULL;
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
    {
        char v[128];
        library_version(v, sizeof v);
        snprintf(p->desc, sizeof p->desc, "%.100s, two-sided emulation, tags up to %d", v,
                 s->tag_ub);
    }
    return DCHAN_SUCCESS;
}

static void mpi_close(struct dchan_prov *p)
{
    struct mpi_state *s = p->state;
    int fini = 0;
    if (!s)
        return;
    MPI_Finalized(&fini);
    if (s->comm != MPI_COMM_NULL && !fini)
        MPI_Comm_free(&s->comm);
    free(s->reqs);
    free(s->owner);
    free(s->done);
    free(s->st);
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

/* dchan_finalize after MPI_Finalize: release without calling MPI. */
static int mpi_gone(void)
{
    int fini = 0;
    MPI_Finalized(&fini);
    return fini;
}

static void free_type(struct mpi_h *m)
{
    if (m->type != MPI_BYTE && m->type != MPI_DATATYPE_NULL)
        MPI_Type_free(&m->type);
}

/* Room for one more handle's request, reserved when the handle is made so
 * that starting a request never allocates. Twice the handles: progress
 * lists completed owners past the started ones. */
static int reserve(struct mpi_state *s)
{
    int need = 2 * (s->nhandles + 1);
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 64;
        while (cap < need)
            cap *= 2;
        MPI_Request *r = realloc(s->reqs, (size_t)cap * sizeof *r);
        if (r)
            s->reqs = r;
        dchan_handle_t **o = realloc(s->owner, (size_t)cap * sizeof *o);
        if (o)
            s->owner = o;
        int *d = realloc(s->done, (size_t)cap * sizeof *d);
        if (d)
            s->done = d;
        MPI_Status *st = realloc(s->st, (size_t)cap * sizeof *st);
        if (st)
            s->st = st;
        if (!r || !o || !d || !st)
            return DCHAN_ERR_NO_MEMORY;
        s->cap = cap;
    }
    s->nhandles++;
    return DCHAN_SUCCESS;
}

static void started_add(struct mpi_state *s, dchan_handle_t *h, struct mpi_h *m)
{
    s->reqs[s->nreq] = m->req;
    s->owner[s->nreq] = h;
    m->pos = s->nreq++;
}

static void started_remove(struct mpi_state *s, int i)
{
    struct mpi_h *m = DCHAN_PROV_PRIV(s->owner[i], struct mpi_h);
    int last = --s->nreq;
    m->pos = -1;
    if (i != last) {
        s->reqs[i] = s->reqs[last];
        s->owner[i] = s->owner[last];
        DCHAN_PROV_PRIV(s->owner[i], struct mpi_h)->pos = i;
    }
}

/* ---- receiver -------------------------------------------------------------------- */

static int mpi_recv_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    uint32_t id = dchan_h_id(h);
    int rc;

    /* The tag is the handle's slot, plus its generation where the tag space
     * allows, so that a stale sender is less likely to match a new handle. */
    uint32_t idx = id & 0xffffffu, gen = id >> 24;
    if (s->tag_ub >= INT_MAX)
        m->tag = (int)(((gen & 0x7fu) << 24) | idx);
    else if (idx < (uint32_t)s->tag_ub)
        m->tag = (int)idx + 1;
    else
        return DCHAN_ERR_NO_MEMORY; /* more live handles than this MPI's tags */
    m->pos = -1;
    m->recv = true;
    m->type = MPI_DATATYPE_NULL;
    m->req = MPI_REQUEST_NULL;
    if (reserve(s) != DCHAN_SUCCESS)
        return DCHAN_ERR_NO_MEMORY;
    rc = make_type(dchan_h_size(h), &m->type, &m->count);
    if (rc == MPI_SUCCESS)
        rc = MPI_Recv_init(dchan_h_buf(h), m->count, m->type, dchan_h_peer(h), m->tag, s->comm,
                           &m->req);
    if (rc != MPI_SUCCESS) {
        free_type(m);
        s->nhandles--;
        return mpi_rc(p, rc, "MPI_Recv_init");
    }
    dchan_put_le32(wire_fields, (uint32_t)m->tag);
    return DCHAN_SUCCESS;
}

static int mpi_recv_arm(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    if (m->pos >= 0)
        return DCHAN_SUCCESS;
    int rc = MPI_Start(&m->req);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Start (receive)");
    started_add(p->state, h, m);
    return DCHAN_SUCCESS;
}

static void mpi_recv_close(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    ((struct mpi_state *)p->state)->nhandles--;
    if (mpi_gone()) {
        if (m->pos >= 0)
            started_remove(p->state, m->pos);
        return;
    }
    if (m->pos >= 0) {
        MPI_Cancel(&m->req);
        MPI_Wait(&m->req, MPI_STATUS_IGNORE);
        started_remove(p->state, m->pos);
    }
    if (m->req != MPI_REQUEST_NULL)
        MPI_Request_free(&m->req);
    free_type(m);
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
    m->pos = -1;
    m->recv = false;
    m->type = MPI_DATATYPE_NULL;
    m->req = MPI_REQUEST_NULL;
    if (reserve(s) != DCHAN_SUCCESS)
        return DCHAN_ERR_NO_MEMORY;
    rc = make_type(dchan_h_size(h), &m->type, &m->count);
    if (rc != MPI_SUCCESS) {
        free_type(m);
        s->nhandles--;
        return mpi_rc(p, rc, "MPI_Type_create");
    }
    return DCHAN_SUCCESS;
}

static int mpi_put(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_state *s = p->state;
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    int done = 0;
    int rc = MPI_Isend(d->src, m->count, m->type, dchan_h_peer(h), m->tag, s->comm, &m->req);
    if (rc == MPI_SUCCESS)
        rc = MPI_Test(&m->req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_rc(p, rc, "MPI_Isend");
    if (done)
        dchan_core_put_done(h, DCHAN_SUCCESS); /* sent inline: nothing to track */
    else
        started_add(s, h, m);
    return DCHAN_SUCCESS;
}

static void mpi_put_abandon(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    if (m->pos < 0)
        return;
    started_remove(p->state, m->pos);
    /* Freeing a started request lets MPI finish it on its own. */
    if (!mpi_gone())
        MPI_Request_free(&m->req);
    m->req = MPI_REQUEST_NULL;
}

static void mpi_send_close(dchan_handle_t *h)
{
    struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
    if (mpi_gone()) {
        ((struct mpi_state *)dchan_h_prov(h)->state)->nhandles--;
        return;
    }
    if (m->req != MPI_REQUEST_NULL)
        MPI_Request_free(&m->req);
    free_type(m);
    ((struct mpi_state *)dchan_h_prov(h)->state)->nhandles--;
}

/* ---- progress ------------------------------------------------------------------------ */

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
    /* Persistent requests stay allocated: keep MPI's updated handle, then
     * mark the slot so that one pass compacts the started list. */
    for (int k = 0; k < n; k++) {
        int i = s->done[k];
        DCHAN_PROV_PRIV(s->owner[i], struct mpi_h)->req = s->reqs[i];
        s->reqs[i] = MPI_REQUEST_NULL;
    }
    /* Completed owners move to the tail of owner[] in completion order. */
    dchan_handle_t **fired = s->owner + s->nreq; /* cap >= 2 * nhandles >= 2 * nreq */
    for (int k = 0; k < n; k++)
        fired[k] = s->owner[s->done[k]];
    for (int i = 0; i < s->nreq; i++) {
        if (s->reqs[i] == MPI_REQUEST_NULL)
            continue;
        s->reqs[j] = s->reqs[i];
        s->owner[j] = s->owner[i];
        DCHAN_PROV_PRIV(s->owner[j], struct mpi_h)->pos = j;
        j++;
    }
    s->nreq = j;
    for (int k = 0; k < n; k++) {
        dchan_handle_t *h = fired[k];
        struct mpi_h *m = DCHAN_PROV_PRIV(h, struct mpi_h);
        int err = rc == MPI_ERR_IN_STATUS ? s->st[k].MPI_ERROR : MPI_SUCCESS;
        int drc = mpi_rc(p, err, "request completion");
        m->pos = -1;
        if (drc == DCHAN_SUCCESS && m->recv) {
            int count = -1;
            MPI_Get_count(&s->st[k], m->type, &count);
            drc = count == m->count ? DCHAN_SUCCESS : DCHAN_ERR_SIZE;
        }
        if (drc != DCHAN_SUCCESS)
            dchan_core_handle_error(h, drc);
        else if (m->recv)
            dchan_core_arrival(h);
        else
            dchan_core_put_done(h, DCHAN_SUCCESS);
    }
    return n;
}

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
    .progress = mpi_progress,
};
