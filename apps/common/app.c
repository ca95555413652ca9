/* SPDX-License-Identifier: BSD-3-Clause */
#include "config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "app.h"

const char *app_name = "app";
int app_rank;
volatile int app_async_error;

void app_die(const char *msg)
{
    fprintf(stderr, "%s: rank %d: %s\n", app_name, app_rank, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

void app_die_dchan(const char *what, int rc)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s: %s", what, dchan_strerror(rc));
    app_die(msg);
}

double *app_xalloc(size_t count)
{
    size_t bytes = (count * sizeof(double) + 63) & ~(size_t)63;
    double *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p)
        app_die("out of memory");
    return p;
}

double *app_buf_alloc(dchan_ctx_t *ctx, size_t count)
{
    void *p;
    if (!ctx)
        return app_xalloc(count);
    int rc = dchan_alloc(ctx, count ? count * sizeof(double) : 64, &p);
    if (rc == DCHAN_ERR_NO_MEMORY)
        app_die_dchan("dchan_alloc (the shared segment is full: raise DCHAN_SHM_SEGMENT_SIZE)",
                      rc);
    if (rc != DCHAN_SUCCESS)
        app_die_dchan("dchan_alloc", rc);
    return p;
}

void app_buf_free(dchan_ctx_t *ctx, double *p)
{
    if (!ctx) {
        free(p);
        return;
    }
    int rc = dchan_free(ctx, p);
    if (rc != DCHAN_SUCCESS)
        app_die_dchan("dchan_free", rc);
}

void app_on_error(dchan_handle_t *h, int rc, void *arg)
{
    (void)h;
    (void)arg;
    fprintf(stderr, "%s: rank %d: channel error: %s\n", app_name, app_rank, dchan_strerror(rc));
    app_async_error = rc;
}

void app_count_arrival(dchan_handle_t *h, void *arg)
{
    (void)h;
    (*(int *)arg)++;
}

void app_wait_put_done(dchan_handle_t *sh)
{
    int rc;
    while ((rc = dchan_put_test(sh)) == 0)
        ;
    if (rc < 0)
        app_die_dchan("dchan_put_test", rc);
}

void app_barrier(dchan_ctx_t *ctx)
{
    int rc;
    if (!ctx)
        MPI_Barrier(MPI_COMM_WORLD);
    else if ((rc = dchan_barrier(ctx)) != DCHAN_SUCCESS)
        app_die_dchan("dchan_barrier", rc);
}

const char *app_detect_name(int d)
{
    switch (d) {
    case DCHAN_DETECT_SENTINEL:
        return "sentinel";
    case DCHAN_DETECT_FLAG:
        return "flag";
    case DCHAN_DETECT_EVENT:
        return "event";
    default:
        return "auto";
    }
}

const char *app_mode_name(int mode)
{
    return mode == MODE_MSG ? "msg" : mode == MODE_DCHAN ? "dchan" : "none";
}

int app_common_option(int c, const char *arg, struct app_common *o, const char **bad)
{
    static const char *const detects[] = {"auto", "sentinel", "flag", "event"};

    switch (c) {
    case 'i':
        if (app_parse_positive(arg, &o->iters))
            *bad = "--iters wants a positive integer";
        return 1;
    case 'm':
        if (!strcmp(arg, "msg"))
            o->mode = MODE_MSG;
        else if (!strcmp(arg, "dchan"))
            o->mode = MODE_DCHAN;
        else if (o->none_ok && !strcmp(arg, "none"))
            o->mode = MODE_NONE;
        else
            *bad = o->none_ok ? "--mode wants msg, dchan or none" : "--mode wants msg or dchan";
        return 1;
    case 'v':
        o->verify = 1;
        return 1;
    case 'd':
        o->detect = -2;
        for (int i = 0; i < 4; i++)
            if (!strcmp(arg, detects[i]))
                o->detect = i; /* DCHAN_DETECT_AUTO .. _EVENT are 0 .. 3 */
        if (o->detect == -2)
            *bad = "--detect wants auto, sentinel, flag or event";
        return 1;
    default:
        return 0;
    }
}

dchan_ctx_t *app_dchan_init(const struct app_common *o)
{
    dchan_attr_t attr;
    dchan_ctx_t *ctx;
    dchan_attr_init(&attr);
    if (o->detect >= 0)
        attr.detect = o->detect;
    attr.error_fn = app_on_error;
    int rc = dchan_init(&attr, &ctx);
    if (rc == DCHAN_ERR_UNSUPPORTED)
        app_die("dchan_init: operation not supported (is the detection mode offered by the "
                "provider? see dchan_info)");
    if (rc != DCHAN_SUCCESS)
        app_die_dchan("dchan_init", rc);
    return ctx;
}

int app_parse_positive(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);

    if (end == s || *end || v < 1 || v > INT_MAX)
        return -1;
    *out = (int)v;
    return 0;
}

int app_parse_triple(const char *s, int out[3])
{
    const char *p = s;

    for (int d = 0; d < 3; d++) {
        char *end;
        long v = strtol(p, &end, 10);

        if (end == p || v <= 0 || v > INT_MAX || (d < 2 ? *end != ',' : *end != '\0'))
            return -1;
        out[d] = (int)v;
        p = end + 1;
    }
    return 0;
}
