/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PMIx bootstrap, for programs without MPI started by a PMIx launcher
 * (mpirun, prterun, srun). An allgather is put + commit + fence with data
 * collection + one get per rank, under a key unique to the context and call.
 */
#include "config.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pmix.h>

#include "core.h"

struct pmix_boot {
    pmix_proc_t me;
    pmix_proc_t all;
    unsigned instance;
    unsigned seq;
};

static int pmix_launched(void)
{
    return getenv("PMIX_NAMESPACE") != NULL && getenv("PMIX_RANK") != NULL;
}

static int pmix_boot_init(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx)
{
    static unsigned instances;
    pmix_value_t *val = NULL;
    pmix_status_t rc;

    if (!pmix_launched()) {
        dchan_err(ctx, "pmix", "bootstrap 'pmix' needs a PMIx launcher (mpirun, prterun, srun)");
        return DCHAN_ERR_STATE;
    }
    struct pmix_boot *s = calloc(1, sizeof *s);
    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    rc = PMIx_Init(&s->me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        dchan_err(ctx, "pmix", "PMIx_Init failed: %s", PMIx_Error_string(rc));
        free(s);
        return DCHAN_ERR_PROVIDER;
    }
    PMIX_PROC_CONSTRUCT(&s->all);
    memcpy(s->all.nspace, s->me.nspace, sizeof s->all.nspace);
    s->all.rank = PMIX_RANK_WILDCARD;
    rc = PMIx_Get(&s->all, PMIX_JOB_SIZE, NULL, 0, &val);
    if (rc != PMIX_SUCCESS || !val || val->type != PMIX_UINT32) {
        dchan_err(ctx, "pmix", "PMIx_Get(PMIX_JOB_SIZE) failed: %s", PMIx_Error_string(rc));
        if (val)
            PMIX_VALUE_RELEASE(val);
        PMIx_Finalize(NULL, 0);
        free(s);
        return DCHAN_ERR_PROVIDER;
    }
    b->size = (int)val->data.uint32;
    b->rank = (int)s->me.rank;
    PMIX_VALUE_RELEASE(val);
    /* Contexts are created collectively, so every rank numbers them alike. */
    s->instance = __atomic_fetch_add(&instances, 1, __ATOMIC_RELAXED);
    b->state = s;
    return DCHAN_SUCCESS;
}

static int pmix_boot_allgather(struct dchan_boot *b, const void *in, void *out, size_t len)
{
    struct pmix_boot *s = b->state;
    char key[PMIX_MAX_KEYLEN + 1];
    pmix_value_t v;
    pmix_info_t info;
    bool collect = true;
    pmix_status_t rc;

    snprintf(key, sizeof key, "dchan.%u.%u", s->instance, s->seq++);
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_BYTE_OBJECT;
    v.data.bo.bytes = (char *)in;
    v.data.bo.size = len;
    rc = PMIx_Put(PMIX_GLOBAL, key, &v);
    if (rc == PMIX_SUCCESS)
        rc = PMIx_Commit();
    if (rc == PMIX_SUCCESS) {
        PMIX_INFO_CONSTRUCT(&info);
        PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
        rc = PMIx_Fence(&s->all, 1, &info, 1);
        PMIX_INFO_DESTRUCT(&info);
    }
    if (rc != PMIX_SUCCESS) {
        dchan_err(b->ctx, "pmix", "PMIx exchange failed: %s", PMIx_Error_string(rc));
        return DCHAN_ERR_PROVIDER;
    }
    for (int r = 0; r < b->size; r++) {
        pmix_proc_t p = s->me;
        pmix_value_t *got = NULL;
        p.rank = (pmix_rank_t)r;
        rc = PMIx_Get(&p, key, NULL, 0, &got);
        if (rc != PMIX_SUCCESS || !got || got->type != PMIX_BYTE_OBJECT ||
            got->data.bo.size != len) {
            dchan_err(b->ctx, "pmix", "PMIx_Get(%s) from rank %d failed: %s", key, r,
                      PMIx_Error_string(rc));
            if (got)
                PMIX_VALUE_RELEASE(got);
            return DCHAN_ERR_PROVIDER;
        }
        memcpy((char *)out + (size_t)r * len, got->data.bo.bytes, len);
        PMIX_VALUE_RELEASE(got);
    }
    return DCHAN_SUCCESS;
}

