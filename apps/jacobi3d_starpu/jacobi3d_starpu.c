/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * jacobi3d_starpu: jacobi3d's problem (7-point Jacobi sweeps for the Laplace
 * equation on an NX x NY x NZ grid, fixed boundary values, bit-identical to
 * the serial run) with several blocks per rank, each block's work a StarPU
 * task per iteration.
 *
 * The grid is cut into (PX*BX) x (PY*BY) x (PZ*BZ) blocks; each rank of the
 * PX x PY x PZ process grid owns BX x BY x BZ of them. Per block and
 * iteration:
 *   - one pack task per face with a neighbour, copying the plane next to
 *     that face out of the block;
 *   - one sweep task, reading the block and the neighbours' faces, writing
 *     the block's other buffer.
 * Faces between blocks of one rank are StarPU data: the pack task writes a
 * face buffer that the neighbour's sweep task reads (StarPU orders them).
 * Faces between ranks travel by
 *   - dchan (--mode dchan): one credited channel of depth 2 per face and
 *     neighbour block. The pack task writes straight into where
 *     dchan_put_ptr points (the neighbour's slot where it is mapped here)
 *     and puts it; the arrival notifies a StarPU tag on which the
 *     neighbour's sweep task depends, and that task reads the face in its
 *     slot (dchan_slot) and hands it back (dchan_ready). Progress comes
 *     from StarPU's progression hook (libdchan_starpu), with a budget.
 *   - StarPU-MPI (--mode starpu-mpi): the packed face buffer goes by
 *     starpu_mpi_isend_detached into a receive buffer posted with
 *     starpu_mpi_irecv_detached, which the sweep task reads: the runtime's
 *     own transfers, ordered by its data dependencies.
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>

#include <dchan.h>

#include "app.h"
#include "dchan_starpu.h"

enum { XLO, XHI, YLO, YHI, ZLO, ZHI, NFACES };
#define OPPOSITE(f) ((f) ^ 1)
/* A signalling NaN: no arithmetic on finite values produces it. */
#define SENTINEL_OOB UINT64_C(0xfff4dc4a6e5e0bbb)
#define DEPTH 2
#define CREDIT_TIMEOUT_MS 120000
/* StarPU tags: arrivals and the sweep tasks that wait for them. */
#define TAG_ARRIVAL (UINT64_C(1) << 62)
#define TAG_SWEEP (UINT64_C(1) << 61)

enum { JMODE_DCHAN = 0, JMODE_STARPU_MPI = 1 };

struct options {
    int grid[3], procs[3], blocks[3];
    int jmode, budget;
    struct app_common c; /* --iters, --verify, --detect */
};

/* How a block gets the values beyond one face. */
enum { FACE_BOUNDARY, FACE_LOCAL, FACE_DCHAN, FACE_SMPI };

struct blk {
    int id;                 /* index among this rank's blocks */
    int gid;                /* index in the global block grid */
    int n[3], off[3];
    size_t fsize[NFACES];
    int kind[NFACES];
    int nbrank[NFACES], nbgid[NFACES], nblocal[NFACES];
    double *u[2];
    starpu_data_handle_t hu[2];
    double *bface[NFACES];
    /* packed faces (FACE_LOCAL, FACE_SMPI) and received ones (FACE_SMPI),
     * one per parity of the iteration */
    double *pf[NFACES][2], *rf[NFACES][2];
    starpu_data_handle_t hpf[NFACES][2], hrf[NFACES][2];
    /* FACE_DCHAN */
    dchan_starpu_recv_t *rr[NFACES];
    dchan_handle_t *sh[NFACES];
    double *slots[NFACES], *sbuf[NFACES];
    /* orders the pack tasks of one send channel (puts must go in turn) */
    starpu_data_handle_t htok[NFACES];
    int tok[NFACES];
    double res;
};

struct run {
    struct options o;
    int nranks, gb[3], nlocal;
    struct blk *b;
    dchan_starpu_t *ds;
    dchan_ctx_t *ctx;
    _Atomic uint64_t task_ns; /* time spent in tasks on this rank */
};

static struct run R;

/* ---- the numerics (as jacobi3d) ------------------------------------------- */

static double boundary_value(const int grid[3], long gi, long gj, long gk)
{
    double x = (gi + 1.0) / (grid[0] + 1.0);
    double y = (gj + 1.0) / (grid[1] + 1.0);
    double z = (gk + 1.0) / (grid[2] + 1.0);

    return 1.0 + x * (1.0 - y) + z * z + 0.5 * sin(3.0 * x * z);
}

static void split(int n, int p, int c, int *len, int *off)
{
    *len = n / p + (c < n % p);
    *off = c * (n / p) + (c < n % p ? c : n % p);
}

/* Fills the fixed values beyond face f of a block of extent n at off. */
static void fill_boundary_face(const int n[3], const int off[3], const int grid[3], int f,
                               double *face)
{
    switch (f) {
    case XLO:
    case XHI: {
        long gi = f == XLO ? -1 : grid[0];
        for (int j = 0; j < n[1]; j++)
            for (int k = 0; k < n[2]; k++)
                face[(size_t)j * n[2] + k] = boundary_value(grid, gi, off[1] + j, off[2] + k);
        break;
    }
    case YLO:
    case YHI: {
        long gj = f == YLO ? -1 : grid[1];
        for (int i = 0; i < n[0]; i++)
            for (int k = 0; k < n[2]; k++)
                face[(size_t)i * n[2] + k] = boundary_value(grid, off[0] + i, gj, off[2] + k);
        break;
    }
    default: {
        long gk = f == ZLO ? -1 : grid[2];
        for (int i = 0; i < n[0]; i++)
            for (int j = 0; j < n[1]; j++)
                face[(size_t)i * n[1] + j] = boundary_value(grid, off[0] + i, off[1] + j, gk);
        break;
    }
    }
}

/* Face layouts: x faces [j][k], y faces [i][k], z faces [i][j]. The plane
 * next to face f, in the layout of the neighbour's opposite face. */
static void pack_face(const int n[3], const double *u, int f, double *out)
{
    const int nx = n[0], ny = n[1], nz = n[2];
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

/* v = mean of the six neighbours of u, in the order jacobi3d adds them, so
 * that any blocking gives the serial run's values bit for bit. */
static double sweep(const int n[3], const double *u, double *v, const double *const face[NFACES],
                    int want_res)
{
    const int nx = n[0], ny = n[1], nz = n[2];
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

/* ---- decomposition ----------------------------------------------------------- */

static int rank_of_block(const struct run *r, const int g[3])
{
    int c[3];
    for (int d = 0; d < 3; d++)
        c[d] = g[d] / r->o.blocks[d];
    return (c[0] * r->o.procs[1] + c[1]) * r->o.procs[2] + c[2];
}

static int gid_of(const struct run *r, const int g[3])
{
    return (g[0] * r->gb[1] + g[1]) * r->gb[2] + g[2];
}

static int local_of(const struct run *r, const int g[3])
{
    int l[3];
    for (int d = 0; d < 3; d++)
        l[d] = g[d] % r->o.blocks[d];
    return (l[0] * r->o.blocks[1] + l[1]) * r->o.blocks[2] + l[2];
}

/* Block extent and offset of global block coordinates g. */
static void block_extent(const struct run *r, const int g[3], int n[3], int off[3])
{
    for (int d = 0; d < 3; d++)
        split(r->o.grid[d], r->gb[d], g[d], &n[d], &off[d]);
}

static void blocks_init(struct run *r)
{
    const struct options *o = &r->o;
    int rc3[3];

    rc3[2] = app_rank % o->procs[2];
    rc3[1] = app_rank / o->procs[2] % o->procs[1];
    rc3[0] = app_rank / o->procs[2] / o->procs[1];
    r->nlocal = o->blocks[0] * o->blocks[1] * o->blocks[2];
    r->b = calloc(r->nlocal, sizeof *r->b);
    if (!r->b)
        app_die("out of memory");
    for (int l0 = 0; l0 < o->blocks[0]; l0++)
        for (int l1 = 0; l1 < o->blocks[1]; l1++)
            for (int l2 = 0; l2 < o->blocks[2]; l2++) {
                int g[3] = { rc3[0] * o->blocks[0] + l0, rc3[1] * o->blocks[1] + l1,
                             rc3[2] * o->blocks[2] + l2 };
                struct blk *b = &r->b[local_of(r, g)];

                b->id = local_of(r, g);
                b->gid = gid_of(r, g);
                block_extent(r, g, b->n, b->off);
                b->fsize[XLO] = b->fsize[XHI] = (size_t)b->n[1] * b->n[2];
                b->fsize[YLO] = b->fsize[YHI] = (size_t)b->n[0] * b->n[2];
                b->fsize[ZLO] = b->fsize[ZHI] = (size_t)b->n[0] * b->n[1];
                for (int f = 0; f < NFACES; f++) {
                    int d = f / 2, c[3] = { g[0], g[1], g[2] };
                    c[d] += f & 1 ? 1 : -1;
                    b->nbrank[f] = b->nbgid[f] = b->nblocal[f] = -1;
                    if (c[d] < 0 || c[d] >= r->gb[d]) {
                        b->kind[f] = FACE_BOUNDARY;
                        continue;
                    }
                    b->nbrank[f] = rank_of_block(r, c);
                    b->nbgid[f] = gid_of(r, c);
                    if (b->nbrank[f] == app_rank) {
                        b->kind[f] = FACE_LOCAL;
                        b->nblocal[f] = local_of(r, c);
                    } else {
                        b->kind[f] = o->jmode == JMODE_DCHAN ? FACE_DCHAN : FACE_SMPI;
                    }
                }
            }
}

/* ---- tasks ----------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

struct pack_arg {
    struct blk *b;
    int f;
};

static void pack_cpu(void *buffers[], void *cl_arg)
{
    const struct pack_arg *a = cl_arg;
    struct blk *b = a->b;
    const double *u = (const double *)STARPU_VECTOR_GET_PTR(buffers[0]);
    uint64_t t0 = now_ns();
    int rc;

    if (b->kind[a->f] == FACE_DCHAN) {
        void *p;
        /* Credit is (almost) always there: the slot was last used two
         * iterations ago; integrations/starpu/README.md says why waiting
         * here cannot deadlock. */
        rc = dchan_starpu_put_ptr(R.ds, b->sh[a->f], &p, CREDIT_TIMEOUT_MS);
        if (rc != DCHAN_SUCCESS)
            app_die_dchan("waiting for credit (dchan_put_ptr)", rc);
        pack_face(b->n, u, a->f, p);
        if ((rc = dchan_put(b->sh[a->f])) != DCHAN_SUCCESS)
            app_die_dchan("dchan_put", rc);
    } else {
        pack_face(b->n, u, a->f, (double *)STARPU_VECTOR_GET_PTR(buffers[1]));
    }
    atomic_fetch_add(&R.task_ns, now_ns() - t0);
}

struct sweep_arg {
    struct blk *b;
    int want_res;
};

static void sweep_cpu(void *buffers[], void *cl_arg)
{
    const struct sweep_arg *a = cl_arg;
    struct blk *b = a->b;
    const double *u = (const double *)STARPU_VECTOR_GET_PTR(buffers[0]);
    double *v = (double *)STARPU_VECTOR_GET_PTR(buffers[1]);
    const double *face[NFACES];
    uint64_t t0 = now_ns();
    int k = 2, rc;

    for (int f = 0; f < NFACES; f++) {
        void *slot;
        switch (b->kind[f]) {
        case FACE_BOUNDARY:
            face[f] = b->bface[f];
            break;
        case FACE_DCHAN:
            /* The tag this task waited for says the face is in. */
            if ((rc = dchan_slot(dchan_starpu_recv_handle(b->rr[f]), &slot)) != DCHAN_SUCCESS)
                app_die_dchan("dchan_slot", rc);
            face[f] = slot;
            break;
        default:
            face[f] = (const double *)STARPU_VECTOR_GET_PTR(buffers[k++]);
            break;
        }
    }
    double res = sweep(b->n, u, v, face, a->want_res);
    if (a->want_res)
        b->res = res;
    for (int f = 0; f < NFACES; f++)
        if (b->kind[f] == FACE_DCHAN &&
            (rc = dchan_ready(dchan_starpu_recv_handle(b->rr[f]))) != DCHAN_SUCCESS)
            app_die_dchan("dchan_ready", rc);
    atomic_fetch_add(&R.task_ns, now_ns() - t0);
}

static struct starpu_codelet pack_cl = {
    .cpu_funcs = { pack_cpu },
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "jacobi_pack",
};

static struct starpu_codelet sweep_cl = {
    .cpu_funcs = { sweep_cpu },
    .nbuffers = STARPU_VARIABLE_NBUFFERS,
    .name = "jacobi_sweep",
};

static starpu_tag_t arrival_tag(const struct run *r, const struct blk *b, int f, int it)
{
    return TAG_ARRIVAL | (((uint64_t)it * r->nlocal + b->id) * NFACES + f);
}

/* StarPU-MPI data tags of faces: the sender's block and face, per
 * iteration, so that no two transfers in flight share one. */
static starpu_mpi_tag_t face_tag(const struct run *r, int gid, int f, int it)
{
    int nglobal = r->gb[0] * r->gb[1] * r->gb[2];
    return ((starpu_mpi_tag_t)it * nglobal + gid) * NFACES + f;
}

static void submit(struct starpu_task *t, const char *what)
{
    int rc = starpu_task_submit(t);
    if (rc != 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "starpu_task_submit (%s): %d", what, rc);
        app_die(msg);
    }
}

