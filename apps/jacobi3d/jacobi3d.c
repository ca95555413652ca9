/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * jacobi3d: 7-point Jacobi sweeps for the Laplace equation on an
 * NX x NY x NZ grid of unknowns with fixed values on the surrounding
 * boundary layer, split into PX x PY x PZ blocks, one per MPI rank.
 *
 * Every iteration each rank sends its six boundary planes ("faces") to the
 * neighbours and sweeps its block. Both modes use the same code except for
 * the transport, so that the comparison is fair:
 *   - faces are packed with the same code into contiguous buffers;
 *   - received faces land in per-face buffers that the sweep reads in place
 *     as ghost values: there is no unpack copy in either mode;
 *   - msg:   faces packed into pack buffers (two per face, used on alternate
 *            iterations), MPI_Isend of those, MPI_Irecv pre-posted one
 *            iteration ahead into two receive buffers per face;
 *   - dchan: one credited channel of depth 2 per face and neighbour, created
 *            once; the sender packs its face straight into the neighbour's
 *            slot where the provider maps it (dchan_put_ptr), then one
 *            dchan_put; the sweep reads the face in the slot (dchan_slot),
 *            and dchan_ready hands the slot back. See run_dchan().
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dchan.h>

#include "app.h"

enum { XLO, XHI, YLO, YHI, ZLO, ZHI, NFACES };

/* Faces are numbered so that f ^ 1 is the opposite face. */
#define OPPOSITE(f) ((f) ^ 1)
/* Out-of-band pattern for SENTINEL detection: a signalling NaN, which no
 * arithmetic on finite values ever produces, so no face can end with it. */
#define SENTINEL_OOB UINT64_C(0xfff4dc4a6e5e0bbb)
/* A face that does not arrive within this time means a broken peer; so
 * does a slot that is not handed back (no credit) within it. */
#define WAIT_TIMEOUT_MS 120000
/* Slots of each dchan receive channel: the neighbour may put the face of
 * the next iteration while this rank still sweeps with the current one. */
#define DEPTH 2
/* The parallel and serial runs call the same sweep code, which adds the
 * same values in the same order (no multiply-add to contract), so they
 * agree bit for bit: verification demands it. A stale or misplaced face
 * shows up as a difference of order 1e-3 or more; even a single 1e-9
 * perturbation early on would still differ by ~1e-13 at the end. */
#define VERIFY_TOL 0.0

struct options {
    int grid[3];
    int procs[3];   /* 0: let MPI_Dims_create choose */
    struct app_common c; /* --iters, --mode, --verify, --detect */
};

/* One rank's part of the grid. */
struct block {
    int n[3];       /* unknowns along x, y, z */
    int off[3];     /* global index of the block's first unknown */
    int coord[3];   /* position in the process grid */
    int nb[NFACES]; /* neighbour rank across each face, -1 on the boundary */
    size_t fsize[NFACES]; /* doubles in each face */
};


/* Fatal error after the ranks went their own ways: stop the whole job. */
/* Fixed value on the boundary layer; global indices run from -1 to N. */
static double boundary_value(const int grid[3], long gi, long gj, long gk)
{
    double x = (gi + 1.0) / (grid[0] + 1.0);
    double y = (gj + 1.0) / (grid[1] + 1.0);
    double z = (gk + 1.0) / (grid[2] + 1.0);

    return 1.0 + x * (1.0 - y) + z * z + 0.5 * sin(3.0 * x * z);
}

/* Part c of n items split into p parts, the first n % p one item larger. */
static void split(int n, int p, int c, int *len, int *off)
{
    *len = n / p + (c < n % p);
    *off = c * (n / p) + (c < n % p ? c : n % p);
}

static int rank_of(const int procs[3], int cx, int cy, int cz)
{
    return (cx * procs[1] + cy) * procs[2] + cz;
}

