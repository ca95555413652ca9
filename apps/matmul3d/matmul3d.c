/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * matmul3d: C = A x B for n x n matrices with the 3D algorithm of Agarwal
 * et al. on q x q x q ranks.
 *
 * The matrices are cut into q x q blocks of b = n/q rows and columns, and
 * every block into q row strips of s = b/q rows (so n must be a multiple
 * of q^2). Rank (x,y,z) computes the block product A(x,y) B(y,z), and
 * C(x,z) is the sum of those products over y:
 *   - A(x,y) is needed by the q ranks (x,y,*): replicated along z. Each of
 *     them owns strip z of it and gets the other strips from its peers.
 *   - B(y,z) is needed by the q ranks (*,y,z): replicated along x; rank
 *     (x,y,z) owns strip x.
 *   - the partial products are reduced along y and scattered: rank (x,y,z)
 *     ends with strip y of C(x,z), summed over the q ranks (x,*,z).
 * Row strips of a row-major block are contiguous, so every incoming strip
 * has a contiguous place in the local operand.
 *
 * msg mode uses MPI collectives on the three line communicators:
 * MPI_Allgather with MPI_IN_PLACE for A and B (the strips land in place),
 * MPI_Reduce_scatter_block for C. dchan mode uses one channel per strip
 * and peer that puts the strip straight into its place in the peer's A or
 * B block, and channels into per-contributor buffers for the reduction,
 * which the final sum reads in place.
 */
#include "config.h"

#include <cblas.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dchan.h>

#include "app.h"

#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
void openblas_set_num_threads(int num_threads);
#endif

enum { KIND_A, KIND_B, KIND_C, NKINDS };

/* A signalling NaN: no arithmetic produces it, so no strip ends with it. */
#define SENTINEL_OOB UINT64_C(0xfff4dc4a6e5e0bbb)
#define WAIT_TIMEOUT_MS 120000

struct options {
    long n;
    struct app_common c; /* --iters, --mode, --verify, --detect */
};

/* This rank's place in the q x q x q grid and the sizes derived from n. */
struct geom {
    int q, x, y, z;
    int b, s;           /* rows of a block, of a strip */
    size_t blk, strip;  /* doubles in a block, in a strip */
};


static int rank_of(int q, int x, int y, int z)
{
    return (x * q + y) * q + z;
}

/* Line of kind k through this rank: A varies z, B varies x, C varies y. */
static int line_index(const struct geom *g, int k)
{
    return k == KIND_A ? g->z : k == KIND_B ? g->x : g->y;
}

static int line_peer(const struct geom *g, int k, int t)
{
    return k == KIND_A ? rank_of(g->q, g->x, g->y, t)
         : k == KIND_B ? rank_of(g->q, t, g->y, g->z)
                       : rank_of(g->q, g->x, t, g->z);
}

/* ---- inputs ------------------------------------------------------------- */

/*
 * Inputs of multiply m. Small integers, so that every product and partial
 * sum is an integer far below 2^53: any correct summation order gives the
 * exact result, and the check against the serial product can demand
 * equality. They change with m (periods 7 and 5), so that a strip that
 * was not delivered in the last multiplies is caught.
 */
static double a_val(long i, long j, int m)
{
    return (double)((i * 7 + j * 3) % 11 - 5 + m % 7);
}

static double b_val(long i, long j, int m)
{
    return (double)((i * 5 + j * 13) % 9 - 4 + m % 5);
}

/* Writes this rank's own strips of A(x,y) and B(y,z) into their places in
 * the local blocks. */
static void fill_own(const struct geom *g, double *ablk, double *bblk, int m)
{
    double *as = ablk + (size_t)g->z * g->strip, *bs = bblk + (size_t)g->x * g->strip;

    for (int r = 0; r < g->s; r++) {
        long ai = (long)g->x * g->b + (long)g->z * g->s + r;
        long bi = (long)g->y * g->b + (long)g->x * g->s + r;
        for (int c = 0; c < g->b; c++) {
            as[(size_t)r * g->b + c] = a_val(ai, (long)g->y * g->b + c, m);
            bs[(size_t)r * g->b + c] = b_val(bi, (long)g->z * g->b + c, m);
        }
    }
}