static void submit_iteration(struct run *r, int it)
{
    const int p = it & 1;

    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        for (int f = 0; f < NFACES; f++) {
            if (b->kind[f] == FACE_BOUNDARY)
                continue;
            struct starpu_task *t = starpu_task_create();
            struct pack_arg *a = malloc(sizeof *a);
            if (!a)
                app_die("out of memory");
            a->b = b;
            a->f = f;
            t->cl = &pack_cl;
            t->cl_arg = a;
            t->cl_arg_size = sizeof *a;
            t->cl_arg_free = 1;
            t->nbuffers = 2;
            t->handles[0] = b->hu[p];
            t->modes[0] = STARPU_R;
            if (b->kind[f] == FACE_DCHAN) {
                t->handles[1] = b->htok[f];
                t->modes[1] = STARPU_RW;
            } else {
                t->handles[1] = b->hpf[f][p];
                t->modes[1] = STARPU_W;
            }
            submit(t, "pack");
            if (b->kind[f] == FACE_SMPI) {
                if (starpu_mpi_isend_detached(b->hpf[f][p], b->nbrank[f],
                                              face_tag(r, b->gid, f, it), MPI_COMM_WORLD, NULL,
                                              NULL) != 0 ||
                    starpu_mpi_irecv_detached(b->hrf[f][p], b->nbrank[f],
                                              face_tag(r, b->nbgid[f], OPPOSITE(f), it),
                                              MPI_COMM_WORLD, NULL, NULL) != 0)
                    app_die("starpu_mpi_isend/irecv_detached failed");
            }
        }
    }
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        struct starpu_task *t = starpu_task_create();
        struct sweep_arg *a = malloc(sizeof *a);
        starpu_tag_t deps[NFACES];
        int ndeps = 0, k = 2;

        if (!a)
            app_die("out of memory");
        a->b = b;
        a->want_res = it == r->o.c.iters - 1;
        t->cl = &sweep_cl;
        t->cl_arg = a;
        t->cl_arg_size = sizeof *a;
        t->cl_arg_free = 1;
        t->handles[0] = b->hu[p];
        t->modes[0] = STARPU_R;
        t->handles[1] = b->hu[1 - p];
        t->modes[1] = STARPU_W;
        for (int f = 0; f < NFACES; f++) {
            switch (b->kind[f]) {
            case FACE_LOCAL:
                t->handles[k] = r->b[b->nblocal[f]].hpf[OPPOSITE(f)][p];
                t->modes[k++] = STARPU_R;
                break;
            case FACE_SMPI:
                t->handles[k] = b->hrf[f][p];
                t->modes[k++] = STARPU_R;
                break;
            case FACE_DCHAN:
                deps[ndeps++] = arrival_tag(r, b, f, it);
                break;
            default:
                break;
            }
        }
        t->nbuffers = k;
        if (ndeps) {
            /* Released by the arrivals of this iteration's faces. */
            t->use_tag = 1;
            t->tag_id = TAG_SWEEP | ((uint64_t)it * r->nlocal + b->id);
            starpu_tag_declare_deps_array(t->tag_id, ndeps, deps);
        }
        submit(t, "sweep");
    }
}

