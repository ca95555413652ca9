/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Death of peers on this host, noticed without their help.
 *
 * A rank that dies abruptly (SIGKILL, a crash) tells nobody. Between hosts
 * the transports notice (a connection breaks, a queue pair times out); on
 * one host they may never: a put into a dead peer's shared segment is a
 * memcpy that succeeds, and its receive buffers simply stop being read.
 * So the core watches every other rank of the kernel (and PID namespace)
 * through a pidfd, which a reused pid cannot fool, from the polls the
 * application already makes (dchan_peers_poll in core.h): every
 * DCHAN_WATCH_TICKS polls it reads the clock, and every DCHAN_PEER_CHECK_MS
 * it asks the kernel once, for all peers, with one poll(2). A dead rank's
 * handles, on every provider, get DCHAN_ERR_PEER; collectives stop waiting
 * for it (dchan_barrier, dchan_finalize).
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core.h"

static int pidfd_open_(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

int dchan_peers_watch_init(dchan_ctx_t *ctx, const int64_t *pids)
{
    uint64_t period = ctx->params.PEER_CHECK_MS;
    int n = 0;

    ctx->dead = calloc((size_t)ctx->nranks, sizeof *ctx->dead);
    if (!ctx->dead)
        return DCHAN_ERR_NO_MEMORY;
    if (period == 0)
        return DCHAN_SUCCESS; /* turned off */
    for (int r = 0; r < ctx->nranks; r++)
        if (r != ctx->rank && pids[r] > 0)
            n++;
    if (n == 0)
        return DCHAN_SUCCESS;
    ctx->watch = calloc((size_t)n, sizeof *ctx->watch);
    ctx->watch_rank = calloc((size_t)n, sizeof *ctx->watch_rank);
    if (!ctx->watch || !ctx->watch_rank)
        return DCHAN_ERR_NO_MEMORY;
    for (int r = 0; r < ctx->nranks; r++) {
        if (r == ctx->rank || pids[r] <= 0)
            continue;
        int fd = pidfd_open_((pid_t)pids[r]);
        if (fd < 0) {
            /* Older kernels: the transports must notice. */
            dchan_info(ctx, NULL, "cannot watch rank %d (pid %lld): %s", r,
                       (long long)pids[r], strerror(errno));
            continue;
        }
        ctx->watch[ctx->nwatch] = (struct pollfd){.fd = fd, .events = POLLIN};
        ctx->watch_rank[ctx->nwatch++] = r;
    }
    ctx->watch_period_ns = period * 1000000ull;
    ctx->watch_next_ns = dchan_now_ns() + ctx->watch_period_ns;
    return DCHAN_SUCCESS;
}

void dchan_peers_watch_fini(dchan_ctx_t *ctx)
{
    for (int i = 0; i < ctx->nwatch; i++)
        close(ctx->watch[i].fd);
    free(ctx->watch);
    free(ctx->watch_rank);
    free(ctx->dead);
    ctx->watch = NULL;
    ctx->watch_rank = NULL;
    ctx->dead = NULL;
    ctx->nwatch = 0;
}

void dchan_peers_lost(dchan_ctx_t *ctx, int rank)
{
    if (rank < 0 || rank >= ctx->nranks || rank == ctx->rank || ctx->dead[rank])
        return;
    ctx->dead[rank] = 1;
    ctx->ndead++;
    dchan_warn(ctx, NULL, "rank %d is gone: its channels fail with DCHAN_ERR_PEER", rank);
    for (int i = 0; i < ctx->nprovs; i++)
        dchan_core_peer_error(ctx->provs[i], rank, DCHAN_ERR_PEER);
}

void dchan_peers_check_now(dchan_ctx_t *ctx)
{
    ctx->watch_next_ns = dchan_now_ns() + ctx->watch_period_ns;
    if (poll(ctx->watch, (nfds_t)ctx->nwatch, 0) <= 0)
        return;
    for (int i = 0; i < ctx->nwatch;) {
        if (!ctx->watch[i].revents) {
            i++;
            continue;
        }
        /* A pidfd becomes readable when its process has exited. */
        int r = ctx->watch_rank[i];
        close(ctx->watch[i].fd);
        ctx->watch[i] = ctx->watch[--ctx->nwatch];
        ctx->watch_rank[i] = ctx->watch_rank[ctx->nwatch];
        dchan_peers_lost(ctx, r);
    }
}

void dchan_peers_tick(dchan_ctx_t *ctx)
{
    ctx->watch_tick = 0;
    if (dchan_now_ns() >= ctx->watch_next_ns)
        dchan_peers_check_now(ctx);
}