static void block_init(struct block *b, const int grid[3], const int procs[3], int rank)
{
    b->coord[2] = rank % procs[2];
    b->coord[1] = rank / procs[2] % procs[1];
    b->coord[0] = rank / procs[2] / procs[1];
    for (int d = 0; d < 3; d++) {
        split(grid[d], procs[d], b->coord[d], &b->n[d], &b->off[d]);
        int lo = b->coord[d] - 1, hi = b->coord[d] + 1, c[3];

        memcpy(c, b->coord, sizeof c);
        c[d] = lo;
        b->nb[2 * d] = lo >= 0 ? rank_of(procs, c[0], c[1], c[2]) : -1;
        c[d] = hi;
        b->nb[2 * d + 1] = hi < procs[d] ? rank_of(procs, c[0], c[1], c[2]) : -1;
    }
    b->fsize[XLO] = b->fsize[XHI] = (size_t)b->n[1] * b->n[2];
    b->fsize[YLO] = b->fsize[YHI] = (size_t)b->n[0] * b->n[2];
    b->fsize[ZLO] = b->fsize[ZHI] = (size_t)b->n[0] * b->n[1];
}

/*
 * Face layouts, chosen so that the sweep reads whole rows along z:
 * x faces are [j][k], y faces [i][k], z faces [i][j].
 */
static void fill_boundary_face(const struct block *b, const int grid[3], int f, double *face)
{
    const int nx = b->n[0], ny = b->n[1], nz = b->n[2];
    const long ox = b->off[0], oy = b->off[1], oz = b->off[2];

    switch (f) {
    case XLO:
    case XHI: {
        long gi = f == XLO ? -1 : grid[0];
        for (int j = 0; j < ny; j++)
            for (int k = 0; k < nz; k++)
                face[(size_t)j * nz + k] = boundary_value(grid, gi, oy + j, oz + k);
        break;
    }
    case YLO:
    case YHI: {
        long gj = f == YLO ? -1 : grid[1];
        for (int i = 0; i < nx; i++)
            for (int k = 0; k < nz; k++)
                face[(size_t)i * nz + k] = boundary_value(grid, ox + i, gj, oz + k);
        break;
    }
    default: {
        long gk = f == ZLO ? -1 : grid[2];
        for (int i = 0; i < nx; i++)
            for (int j = 0; j < ny; j++)
                face[(size_t)i * ny + j] = boundary_value(grid, ox + i, oy + j, gk);
        break;
    }
    }
}

/* Copy the block's plane next to face f into the contiguous buffer out,
 * in the layout of the neighbour's opposite face. */
static void pack_face(const struct block *b, const double *u, int f, double *out)
{
    const int nx = b->n[0], ny = b->n[1], nz = b->n[2];
    const size_t plane = (size_t)ny * nz;

    switch (f) {
    case XLO:
    case XHI:
        memcpy(out, u + (f == XLO ? 0 : (size_t)(nx - 1) * plane), plane * sizeof *u);
        break;
    case YLO:
    case YHI: {
        const int j = f == YLO ? 0 : ny - 1;
        for (int i = 0; i < nx; i++)
            memcpy(out + (size_t)i * nz, u + i * plane + (size_t)j * nz, nz * sizeof *u);
        break;
    }
    default: {
        const int k = f == ZLO ? 0 : nz - 1;
        for (int i = 0; i < nx; i++)
            for (int j = 0; j < ny; j++)
                out[(size_t)i * ny + j] = u[i * plane + (size_t)j * nz + k];
        break;
    }
    }
}

/*
 * One Jacobi sweep: v = mean of the six neighbours of u. Values outside the
 * block come from face[] (a neighbour's face as received, or the fixed
 * boundary). Returns the sum of the squared updates when want_res is set.
 * The serial reference runs this same function on the whole grid, so both
 * add the same values in the same order.
 */
