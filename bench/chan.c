/* SPDX-License-Identifier: BSD-3-Clause */
/* Channels of the credit benchmarks; see chan.h. */
#include <string.h>

#include "chan.h"

#define TAG_WIRE 31

int bench_agree(int rc)
{
    int lo;
    MPI_Allreduce(&rc, &lo, 1, MPI_INT, MPI_MIN, bench_comm);
    return lo;
}

int bench_chan_open(dchan_ctx_t *ctx, int from, int credit, int depth, void *sbuf, void *rbuf,
                    size_t size, dchan_arrival_fn fn, void *arg, dchan_handle_t **h)
{
    int to = 1 - from, rc = DCHAN_SUCCESS, all;
    dchan_handle_t *mine = NULL;
    dchan_wire_t wire;

    if (bench_rank == to) {
        if (credit || depth > 1) {
            dchan_handle_attr_t ha;
            dchan_handle_attr_init(&ha);
            ha.credit = credit;
            ha.depth = depth;
            rc = dchan_create_handle_attr(ctx, from, rbuf, size, BENCH_OOB, fn, arg, &ha, &mine);
        } else {
            rc = dchan_create_handle(ctx, from, rbuf, size, BENCH_OOB, fn, arg, &mine);
        }
        if (rc == DCHAN_SUCCESS)
            rc = dchan_handle_export(mine, &wire);
    }
    if ((all = bench_agree(rc)) != DCHAN_SUCCESS) {
        if (mine)
            dchan_handle_destroy(mine);
        return all;
    }
    if (bench_rank == to) {
        MPI_Send(&wire, sizeof wire, MPI_BYTE, from, TAG_WIRE, bench_comm);
    } else {
        MPI_Recv(&wire, sizeof wire, MPI_BYTE, to, TAG_WIRE, bench_comm, MPI_STATUS_IGNORE);
        rc = dchan_assoc_local(ctx, &wire, sbuf, size, &mine);
    }
    if ((all = bench_agree(rc)) != DCHAN_SUCCESS)
        bench_fatal("dchan_assoc_local (%zu bytes, credit %d, depth %d): %s", size, credit, depth,
                    dchan_strerror(all));
    *h = mine;
    return DCHAN_SUCCESS;
}

void bench_chan_destroy(dchan_handle_t *h, const char *what)
{
    int rc = dchan_handle_destroy(h);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_destroy (%s): %s", what, dchan_strerror(rc));
}

void bench_wait_sent(dchan_handle_t *h)
{
    struct bench_spin sp;
    int rc;
    bench_spin_init(&sp, "a dchan put to complete locally");
    while ((rc = dchan_put_test(h)) == 0)
        bench_spin(&sp);
    if (rc < 0)
        bench_fatal("dchan_put_test: %s", dchan_strerror(rc));
}

long bench_put_credited(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    struct bench_spin sp;
    long refused = 0;
    int rc;
    bench_spin_init(&sp, "credit to put");
    while ((rc = dchan_put(h)) == DCHAN_ERR_AGAIN) {
        refused++;
        bench_progress(ctx);
        bench_spin(&sp);
    }
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_put: %s (%s)", dchan_strerror(rc), bench_rc_name(rc));
    return refused;
}

void *bench_put_ptr(dchan_ctx_t *ctx, dchan_handle_t *h, long *refusals)
{
    struct bench_spin sp;
    void *p = NULL;
    int rc;
    bench_spin_init(&sp, "credit to write");
    while ((rc = dchan_put_ptr(h, &p)) == DCHAN_ERR_AGAIN) {
        ++*refusals;
        bench_progress(ctx);
        bench_spin(&sp);
    }
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_put_ptr: %s (%s)", dchan_strerror(rc), bench_rc_name(rc));
    return p;
}

void bench_hstats(const dchan_handle_t *h, dchan_handle_stats_t *s)
{
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
    int rc = dchan_handle_stats(h, s);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_stats: %s", dchan_strerror(rc));
}
