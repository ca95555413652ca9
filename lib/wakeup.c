/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The wake-up descriptor (DESIGN §7). The descriptor the application gets
 * is an epoll set that the context owns: the core's own eventfd (work made
 * inside this process: self puts, another thread's), each provider's wait
 * object (shm's eventfd, ofi's wait fd, verbs' completion channel, mpi's
 * timer) and the pidfds of the ranks of this host (a death is an error to
 * report). Nothing of it is touched on the data path until the application
 * arms: arming publishes "asleep" (to in-process senders here, to peers
 * through each provider), then looks once more for work that came before,
 * so that every event lands either before that look (DCHAN_ERR_AGAIN) or
 * after the flag was visible (its sender signals). The first progress after
 * a successful arm clears the flags again.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core.h"
#include "handle.h"

/* ---- live contexts ------------------------------------------------------------------ */

/* A finalised context is freed memory: the wake-up calls, which runtimes
 * may keep calling from an event loop after a shutdown, look the pointer
 * up here instead of reading it. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static dchan_ctx_t *reg_head;

void dchan_ctx_register(dchan_ctx_t *ctx)
{
    pthread_mutex_lock(&reg_lock);
    ctx->reg_next = reg_head;
    reg_head = ctx;
    pthread_mutex_unlock(&reg_lock);
}

void dchan_ctx_unregister(dchan_ctx_t *ctx)
{
    pthread_mutex_lock(&reg_lock);
    for (dchan_ctx_t **pp = &reg_head; *pp; pp = &(*pp)->reg_next)
        if (*pp == ctx) {
            *pp = ctx->reg_next;
            break;
        }
    pthread_mutex_unlock(&reg_lock);
}

bool dchan_ctx_registered(const dchan_ctx_t *ctx)
{
    bool found = false;
    if (!ctx)
        return false;
    pthread_mutex_lock(&reg_lock);
    for (dchan_ctx_t *c = reg_head; c && !found; c = c->reg_next)
        found = c == ctx;
    pthread_mutex_unlock(&reg_lock);
    return found && dchan_ctx_ok(ctx);
}

/* ---- the descriptor ----------------------------------------------------------------- */

static int ep_add(int ep, int fd)
{
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.fd = fd;
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
}

static int wake_open(dchan_ctx_t *ctx)
{
    int ep = epoll_create1(EPOLL_CLOEXEC), efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc = DCHAN_ERR_NO_MEMORY;

    if (ep < 0 || efd < 0 || ep_add(ep, efd) != 0)
        goto fail;
    for (int i = 0; i < ctx->nprovs; i++) {
        struct dchan_prov *p = ctx->provs[i];
        int fd = -1;
        if (!p->ops->wake_fd)
            continue;
        rc = p->ops->wake_fd(p, &fd);
        if (rc != DCHAN_SUCCESS)
            goto fail;
        if (fd >= 0 && ep_add(ep, fd) != 0) {
            dchan_err(ctx, p->ops->name, "cannot watch its wait object: %s", strerror(errno));
            rc = DCHAN_ERR_PROVIDER;
            goto fail;
        }
    }
    /* A pidfd turns readable when its process exits; peers.c closes it
     * after the death was seen, which also takes it out of the set. */
    for (int i = 0; i < ctx->nwatch; i++)
        if (ep_add(ep, ctx->watch[i].fd) != 0)
            dchan_info(ctx, NULL, "cannot watch rank %d's pidfd for the wake-up descriptor",
                       ctx->watch_rank[i]);
    ctx->wake_epfd = ep;
    ctx->wake_efd = efd;
    return DCHAN_SUCCESS;
fail:
    if (rc == DCHAN_ERR_NO_MEMORY)
        dchan_err(ctx, NULL, "cannot create the wake-up descriptor: %s", strerror(errno));
    if (efd >= 0)
        close(efd);
    if (ep >= 0)
        close(ep);
    return rc;
}

void dchan_wake_fini(dchan_ctx_t *ctx)
{
    if (ctx->wake_epfd >= 0)
        close(ctx->wake_epfd);
    if (ctx->wake_efd >= 0)
        close(ctx->wake_efd);
    ctx->wake_epfd = ctx->wake_efd = -1;
}

DCHAN_API int dchan_wakeup_fd(dchan_ctx_t *ctx, int *fd)
{
    int rc = DCHAN_SUCCESS;
    if (!fd || !dchan_ctx_registered(ctx))
        return DCHAN_ERR_INVALID_ARG;
    dchan_ctx_lock(ctx);
    /* Asked again: the same descriptor, which the context keeps owning. */
    if (ctx->wake_epfd < 0)
        rc = wake_open(ctx);
    if (rc == DCHAN_SUCCESS)
        *fd = ctx->wake_epfd;
    dchan_ctx_unlock(ctx);
    return rc;
}

/* ---- arm and disarm ----------------------------------------------------------------- */

void dchan_wake_disarm(dchan_ctx_t *ctx)
{
    ctx->wake_armed = false;
    __atomic_store_n(&ctx->asleep, 0, __ATOMIC_RELAXED);
    for (int i = 0; i < ctx->nprovs; i++)
        if (ctx->provs[i]->ops->wake_disarm)
            ctx->provs[i]->ops->wake_disarm(ctx->provs[i]);
}