/* ---- setup and teardown ------------------------------------------------------ */

static void register_vec(starpu_data_handle_t *h, double *p, size_t n)
{
    starpu_vector_data_register(h, STARPU_MAIN_RAM, (uintptr_t)p, (uint32_t)n, sizeof(double));
}

static void setup_data(struct run *r)
{
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        const size_t local = (size_t)b->n[0] * b->n[1] * b->n[2];

        for (int p = 0; p < 2; p++) {
            b->u[p] = app_xalloc(local);
            memset(b->u[p], 0, local * sizeof(double));
            register_vec(&b->hu[p], b->u[p], local);
        }
        for (int f = 0; f < NFACES; f++) {
            switch (b->kind[f]) {
            case FACE_BOUNDARY:
                b->bface[f] = app_xalloc(b->fsize[f]);
                fill_boundary_face(b->n, b->off, r->o.grid, f, b->bface[f]);
                break;
            case FACE_DCHAN:
                starpu_variable_data_register(&b->htok[f], STARPU_MAIN_RAM,
                                              (uintptr_t)&b->tok[f], sizeof b->tok[f]);
                break;
            default:
                for (int p = 0; p < 2; p++) {
                    b->pf[f][p] = app_xalloc(b->fsize[f]);
                    register_vec(&b->hpf[f][p], b->pf[f][p], b->fsize[f]);
                    if (b->kind[f] == FACE_SMPI) {
                        b->rf[f][p] = app_xalloc(b->fsize[f]);
                        register_vec(&b->hrf[f][p], b->rf[f][p], b->fsize[f]);
                    }
                }
                break;
            }
        }
    }
}

