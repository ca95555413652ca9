/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libdchan_starpu: dchan channels driven by StarPU (see dchan_starpu.h and
 * README.md). Uses only dchan's public header.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <starpu.h>
#include <starpu_expert.h>
#include <starpu_mpi.h>

#include "dchan_starpu.h"

/* StarPU 1.3 built with blocking drivers (not Debian's: its starpu_config.h
 * defines STARPU_NON_BLOCKING_DRIVERS) also runs progression hooks from
 * _starpu_worker_can_block(), under the worker's scheduling mutex, where a
 * tag notification that wakes that same worker could deadlock: see
 * README.md, Limits. */

/* Tags of the glue's own StarPU-MPI transfers (the bootstrap's
 * allgathers): far above any application tag we document, below 2^31 so
 * that any MPI tag bound would hold too. */
#define COLL_TAG_BASE 0x7ff00000

struct wire_xfer {
    starpu_data_handle_t handle;
    starpu_mpi_req req;
};

struct dchan_starpu {
    dchan_ctx_t *ctx;
    MPI_Comm comm;
    int rank, size;
    int64_t coll_seq;          /* allgathers so far: the same on every rank */
    /* progression */
    pthread_mutex_t progress_lock; /* one thread drives progress at a time */
    int hook_id;               /* -1 when not registered */
    int hook_on;               /* under progress_lock */
    _Atomic int budget;        /* the hook's; 0 before hook_start */
    _Atomic int64_t due;       /* arrivals announced and not seen yet */
    _Atomic int error;         /* first asynchronous channel error */
    dchan_error_fn user_error_fn;
    void *user_error_arg;
    struct dchan_starpu_stats stats; /* hook_* under progress_lock */
    _Atomic uint64_t busy, notified;
    /* wires posted, completed by dchan_starpu_wires_wait */
    struct wire_xfer *xfers;
    int nxfers, capxfers;
};

struct dchan_starpu_recv {
    dchan_starpu_t *ds;
    dchan_handle_t *h;
    starpu_tag_t base, stride;
    _Atomic uint64_t arrived;
};

/* Callbacks run by the progress call of this thread, for the budget count. */
static __thread int tls_callbacks;

/* ---- bootstrap over StarPU-MPI ------------------------------------------- */

/* dchan's external allgather: every rank sends its len bytes to every
 * other rank as a registered StarPU variable. */
static int sp_allgather(const void *in, void *out, size_t len, void *arg)
{
    dchan_starpu_t *ds = arg;
    const int n = ds->size, me = ds->rank;
    const starpu_mpi_tag_t tag = COLL_TAG_BASE + (starpu_mpi_tag_t)(ds->coll_seq++ % 0xfffff);
    starpu_data_handle_t hin, *hout;
    starpu_mpi_req *req;
    void *copy;
    int rc = 0, nreq = 0;

    memcpy((char *)out + (size_t)me * len, in, len);
    if (n == 1 || len == 0)
        return 0;
    /* StarPU registers writable memory; in is const to dchan. */
    copy = malloc(len);
    hout = calloc(n, sizeof *hout);
    req = calloc(2 * (size_t)n, sizeof *req);
    if (!copy || !hout || !req) {
        rc = -1;
        goto out_free;
    }
    memcpy(copy, in, len);
    starpu_variable_data_register(&hin, STARPU_MAIN_RAM, (uintptr_t)copy, len);
    for (int r = 0; r < n; r++) {
        if (r == me)
            continue;
        starpu_variable_data_register(&hout[r], STARPU_MAIN_RAM,
                                      (uintptr_t)((char *)out + (size_t)r * len), len);
        if (starpu_mpi_irecv(hout[r], &req[nreq++], r, tag, ds->comm) != 0 ||
            starpu_mpi_isend(hin, &req[nreq++], r, tag, ds->comm) != 0)
            rc = -1;
    }
    /* starpu_mpi_wait's return is no verdict in 1.3: a receive served from
     * data that arrived before it was posted answers -1 on success. MPI
     * errors stop StarPU-MPI itself, and dchan checks what it received. */
    for (int i = 0; i < nreq; i++)
        if (req[i])
            starpu_mpi_wait(&req[i], MPI_STATUS_IGNORE);
    for (int r = 0; r < n; r++)
        if (r != me)
            starpu_data_unregister(hout[r]);
    starpu_data_unregister(hin);
out_free:
    free(req);
    free(hout);
    free(copy);
    return rc;
}