static double sweep(const struct block *b, const double *u, double *v,
                    const double *const face[NFACES], int want_res)
{
    const int nx = b->n[0], ny = b->n[1], nz = b->n[2];
    const size_t plane = (size_t)ny * nz;
    const double sixth = 1.0 / 6.0;
    double res = 0.0;

    for (int i = 0; i < nx; i++) {
        for (int j = 0; j < ny; j++) {
            const double *c = u + i * plane + (size_t)j * nz;
            const double *xm = i > 0 ? c - plane : face[XLO] + (size_t)j * nz;
            const double *xp = i < nx - 1 ? c + plane : face[XHI] + (size_t)j * nz;
            const double *ym = j > 0 ? c - nz : face[YLO] + (size_t)i * nz;
            const double *yp = j < ny - 1 ? c + nz : face[YHI] + (size_t)i * nz;
            const double zm = face[ZLO][(size_t)i * ny + j];
            const double zp = face[ZHI][(size_t)i * ny + j];
            double *o = v + i * plane + (size_t)j * nz;

            /* The two ends of the row read the z faces; the middle is a
             * branch-free loop the compiler can vectorise. */
            if (nz == 1) {
                o[0] = ((xm[0] + xp[0]) + (ym[0] + yp[0]) + (zm + zp)) * sixth;
            } else {
                o[0] = ((xm[0] + xp[0]) + (ym[0] + yp[0]) + (zm + c[1])) * sixth;
                for (int k = 1; k < nz - 1; k++)
                    o[k] = ((xm[k] + xp[k]) + (ym[k] + yp[k]) + (c[k - 1] + c[k + 1])) * sixth;
                o[nz - 1] = ((xm[nz - 1] + xp[nz - 1]) + (ym[nz - 1] + yp[nz - 1]) +
                             (c[nz - 2] + zp)) * sixth;
            }
            if (want_res)
                for (int k = 0; k < nz; k++)
                    res += (o[k] - c[k]) * (o[k] - c[k]);
        }
    }
    return res;
}

/* ---- communication -------------------------------------------------------- */

/*
 * Buffers of one rank. In msg mode everything that carries faces is
 * doubled, index [parity][face], parity = iteration & 1 (see run_msg());
 * dchan mode keeps its buffers with its channels (struct channels).
 */
struct comm {
    double *pack[2][NFACES];  /* msg: outgoing faces, contiguous */
    double *recv[2][NFACES];  /* msg: incoming faces, read by the sweep in place */
    double *bface[NFACES];    /* fixed boundary values, where nb[f] < 0 */
    MPI_Request rreq[2][NFACES], sreq[2][NFACES]; /* msg mode */
};


static void faces_of(const struct block *b, const struct comm *cm, int parity,
                     const double *face[NFACES])
{
    for (int f = 0; f < NFACES; f++)
        face[f] = b->nb[f] >= 0 ? cm->recv[parity][f] : cm->bface[f];
}

/* Iterations [first, end) of iters; returns the squared update of the
 * last iteration (0 when it is not among these). */
static double run_msg(const struct block *b, struct comm *cm, double **u, double **v, int first,
                      int end, int iters)
{
    MPI_Request (*rreq)[NFACES] = cm->rreq, (*sreq)[NFACES] = cm->sreq;
    double res = 0.0;

    /* Tag = the sender's face; the receiver expects its opposite. MPI's
     * non-overtaking rule keeps consecutive iterations in order. */
    if (first == 0)
        for (int f = 0; f < NFACES; f++)
            if (b->nb[f] >= 0)
                MPI_Irecv(cm->recv[0][f], (int)b->fsize[f], MPI_DOUBLE, b->nb[f], OPPOSITE(f),
                          MPI_COMM_WORLD, &rreq[0][f]);
    for (int it = first; it < end; it++) {
        const int p = it & 1;
        const double *face[NFACES];

        /* The sends of iteration it-2 read pack[p]; they must be done. */
        MPI_Waitall(NFACES, sreq[p], MPI_STATUSES_IGNORE);
        for (int f = 0; f < NFACES; f++) {
            if (b->nb[f] < 0)
                continue;
            pack_face(b, *u, f, cm->pack[p][f]);
            MPI_Isend(cm->pack[p][f], (int)b->fsize[f], MPI_DOUBLE, b->nb[f], f, MPI_COMM_WORLD,
                      &sreq[p][f]);
        }
        /* Pre-post the next iteration's receives: recv[1-p] was consumed by
         * the sweep of iteration it-1. */
        if (it + 1 < iters)
            for (int f = 0; f < NFACES; f++)
                if (b->nb[f] >= 0)
                    MPI_Irecv(cm->recv[1 - p][f], (int)b->fsize[f], MPI_DOUBLE, b->nb[f],
                              OPPOSITE(f), MPI_COMM_WORLD, &rreq[1 - p][f]);
        MPI_Waitall(NFACES, rreq[p], MPI_STATUSES_IGNORE);
        faces_of(b, cm, p, face);
        res = sweep(b, *u, *v, face, it == iters - 1);
        double *t = *u;
        *u = *v;
        *v = t;
    }
    if (end == iters)
        MPI_Waitall(2 * NFACES, &sreq[0][0], MPI_STATUSES_IGNORE);
    return res;
}