static void local_product(const struct geom *g, const double *a, const double *b, double *c)
{
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->b, g->b, g->b, 1.0, a, g->b, b,
                g->b, 0.0, c, g->b);
}

/* ---- buffers ------------------------------------------------------------ */

/* Everything the multiply reads or writes remotely is doubled, indexed by
 * parity = multiply & 1; see run_dchan(). */
struct bufs {
    double *a[2], *b[2];  /* local blocks A(x,y), B(y,z): q strips each */
    double *cpart[2];     /* partial product A(x,y) B(y,z) */
    double *crecv[2];     /* q strips: strip t holds the partial of rank (x,t,z) */
    double *cown;         /* result: strip y of C(x,z) */
};

/* What other ranks write (the blocks and the partials received) comes
 * from dchan_alloc in dchan mode: under shm a put into it is one memcpy,
 * elsewhere a system call per put. ctx NULL: the heap (msg mode). */
static void alloc_bufs(dchan_ctx_t *ctx, const struct geom *g, struct bufs *bu)
{
    for (int p = 0; p < 2; p++) {
        bu->a[p] = app_buf_alloc(ctx, g->blk);
        bu->b[p] = app_buf_alloc(ctx, g->blk);
        bu->cpart[p] = app_xalloc(g->blk);
        bu->crecv[p] = app_buf_alloc(ctx, g->blk);
        memset(bu->crecv[p], 0, g->blk * sizeof(double));
    }
    bu->cown = app_xalloc(g->strip);
}

static void free_bufs(dchan_ctx_t *ctx, struct bufs *bu)
{
    for (int p = 0; p < 2; p++) {
        app_buf_free(ctx, bu->a[p]);
        app_buf_free(ctx, bu->b[p]);
        free(bu->cpart[p]);
        app_buf_free(ctx, bu->crecv[p]);
    }
    free(bu->cown);
}

/* ---- msg mode ----------------------------------------------------------- */

/* Line communicators, ranks ordered by their index along the line so that
 * the strips of an allgather land at their places in the block. */
static void split_lines(const struct geom *g, MPI_Comm line[NKINDS])
{
    MPI_Comm_split(MPI_COMM_WORLD, g->x * g->q + g->y, g->z, &line[KIND_A]);
    MPI_Comm_split(MPI_COMM_WORLD, g->y * g->q + g->z, g->x, &line[KIND_B]);
    MPI_Comm_split(MPI_COMM_WORLD, g->x * g->q + g->z, g->y, &line[KIND_C]);
}

/* Multiplies [first, end). */
static void run_msg(const struct geom *g, struct bufs *bu, MPI_Comm line[NKINDS], int first,
                    int end)
{
    for (int m = first; m < end; m++) {
        const int p = m & 1;

        fill_own(g, bu->a[p], bu->b[p], m);
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, bu->a[p], (int)g->strip, MPI_DOUBLE,
                      line[KIND_A]);
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, bu->b[p], (int)g->strip, MPI_DOUBLE,
                      line[KIND_B]);
        local_product(g, bu->a[p], bu->b[p], bu->cpart[p]);
        MPI_Reduce_scatter_block(bu->cpart[p], bu->cown, (int)g->strip, MPI_DOUBLE, MPI_SUM,
                                 line[KIND_C]);
    }
}

/* ---- dchan mode --------------------------------------------------------- */

struct channels {
    /* [kind][parity][t]: the channel with the rank at index t of the line */
    dchan_handle_t **rh[NKINDS][2];
    dchan_handle_t **sh[NKINDS][2];
    int arrived[NKINDS][2];
};

/* Where a strip from index t of a line of kind k lands, and what this rank
 * sends to index t. */
static double *recv_place(const struct geom *g, struct bufs *bu, int k, int p, int t)
{
    double *base = k == KIND_A ? bu->a[p] : k == KIND_B ? bu->b[p] : bu->crecv[p];
    return base + (size_t)t * g->strip;
}

static double *send_place(const struct geom *g, struct bufs *bu, int k, int p, int t)
{
    /* A and B: this rank's own strip, multicast to the whole line (one
     * buffer, q-1 channels); C: strip t of the partial product. */
    if (k == KIND_C)
        return bu->cpart[p] + (size_t)t * g->strip;
    return (k == KIND_A ? bu->a[p] : bu->b[p]) + (size_t)line_index(g, k) * g->strip;
}