/* ---- errors --------------------------------------------------------------- */

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    dchan_starpu_t *ds = arg;
    int none = 0;

    atomic_compare_exchange_strong(&ds->error, &none, rc);
    tls_callbacks++;
    if (ds->user_error_fn)
        ds->user_error_fn(h, rc, ds->user_error_arg);
}

int dchan_starpu_error(const dchan_starpu_t *ds)
{
    return ds ? atomic_load(&((dchan_starpu_t *)ds)->error) : DCHAN_ERR_INVALID_ARG;
}

/* ---- context -------------------------------------------------------------- */

int dchan_starpu_init(MPI_Comm comm, const dchan_attr_t *attr, dchan_starpu_t **ds_out)
{
    dchan_starpu_t *ds;
    dchan_attr_t a;
    int rc;

    if (!ds_out)
        return DCHAN_ERR_INVALID_ARG;
    ds = calloc(1, sizeof *ds);
    if (!ds)
        return DCHAN_ERR_NO_MEMORY;
    ds->comm = comm;
    ds->hook_id = -1;
    if (starpu_mpi_comm_rank(comm, &ds->rank) != 0 || starpu_mpi_comm_size(comm, &ds->size) != 0) {
        rc = DCHAN_ERR_STATE; /* StarPU-MPI not initialised */
        goto err_free;
    }
    if (pthread_mutex_init(&ds->progress_lock, NULL) != 0) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto err_free;
    }
    if (attr)
        a = *attr;
    else
        dchan_attr_init(&a);
    ds->user_error_fn = a.error_fn;
    ds->user_error_arg = a.error_arg;
    /* Workers call dchan concurrently (tasks, hooks): dchan locks. */
    a.thread_level = DCHAN_THREAD_MULTIPLE;
    a.bootstrap = DCHAN_BOOT_EXTERNAL;
    a.ext_rank = ds->rank;
    a.ext_size = ds->size;
    a.ext_allgather = sp_allgather;
    a.ext_arg = ds;
    a.error_fn = on_error;
    a.error_arg = ds;
    rc = dchan_init(&a, &ds->ctx);
    if (rc != DCHAN_SUCCESS)
        goto err_lock;
    *ds_out = ds;
    return DCHAN_SUCCESS;

err_lock:
    pthread_mutex_destroy(&ds->progress_lock);
err_free:
    free(ds);
    return rc;
}

dchan_ctx_t *dchan_starpu_ctx(const dchan_starpu_t *ds)
{
    return ds ? ds->ctx : NULL;
}

int dchan_starpu_finalize(dchan_starpu_t *ds)
{
    if (!ds)
        return DCHAN_ERR_INVALID_ARG;
    dchan_starpu_hook_stop(ds);
    if (ds->nxfers)
        dchan_starpu_wires_wait(ds);
    int rc = dchan_finalize(ds->ctx);
    pthread_mutex_destroy(&ds->progress_lock);
    free(ds->xfers);
    free(ds);
    return rc;
}

/* ---- progress -------------------------------------------------------------- */

/* One bounded progress call, unless another thread is in one. From the
 * hook, the budget is the hook's (read under the lock). */
static int progress_once(dchan_starpu_t *ds, int budget, int from_hook)
{
    if (pthread_mutex_trylock(&ds->progress_lock) != 0) {
        atomic_fetch_add(&ds->busy, 1);
        return 0;
    }
    if (from_hook) {
        if (!ds->hook_on) {
            pthread_mutex_unlock(&ds->progress_lock);
            return 0;
        }
        budget = ds->budget;
    }
    tls_callbacks = 0;
    int rc = dchan_progress_n(ds->ctx, budget);
    const int ran = tls_callbacks;
    if (from_hook) {
        ds->stats.hook_calls++;
        ds->stats.hook_callbacks += ran;
        if ((uint64_t)ran > ds->stats.hook_max)
            ds->stats.hook_max = ran;
        if (ran >= budget)
            ds->stats.hook_full++;
    }
    pthread_mutex_unlock(&ds->progress_lock);
    if (rc < 0) {
        int none = 0;
        atomic_compare_exchange_strong(&ds->error, &none, rc);
    }
    return rc;
}

/* StarPU's progression hook: its answer says whether the worker may block
 * (nonzero) or should keep polling (0, while arrivals are due). */