/* Channels for every face between ranks; the wires go as StarPU-MPI data. */
static void setup_channels(struct run *r)
{
    dchan_handle_attr_t hattr;
    dchan_wire_t(*mine)[NFACES] = calloc(r->nlocal, sizeof *mine);
    dchan_wire_t(*theirs)[NFACES] = calloc(r->nlocal, sizeof *theirs);
    int rc;

    if (!mine || !theirs)
        app_die("out of memory");
    dchan_handle_attr_init(&hattr);
    hattr.credit = 1;
    hattr.depth = DEPTH;
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        for (int f = 0; f < NFACES; f++) {
            if (b->kind[f] != FACE_DCHAN)
                continue;
            b->slots[f] = app_buf_alloc(r->ctx, DEPTH * b->fsize[f]);
            b->sbuf[f] = app_buf_alloc(r->ctx, b->fsize[f]);
            /* The n-th arrival is the face of iteration n. */
            rc = dchan_starpu_recv_create(r->ds, b->nbrank[f], b->slots[f],
                                          b->fsize[f] * sizeof(double), SENTINEL_OOB, &hattr,
                                          arrival_tag(r, b, f, 0),
                                          (starpu_tag_t)r->nlocal * NFACES, r->o.c.iters,
                                          &b->rr[f]);
            if (rc == DCHAN_SUCCESS)
                rc = dchan_handle_export(dchan_starpu_recv_handle(b->rr[f]), &mine[i][f]);
            if (rc != DCHAN_SUCCESS)
                app_die_dchan("dchan_create_handle_attr", rc);
            /* Tags: the wire of the receive channel of block g, face f. */
            if ((rc = dchan_starpu_wires_post(r->ds, b->nbrank[f], &mine[i][f], 1, NULL, 0,
                                              (starpu_mpi_tag_t)b->gid * NFACES + f)) ||
                (rc = dchan_starpu_wires_post(r->ds, b->nbrank[f], NULL, 0, &theirs[i][f], 1,
                                              (starpu_mpi_tag_t)b->nbgid[f] * NFACES +
                                                  OPPOSITE(f))))
                app_die_dchan("dchan_starpu_wires_post", rc);
        }
    }
    if ((rc = dchan_starpu_wires_wait(r->ds)) != DCHAN_SUCCESS)
        app_die_dchan("dchan_starpu_wires_wait", rc);
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        for (int f = 0; f < NFACES; f++) {
            if (b->kind[f] != FACE_DCHAN)
                continue;
            rc = dchan_assoc_local(r->ctx, &theirs[i][f], b->sbuf[f],
                                   b->fsize[f] * sizeof(double), &b->sh[f]);
            if (rc != DCHAN_SUCCESS)
                app_die_dchan("dchan_assoc_local", rc);
        }
    }
    free(mine);
    free(theirs);
}