static void setup_channels(dchan_ctx_t *ctx, const struct geom *g, struct bufs *bu,
                           struct channels *ch)
{
    const int q = g->q, n = NKINDS * 2 * q;
    dchan_wire_t *mine = calloc(n, sizeof *mine), *theirs = calloc(n, sizeof *theirs);
    MPI_Request *req = malloc(2 * n * sizeof *req);
    int nreq = 0, rc;

    if (!mine || !theirs || !req)
        app_die("out of memory");
    for (int k = 0; k < NKINDS; k++) {
        for (int p = 0; p < 2; p++) {
            ch->rh[k][p] = calloc(q, sizeof(dchan_handle_t *));
            ch->sh[k][p] = calloc(q, sizeof(dchan_handle_t *));
            if (!ch->rh[k][p] || !ch->sh[k][p])
                app_die("out of memory");
            ch->arrived[k][p] = 0;
            for (int t = 0; t < q; t++) {
                const int i = (k * 2 + p) * q + t, peer = line_peer(g, k, t);

                if (t == line_index(g, k))
                    continue;
                rc = dchan_create_handle(ctx, peer, recv_place(g, bu, k, p, t),
                                         g->strip * sizeof(double), SENTINEL_OOB, app_count_arrival,
                                         &ch->arrived[k][p], &ch->rh[k][p][t]);
                if (rc == DCHAN_SUCCESS)
                    rc = dchan_handle_export(ch->rh[k][p][t], &mine[i]);
                if (rc != DCHAN_SUCCESS)
                    app_die_dchan("dchan_create_handle", rc);
                /* Two ranks share at most one line, so kind and parity
                 * make the tag unique. */
                MPI_Isend(&mine[i], sizeof mine[i], MPI_BYTE, peer, k * 2 + p, MPI_COMM_WORLD,
                          &req[nreq++]);
                MPI_Irecv(&theirs[i], sizeof theirs[i], MPI_BYTE, peer, k * 2 + p,
                          MPI_COMM_WORLD, &req[nreq++]);
            }
        }
    }
    MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
    for (int k = 0; k < NKINDS; k++)
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < q; t++) {
                if (t == line_index(g, k))
                    continue;
                rc = dchan_assoc_local(ctx, &theirs[(k * 2 + p) * q + t],
                                       send_place(g, bu, k, p, t), g->strip * sizeof(double),
                                       &ch->sh[k][p][t]);
                if (rc != DCHAN_SUCCESS)
                    app_die_dchan("dchan_assoc_local", rc);
            }
    free(mine);
    free(theirs);
    free(req);
}

static void wait_all_puts(const struct channels *ch, int k, int p, int q)
{
    for (int t = 0; t < q; t++)
        if (ch->sh[k][p][t])
            app_wait_put_done(ch->sh[k][p][t]);
}

static void put_all(const struct channels *ch, int k, int p, int q)
{
    int rc;

    for (int t = 0; t < q; t++)
        if (ch->sh[k][p][t] && (rc = dchan_put(ch->sh[k][p][t])) != DCHAN_SUCCESS)
            app_die_dchan("dchan_put", rc);
}

static void rearm_all(struct channels *ch, int k, int p, int q)
{
    int rc;

    ch->arrived[k][p] = 0;
    for (int t = 0; t < q; t++)
        if (ch->rh[k][p][t] && (rc = dchan_ready(ch->rh[k][p][t])) != DCHAN_SUCCESS)
            app_die_dchan("dchan_ready", rc);
}

static void wait_arrivals(dchan_ctx_t *ctx, const volatile int *c1, const volatile int *c2,
                          int want)
{
    while (*c1 + (c2 ? *c2 : 0) < want) {
        int rc = dchan_wait(ctx, WAIT_TIMEOUT_MS);
        if (rc < 0)
            app_die_dchan("waiting for strips", rc);
        if (app_async_error)
            app_die_dchan("channel", app_async_error);
    }
}

