/* SPDX-License-Identifier: BSD-3-Clause */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "core.h"

static const char *const level_names[] = {"none", "error", "warn", "info", "debug"};

int dchan_log_level(const dchan_ctx_t *ctx)
{
    return ctx ? ctx->log_level : DCHAN_LOG_WARN;
}

void dchan_log_emit(const dchan_ctx_t *ctx, int level, const char *prov, const char *fmt, ...)
{
    char line[1024];
    int n;
    va_list ap;

    if (ctx && ctx->rank >= 0)
        n = snprintf(line, sizeof line, "dchan[%d:%s] %s: ", ctx->rank, prov ? prov : "core",
                     level_names[level]);
    else
        n = snprintf(line, sizeof line, "dchan[pid %d:%s] %s: ", (int)getpid(),
                     prov ? prov : "core", level_names[level]);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* One write per line so that lines of different ranks do not interleave. */
    if (write(STDERR_FILENO, line, (size_t)n) < 0)
        return;
}
