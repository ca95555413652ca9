/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan inside StarPU: the glue between dchan channels and a StarPU-MPI
 * program (libdchan_starpu).
 *
 *  - dchan_starpu_init() opens a dchan context whose bootstrap is external:
 *    its allgather runs over StarPU-MPI (starpu_mpi_isend/irecv of
 *    registered buffers), so the runtime's own communication carries it.
 *  - dchan_starpu_hook_start() registers a StarPU progression hook that
 *    drives dchan_progress_n() with a budget from the workers' scheduling
 *    loop; the hook never runs more than that many callbacks per call.
 *  - dchan_starpu_recv_create() opens a receive channel whose n-th arrival
 *    (counted from 0) notifies the StarPU tag tag_base + n * tag_stride
 *    (starpu_tag_notify_from_apps), releasing the tasks that declared a
 *    dependency on it (starpu_tag_declare_deps).
 *  - dchan_starpu_wires_post() ships wire forms as StarPU-MPI data.
 *
 * Threads: StarPU calls the hook from any worker, and tasks call dchan on
 * their workers; the context is therefore opened at DCHAN_THREAD_MULTIPLE
 * (so MPI must provide MPI_THREAD_MULTIPLE when dchan's mpi provider
 * serves a peer), and the glue lets one thread at a time drive progress.
 * See README.md.
 */
#ifndef DCHAN_STARPU_H
#define DCHAN_STARPU_H

#include <stdint.h>

#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>

#include <dchan.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dchan_starpu dchan_starpu_t;           /* one per process */
typedef struct dchan_starpu_recv dchan_starpu_recv_t; /* a receive channel releasing tags */

/* Counters of the progression hook, for tests and tuning. */
struct dchan_starpu_stats {
    uint64_t hook_calls;     /* hook calls that drove dchan progress */
    uint64_t hook_callbacks; /* callbacks run by them */
    uint64_t hook_max;       /* most callbacks run by one hook call */
    uint64_t hook_full;      /* hook calls that used their whole budget */
    uint64_t hook_busy;      /* hook calls skipped: another thread progressed */
    uint64_t notified;       /* tags notified by arrivals */
};

/* Collective over comm, after starpu_mpi_init_conf(). attr: NULL for the
 * defaults and DCHAN_* variables; its bootstrap, thread level and external
 * fields are set here. Returns 0 or a negative DCHAN_ERR_*. */
int dchan_starpu_init(MPI_Comm comm, const dchan_attr_t *attr, dchan_starpu_t **ds);
/* Collective: stops the hook, finalises the context, frees ds. Every
 * channel must have been destroyed; call before starpu_mpi_shutdown(). */
int dchan_starpu_finalize(dchan_starpu_t *ds);
dchan_ctx_t *dchan_starpu_ctx(const dchan_starpu_t *ds);

/* Registers the progression hook: each call runs dchan_progress_n(ctx,
 * budget) (budget >= 1). DCHAN_ERR_STATE when it is already registered. */
int dchan_starpu_hook_start(dchan_starpu_t *ds, int budget);
/* Deregisters it; no hook call is running or about to run once this
 * returns (it waits for every worker to pass a task, so call it from the
 * application thread, never from a task or a callback). */
void dchan_starpu_hook_stop(dchan_starpu_t *ds);
/* Progress from a task or the main thread, with the same budget rule and
 * the same exclusion as the hook: 0 when another thread is progressing. */
int dchan_starpu_progress(dchan_starpu_t *ds, int budget);
/* dchan_put_ptr, driving progress (dchan_starpu_progress) while the
 * channel has no credit; DCHAN_ERR_TIMEOUT after timeout_ms. */
int dchan_starpu_put_ptr(dchan_starpu_t *ds, dchan_handle_t *sh, void **ptr, int timeout_ms);
/* The first asynchronous error reported on a channel, 0 while none. */
int dchan_starpu_error(const dchan_starpu_t *ds);
int dchan_starpu_get_stats(const dchan_starpu_t *ds, struct dchan_starpu_stats *stats);

/* Receiver: dchan_create_handle_attr (hattr NULL: credit 1, depth 1)
 * whose n-th arrival notifies tag_base + n * tag_stride. expect: arrivals
 * to come, for the hook's answer to StarPU (workers should keep polling
 * while some are due); more can be announced by dchan_starpu_recv_expect. */
int dchan_starpu_recv_create(dchan_starpu_t *ds, int sender_rank, void *buf, size_t size,
                             uint64_t oob, const dchan_handle_attr_t *hattr, starpu_tag_t tag_base,
                             starpu_tag_t tag_stride, uint64_t expect, dchan_starpu_recv_t **r);
void dchan_starpu_recv_expect(dchan_starpu_recv_t *r, uint64_t more);
dchan_handle_t *dchan_starpu_recv_handle(const dchan_starpu_recv_t *r);
/* Arrivals seen so far on r. */
uint64_t dchan_starpu_recv_arrived(const dchan_starpu_recv_t *r);
/* Destroys the handle and r. */
int dchan_starpu_recv_destroy(dchan_starpu_recv_t *r);

/* Ships nsend wires to peer and receives nrecv wires from it, as
 * StarPU-MPI data under tag (both sides name the same tag): posts the
 * transfers (starpu_mpi_isend/irecv of registered buffers) and returns;
 * dchan_starpu_wires_wait() completes every posted one. The buffers must
 * stay until then. Main thread only. */
int dchan_starpu_wires_post(dchan_starpu_t *ds, int peer, const dchan_wire_t *send, int nsend,
                            dchan_wire_t *recv, int nrecv, starpu_mpi_tag_t tag);
int dchan_starpu_wires_wait(dchan_starpu_t *ds);

#ifdef __cplusplus
}
#endif

#endif /* DCHAN_STARPU_H */
