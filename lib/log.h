/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Logging: one macro family, to stderr, every line tagged with the rank and
 * the provider. Debug lines are compiled out unless configured with
 * --enable-debug.
 */
#ifndef DCHAN_LOG_H
#define DCHAN_LOG_H

#include "dchan.h"

void dchan_log_emit(const dchan_ctx_t *ctx, int level, const char *prov, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int dchan_log_level(const dchan_ctx_t *ctx);

#define DCHAN_LOG_AT(ctx, lvl, prov, ...)                                                  \
    do {                                                                                   \
        if (dchan_log_level(ctx) >= (lvl))                                                 \
            dchan_log_emit((ctx), (lvl), (prov), __VA_ARGS__);                             \
    } while (0)

#define dchan_err(ctx, prov, ...) DCHAN_LOG_AT(ctx, DCHAN_LOG_ERROR, prov, __VA_ARGS__)
#define dchan_warn(ctx, prov, ...) DCHAN_LOG_AT(ctx, DCHAN_LOG_WARN, prov, __VA_ARGS__)
#define dchan_info(ctx, prov, ...) DCHAN_LOG_AT(ctx, DCHAN_LOG_INFO, prov, __VA_ARGS__)
#ifdef DCHAN_DEBUG
#define dchan_debug(ctx, prov, ...) DCHAN_LOG_AT(ctx, DCHAN_LOG_DEBUG, prov, __VA_ARGS__)
#else
#define dchan_debug(ctx, prov, ...) ((void)0)
#endif

#endif