/*
 * dchan mode: per face with a neighbour, one receive channel (the
 * neighbour's face of every iteration lands in one of its DEPTH slots) and
 * one send channel (this rank's face, into the neighbour's receive channel
 * for the opposite face).
 */
struct channels {
    dchan_handle_t *rh[NFACES]; /* receive: neighbour across f -> slots[f] */
    dchan_handle_t *sh[NFACES]; /* send: -> the neighbour's slots[opposite] */
    double *slots[NFACES];      /* DEPTH slots of fsize[f] doubles each */
    double *sbuf[NFACES];       /* send buffer: packed into where dchan_put_ptr
                                 * cannot give the neighbour's slot itself */
    int arrived[NFACES];        /* faces arrived on rh[f] since creation */
};

/* Creates the channels and their buffers. Wires travel by MPI, once. */
static void setup_channels(dchan_ctx_t *ctx, const struct block *b, struct channels *ch)
{
    dchan_wire_t mine[NFACES], theirs[NFACES];
    dchan_handle_attr_t hattr;
    MPI_Request req[2 * NFACES];
    int nreq = 0, rc;

    memset(ch, 0, sizeof *ch);
    dchan_handle_attr_init(&hattr);
    hattr.credit = 1;
    hattr.depth = DEPTH;
    for (int f = 0; f < NFACES; f++) {
        if (b->nb[f] < 0)
            continue;
        /* From dchan_alloc: under shm the neighbour maps the slots and packs
         * its face straight into them. */
        ch->slots[f] = app_buf_alloc(ctx, DEPTH * b->fsize[f]);
        ch->sbuf[f] = app_buf_alloc(ctx, b->fsize[f]);
        rc = dchan_create_handle_attr(ctx, b->nb[f], ch->slots[f], b->fsize[f] * sizeof(double),
                                      SENTINEL_OOB, app_count_arrival, &ch->arrived[f], &hattr,
                                      &ch->rh[f]);
        if (rc == DCHAN_ERR_UNSUPPORTED)
            app_die("dchan_create_handle_attr: the provider serving a neighbour offers no "
                    "credited channels (credit 1, depth 2), which dchan mode needs");
        if (rc == DCHAN_SUCCESS)
            rc = dchan_handle_export(ch->rh[f], &mine[f]);
        if (rc != DCHAN_SUCCESS)
            app_die_dchan("dchan_create_handle_attr", rc);
        MPI_Isend(&mine[f], sizeof mine[f], MPI_BYTE, b->nb[f], f, MPI_COMM_WORLD, &req[nreq++]);
        MPI_Irecv(&theirs[f], sizeof theirs[f], MPI_BYTE, b->nb[f], OPPOSITE(f), MPI_COMM_WORLD,
                  &req[nreq++]);
    }
    MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
    for (int f = 0; f < NFACES; f++) {
        if (b->nb[f] < 0)
            continue;
        rc = dchan_assoc_local(ctx, &theirs[f], ch->sbuf[f], b->fsize[f] * sizeof(double),
                               &ch->sh[f]);
        if (rc != DCHAN_SUCCESS)
            app_die_dchan("dchan_assoc_local", rc);
    }
}

/* Dies on an error from dchan_progress/dchan_wait or one reported on a
 * channel (app_on_error). */
static void check_progress(int rc, const char *what)
{
    if (rc < 0)
        app_die_dchan(what, rc);
    if (app_async_error)
        app_die_dchan("channel", app_async_error);
}

/* Where to pack the next face on send channel sh: the neighbour's slot
 * itself where it is mapped here (shm with the slots from dchan_alloc, or
 * self; never under SENTINEL detection, whose tail written in place would
 * announce the face early), else sh's send buffer, which dchan_put then
 * copies into the slot. Without credit (the neighbour has not handed the
 * slot back yet) this drives progress until the credit comes; see
 * run_dchan(). */