/*
 * The dchan scheme. Every channel exists twice, parity 0 and 1, used by
 * even and odd multiplies, with its own receive place (A, B, C-receive
 * buffers are doubled) and its own send buffer. In multiply m (parity p)
 * a rank puts its A and B strips, waits for the 2(q-1) strips of its
 * peers, multiplies, re-arms its parity-p A and B channels, puts the strips
 * of its partial product, waits for the q-1 partials of its C line, sums,
 * and re-arms its parity-p C channels.
 *
 * One put per armed period, by structure: a peer S on a line puts into my
 * parity-p buffers again in multiply m+2. To get there S finished multiply
 * m+1, which needs my strip of the same kind (the line relation is
 * symmetric and S waits for every peer of the line), which I put only
 * after finishing multiply m, re-arms included.
 *
 * Send-buffer reuse: the A and B strips are rewritten in multiply m+2 and
 * the partial product overwritten by the dgemm of m+2; before that,
 * dchan_put_test confirms that the puts of multiply m completed locally.
 */
static void run_dchan(dchan_ctx_t *ctx, const struct geom *g, struct bufs *bu,
                      struct channels *ch, int first, int end)
{
    const int q = g->q;

    for (int m = first; m < end; m++) {
        const int p = m & 1;

        wait_all_puts(ch, KIND_A, p, q);
        wait_all_puts(ch, KIND_B, p, q);
        fill_own(g, bu->a[p], bu->b[p], m);
        put_all(ch, KIND_A, p, q);
        put_all(ch, KIND_B, p, q);
        wait_arrivals(ctx, &ch->arrived[KIND_A][p], &ch->arrived[KIND_B][p], 2 * (q - 1));

        wait_all_puts(ch, KIND_C, p, q);
        local_product(g, bu->a[p], bu->b[p], bu->cpart[p]);
        rearm_all(ch, KIND_A, p, q);
        rearm_all(ch, KIND_B, p, q);
        put_all(ch, KIND_C, p, q);
        wait_arrivals(ctx, &ch->arrived[KIND_C][p], NULL, q - 1);

        /* Sum the partials in the order of y, reading them where they
         * landed; the own one stays in cpart. */
        for (int t = 0; t < q; t++) {
            const double *src = t == g->y ? bu->cpart[p] + (size_t)g->y * g->strip
                                          : bu->crecv[p] + (size_t)t * g->strip;
            if (t == 0)
                memcpy(bu->cown, src, g->strip * sizeof(double));
            else
                for (size_t i = 0; i < g->strip; i++)
                    bu->cown[i] += src[i];
        }
        rearm_all(ch, KIND_C, p, q);
    }
}

static void teardown_channels(dchan_ctx_t *ctx, struct channels *ch, int q)
{
    /* Every put has arrived, since each receiver waited for all of them;
     * local completion may lag, and no handle may go while a peer could
     * still use it, hence the barrier. */
    for (int k = 0; k < NKINDS; k++)
        for (int p = 0; p < 2; p++)
            wait_all_puts(ch, k, p, q);
    app_barrier(ctx);
    for (int k = 0; k < NKINDS; k++)
        for (int p = 0; p < 2; p++) {
            for (int t = 0; t < q; t++) {
                if (ch->sh[k][p][t])
                    dchan_handle_destroy(ch->sh[k][p][t]);
                if (ch->rh[k][p][t])
                    dchan_handle_destroy(ch->rh[k][p][t]);
            }
            free(ch->sh[k][p]);
            free(ch->rh[k][p]);
        }
}

/* ---- verification ------------------------------------------------------- */

/* Gathers C on rank 0 and compares it with a serial product of the last
 * multiply's inputs. Exact equality is required (see a_val). */
