/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * MPI bootstrap: the program has initialised MPI; dchan uses a private
 * duplicate of its communicator and never initialises or finalises MPI.
 */
#include "config.h"

#include <limits.h>
#include <sched.h>
#include <stdlib.h>

#include <mpi.h>

#include "core.h"

struct mpi_boot {
    MPI_Comm comm;
};

static int mpi_usable(void)
{
    int init = 0, fini = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fini);
    return init && !fini;
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

static int mpi_boot_init(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx)
{
    MPI_Comm base = MPI_COMM_WORLD;
    int provided = MPI_THREAD_SINGLE, rc;

    if (!mpi_usable()) {
        dchan_err(ctx, "mpi",
                  "bootstrap 'mpi' needs MPI initialised by the program (call MPI_Init first; "
                  "dchan never initialises MPI)");
        return DCHAN_ERR_STATE;
    }
    MPI_Query_thread(&provided);
    if (provided < needed_mpi_level(attr->thread_level)) {
        dchan_err(ctx, "mpi", "thread level %d needs MPI at thread level %d, MPI provides %d",
                  attr->thread_level, needed_mpi_level(attr->thread_level), provided);
        return DCHAN_ERR_UNSUPPORTED;
    }
    if (attr->mpi_comm)
        base = *(const MPI_Comm *)attr->mpi_comm;
    else if (attr->mpi_fcomm >= 0)
        base = MPI_Comm_f2c((MPI_Fint)attr->mpi_fcomm);
    if (base == MPI_COMM_NULL) {
        dchan_err(ctx, "mpi", "the communicator given for the bootstrap is MPI_COMM_NULL");
        return DCHAN_ERR_INVALID_ARG;
    }
    struct mpi_boot *s = calloc(1, sizeof *s);
    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    rc = MPI_Comm_dup(base, &s->comm);
    if (rc != MPI_SUCCESS) {
        free(s);
        dchan_err(ctx, "mpi", "MPI_Comm_dup failed (MPI error %d)", rc);
        return DCHAN_ERR_PROVIDER;
    }
    /* Errors on our communicator come back as codes, never abort the job. */
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(s->comm, &b->rank);
    MPI_Comm_size(s->comm, &b->size);
    b->state = s;
    b->mpi_comm = &s->comm;
    return DCHAN_SUCCESS;
}

static int mpi_boot_allgather(struct dchan_boot *b, const void *in, void *out, size_t len)
{
    struct mpi_boot *s = b->state;
    int fini = 0;
    if (len > INT_MAX)
        return DCHAN_ERR_SIZE;
    MPI_Finalized(&fini);
    if (fini) {
        dchan_err(b->ctx, "mpi", "MPI was finalised before dchan: finalise dchan first");
        return DCHAN_ERR_STATE;
    }
    int rc = MPI_Allgather(in, (int)len, MPI_BYTE, out, (int)len, MPI_BYTE, s->comm);
    if (rc != MPI_SUCCESS) {
        dchan_err(b->ctx, "mpi", "MPI_Allgather failed (MPI error %d)", rc);
        return DCHAN_ERR_PROVIDER;
    }
    return DCHAN_SUCCESS;
}

static int mpi_boot_barrier(struct dchan_boot *b, int (*poll)(void *), void *arg)
{
    struct mpi_boot *s = b->state;
    MPI_Request req;
    int done = 0, fini = 0, rc;
    MPI_Finalized(&fini);
    if (fini) {
        dchan_err(b->ctx, "mpi", "MPI was finalised before dchan: finalise dchan first");
        return DCHAN_ERR_STATE;
    }
    rc = MPI_Ibarrier(s->comm, &req);
    for (unsigned long spins = 0; rc == MPI_SUCCESS && !done; spins++) {
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done && poll && poll(arg))
            return DCHAN_ERR_PEER; /* a rank died: the request never completes */
        if (!done && spins > 1000)
            sched_yield(); /* with more ranks than cores, let the others in */
    }
    if (rc != MPI_SUCCESS) {
        dchan_err(b->ctx, "mpi", "barrier failed (MPI error %d)", rc);
        return DCHAN_ERR_PROVIDER;
    }
    return DCHAN_SUCCESS;
}

static void mpi_boot_fini(struct dchan_boot *b)
{
    struct mpi_boot *s = b->state;
    int fini = 0;
    if (!s)
        return;
    MPI_Finalized(&fini);
    if (!fini)
        MPI_Comm_free(&s->comm);
    else
        dchan_warn(b->ctx, "mpi", "dchan_finalize called after MPI_Finalize");
    free(s);
    b->state = NULL;
    b->mpi_comm = NULL;
}

const struct dchan_boot_ops dchan_boot_mpi_ops = {
    .name = "mpi",
    .method = DCHAN_BOOT_MPI,
    .detect = mpi_usable,
    .init = mpi_boot_init,
    .allgather = mpi_boot_allgather,
    .barrier = mpi_boot_barrier,
    .fini = mpi_boot_fini,
};