static double *face_target(dchan_ctx_t *ctx, dchan_handle_t *sh)
{
    double deadline = 0.0;
    unsigned spins = 0;
    void *p;
    int rc;

    while ((rc = dchan_put_ptr(sh, &p)) == DCHAN_ERR_AGAIN) {
        check_progress(dchan_progress(ctx), "waiting for credit");
        if (++spins < 64)
            continue;
        /* Then give the core away: with more ranks than cores, the
         * neighbour that owes the credit needs it. */
        if (spins == 64)
            deadline = MPI_Wtime() + WAIT_TIMEOUT_MS / 1000.0;
        else if (MPI_Wtime() > deadline)
            app_die("waiting for credit: a neighbour did not hand back its slot");
        sched_yield();
    }
    if (rc != DCHAN_SUCCESS)
        app_die_dchan("dchan_put_ptr", rc);
    return p;
}

/* Whether a face of iteration it (counted from 0 since the channels were
 * created) is still missing. */
static int faces_missing(const struct channels *ch, int it)
{
    for (int f = 0; f < NFACES; f++)
        if (ch->rh[f] && ch->arrived[f] <= it)
            return 1;
    return 0;
}

/*
 * The dchan scheme. Each face and neighbour has one credited channel of
 * depth 2: the receiver's buffer holds two slots, the n-th put lands in
 * slot n mod 2, and the sender may put only into a slot that the receiver
 * handed back (dchan_ready returns its credit). In iteration it a rank
 *   - packs each face straight into where dchan_put_ptr points (the
 *     neighbour's slot for iteration it where it is mapped here, else the
 *     send buffer) and dchan_puts it;
 *   - waits until every neighbour's face of iteration it arrived (per-face
 *     counts: a neighbour may already have put its face of iteration it+1
 *     into the other slot, while another's face of iteration it is still
 *     on the way);
 *   - sweeps, reading each face in its slot (dchan_slot: the oldest one
 *     not handed back, here the one of iteration it);
 *   - hands the slots back (dchan_ready).
 *
 * Correctness no longer rests on the solver's data dependence: the library
 * enforces the credit, so a put never overwrites a slot the receiver still
 * reads. The credit almost never makes a rank wait: the slot of iteration it was last used in
 * iteration it-2, and the neighbour handed it back before it put its face
 * of iteration it-1, which this rank needed to finish iteration it-1. When
 * dchan_put_ptr still answers DCHAN_ERR_AGAIN (a credit written by the
 * neighbour's transport but not landed yet), face_target drives progress
 * until it lands. Two slots let a neighbour put its next face while this
 * rank still sweeps with the current one; with one slot it would wait for
 * that sweep.
 *
 * The send buffer is only rewritten when dchan_put_ptr returns it, which
 * it does once the previous put from it completed locally.
 */
static double run_dchan(dchan_ctx_t *ctx, const struct block *b, struct comm *cm,
                        struct channels *ch, double **u, double **v, int first, int end,
                        int iters)
{
    double res = 0.0;
    int rc;

    for (int it = first; it < end; it++) {
        const double *face[NFACES];

        for (int f = 0; f < NFACES; f++) {
            if (!ch->sh[f])
                continue;
            pack_face(b, *u, f, face_target(ctx, ch->sh[f]));
            if ((rc = dchan_put(ch->sh[f])) != DCHAN_SUCCESS)
                app_die_dchan("dchan_put", rc);
        }
        /* Callbacks (app_count_arrival) run only inside our dchan_wait and
         * dchan_progress calls. */
        while (faces_missing(ch, it))
            check_progress(dchan_wait(ctx, WAIT_TIMEOUT_MS), "waiting for neighbour faces");
        for (int f = 0; f < NFACES; f++) {
            void *slot;

            if (!ch->rh[f]) {
                face[f] = cm->bface[f];
                continue;
            }
            if ((rc = dchan_slot(ch->rh[f], &slot)) != DCHAN_SUCCESS)
                app_die_dchan("dchan_slot", rc);
            face[f] = slot;
        }
        res = sweep(b, *u, *v, face, it == iters - 1);
        /* Done with the slots of iteration it: hand them back. */
        for (int f = 0; f < NFACES; f++)
            if (ch->rh[f] && (rc = dchan_ready(ch->rh[f])) != DCHAN_SUCCESS)
                app_die_dchan("dchan_ready", rc);
        double *t = *u;
        *u = *v;
        *v = t;
    }
    return res;
}