DCHAN_API int dchan_wakeup_arm(dchan_ctx_t *ctx)
{
    int rc = DCHAN_SUCCESS, i;
    uint64_t v;

    if (!dchan_ctx_registered(ctx))
        return DCHAN_ERR_INVALID_ARG;
    /* The callback runs inside progress, which disarms when it returns. */
    if (dchan_in_callback(ctx))
        return DCHAN_ERR_STATE;
    dchan_ctx_lock(ctx);
    if (ctx->wake_epfd < 0) {
        rc = DCHAN_ERR_STATE; /* no descriptor to sleep on yet */
        goto out;
    }
    if (ctx->wake_armed)
        dchan_wake_disarm(ctx); /* armed twice: start over */
    /* A signal of an earlier sleep, consumed: the flag below is what makes
     * senders signal again. */
    while (read(ctx->wake_efd, &v, sizeof v) < 0 && errno == EINTR)
        ;
    __atomic_store_n(&ctx->asleep, 1, __ATOMIC_SEQ_CST);
    for (i = 0; i < ctx->nprovs; i++) {
        struct dchan_prov *p = ctx->provs[i];
        if (p->ops->wake_arm && (rc = p->ops->wake_arm(p)) != DCHAN_SUCCESS)
            break;
    }
    if (rc == DCHAN_SUCCESS) {
        /* Dekker's other half: the flags are visible before these loads,
         * and senders load the flags after their signalling stores. */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (ctx->nwatch)
            dchan_peers_check_now(ctx);
        dchan_scan_pollq(ctx);
        if (ctx->srcq_head)
            dchan_get_scan(ctx); /* sources whose version was taken meanwhile */
        if (ctx->fire_head || ctx->errq_head || ctx->credq_head || dchan_credit_returned(ctx) ||
            dchan_get_published(ctx))
            rc = DCHAN_ERR_AGAIN;
    }
    if (rc == DCHAN_SUCCESS) {
        ctx->wake_armed = true;
        ctx->wake_thread = pthread_self();
    } else {
        while (i-- > 0)
            if (ctx->provs[i]->ops->wake_disarm)
                ctx->provs[i]->ops->wake_disarm(ctx->provs[i]);
        __atomic_store_n(&ctx->asleep, 0, __ATOMIC_RELAXED);
    }
out:
    dchan_ctx_unlock(ctx);
    return rc;
}

/* No fence between the caller's signalling store and its load of
 * "asleep", unlike a peer's (shm's wake_peer): every caller is inside a
 * dchan call on ctx, as dchan_wakeup_arm is, and such calls never overlap
 * (the context's lock under DCHAN_THREAD_MULTIPLE, the application's
 * promise at the other levels). So either the arm came first, and its
 * store of "asleep" happened before this load, or the caller's store came
 * before the arm's look for work. The fence cost a drain of the store
 * buffer on every self put and credit: about 6 % of a rank's time in
 * jacobi3d with 64 blocks. */
void dchan_core_wake(dchan_ctx_t *ctx)
{
    if (__builtin_expect(__atomic_load_n(&ctx->asleep, __ATOMIC_RELAXED), 0) &&
        __atomic_exchange_n(&ctx->asleep, 0, __ATOMIC_ACQ_REL)) {
        uint64_t one = 1;
        /* Cannot fail short of a counter at its maximum, which is readable anyway. */
        if (write(ctx->wake_efd, &one, sizeof one) < 0)
            dchan_debug(ctx, NULL, "wake-up eventfd: %s", strerror(errno));
    }
}

/* ---- the timer of providers that cannot sleep until an event -------------------------- */

void dchan_waketimer_init(dchan_ctx_t *ctx, struct dchan_waketimer *t)
{
    t->fd = -1;
    t->cur_us = 0;
    t->min_us = ctx->params.WAKE_TIMER_MIN_US < 10 ? 10 : ctx->params.WAKE_TIMER_MIN_US;
    t->max_us = ctx->params.WAKE_TIMER_MAX_US < t->min_us ? t->min_us
                                                           : ctx->params.WAKE_TIMER_MAX_US;
}

int dchan_waketimer_fd(dchan_ctx_t *ctx, struct dchan_waketimer *t, int *fd)
{
    if (t->fd < 0)
        t->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (t->fd < 0) {
        dchan_err(ctx, NULL, "timerfd_create: %s", strerror(errno));
        return DCHAN_ERR_NO_MEMORY;
    }
    *fd = t->fd;
    return DCHAN_SUCCESS;
}

int dchan_waketimer_arm(struct dchan_waketimer *t, bool stop)
{
    struct itimerspec its;
    memset(&its, 0, sizeof its);
    if (!stop) {
        t->cur_us = t->cur_us ? t->cur_us : t->min_us;
        its.it_value.tv_sec = (time_t)(t->cur_us / 1000000u);
        its.it_value.tv_nsec = (long)(t->cur_us % 1000000u) * 1000;
        t->cur_us = t->cur_us * 2 < t->max_us ? t->cur_us * 2 : t->max_us;
    }
    /* Setting it also clears an expiry of an earlier sleep. */
    return timerfd_settime(t->fd, 0, &its, NULL) == 0 ? DCHAN_SUCCESS : DCHAN_ERR_PROVIDER;
}

void dchan_waketimer_close(struct dchan_waketimer *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
}