static unsigned hook(void *arg)
{
    dchan_starpu_t *ds = arg;

    progress_once(ds, 1, 1);
    return atomic_load(&ds->due) <= 0;
}

int dchan_starpu_hook_start(dchan_starpu_t *ds, int budget)
{
    if (!ds || budget < 1)
        return DCHAN_ERR_INVALID_ARG;
    if (ds->hook_id >= 0)
        return DCHAN_ERR_STATE;
    pthread_mutex_lock(&ds->progress_lock);
    ds->budget = budget;
    ds->hook_on = 1;
    pthread_mutex_unlock(&ds->progress_lock);
    ds->hook_id = starpu_progression_hook_register(hook, ds);
    if (ds->hook_id < 0) {
        ds->hook_on = 0;
        return DCHAN_ERR_NO_MEMORY; /* StarPU's hook table is full */
    }
    return DCHAN_SUCCESS;
}

static void grace(void *arg)
{
    (void)arg;
}

void dchan_starpu_hook_stop(dchan_starpu_t *ds)
{
    if (!ds || ds->hook_id < 0)
        return;
    starpu_progression_hook_deregister(ds->hook_id);
    ds->hook_id = -1;
    /* A call that StarPU started before the deregistration either holds
     * the lock now (we wait for it) or finds hook_on cleared. */
    pthread_mutex_lock(&ds->progress_lock);
    ds->hook_on = 0;
    pthread_mutex_unlock(&ds->progress_lock);
    /* StarPU calls a hook outside its own lock: a worker that saw it
     * registered may still be about to call it, and ds must outlive that
     * call. A task run on every worker is a grace period: each worker has
     * finished the hook calls of its earlier driver loops when it runs it. */
    starpu_execute_on_each_worker(grace, NULL, STARPU_CPU | STARPU_CUDA | STARPU_OPENCL);
}