static void teardown_channels(dchan_ctx_t *ctx, struct channels *ch)
{
    /* Every put has arrived (each receiver waited for all of them), but the
     * senders' local completion may lag; then no handle or buffer may go
     * while a neighbour could still touch it, hence the barrier. */
    for (int f = 0; f < NFACES; f++)
        if (ch->sh[f])
            app_wait_put_done(ch->sh[f]);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int f = 0; f < NFACES; f++) {
        if (ch->sh[f])
            dchan_handle_destroy(ch->sh[f]);
        if (ch->rh[f])
            dchan_handle_destroy(ch->rh[f]);
        if (ch->sbuf[f])
            app_buf_free(ctx, ch->sbuf[f]);
        if (ch->slots[f])
            app_buf_free(ctx, ch->slots[f]);
    }
}

/* ---- verification --------------------------------------------------------- */

/* Gathers the blocks on rank 0 and compares them with a serial run of the
 * same problem. Returns 1 if verified (on every rank), 0 if not. */
static int verify(const struct options *o, const struct block *b, const double *u,
                  int nranks, double *maxdiff_out)
{
    const size_t total = (size_t)o->grid[0] * o->grid[1] * o->grid[2];
    const size_t local = (size_t)b->n[0] * b->n[1] * b->n[2];
    int *counts = NULL, *displs = NULL, ok = 0;
    double *all = NULL, maxdiff = 0.0;

    if (app_rank == 0) {
        counts = malloc(nranks * sizeof *counts);
        displs = malloc(nranks * sizeof *displs);
        all = app_xalloc(total);
        if (!counts || !displs)
            app_die("out of memory");
        size_t at = 0;
        for (int r = 0; r < nranks; r++) {
            struct block rb;
            block_init(&rb, o->grid, o->procs, r);
            counts[r] = rb.n[0] * rb.n[1] * rb.n[2];
            displs[r] = (int)at;
            at += counts[r];
        }
    }
    MPI_Gatherv(u, (int)local, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD);

    if (app_rank == 0) {
        /* The serial reference: one block covering the whole grid. */
        struct block g;
        double *s = app_xalloc(total), *t = app_xalloc(total), *bface[NFACES];
        const double *face[NFACES];
        int one[3] = { 1, 1, 1 };

        block_init(&g, o->grid, one, 0);
        for (int f = 0; f < NFACES; f++) {
            bface[f] = app_xalloc(g.fsize[f]);
            fill_boundary_face(&g, o->grid, f, bface[f]);
            face[f] = bface[f];
        }
        memset(s, 0, total * sizeof *s);
        for (int it = 0; it < o->c.iters; it++) {
            sweep(&g, s, t, face, 0);
            double *x = s;
            s = t;
            t = x;
        }
        for (int r = 0; r < nranks; r++) {
            struct block rb;
            const double *blk = all + displs[r];

            block_init(&rb, o->grid, o->procs, r);
            for (int i = 0; i < rb.n[0]; i++)
                for (int j = 0; j < rb.n[1]; j++)
                    for (int k = 0; k < rb.n[2]; k++) {
                        size_t gi = ((size_t)(rb.off[0] + i) * o->grid[1] + rb.off[1] + j) *
                                        o->grid[2] + rb.off[2] + k;
                        double d = fabs(blk[((size_t)i * rb.n[1] + j) * rb.n[2] + k] - s[gi]);
                        /* !(d <= maxdiff) also catches NaN */
                        if (!(d <= maxdiff))
                            maxdiff = d;
                    }
        }
        ok = maxdiff <= VERIFY_TOL;
        for (int f = 0; f < NFACES; f++)
            free(bface[f]);
        free(s);
        free(t);
        free(all);
        free(counts);
        free(displs);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(&maxdiff, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    *maxdiff_out = maxdiff;
    return ok;
}

/* ---- command line --------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mpirun -np P jacobi3d [options]\n"
            "  --grid NX,NY,NZ     unknowns along x, y, z (default 64,64,64)\n"
            "  --procs PX,PY,PZ    process grid, PX*PY*PZ = P (default: MPI_Dims_create)\n"
            "  --iters N           Jacobi iterations (default 100)\n"
            "  --mode msg|dchan    face exchange: MPI_Isend/MPI_Irecv or dchan channels\n"
            "                      (default dchan)\n"
            "  --verify            compare with a serial run on rank 0 (gathered grid); the\n"
            "                      results must agree exactly; exit 1 if they do not\n"
            "  --detect auto|sentinel|flag|event\n"
            "                      dchan arrival detection (default: DCHAN_DETECT, else auto)\n"
            "  --help              this text\n"
            "Solves the Laplace equation with fixed boundary values by Jacobi sweeps,\n"
            "starting from zero. The last line on stdout is a RESULT line: iter_time_s is\n"
            "the mean time of one iteration on the slowest rank (the first iteration,\n"
            "which pays for first contact, is not timed); residual is the 2-norm of the\n"
            "last iteration's update over the whole grid, sqrt(sum (u_new - u_old)^2).\n");
}

/* "A,B,C" with three positive ints; returns 0 on success. */
static int parse_triple(const char *s, int out[3])
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

/* Returns 0 to run, 1 for --help, -1 for an error (message printed on rank 0). */
static int parse_args(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        { "grid", required_argument, NULL, 'g' },  { "procs", required_argument, NULL, 'p' },
        { "iters", required_argument, NULL, 'i' }, { "mode", required_argument, NULL, 'm' },
        { "verify", no_argument, NULL, 'v' },      { "detect", required_argument, NULL, 'd' },
        { "help", no_argument, NULL, 'h' },        { NULL, 0, NULL, 0 }
    };
    int c;

    *o = (struct options){ .grid = { 64, 64, 64 },
                           .c = { .iters = 100, .mode = MODE_DCHAN, .detect = -1 } };
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *bad = NULL;

        switch (c) {
        case 'g':
            if (parse_triple(optarg, o->grid))
                bad = "--grid wants NX,NY,NZ, three positive integers";
            break;
        case 'p':
            if (parse_triple(optarg, o->procs))
                bad = "--procs wants PX,PY,PZ, three positive integers";
            break;
        case 'h':
            if (app_rank == 0)
                usage(stdout);
            return 1;
        default:
            if (app_common_option(c, optarg, &o->c, &bad))
                break;
            bad = "unknown option or missing argument (see --help)";
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d: %s: %s\n", argv[optind - 1], bad);
            return -1;
        }
        if (bad) {
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d: %s\n", bad);
            return -1;
        }
    }
    if (optind < argc) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    return 0;
}