static void teardown(struct run *r)
{
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        for (int p = 0; p < 2; p++)
            starpu_data_unregister(b->hu[p]);
        for (int f = 0; f < NFACES; f++) {
            if (b->kind[f] == FACE_DCHAN)
                starpu_data_unregister(b->htok[f]);
            for (int p = 0; p < 2; p++) {
                if (b->pf[f][p])
                    starpu_data_unregister(b->hpf[f][p]);
                if (b->rf[f][p])
                    starpu_data_unregister(b->hrf[f][p]);
            }
        }
    }
    if (!r->ds)
        return;
    /* Every face arrived (each sweep waited for its own), but a sender's
     * local completion may lag: nothing goes while a peer could touch it. */
    for (int i = 0; i < r->nlocal; i++)
        for (int f = 0; f < NFACES; f++)
            if (r->b[i].sh[f])
                app_wait_put_done(r->b[i].sh[f]);
    starpu_mpi_barrier(MPI_COMM_WORLD);
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        for (int f = 0; f < NFACES; f++) {
            if (b->kind[f] != FACE_DCHAN)
                continue;
            dchan_handle_destroy(b->sh[f]);
            dchan_starpu_recv_destroy(b->rr[f]);
            app_buf_free(r->ctx, b->sbuf[f]);
            app_buf_free(r->ctx, b->slots[f]);
        }
    }
}

/* ---- verification (after StarPU-MPI is shut down: plain MPI) -------------- */

/* The grid as this rank's blocks fill it, zero elsewhere: a sum over ranks
 * assembles it exactly (x + 0 == x). */
static double *assemble(const struct run *r, int final)
{
    const int *g = r->o.grid;
    const size_t total = (size_t)g[0] * g[1] * g[2];
    double *all = app_xalloc(total);

    memset(all, 0, total * sizeof *all);
    for (int i = 0; i < r->nlocal; i++) {
        const struct blk *b = &r->b[i];
        const double *u = b->u[final];
        for (int x = 0; x < b->n[0]; x++)
            for (int y = 0; y < b->n[1]; y++)
                memcpy(all + ((size_t)(b->off[0] + x) * g[1] + b->off[1] + y) * g[2] + b->off[2],
                       u + ((size_t)x * b->n[1] + y) * b->n[2], b->n[2] * sizeof *u);
    }
    return all;
}