static int verify(const struct geom *g, const struct bufs *bu, long n, int m, int nranks,
                  double *maxdiff_out)
{
    double *all = NULL, maxdiff = 0.0;
    int ok = 0;

    if (app_rank == 0)
        all = app_xalloc(g->strip * nranks);
    MPI_Gather(bu->cown, (int)g->strip, MPI_DOUBLE, all, (int)g->strip, MPI_DOUBLE, 0,
               MPI_COMM_WORLD);
    if (app_rank == 0) {
        double *a = app_xalloc((size_t)n * n), *b = app_xalloc((size_t)n * n), *c = app_xalloc((size_t)n * n);

        for (long i = 0; i < n; i++)
            for (long j = 0; j < n; j++) {
                a[i * n + j] = a_val(i, j, m);
                b[i * n + j] = b_val(i, j, m);
            }
        /* Plain loops, independent of the BLAS under test. */
        memset(c, 0, (size_t)n * n * sizeof *c);
        for (long i = 0; i < n; i++)
            for (long k = 0; k < n; k++) {
                const double aik = a[i * n + k];
                for (long j = 0; j < n; j++)
                    c[i * n + j] += aik * b[k * n + j];
            }
        for (int r = 0; r < nranks; r++) {
            const int rx = r / (g->q * g->q), ry = r / g->q % g->q, rz = r % g->q;
            const double *strip = all + (size_t)r * g->strip;

            for (int i = 0; i < g->s; i++)
                for (int j = 0; j < g->b; j++) {
                    long gi = (long)rx * g->b + (long)ry * g->s + i, gj = (long)rz * g->b + j;
                    double d = fabs(strip[(size_t)i * g->b + j] - c[gi * n + gj]);
                    if (!(d <= maxdiff)) /* also catches NaN */
                        maxdiff = d;
                }
        }
        ok = maxdiff == 0.0;
        free(a);
        free(b);
        free(c);
        free(all);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(&maxdiff, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    *maxdiff_out = maxdiff;
    return ok;
}

/* ---- command line ------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mpirun -np q^3 matmul3d [options]\n"
            "  --n N               matrix order, a multiple of q^2 (default 256)\n"
            "  --iters K           timed multiplies, after one untimed (default 4)\n"
            "  --mode msg|dchan    communication (default dchan):\n"
            "                      msg: MPI collectives on line sub-communicators\n"
            "                      (MPI_Allgather in place for A and B,\n"
            "                      MPI_Reduce_scatter_block for C);\n"
            "                      dchan: channels putting strips in place\n"
            "  --verify            compare with a serial product on rank 0 (exact: the\n"
            "                      inputs are small integers); exit 1 if it differs\n"
            "  --detect auto|sentinel|flag|event\n"
            "                      dchan arrival detection (default: DCHAN_DETECT, else auto)\n"
            "  --help              this text\n"
            "C = A x B by the 3D algorithm of Agarwal et al.: A replicated along z, B along\n"
            "x, partial products reduced along y; local products by BLAS dgemm (one\n"
            "thread per rank unless OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set).\n"
            "The last line on stdout is a RESULT line: time_s is the time of one\n"
            "multiply (slowest rank), gflops = 2 n^3 / time_s / 1e9.\n");
}

static int parse_args(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        { "n", required_argument, NULL, 'n' },      { "iters", required_argument, NULL, 'i' },
        { "mode", required_argument, NULL, 'm' },   { "verify", no_argument, NULL, 'v' },
        { "detect", required_argument, NULL, 'd' }, { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    int c;

    *o = (struct options){ .n = 256, .c = { .iters = 4, .mode = MODE_DCHAN, .detect = -1 } };
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *bad = NULL;
        char *end;
        long v;

        switch (c) {
        case 'n':
            v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > 1000000)
                bad = "--n wants a positive integer";
            else
                o->n = v;
            break;
        case 'h':
            if (app_rank == 0)
                usage(stdout);
            return 1;
        default:
            if (app_common_option(c, optarg, &o->c, &bad))
                break;
            if (app_rank == 0)
                fprintf(stderr, "matmul3d: %s: unknown option or missing argument (see --help)\n",
                        argv[optind - 1]);
            return -1;
        }
        if (bad) {
            if (app_rank == 0)
                fprintf(stderr, "matmul3d: %s\n", bad);
            return -1;
        }
    }
    if (optind < argc) {
        if (app_rank == 0)
            fprintf(stderr, "matmul3d: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    return 0;
}

static int make_geom(const struct options *o, int nranks, struct geom *g)
{
    int q = (int)lround(cbrt((double)nranks));

    if ((long)q * q * q != nranks) {
        if (app_rank == 0)
            fprintf(stderr, "matmul3d: needs q^3 ranks (1, 8, 27, 64, ...), not %d\n", nranks);
        return -1;
    }
    if (o->n % ((long)q * q)) {
        if (app_rank == 0)
            fprintf(stderr,
                    "matmul3d: --n %ld is not a multiple of q^2 = %d: on %d ranks each %ld-row "
                    "block is split into %d row strips\n",
                    o->n, q * q, nranks, o->n / q, q);
        return -1;
    }
    if (o->c.verify && o->n > 8192) {
        if (app_rank == 0)
            fprintf(stderr, "matmul3d: --verify builds the whole product on rank 0; --n %ld is "
                            "too large (at most 8192)\n", o->n);
        return -1;
    }
    g->q = q;
    g->x = app_rank / (q * q);
    g->y = app_rank / q % q;
    g->z = app_rank % q;
    g->b = (int)(o->n / q);
    g->s = g->b / q;
    g->blk = (size_t)g->b * g->b;
    g->strip = (size_t)g->s * g->b;
    if (g->strip > INT_MAX) {
        if (app_rank == 0)
            fprintf(stderr, "matmul3d: --n %ld makes strips too large for MPI counts\n", o->n);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;
    struct geom g;
    struct bufs bu;
    struct channels ch;
    MPI_Comm line[NKINDS];
    dchan_ctx_t *ctx = NULL;
    const char *provider = "mpi";
    int nranks, rc;

    app_name = "matmul3d";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &app_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    rc = parse_args(argc, argv, &o);
    if (rc == 0)
        rc = make_geom(&o, nranks, &g);
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    /* Ranks are the parallelism; BLAS threads on top would oversubscribe. */
    if (!getenv("OPENBLAS_NUM_THREADS") && !getenv("OMP_NUM_THREADS"))
        openblas_set_num_threads(1);
#endif
    if (o.c.mode == MODE_DCHAN) {
        ctx = app_dchan_init(&o.c);
        provider = dchan_provider_name(ctx);
        alloc_bufs(ctx, &g, &bu);
        setup_channels(ctx, &g, &bu, &ch);
    } else {
        alloc_bufs(NULL, &g, &bu);
        split_lines(&g, line);
    }
    if (app_rank == 0)
        fprintf(stderr, "matmul3d: n %ld on %d ranks (q %d, blocks %d, strips %d rows), "
                "%d+1 multiplies, mode %s, provider %s\n",
                o.n, nranks, g.q, g.b, g.s, o.c.iters, o.c.mode == MODE_MSG ? "msg" : "dchan",
                provider);

    /* One extra multiply first, not timed: it pays for first contact
     * (connections, BLAS start-up, first touch) in either mode. */
    double elapsed = 0.0, slowest;
    for (int pass = 0; pass < 2; pass++) {
        const int first = pass ? 1 : 0, end = pass ? o.c.iters + 1 : 1;
        if (pass)
            app_barrier(ctx); /* NULL outside dchan mode: MPI_Barrier */
        double t0 = MPI_Wtime();
        if (o.c.mode == MODE_MSG)
            run_msg(&g, &bu, line, first, end);
        else
            run_dchan(ctx, &g, &bu, &ch, first, end);
        elapsed = MPI_Wtime() - t0;
    }
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    const char *verified = "skipped";
    int failed = 0;
    if (o.c.verify) {
        double maxdiff;
        int ok = verify(&g, &bu, o.n, o.c.iters, nranks, &maxdiff);

        verified = ok ? "yes" : "no";
        failed = !ok;
        if (app_rank == 0)
            fprintf(stderr, "matmul3d: largest difference from the serial product: %.3e (%s)\n",
                    maxdiff, ok ? "verified" : "NOT verified");
    }
    if (app_rank == 0) {
        double t = slowest / o.c.iters;
        printf("RESULT app=matmul3d provider=%s mode=%s ranks=%d n=%ld time_s=%.6e gflops=%.3f "
               "verified=%s\n",
               provider, o.c.mode == MODE_MSG ? "msg" : "dchan", nranks, o.n, t,
               2.0 * o.n * o.n * o.n / t / 1e9, verified);
        fflush(stdout);
    }

    if (ctx) {
        teardown_channels(ctx, &ch, g.q);
        free_bufs(ctx, &bu); /* before the context: dchan_alloc memory goes with it */
        if ((rc = dchan_finalize(ctx)) != DCHAN_SUCCESS)
            fprintf(stderr, "matmul3d: rank %d: dchan_finalize: %s\n", app_rank, dchan_strerror(rc));
    } else {
        for (int k = 0; k < NKINDS; k++)
            MPI_Comm_free(&line[k]);
        free_bufs(NULL, &bu);
    }
    MPI_Finalize();
    return failed;
}