static int check_decomposition(struct options *o, int nranks)
{
    if (o->procs[0] == 0)
        MPI_Dims_create(nranks, 3, o->procs);
    if ((long long)o->procs[0] * o->procs[1] * o->procs[2] != nranks) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d: --procs %d,%d,%d needs %lld ranks, but the job has %d\n",
                    o->procs[0], o->procs[1], o->procs[2],
                    (long long)o->procs[0] * o->procs[1] * o->procs[2], nranks);
        return -1;
    }
    for (int d = 0; d < 3; d++) {
        if (o->grid[d] < o->procs[d]) {
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d: grid %d along %c cannot be split over %d ranks\n",
                        o->grid[d], "xyz"[d], o->procs[d]);
            return -1;
        }
    }
    if (o->c.verify && (double)o->grid[0] * o->grid[1] * o->grid[2] > INT_MAX) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d: --verify gathers the grid on rank 0; %d,%d,%d is too large\n",
                    o->grid[0], o->grid[1], o->grid[2]);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;
    struct block b;
    struct comm cm;
    struct channels ch;
    dchan_ctx_t *ctx = NULL;
    const char *provider = "mpi";
    double elapsed = 0.0;
    int nranks, rc;

    app_name = "jacobi3d";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &app_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    /* Every rank parses the same arguments and reaches the same verdict. */
    rc = parse_args(argc, argv, &o);
    if (rc == 0)
        rc = check_decomposition(&o, nranks);
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }

    block_init(&b, o.grid, o.procs, app_rank);
    memset(&cm, 0, sizeof cm);
    /* dchan mode: the context first; setup_channels() takes the faces'
     * buffers from it (dchan_alloc), so that neighbours on the host write
     * them directly. */
    if (o.c.mode == MODE_DCHAN) {
        ctx = app_dchan_init(&o.c);
        provider = dchan_provider_name(ctx);
    }
    for (int f = 0; f < NFACES; f++) {
        if (b.nb[f] >= 0) {
            if (o.c.mode == MODE_MSG)
                for (int p = 0; p < 2; p++) {
                    cm.pack[p][f] = app_buf_alloc(ctx, b.fsize[f]);
                    cm.recv[p][f] = app_buf_alloc(ctx, b.fsize[f]);
                }
        } else {
            cm.bface[f] = app_xalloc(b.fsize[f]);
            fill_boundary_face(&b, o.grid, f, cm.bface[f]);
        }
    }
    for (int p = 0; p < 2; p++)
        for (int f = 0; f < NFACES; f++)
            cm.rreq[p][f] = cm.sreq[p][f] = MPI_REQUEST_NULL;
    const size_t local = (size_t)b.n[0] * b.n[1] * b.n[2];
    double *u = app_xalloc(local), *v = app_xalloc(local);
    memset(u, 0, local * sizeof *u);
    memset(v, 0, local * sizeof *v);

    if (o.c.mode == MODE_DCHAN)
        setup_channels(ctx, &b, &ch);
    if (app_rank == 0) {
        char how[128] = "";
        if (o.c.mode == MODE_DCHAN) {
            int d = -1;
            for (int f = 0; f < NFACES && d < 0; f++)
                if (ch.rh[f])
                    d = dchan_handle_detect(ch.rh[f]);
            snprintf(how, sizeof how, ", provider %s, detection %s", provider,
                     d >= 0 ? app_detect_name(d) : "none (no neighbours)");
        }
        /* One write, so that the line stays whole in mpirun's output. */
        fprintf(stderr, "jacobi3d: grid %d,%d,%d on %d ranks (%d,%d,%d), %d iterations, mode %s%s\n",
                o.grid[0], o.grid[1], o.grid[2], nranks, o.procs[0], o.procs[1], o.procs[2],
                o.c.iters, o.c.mode == MODE_MSG ? "msg" : "dchan", how);
    }

    /* Iteration 0 is not timed when there are more: it pays for first
     * contact (connections, first touch of buffers) in either mode. */
    const int untimed = o.c.iters > 1;
    double res = 0.0;
    for (int pass = !untimed; pass < 2; pass++) {
        const int first = pass ? untimed : 0, end = pass ? o.c.iters : 1;
        if (pass)
            MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        res = o.c.mode == MODE_MSG ? run_msg(&b, &cm, &u, &v, first, end, o.c.iters)
                                 : run_dchan(ctx, &b, &cm, &ch, &u, &v, first, end, o.c.iters);
        elapsed = MPI_Wtime() - t0;
    }
    double slowest, sum_res;

    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&res, &sum_res, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    const char *verified = "skipped";
    double maxdiff = 0.0;
    int failed = 0;
    if (o.c.verify) {
        int ok = verify(&o, &b, u, nranks, &maxdiff);
        verified = ok ? "yes" : "no";
        failed = !ok;
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d: largest difference from the serial run: %.3e (%s)\n",
                    maxdiff, ok ? "verified" : "NOT verified");
    }
    if (app_rank == 0) {
        printf("RESULT app=jacobi3d provider=%s mode=%s ranks=%d grid=%d,%d,%d procs=%d,%d,%d "
               "iters=%d iter_time_s=%.6e residual=%.6e verified=%s\n",
               provider, o.c.mode == MODE_MSG ? "msg" : "dchan", nranks, o.grid[0], o.grid[1],
               o.grid[2], o.procs[0], o.procs[1], o.procs[2], o.c.iters, slowest / (o.c.iters - untimed),
               sqrt(sum_res), verified);
        fflush(stdout);
    }

    if (ctx)
        teardown_channels(ctx, &ch);
    for (int f = 0; f < NFACES; f++) {
        free(cm.bface[f]);
        for (int p = 0; p < 2; p++) {
            if (cm.pack[p][f])
                app_buf_free(ctx, cm.pack[p][f]);
            if (cm.recv[p][f])
                app_buf_free(ctx, cm.recv[p][f]);
        }
    }
    if (ctx && (rc = dchan_finalize(ctx)) != DCHAN_SUCCESS)
        fprintf(stderr, "jacobi3d: rank %d: dchan_finalize: %s\n", app_rank, dchan_strerror(rc));
    free(u);
    free(v);
    MPI_Finalize();
    return failed;
}