/* Completion of a non-blocking fence, set from PMIx's progress thread. */
struct fence_done {
    volatile int done;
    volatile pmix_status_t status;
    struct fence_done *next;
};

/* Fences a barrier stopped waiting for (a rank died): PMIx may still call
 * back into them, so they stay allocated, and reachable from here. */
static struct fence_done *abandoned;

static void fence_cb(pmix_status_t status, void *cbdata)
{
    struct fence_done *f = cbdata;
    f->status = status;
    __atomic_store_n(&f->done, 1, __ATOMIC_RELEASE);
}

static int pmix_boot_barrier(struct dchan_boot *b, int (*poll)(void *), void *arg)
{
    struct pmix_boot *s = b->state;
    struct fence_done *f = calloc(1, sizeof *f);
    if (!f)
        return DCHAN_ERR_NO_MEMORY;
    pmix_status_t rc = PMIx_Fence_nb(&s->all, 1, NULL, 0, fence_cb, f);
    if (rc != PMIX_SUCCESS) {
        dchan_err(b->ctx, "pmix", "PMIx_Fence_nb failed: %s", PMIx_Error_string(rc));
        free(f);
        return DCHAN_ERR_PROVIDER;
    }
    for (unsigned long spins = 0; !__atomic_load_n(&f->done, __ATOMIC_ACQUIRE); spins++) {
        if (poll && poll(arg)) {
            f->next = __atomic_exchange_n(&abandoned, f, __ATOMIC_ACQ_REL);
            return DCHAN_ERR_PEER;
        }
        if (spins > 1000)
            sched_yield();
    }
    rc = f->status;
    free(f);
    if (rc == PMIX_ERR_PARTIAL_SUCCESS || rc == PMIX_ERR_PROC_ABORTED_BY_SIG ||
        rc == PMIX_PROC_TERMINATED || rc == PMIX_ERR_PROC_TERM_WO_SYNC ||
        rc == PMIX_ERR_UNREACH || rc == PMIX_ERR_LOST_CONNECTION) {
        /* A participant died (the launcher lets the others run on). */
        dchan_info(b->ctx, "pmix", "fence: %s: a rank is gone", PMIx_Error_string(rc));
        return DCHAN_ERR_PEER;
    }
    if (rc != PMIX_SUCCESS) {
        dchan_err(b->ctx, "pmix", "fence failed: %s", PMIx_Error_string(rc));
        return DCHAN_ERR_PROVIDER;
    }
    return DCHAN_SUCCESS;
}

/* Each context finalizes PMIx: a process may not end with PMIx still
 * initialised (Open MPI's launcher then reports an abnormal termination).
 * A known limit: a context created after another was finalized in the same
 * process initialises PMIx again, and with PMIx 4.2 under Open MPI 4.1's
 * launcher one of its exchanges then fails now and then (a rank's data
 * missing after a fence: 6 runs in 40 of a program making four contexts
 * in a row, none in 80 of one making one). */
static void pmix_boot_fini(struct dchan_boot *b)
{
    if (!b->state)
        return;
    PMIx_Finalize(NULL, 0);
    free(b->state);
    b->state = NULL;
}

const struct dchan_boot_ops dchan_boot_pmix_ops = {
    .name = "pmix",
    .method = DCHAN_BOOT_PMIX,
    .detect = pmix_launched,
    .init = pmix_boot_init,
    .allgather = pmix_boot_allgather,
    .barrier = pmix_boot_barrier,
    .fini = pmix_boot_fini,
};
