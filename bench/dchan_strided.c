/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Strided puts and get (bench/README.md, "Strided data and get"), 2 ranks.
 *
 *   face  a y- and a z-face of an N^3 block of doubles (default 128), each
 *         a ping-pong between the ranks: a subarray channel
 *         (dchan_assoc_local_subarray, gathered by the provider) against a
 *         pack loop into a contiguous send buffer and dchan_put.
 *   get   one-way latency and bandwidth (half a ping-pong) of get against
 *         put over sizes 8 B ... 4 MiB: the put side writes into the peer's
 *         buffer; the get side publishes (dchan_ready on a source) and the
 *         peer pulls (dchan_get as soon as it answers other than AGAIN).
 * Buffers come from dchan_alloc (the shm segment when shm runs). The last
 * line is the RESULT line of DESIGN §5; each message's first and last word
 * are checked, every byte with --check.
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <dchan.h>

static dchan_ctx_t *ctx;
static int me, peer;
static int check_all;
static volatile int arrived;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "dchan_strided[%d]: %s: %s\n", me, what, dchan_strerror(rc));
    MPI_Abort(MPI_COMM_WORLD, 1);
}
#define CK(call)                                                                           \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ < 0)                                                                       \
            die(#call, rc_);                                                               \
    } while (0)

static void on_arrival(dchan_handle_t *h, void *arg)
{
    arrived++;
}

static void wait_arrival(void)
{
    int before = arrived;
    while (arrived == before)
        CK(dchan_progress(ctx));
}

static void *alloc(size_t n)
{
    void *p;
    CK(dchan_alloc(ctx, n, &p));
    memset(p, 0, n);
    return p;
}