static int verify(const struct run *r, double *maxdiff_out)
{
    const int *g = r->o.grid;
    const size_t total = (size_t)g[0] * g[1] * g[2];
    double *mine = assemble(r, r->o.c.iters & 1), *all = NULL, maxdiff = 0.0;
    int ok = 0;

    if (app_rank == 0)
        all = app_xalloc(total);
    MPI_Reduce(mine, all, (int)total, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (app_rank == 0) {
        /* The serial reference: one block covering the whole grid. */
        int n[3] = { g[0], g[1], g[2] }, off[3] = { 0, 0, 0 };
        double *s = app_xalloc(total), *t = app_xalloc(total), *bf[NFACES];
        const double *face[NFACES];
        for (int f = 0; f < NFACES; f++) {
            size_t fs = f < 2 ? (size_t)n[1] * n[2] : f < 4 ? (size_t)n[0] * n[2]
                                                            : (size_t)n[0] * n[1];
            bf[f] = app_xalloc(fs);
            fill_boundary_face(n, off, g, f, bf[f]);
            face[f] = bf[f];
        }
        memset(s, 0, total * sizeof *s);
        for (int it = 0; it < r->o.c.iters; it++) {
            sweep(n, s, t, face, 0);
            double *x = s;
            s = t;
            t = x;
        }
        for (size_t i = 0; i < total; i++) {
            double d = fabs(all[i] - s[i]);
            if (!(d <= maxdiff)) /* also catches NaN */
                maxdiff = d;
        }
        ok = maxdiff == 0.0;
        for (int f = 0; f < NFACES; f++)
            free(bf[f]);
        free(s);
        free(t);
        free(all);
    }
    free(mine);
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(&maxdiff, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    *maxdiff_out = maxdiff;
    return ok;
}

/* ---- command line ---------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mpirun -np P jacobi3d_starpu [options]\n"
            "  --grid NX,NY,NZ       unknowns along x, y, z (default 64,64,64)\n"
            "  --procs PX,PY,PZ      process grid, PX*PY*PZ = P (default: MPI_Dims_create)\n"
            "  --blocks B|BX,BY,BZ   blocks per rank (B: 1,B,1; default 2)\n"
            "  --iters N             Jacobi iterations (default 100)\n"
            "  --mode dchan|starpu-mpi\n"
            "                        faces between ranks: dchan channels driven by StarPU's\n"
            "                        progression hook, or StarPU-MPI's own transfers\n"
            "                        (default dchan)\n"
            "  --budget N            dchan callbacks per progression hook call (default 8)\n"
            "  --verify              compare with a serial run on rank 0; the results must\n"
            "                        agree exactly; exit 1 if they do not\n"
            "  --detect auto|sentinel|flag|event\n"
            "                        dchan arrival detection (default: DCHAN_DETECT, else auto)\n"
            "  --help                this text\n"
            "One StarPU task per block and iteration sweeps the block; one per face packs it.\n"
            "The last line on stdout is a RESULT line as jacobi3d's (iter_time_s: mean time\n"
            "of one iteration on the slowest rank, iteration 0 not timed), plus blocks= and\n"
            "task_time_s= (time inside tasks per iteration, largest over the ranks).\n");
}

static int parse_args(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        { "grid", required_argument, NULL, 'g' },   { "procs", required_argument, NULL, 'p' },
        { "blocks", required_argument, NULL, 'b' }, { "iters", required_argument, NULL, 'i' },
        { "mode", required_argument, NULL, 'M' },   { "budget", required_argument, NULL, 'B' },
        { "verify", no_argument, NULL, 'v' },       { "detect", required_argument, NULL, 'd' },
        { "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 }
    };
    int c;

    *o = (struct options){ .grid = { 64, 64, 64 }, .blocks = { 1, 2, 1 }, .budget = 8,
                           .c = { .iters = 100, .mode = MODE_DCHAN, .detect = -1 } };
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *bad = NULL;
        char *end;
        long v;

        switch (c) {
        case 'g':
            if (app_parse_triple(optarg, o->grid))
                bad = "--grid wants NX,NY,NZ, three positive integers";
            break;
        case 'p':
            if (app_parse_triple(optarg, o->procs))
                bad = "--procs wants PX,PY,PZ, three positive integers";
            break;
        case 'b':
            if (strchr(optarg, ',')) {
                if (app_parse_triple(optarg, o->blocks))
                    bad = "--blocks wants B or BX,BY,BZ, positive integers";
            } else {
                v = strtol(optarg, &end, 10);
                if (end == optarg || *end || v < 1 || v > 4096)
                    bad = "--blocks wants B or BX,BY,BZ, positive integers";
                else
                    o->blocks[0] = 1, o->blocks[1] = (int)v, o->blocks[2] = 1;
            }
            break;
        case 'M':
            if (!strcmp(optarg, "dchan"))
                o->jmode = JMODE_DCHAN;
            else if (!strcmp(optarg, "starpu-mpi"))
                o->jmode = JMODE_STARPU_MPI;
            else
                bad = "--mode wants dchan or starpu-mpi";
            break;
        case 'B':
            if (app_parse_positive(optarg, &o->budget))
                bad = "--budget wants a positive integer";
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
                fprintf(stderr, "jacobi3d_starpu: %s: %s\n", argv[optind - 1], bad);
            return -1;
        }
        if (bad) {
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d_starpu: %s\n", bad);
            return -1;
        }
    }
    if (optind < argc) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d_starpu: unexpected argument '%s' (see --help)\n",
                    argv[optind]);
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
            fprintf(stderr, "jacobi3d_starpu: --procs %d,%d,%d needs %lld ranks, the job has %d\n",
                    o->procs[0], o->procs[1], o->procs[2],
                    (long long)o->procs[0] * o->procs[1] * o->procs[2], nranks);
        return -1;
    }
    for (int d = 0; d < 3; d++) {
        if ((long long)o->procs[d] * o->blocks[d] > o->grid[d]) {
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d_starpu: grid %d along %c cannot be cut into %d x %d "
                                "blocks\n",
                        o->grid[d], "xyz"[d], o->procs[d], o->blocks[d]);
            return -1;
        }
    }
    if ((double)o->grid[0] * o->grid[1] * o->grid[2] > INT_MAX ||
        (double)o->c.iters * o->procs[0] * o->blocks[0] * o->procs[1] * o->blocks[1] *
                o->procs[2] * o->blocks[2] * NFACES >= 0x7ff00000) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d_starpu: problem too large (grid or tags)\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct run *r = &R;
    struct starpu_conf conf;
    char provider[32] = "starpu-mpi"; /* a copy: dchan's string goes with the context */
    int provided, rc;

    app_name = "jacobi3d_starpu";
    /* MPI_THREAD_MULTIPLE: StarPU-MPI's thread calls MPI, and so may
     * dchan's mpi provider from StarPU's workers. */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &app_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r->nranks);

    rc = parse_args(argc, argv, &r->o);
    if (rc == 0)
        rc = check_decomposition(&r->o, r->nranks);
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
    for (int d = 0; d < 3; d++)
        r->gb[d] = r->o.procs[d] * r->o.blocks[d];
    blocks_init(r);

    starpu_conf_init(&conf);
    conf.ncuda = 0;
    conf.nopencl = 0;
    if (!getenv("STARPU_SCHED"))
        conf.sched_policy_name = "eager"; /* no performance models to calibrate */
    if ((rc = starpu_mpi_init_conf(&argc, &argv, 0, MPI_COMM_WORLD, &conf)) != 0) {
        fprintf(stderr, "jacobi3d_starpu: rank %d: starpu_mpi_init_conf: %d\n", app_rank, rc);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (starpu_cpu_worker_get_count() < 1)
        app_die("StarPU has no CPU worker (STARPU_NCPU)");


    if (r->o.jmode == JMODE_DCHAN) {
        dchan_attr_t attr;
        dchan_attr_init(&attr);
        if (r->o.c.detect >= 0)
            attr.detect = r->o.c.detect;
        attr.error_fn = app_on_error;
        rc = dchan_starpu_init(MPI_COMM_WORLD, &attr, &r->ds);
        if (rc != DCHAN_SUCCESS)
            app_die_dchan("dchan_starpu_init", rc);
        r->ctx = dchan_starpu_ctx(r->ds);
        snprintf(provider, sizeof provider, "%s", dchan_provider_name(r->ctx));
    }
    setup_data(r);
    if (r->ds) {
        setup_channels(r);
        if ((rc = dchan_starpu_hook_start(r->ds, r->o.budget)) != DCHAN_SUCCESS)
            app_die_dchan("dchan_starpu_hook_start", rc);
    }
    if (app_rank == 0) {
        char how[128] = "";
        if (r->ds) {
            int d = -1;
            for (int i = 0; i < r->nlocal && d < 0; i++)
                for (int f = 0; f < NFACES && d < 0; f++)
                    if (r->b[i].rr[f])
                        d = dchan_handle_detect(dchan_starpu_recv_handle(r->b[i].rr[f]));
            snprintf(how, sizeof how, ", provider %s, detection %s, budget %d", provider,
                     d >= 0 ? app_detect_name(d) : "none (no neighbours)", r->o.budget);
        }
        fprintf(stderr,
                "jacobi3d_starpu: grid %d,%d,%d on %d ranks (%d,%d,%d) x blocks (%d,%d,%d), "
                "%d iterations, %u CPU workers per rank, mode %s%s\n",
                r->o.grid[0], r->o.grid[1], r->o.grid[2], r->nranks, r->o.procs[0],
                r->o.procs[1], r->o.procs[2], r->o.blocks[0], r->o.blocks[1], r->o.blocks[2],
                r->o.c.iters, starpu_cpu_worker_get_count(),
                r->o.jmode == JMODE_DCHAN ? "dchan" : "starpu-mpi", how);
    }

    /* Iteration 0 is not timed when there are more: it pays for first
     * contact in either mode. */
    const int untimed = r->o.c.iters > 1;
    double elapsed = 0.0;
    uint64_t task_ns = 0;
    for (int pass = !untimed; pass < 2; pass++) {
        const int first = pass ? untimed : 0, end = pass ? r->o.c.iters : 1;
        if (pass)
            starpu_mpi_barrier(MPI_COMM_WORLD);
        atomic_store(&r->task_ns, 0);
        double t0 = starpu_timing_now();
        for (int it = first; it < end; it++)
            submit_iteration(r, it);
        starpu_mpi_wait_for_all(MPI_COMM_WORLD);
        elapsed = (starpu_timing_now() - t0) * 1e-6;
        task_ns = atomic_load(&r->task_ns);
    }
    if (r->ds && dchan_starpu_error(r->ds))
        app_die_dchan("channel", dchan_starpu_error(r->ds));
    if (r->ds) {
        struct dchan_starpu_stats st;
        dchan_starpu_hook_stop(r->ds);
        dchan_starpu_get_stats(r->ds, &st);
        if (st.hook_max > (uint64_t)r->o.budget)
            app_die("the progression hook ran more callbacks than its budget");
        if (app_rank == 0)
            fprintf(stderr,
                    "jacobi3d_starpu: rank 0: progression hook: %llu calls, %llu callbacks, "
                    "at most %llu in one call (budget %d), %llu calls used the whole budget\n",
                    (unsigned long long)st.hook_calls, (unsigned long long)st.hook_callbacks,
                    (unsigned long long)st.hook_max, r->o.budget,
                    (unsigned long long)st.hook_full);
    }
    teardown(r);
    if (r->ds && (rc = dchan_starpu_finalize(r->ds)) != DCHAN_SUCCESS)
        fprintf(stderr, "jacobi3d_starpu: rank %d: dchan_finalize: %s\n", app_rank,
                dchan_strerror(rc));
    starpu_mpi_shutdown();

    /* StarPU-MPI is down: this thread alone calls MPI from here on. */
    double res = 0.0, sum_res, slowest, task_s = task_ns * 1e-9, slowest_task;
    for (int i = 0; i < r->nlocal; i++)
        res += r->b[i].res;
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&task_s, &slowest_task, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&res, &sum_res, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    const char *verified = "skipped";
    double maxdiff = 0.0;
    int failed = 0;
    if (r->o.c.verify) {
        int ok = verify(r, &maxdiff);
        verified = ok ? "yes" : "no";
        failed = !ok;
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d_starpu: largest difference from the serial run: %.3e (%s)\n",
                    maxdiff, ok ? "verified" : "NOT verified");
    }
    if (app_rank == 0) {
        const int timed = r->o.c.iters - untimed;
        printf("RESULT app=jacobi3d_starpu provider=%s mode=%s ranks=%d grid=%d,%d,%d "
               "procs=%d,%d,%d iters=%d iter_time_s=%.6e residual=%.6e verified=%s "
               "blocks=%d,%d,%d task_time_s=%.6e\n",
               provider, r->o.jmode == JMODE_DCHAN ? "dchan" : "starpu-mpi", r->nranks,
               r->o.grid[0], r->o.grid[1], r->o.grid[2], r->o.procs[0], r->o.procs[1],
               r->o.procs[2], r->o.c.iters, slowest / timed, sqrt(sum_res), verified,
               r->o.blocks[0], r->o.blocks[1], r->o.blocks[2], slowest_task / timed);
        fflush(stdout);
    }
    for (int i = 0; i < r->nlocal; i++) {
        struct blk *b = &r->b[i];
        for (int p = 0; p < 2; p++)
            free(b->u[p]);
        for (int f = 0; f < NFACES; f++) {
            free(b->bface[f]);
            for (int p = 0; p < 2; p++) {
                free(b->pf[f][p]);
                free(b->rf[f][p]);
            }
        }
    }
    free(r->b);
    MPI_Finalize();
    return failed;
}
