/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channels of the credit benchmarks (dchan_credit, dchan_stream,
 * dchan_direct; bench/README.md): one channel between the 2 ranks, plain or
 * credited, of any depth, set up collectively, and the sender's and the
 * receiver's loops that every one of those programs shares.
 */
#ifndef DCHAN_BENCH_CHAN_H
#define DCHAN_BENCH_CHAN_H

#include "bench.h"

/* First failure on any rank (the lowest code), so that all take one branch. */
int bench_agree(int rc);

/*
 * Opens one channel from rank `from` to the other rank, collectively. The
 * receiver creates its handle over rbuf (depth slots of size bytes):
 * dchan_create_handle when credit is 0 and depth 1, else
 * dchan_create_handle_attr with that credit and depth; it ships the wire
 * form over MPI and the sender associates sbuf (size bytes). *h is the send
 * handle on rank `from`, the receive handle on the other. Returns
 * DCHAN_SUCCESS, or the receiver's failure (DCHAN_ERR_UNSUPPORTED: the
 * provider has no credit yet), agreed by both ranks, with nothing left
 * open; a failing dchan_assoc_local is fatal.
 */
int bench_chan_open(dchan_ctx_t *ctx, int from, int credit, int depth, void *sbuf, void *rbuf,
                    size_t size, dchan_arrival_fn fn, void *arg, dchan_handle_t **h);
/* dchan_handle_destroy, fatal on failure. The send ends go first, then a
 * barrier, then the receive ends (no put is left in flight to them). */
void bench_chan_destroy(dchan_handle_t *h, const char *what);

/* One dchan_progress, fatal on an error. */
static inline void bench_progress(dchan_ctx_t *ctx)
{
    int rc = dchan_progress(ctx);
    if (rc < 0)
        bench_fatal("dchan_progress: %s (%s)", dchan_strerror(rc), bench_rc_name(rc));
}

/* Spins until the last put of h completed locally (its send buffer may be
 * rewritten). */
void bench_wait_sent(dchan_handle_t *h);

/* dchan_put on a credited channel: while it answers DCHAN_ERR_AGAIN (no
 * credit), one dchan_progress and again. Returns the number of refusals. */
long bench_put_credited(dchan_ctx_t *ctx, dchan_handle_t *h);

/* dchan_put_ptr, likewise: where the next message goes, once there is credit. */
void *bench_put_ptr(dchan_ctx_t *ctx, dchan_handle_t *h, long *refusals);

/* dchan_handle_stats, fatal on failure. */
void bench_hstats(const dchan_handle_t *h, dchan_handle_stats_t *s);

#endif /* DCHAN_BENCH_CHAN_H */