int dchan_starpu_progress(dchan_starpu_t *ds, int budget)
{
    if (!ds || budget < 1)
        return DCHAN_ERR_INVALID_ARG;
    return progress_once(ds, budget, 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

int dchan_starpu_put_ptr(dchan_starpu_t *ds, dchan_handle_t *sh, void **ptr, int timeout_ms)
{
    double deadline = 0.0;
    unsigned spins = 0;
    int rc;

    if (!ds || !sh || !ptr)
        return DCHAN_ERR_INVALID_ARG;
    while ((rc = dchan_put_ptr(sh, ptr)) == DCHAN_ERR_AGAIN) {
        /* The credit comes with the receiver's re-arm; it may need our
         * progress to land (and the hook may be busy on another worker). */
        int b = atomic_load(&ds->budget);
        int p = progress_once(ds, b > 0 ? b : 16, 0);
        if (p < 0)
            return p;
        if (atomic_load(&ds->error))
            return atomic_load(&ds->error);
        if (++spins < 64)
            continue;
        if (spins == 64)
            deadline = now_s() + timeout_ms / 1000.0;
        else if (timeout_ms >= 0 && now_s() > deadline)
            return DCHAN_ERR_TIMEOUT;
        sched_yield(); /* the peer that owes the credit may share our core */
    }
    return rc;
}

int dchan_starpu_get_stats(const dchan_starpu_t *ds, struct dchan_starpu_stats *st)
{
    dchan_starpu_t *m = (dchan_starpu_t *)ds;

    if (!ds || !st)
        return DCHAN_ERR_INVALID_ARG;
    pthread_mutex_lock(&m->progress_lock);
    *st = m->stats;
    pthread_mutex_unlock(&m->progress_lock);
    st->hook_busy = atomic_load(&m->busy);
    st->notified = atomic_load(&m->notified);
    return DCHAN_SUCCESS;
}

/* ---- receive channels releasing tags ---------------------------------- */

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct dchan_starpu_recv *r = arg;
    uint64_t n = atomic_fetch_add(&r->arrived, 1);

    (void)h;
    tls_callbacks++;
    atomic_fetch_sub(&r->ds->due, 1);
    atomic_fetch_add(&r->ds->notified, 1);
    /* Tasks waiting on this tag become ready; notifying before they
     * declared the dependency is fine too (the tag is then done). */
    starpu_tag_notify_from_apps(r->base + n * r->stride);
}

int dchan_starpu_recv_create(dchan_starpu_t *ds, int sender_rank, void *buf, size_t size,
                             uint64_t oob, const dchan_handle_attr_t *hattr, starpu_tag_t tag_base,
                             starpu_tag_t tag_stride, uint64_t expect, dchan_starpu_recv_t **r_out)
{
    struct dchan_starpu_recv *r;
    dchan_handle_attr_t def;
    int rc;

    if (!ds || !r_out)
        return DCHAN_ERR_INVALID_ARG;
    if (!hattr) {
        dchan_handle_attr_init(&def);
        def.credit = 1;
        hattr = &def;
    }
    r = calloc(1, sizeof *r);
    if (!r)
        return DCHAN_ERR_NO_MEMORY;
    r->ds = ds;
    r->base = tag_base;
    r->stride = tag_stride;
    rc = dchan_create_handle_attr(ds->ctx, sender_rank, buf, size, oob, on_arrival, r, hattr,
                                  &r->h);
    if (rc != DCHAN_SUCCESS) {
        free(r);
        return rc;
    }
    atomic_fetch_add(&ds->due, (int64_t)expect);
    *r_out = r;
    return DCHAN_SUCCESS;
}

void dchan_starpu_recv_expect(dchan_starpu_recv_t *r, uint64_t more)
{
    if (r)
        atomic_fetch_add(&r->ds->due, (int64_t)more);
}

dchan_handle_t *dchan_starpu_recv_handle(const dchan_starpu_recv_t *r)
{
    return r ? r->h : NULL;
}

uint64_t dchan_starpu_recv_arrived(const dchan_starpu_recv_t *r)
{
    return r ? atomic_load(&((dchan_starpu_recv_t *)r)->arrived) : 0;
}

int dchan_starpu_recv_destroy(dchan_starpu_recv_t *r)
{
    if (!r)
        return DCHAN_ERR_INVALID_ARG;
    int rc = dchan_handle_destroy(r->h);
    free(r);
    return rc;
}

/* ---- wires as StarPU-MPI data -------------------------------------------- */

static int xfer_add(dchan_starpu_t *ds, void *buf, size_t len, int send, int peer,
                    starpu_mpi_tag_t tag)
{
    if (ds->nxfers == ds->capxfers) {
        int cap = ds->capxfers ? 2 * ds->capxfers : 16;
        struct wire_xfer *x = realloc(ds->xfers, cap * sizeof *x);
        if (!x)
            return DCHAN_ERR_NO_MEMORY;
        ds->xfers = x;
        ds->capxfers = cap;
    }
    struct wire_xfer *x = &ds->xfers[ds->nxfers];
    starpu_variable_data_register(&x->handle, STARPU_MAIN_RAM, (uintptr_t)buf, len);
    int rc = send ? starpu_mpi_isend(x->handle, &x->req, peer, tag, ds->comm)
                  : starpu_mpi_irecv(x->handle, &x->req, peer, tag, ds->comm);
    if (rc != 0) {
        starpu_data_unregister(x->handle);
        return DCHAN_ERR_PROVIDER;
    }
    ds->nxfers++;
    return DCHAN_SUCCESS;
}

int dchan_starpu_wires_post(dchan_starpu_t *ds, int peer, const dchan_wire_t *send, int nsend,
                            dchan_wire_t *recv, int nrecv, starpu_mpi_tag_t tag)
{
    int rc = DCHAN_SUCCESS;

    if (!ds || peer < 0 || peer >= ds->size || nsend < 0 || nrecv < 0 ||
        (nsend && !send) || (nrecv && !recv) || tag < 0 || tag >= COLL_TAG_BASE)
        return DCHAN_ERR_INVALID_ARG;
    if (nrecv)
        rc = xfer_add(ds, recv, nrecv * sizeof *recv, 0, peer, tag);
    /* A send only reads its buffer; StarPU's interface wants it writable. */
    if (rc == DCHAN_SUCCESS && nsend)
        rc = xfer_add(ds, (void *)send, nsend * sizeof *send, 1, peer, tag);
    return rc;
}

int dchan_starpu_wires_wait(dchan_starpu_t *ds)
{
    int rc = DCHAN_SUCCESS;

    if (!ds)
        return DCHAN_ERR_INVALID_ARG;
    /* As in sp_allgather: the wait's return says nothing; the wires are
     * validated by dchan_assoc_local. */
    for (int i = 0; i < ds->nxfers; i++) {
        starpu_mpi_wait(&ds->xfers[i].req, MPI_STATUS_IGNORE);
        starpu_data_unregister(ds->xfers[i].handle);
    }
    ds->nxfers = 0;
    return rc;
}
