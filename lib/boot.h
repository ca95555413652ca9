/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bootstrap: rank, size and collective exchange, before any provider runs.
 * Implementations: singleton, external (callbacks from the embedding
 * runtime), mpi (the program's MPI), pmix (a PMIx launcher).
 */
#ifndef DCHAN_BOOT_H
#define DCHAN_BOOT_H

#include <stddef.h>

#include "dchan.h"

struct dchan_boot;

struct dchan_boot_ops {
    const char *name;
    int method; /* DCHAN_BOOT_* */
    /* For DCHAN_BOOT_AUTO: 1 when this process can use this method. */
    int (*detect)(void);
    int (*init)(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx);
    /* Collective: len bytes from every rank into out, in rank order. */
    int (*allgather)(struct dchan_boot *b, const void *in, void *out, size_t len);
    /* Collective barrier that calls poll(arg) while it waits, so that
     * transports needing the caller's progress finish what peers wait for;
     * when poll returns non-zero (a rank died), it stops waiting and returns
     * DCHAN_ERR_PEER, leaving the collective unfinished. NULL: a blocking
     * allgather serves. */
    int (*barrier)(struct dchan_boot *b, int (*poll)(void *), void *arg);
    void (*fini)(struct dchan_boot *b);
};

struct dchan_boot {
    const struct dchan_boot_ops *ops;
    int rank, size;
    void *state;
    const void *mpi_comm; /* MPI_Comm * of the mpi bootstrap, else NULL */
    dchan_ctx_t *ctx;     /* for log lines */
};

/* Choose (attr->bootstrap, or AUTO as DESIGN §4) and initialise. */
int dchan_boot_init(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx);
int dchan_boot_allgather(struct dchan_boot *b, const void *in, void *out, size_t len);
/* poll(arg) is called while waiting, where the method can wait without
 * blocking (mpi, pmix); it may be NULL; non-zero from it ends the wait with
 * DCHAN_ERR_PEER. */
int dchan_boot_barrier(struct dchan_boot *b, int (*poll)(void *), void *arg);
void dchan_boot_fini(struct dchan_boot *b);
/* Name of a method, "mpi", for dchan_info and logs. */
const char *dchan_boot_name(int method);

extern const struct dchan_boot_ops dchan_boot_singleton_ops;
extern const struct dchan_boot_ops dchan_boot_external_ops;
#ifdef HAVE_MPI
extern const struct dchan_boot_ops dchan_boot_mpi_ops;
#endif
#ifdef HAVE_PMIX
extern const struct dchan_boot_ops dchan_boot_pmix_ops;
#endif

#endif