/* Wires: each rank makes a receive handle (or a source) for the other. */
static void swap_wire(const dchan_wire_t *mine, dchan_wire_t *theirs)
{
    MPI_Sendrecv(mine, sizeof *mine, MPI_BYTE, peer, 7, theirs, sizeof *theirs, MPI_BYTE, peer, 7,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

/* ---- faces ------------------------------------------------------------------------- */

static double face_run(int n, int axis, int packed, long iters)
{
    size_t cells = (size_t)n * n * n, fsz = (size_t)n * n * sizeof(double);
    double *u = malloc(cells * sizeof *u), *rbuf = alloc(fsz), *sbuf = NULL;
    for (size_t i = 0; i < cells; i++)
        u[i] = (double)i + me * 0.5;
    dchan_handle_t *rh, *sh;
    dchan_wire_t w, pw;
    CK(dchan_create_handle(ctx, peer, rbuf, fsz, 0, on_arrival, NULL, &rh));
    CK(dchan_handle_export(rh, &w));
    swap_wire(&w, &pw);
    size_t sizes[3] = {n, n, n}, sub[3] = {n, n, n}, st[3] = {0, 0, 0};
    sub[axis] = 1;
    st[axis] = 1; /* the first interior plane, as a halo exchange sends */
    if (packed) {
        sbuf = malloc(fsz);
        CK(dchan_assoc_local(ctx, &pw, sbuf, fsz, &sh));
    } else {
        CK(dchan_assoc_local_subarray(ctx, &pw, u, 3, sizes, sub, st, sizeof(double), &sh));
    }
    double t0 = 0;
    for (long it = -10; it < iters; it++) {
        if (it == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now();
        }
        if (me == 1) {
            wait_arrival();
            CK(dchan_ready(rh));
        }
        if (packed) {
            /* What an application does without subarray channels. */
            size_t k = 0;
            for (size_t i = 0; i < sub[0]; i++)
                for (size_t j = 0; j < sub[1]; j++) {
                    const double *row = u + ((st[0] + i) * n + st[1] + j) * n + st[2];
                    if (sub[2] == 1)
                        sbuf[k++] = row[0];
                    else {
                        memcpy(sbuf + k, row, sub[2] * sizeof(double));
                        k += sub[2];
                    }
                }
        }
        CK(dchan_put(sh));
        if (me == 0) {
            wait_arrival();
            CK(dchan_ready(rh));
        }
    }
    double t = (now() - t0) / (double)iters / 2;
    /* What arrived is the peer's face: element (a, b) of the plane. */
    size_t bad = 0;
    for (size_t a = 0; a < (size_t)n; a++)
        for (size_t b = 0; b < (size_t)n; b += check_all ? 1 : (size_t)n - 1) {
            size_t i = axis == 0 ? 1 : a, j = axis == 1 ? 1 : (axis == 0 ? a : b),
                   k = axis == 2 ? 1 : b;
            double want = (double)((i * n + j) * n + k) + peer * 0.5;
            if (rbuf[a * n + b] != want)
                bad++;
        }
    if (bad)
        die("face content", DCHAN_ERR_SIZE);
    MPI_Barrier(MPI_COMM_WORLD);
    CK(dchan_handle_destroy(sh));
    CK(dchan_handle_destroy(rh));
    CK(dchan_free(ctx, rbuf));
    free(sbuf);
    free(u);
    return t;
}

/* ---- get against put ----------------------------------------------------------------- */

static double put_pp(size_t size, long iters)
{
    unsigned char *rbuf = alloc(size), *sbuf = alloc(size);
    dchan_handle_t *rh, *sh;
    dchan_wire_t w, pw;
    CK(dchan_create_handle(ctx, peer, rbuf, size, 0, on_arrival, NULL, &rh));
    CK(dchan_handle_export(rh, &w));
    swap_wire(&w, &pw);
    CK(dchan_assoc_local(ctx, &pw, sbuf, size, &sh));
    double t0 = 0;
    for (long it = -10; it < iters; it++) {
        if (it == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now();
        }
        if (me == 1) {
            wait_arrival();
            CK(dchan_ready(rh));
        }
        sbuf[0] = sbuf[size - 1] = (unsigned char)it;
        CK(dchan_put(sh));
        if (me == 0) {
            wait_arrival();
            CK(dchan_ready(rh));
        }
    }
    double t = (now() - t0) / (double)iters / 2;
    if (rbuf[0] != (unsigned char)(iters - 1) || rbuf[size - 1] != (unsigned char)(iters - 1))
        die("put content", DCHAN_ERR_SIZE);
    MPI_Barrier(MPI_COMM_WORLD);
    CK(dchan_handle_destroy(sh));
    CK(dchan_handle_destroy(rh));
    CK(dchan_free(ctx, rbuf));
    CK(dchan_free(ctx, sbuf));
    return t;
}

static volatile int taken;
static void on_taken(dchan_handle_t *h, void *arg)
{
    taken++;
}

/* Pull the next version: dchan_get until it starts, then its arrival. */
static void pull(dchan_handle_t *g)
{
    int rc;
    while ((rc = dchan_get(g)) == DCHAN_ERR_AGAIN)
        CK(dchan_progress(ctx));
    CK(rc);
    wait_arrival();
}

static double get_pp(size_t size, long iters)
{
    unsigned char *sbuf = alloc(size), *gbuf = alloc(size);
    dchan_handle_t *src, *g;
    dchan_wire_t w, pw;
    CK(dchan_create_source(ctx, peer, sbuf, size, on_taken, NULL, &src));
    CK(dchan_handle_export(src, &w));
    swap_wire(&w, &pw);
    CK(dchan_assoc_remote(ctx, &pw, gbuf, size, on_arrival, NULL, &g));
    /* Version 0 was published at creation: rank 1 takes it first, so the
     * loop below starts with rank 0 publishing. */
    int published = 1;
    double t0 = 0;
    /* dchan_barrier, not MPI's: it drives progress, which serves the
     * peer's reads where the fabric needs the source's progress (tcp). */
    for (long it = -10; it < iters; it++) {
        if (it == 0) {
            CK(dchan_barrier(ctx));
            t0 = now();
        }
        if (me == 1)
            pull(g);
        /* The previous version was taken (the peer pulled it before it
         * answered): write the next one and publish it. */
        if (!published) {
            while (taken == 0)
                CK(dchan_progress(ctx));
            taken--;
            sbuf[0] = sbuf[size - 1] = (unsigned char)it;
            CK(dchan_ready(src));
        }
        published = 0;
        if (me == 0)
            pull(g);
    }
    double t = (now() - t0) / (double)iters / 2;
    if (gbuf[0] != (unsigned char)(iters - 1) || gbuf[size - 1] != (unsigned char)(iters - 1))
        die("get content", DCHAN_ERR_SIZE);
    CK(dchan_barrier(ctx));
    while (taken == 0)
        CK(dchan_progress(ctx));
    taken = 0;
    CK(dchan_barrier(ctx));
    CK(dchan_handle_destroy(g));
    CK(dchan_handle_destroy(src));
    CK(dchan_free(ctx, sbuf));
    CK(dchan_free(ctx, gbuf));
    return t;
}

int main(int argc, char **argv)
{
    int n = 128, opt;
    long iters = 2000;
    MPI_Init(&argc, &argv);
    while ((opt = getopt(argc, argv, "n:i:c")) != -1) {
        if (opt == 'n')
            n = atoi(optarg);
        else if (opt == 'i')
            iters = atol(optarg);
        else if (opt == 'c')
            check_all = 1;
    }
    dchan_attr_t attr;
    dchan_attr_init(&attr);
    attr.bootstrap = DCHAN_BOOT_MPI;
    CK(dchan_init(&attr, &ctx));
    me = dchan_rank(ctx);
    if (dchan_nranks(ctx) != 2)
        die("needs 2 ranks", DCHAN_ERR_INVALID_ARG);
    peer = 1 - me;
    const char *prov = dchan_provider_name(ctx);

    double ty_sub = face_run(n, 1, 0, iters), ty_pack = face_run(n, 1, 1, iters);
    double tz_sub = face_run(n, 2, 0, iters / 4), tz_pack = face_run(n, 2, 1, iters / 4);
    if (me == 0) {
        printf("# face %dx%d doubles, one-way us: subarray  pack+put  ratio\n", n, n);
        printf("y-face %10.2f %10.2f %6.2f\n", ty_sub * 1e6, ty_pack * 1e6, ty_sub / ty_pack);
        printf("z-face %10.2f %10.2f %6.2f\n", tz_sub * 1e6, tz_pack * 1e6, tz_sub / tz_pack);
        printf("# size  put-us  get-us  get-put-us  put-MB/s  get-MB/s  get/put-bw\n");
    }
    static const size_t sizes[] = {8, 64, 512, 4096, 65536, 262144, 1048576, 4194304};
    double worst_small = 0, worst_bw = 1e9;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t s = sizes[i];
        long it = s >= 1048576 ? iters / 10 : iters;
        double tp = put_pp(s, it), tg = get_pp(s, it);
        if (me == 0) {
            double bwp = (double)s / tp / 1e6, bwg = (double)s / tg / 1e6;
            printf("%8zu %7.2f %7.2f %7.2f %9.0f %9.0f %6.2f\n", s, tp * 1e6, tg * 1e6,
                   (tg - tp) * 1e6, bwp, bwg, bwg / bwp);
            if (s <= 4096 && tg - tp > worst_small)
                worst_small = tg - tp;
            if (s >= 65536 && bwg / bwp < worst_bw)
                worst_bw = bwg / bwp;
        }
    }
    if (me == 0)
        printf("RESULT app=dchan_strided provider=%s ranks=2 n=%d yface_ratio=%.2f "
               "zface_ratio=%.2f get_extra_small_us=%.2f get_bw_ratio_min=%.2f\n",
               prov, n, ty_sub / ty_pack, tz_sub / tz_pack, worst_small * 1e6, worst_bw);
    CK(dchan_finalize(ctx));
    MPI_Finalize();
    return 0;
}
