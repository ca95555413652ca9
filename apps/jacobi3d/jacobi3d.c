/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * jacobi3d: 7-point Jacobi sweeps for the Laplace equation on an
 * NX x NY x NZ grid of unknowns with fixed values on the surrounding
 * boundary layer, split into PX x PY x PZ parts, one per MPI rank, each
 * part split again into B blocks (--blocks, default 1).
 *
 * Every iteration each block sends its six boundary planes ("faces") to
 * the neighbour blocks, on this rank or another, and sweeps. The exchange
 * overlaps the sweep: the interior of every block (the cells that read no
 * neighbour's face) is swept while the faces are in flight, then each
 * block's boundary layer once its faces arrived; that sweep packs the
 * block's faces of the next iteration as it computes them, and they leave
 * right after it. All modes run the same code except for the transport,
 * so that the comparison is fair:
 *   - faces are packed with the same code, straight into where the
 *     transport takes them from (but by dchan --faces subarray, which
 *     packs nothing), and sent faces to other ranks first;
 *   - received faces land in per-face buffers that the sweep reads in place
 *     as ghost values: there is no unpack copy in either mode;
 *   - msg:   faces packed into pack buffers (two per face, used on alternate
 *            iterations), MPI_Isend of those (to this rank too), MPI_Irecv
 *            pre-posted one iteration ahead into two receive buffers per face;
 *   - dchan: channels created once, one per face and neighbour block (a
 *            self channel when the neighbour is on this rank), credited;
 *            the sweep reads the face where it landed (dchan_slot), and
 *            dchan_ready hands it back. Two ways to send (--faces):
 *            subarray (the default): no packing at all. Each face's send
 *            side is a plane of the block array itself
 *            (dchan_assoc_local_subarray), which the library gathers at
 *            each dchan_put (on shm a gathering copy straight into the
 *            neighbour's slot). The block's values alternate between two
 *            arrays (u and v), so each face has two channels of depth 1,
 *            one bound to each array, used on alternate iterations;
 *            pack: one channel of depth 2 per face; the sweep packs the
 *            face straight into the neighbour's slot where the provider
 *            maps it (dchan_put_ptr), else into the send buffer, then one
 *            dchan_put. See run()'s comment;
 *   - none:  no exchange: neighbours' faces read zeros. The compute floor of
 *            the same decomposition; not verified.
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

/* The exchange is timed several times per iteration (once per block): by
 * the cycle counter where there is one (about 10 ns a read, MPI_Wtime 30),
 * converted to seconds against MPI_Wtime over the whole timed run. */
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline double ticks(void)
{
    return (double)__rdtsc();
}
#else
static inline double ticks(void)
{
    return MPI_Wtime();
}
#endif

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
/* The parallel and serial runs compute every cell with the same expression
 * (no multiply-add to contract), whatever the order in which cells are
 * visited, so they agree bit for bit: verification demands it. A stale or
 * misplaced face shows up as a difference of order 1e-3 or more; even a
 * single 1e-9 perturbation early on would still differ by ~1e-13 at the end. */
#define VERIFY_TOL 0.0
/* dchan's default number of credited channels one rank may receive from
 * each peer (DCHAN_CREDIT_WORDS); many blocks per rank need more. */
#define CREDIT_WORDS_DEFAULT 256

/* How dchan mode sends a face (--faces). */
enum { FACES_SUBARRAY, FACES_PACK };

struct options {
    int grid[3];
    int procs[3];   /* 0: let MPI_Dims_create choose */
    int blocks;     /* blocks per rank */
    int faces;      /* FACES_SUBARRAY or FACES_PACK (dchan mode) */
    struct app_common c; /* --iters, --mode, --verify, --detect */
    int modes[3];   /* --modes: the modes run side by side, in this order */
    int nmodes;     /* 1 without --modes: --mode's */
    int modes_given; /* --modes */
    int rounds;     /* --rounds: the timed iterations in this many turns per mode */
};

/*
 * The decomposition, the same on every rank: the grid is split into
 * nblk[0] x nblk[1] x nblk[2] blocks (uneven splits as split() makes them),
 * and rank (px,py,pz) owns the bpr[0] x bpr[1] x bpr[2] blocks from block
 * (px*bpr[0], py*bpr[1], pz*bpr[2]) on. With one block per rank this is
 * the plain split of the grid over the ranks.
 */
struct layout {
    int grid[3], procs[3];
    int bpr[3];     /* blocks per rank along x, y, z */
    int nblk[3];    /* blocks along x, y, z: procs[d] * bpr[d] */
    int nlocal;     /* blocks per rank */
};

/* One block of the grid, with what its exchange needs. */
struct block {
    int n[3];       /* unknowns along x, y, z */
    int off[3];     /* global index of the block's first unknown */
    int nb_rank[NFACES]; /* owner of the neighbour block across each face, -1 on the boundary */
    int nb_idx[NFACES];  /* the neighbour's index among its owner's blocks */
    size_t fsize[NFACES]; /* doubles in each face */
    int lo[3], hi[3];     /* interior box [lo, hi): the cells that read no exchanged face */
    double *u, *v;        /* this iteration's values and the next */
    double *arr[2];       /* the two arrays u and v swap between: iteration it
                           * reads arr[it & 1] and writes arr[(it + 1) & 1] */
    double *bface[NFACES];  /* fixed boundary values, where nb_rank[f] < 0 */
    /* msg: outgoing and incoming faces, [parity][face]; none: recv[0] zeros */
    double *pack[2][NFACES], *recv[2][NFACES];
    /* dchan, per face with a neighbour block, [channel][face]: pack uses
     * channel 0 (depth DEPTH) for every iteration; subarray uses channel
     * it & 1 (depth 1) for the faces of iteration it, sent from arr[it & 1] */
    dchan_handle_t *rh[2][NFACES]; /* receive: neighbour across f -> slots[c][f] */
    dchan_handle_t *sh[2][NFACES]; /* send: -> the neighbour's slots[c][opposite] */
    double *slots[2][NFACES];      /* the receive buffers: DEPTH slots (pack) or one */
    double *sbuf[NFACES];          /* pack: send buffer, where dchan_put_ptr cannot give the slot */
    int arrived[2][NFACES];        /* faces arrived on rh[c][f] since creation */
};

/* This rank's blocks and the order in which it serves them. */
struct domain {
    struct layout L;
    int me;
    int mode;
    int faces;                  /* FACES_SUBARRAY or FACES_PACK */
    int nchan;                  /* dchan channels per face: 2 (subarray) or 1 (pack) */
    struct block *blk;          /* L.nlocal blocks */
    int *wait_order;            /* blocks by faces from other ranks, most first */
    MPI_Request *rreq[2], *sreq[2]; /* msg: [parity][block * NFACES + face] */
    double comm;                /* ticks() in the calls of the face exchange */
};

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

/*
 * Splits each rank's part into blocks blocks: of the factorisations
 * bx * by * bz = blocks whose global block grid fits the grid (at least one
 * unknown per block along each axis), the one that cuts the least face
 * area in all, and among equals the one with the fewest cuts along z, then
 * y (z faces are strided gathers, x faces one memcpy). Returns -1 when
 * none fits.
 */
static int layout_init(struct layout *L, const int grid[3], const int procs[3], int blocks)
{
    double best = -1.0;
    int bestz = 0, besty = 0;

    memcpy(L->grid, grid, sizeof L->grid);
    memcpy(L->procs, procs, sizeof L->procs);
    L->nlocal = blocks;
    for (int bx = 1; bx <= blocks; bx++) {
        if (blocks % bx)
            continue;
        for (int by = 1; by <= blocks / bx; by++) {
            if ((blocks / bx) % by)
                continue;
            const int b[3] = { bx, by, blocks / bx / by };
            double cut = 0.0;
            int fits = 1;

            for (int d = 0; d < 3; d++) {
                long long nb = (long long)procs[d] * b[d];
                fits &= nb <= grid[d];
                cut += (nb - 1) * ((double)grid[(d + 1) % 3] * grid[(d + 2) % 3]);
            }
            const int nz = procs[2] * b[2], ny = procs[1] * b[1];
            if (!fits || (best >= 0.0 && (cut > best || (cut == best && (nz > bestz ||
                                                        (nz == bestz && ny >= besty))))))
                continue;
            best = cut;
            bestz = nz;
            besty = ny;
            for (int d = 0; d < 3; d++) {
                L->bpr[d] = b[d];
                L->nblk[d] = procs[d] * b[d];
            }
        }
    }
    return best < 0.0 ? -1 : 0;
}

static int owner_of(const struct layout *L, const int g[3])
{
    return rank_of(L->procs, g[0] / L->bpr[0], g[1] / L->bpr[1], g[2] / L->bpr[2]);
}

static int local_index(const struct layout *L, const int g[3])
{
    return ((g[0] % L->bpr[0]) * L->bpr[1] + g[1] % L->bpr[1]) * L->bpr[2] + g[2] % L->bpr[2];
}

/* Global block coordinates of block idx of rank. */
static void block_coords(const struct layout *L, int rank, int idx, int g[3])
{
    const int p[3] = { rank / L->procs[2] / L->procs[1], rank / L->procs[2] % L->procs[1],
                       rank % L->procs[2] };
    const int l[3] = { idx / L->bpr[2] / L->bpr[1], idx / L->bpr[2] % L->bpr[1],
                       idx % L->bpr[2] };

    for (int d = 0; d < 3; d++)
        g[d] = p[d] * L->bpr[d] + l[d];
}

/* Geometry and neighbours of block idx of rank; buffers untouched. */
static void block_init(struct block *b, const struct layout *L, int rank, int idx)
{
    int g[3];

    block_coords(L, rank, idx, g);
    for (int d = 0; d < 3; d++) {
        split(L->grid[d], L->nblk[d], g[d], &b->n[d], &b->off[d]);
        for (int s = 0; s < 2; s++) {
            const int f = 2 * d + s;
            int c[3];

            memcpy(c, g, sizeof c);
            c[d] += s ? 1 : -1;
            if (c[d] < 0 || c[d] >= L->nblk[d]) {
                b->nb_rank[f] = b->nb_idx[f] = -1;
            } else {
                b->nb_rank[f] = owner_of(L, c);
                b->nb_idx[f] = local_index(L, c);
            }
        }
        /* Cells next to an exchanged face wait for it; those next to the
         * fixed boundary do not. An empty interior has lo == hi. */
        b->lo[d] = b->nb_rank[2 * d] >= 0;
        b->hi[d] = b->n[d] - (b->nb_rank[2 * d + 1] >= 0);
        if (b->hi[d] < b->lo[d])
            b->hi[d] = b->lo[d];
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

/* Cells [k0, k1) of a row: short rows are common with many blocks, where
 * an inline loop beats a call of memcpy. */
static inline void copy_row(double *restrict dst, const double *restrict src, int k0, int k1)
{
    for (int k = k0; k < k1; k++)
        dst[k] = src[k];
}

/*
 * One Jacobi update, v = mean of the six neighbours of u, on the cells
 * [lo, hi) of the block. Values outside the block come from face[] (a
 * neighbour's face as received, or the fixed boundary); a face is read
 * only by the cells next to it, so the interior box may pass NULL for the
 * faces still in flight. Every cell gets the same expression in any box,
 * so a sweep split into boxes equals one sweep of the whole block, and the
 * serial reference (the whole grid as one box) equals both.
 *
 * Where out[f] is set, the new values of the plane next to face f are also
 * stored there, in pack_face's layout, as each row is computed: the pack
 * of the next iteration's face, fused into the sweep while the row is in
 * L1 (out may be NULL: nothing to pack).
 */
static void sweep_box(const struct block *b, const double *u, double *v,
                      const double *const face[NFACES], double *const *out, const int lo[3],
                      const int hi[3])
{
    const int nx = b->n[0], ny = b->n[1], nz = b->n[2];
    const size_t plane = (size_t)ny * nz;
    const double sixth = 1.0 / 6.0;
    const int k0 = lo[2], k1 = hi[2];

    if (k0 >= k1)
        return;
    for (int i = lo[0]; i < hi[0]; i++) {
        for (int j = lo[1]; j < hi[1]; j++) {
            const double *c = u + i * plane + (size_t)j * nz;
            const double *xm = i > 0 ? c - plane : face[XLO] + (size_t)j * nz;
            const double *xp = i < nx - 1 ? c + plane : face[XHI] + (size_t)j * nz;
            const double *ym = j > 0 ? c - nz : face[YLO] + (size_t)i * nz;
            const double *yp = j < ny - 1 ? c + nz : face[YHI] + (size_t)i * nz;
            double *o = v + i * plane + (size_t)j * nz;
            int k = k0, kmid = k1 < nz - 1 ? k1 : nz - 1;

            /* The two ends of the row read the z faces; the middle is a
             * branch-free loop the compiler can vectorise. */
            if (k == 0) {
                const double zm = face[ZLO][(size_t)i * ny + j];
                const double zr = nz > 1 ? c[1] : face[ZHI][(size_t)i * ny + j];
                o[0] = ((xm[0] + xp[0]) + (ym[0] + yp[0]) + (zm + zr)) * sixth;
                k = 1;
            }
            for (; k < kmid; k++)
                o[k] = ((xm[k] + xp[k]) + (ym[k] + yp[k]) + (c[k - 1] + c[k + 1])) * sixth;
            if (k1 == nz && nz > 1 && k == nz - 1) {
                const double zp = face[ZHI][(size_t)i * ny + j];
                o[nz - 1] = ((xm[nz - 1] + xp[nz - 1]) + (ym[nz - 1] + yp[nz - 1]) +
                             (c[nz - 2] + zp)) * sixth;
            }
            if (!out)
                continue;
            if (i == 0 && out[XLO])
                copy_row(out[XLO] + (size_t)j * nz, o, k0, k1);
            if (i == nx - 1 && out[XHI])
                copy_row(out[XHI] + (size_t)j * nz, o, k0, k1);
            if (j == 0 && out[YLO])
                copy_row(out[YLO] + (size_t)i * nz, o, k0, k1);
            if (j == ny - 1 && out[YHI])
                copy_row(out[YHI] + (size_t)i * nz, o, k0, k1);
            if (k0 == 0 && out[ZLO])
                out[ZLO][(size_t)i * ny + j] = o[0];
            if (k1 == nz && out[ZHI])
                out[ZHI][(size_t)i * ny + j] = o[nz - 1];
        }
    }
}

/* The block's interior box (no exchanged face read, none packed: the
 * cells of an exchanged face are next to it, so in the boundary layer). */
static void sweep_interior(const struct block *b, const double *const face[NFACES])
{
    sweep_box(b, b->u, b->v, face, NULL, b->lo, b->hi);
}

/* Everything outside the interior box, as up to six disjoint boxes: the x
 * slabs, then the y slabs between them, then the z ends of the rows left;
 * packing the next faces into out (may be NULL). */
static void sweep_boundary(const struct block *b, const double *const face[NFACES],
                           double *const *out)
{
    for (int d = 0; d < 3; d++) {
        int lo[3], hi[3];

        for (int e = 0; e < 3; e++) {
            lo[e] = e < d ? b->lo[e] : 0;
            hi[e] = e < d ? b->hi[e] : b->n[e];
        }
        hi[d] = b->lo[d];
        sweep_box(b, b->u, b->v, face, out, lo, hi);
        lo[d] = b->hi[d];
        hi[d] = b->n[d];
        sweep_box(b, b->u, b->v, face, out, lo, hi);
    }
}

/* Sum of the squared updates v - u over the block, row by row. */
static double residual(const struct block *b)
{
    const size_t cells = (size_t)b->n[0] * b->n[1] * b->n[2];
    double res = 0.0;

    for (size_t x = 0; x < cells; x++)
        res += (b->v[x] - b->u[x]) * (b->v[x] - b->u[x]);
    return res;
}

/* Faces of a block for the interior sweep: the fixed ones, NULL for those
 * still in flight (never read there). */
static void interior_faces(const struct block *b, const double *face[NFACES])
{
    for (int f = 0; f < NFACES; f++)
        face[f] = b->nb_rank[f] >= 0 ? NULL : b->bface[f];
}

/* ---- communication -------------------------------------------------------- */

/* Tag of the messages and wires for face f of block idx of the receiving
 * rank: unique between two ranks, since a rank's blocks are numbered. */
static int face_tag(int idx, int f)
{
    return idx * NFACES + f;
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

/* msg: posts the receives of iteration it: recv[it & 1] was last read by
 * the sweep of iteration it-2. */
static void msg_post(struct domain *dm, int it)
{
    const int p = it & 1;

    for (int bi = 0; bi < dm->L.nlocal; bi++) {
        struct block *b = &dm->blk[bi];

        for (int f = 0; f < NFACES; f++)
            if (b->nb_rank[f] >= 0)
                MPI_Irecv(b->recv[p][f], (int)b->fsize[f], MPI_DOUBLE, b->nb_rank[f],
                          face_tag(bi, f), MPI_COMM_WORLD, &dm->rreq[p][bi * NFACES + f]);
    }
}

/* msg: sends face f of block bi for iteration it, packed in pack[it & 1]. */
static void msg_send(struct domain *dm, int bi, int f, int it)
{
    struct block *b = &dm->blk[bi];
    const int p = it & 1;

    /* MPI's non-overtaking rule keeps consecutive iterations in order. */
    MPI_Isend(b->pack[p][f], (int)b->fsize[f], MPI_DOUBLE, b->nb_rank[f],
              face_tag(b->nb_idx[f], OPPOSITE(f)), MPI_COMM_WORLD,
              &dm->sreq[p][bi * NFACES + f]);
}

/* One more round of a wait loop on the neighbours (credit, a put's local
 * completion): progress, and after a while give the core away (with more
 * ranks than cores, the neighbour we wait for needs it), until the
 * timeout. *spins and *deadline start at 0. */
static void wait_round(dchan_ctx_t *ctx, unsigned *spins, double *deadline, const char *what)
{
    check_progress(dchan_progress(ctx), what);
    if (++*spins < 64)
        return;
    if (*spins == 64)
        *deadline = MPI_Wtime() + WAIT_TIMEOUT_MS / 1000.0;
    else if (MPI_Wtime() > *deadline)
        app_die(what);
    sched_yield();
}

/* pack: where to pack the next face on send channel sh: the neighbour's
 * slot itself where it is mapped here (shm with the slots from
 * dchan_alloc, or self; never under SENTINEL detection, whose tail written
 * in place would announce the face early), else sh's send buffer, which
 * dchan_put then copies into the slot. Without credit (the neighbour has
 * not handed the slot back yet) this drives progress until the credit
 * comes; see run()'s comment. */
static double *face_target(dchan_ctx_t *ctx, dchan_handle_t *sh)
{
    double deadline = 0.0;
    unsigned spins = 0;
    void *p;
    int rc;

    while ((rc = dchan_put_ptr(sh, &p)) == DCHAN_ERR_AGAIN)
        wait_round(ctx, &spins, &deadline,
                   "waiting for credit: a neighbour did not hand back its slot");
    if (rc != DCHAN_SUCCESS)
        app_die_dchan("dchan_put_ptr", rc);
    return p;
}

/* subarray: block bi's sweep is about to write arr[c] again, whose face
 * planes the puts on channel c read (the faces of two iterations ago):
 * wait until each of them completed locally. They almost always have:
 * see run()'s comment. */
static void sends_reusable(dchan_ctx_t *ctx, struct domain *dm, int bi, int c)
{
    struct block *b = &dm->blk[bi];

    for (int f = 0; f < NFACES; f++) {
        double deadline = 0.0;
        unsigned spins = 0;
        int rc;

        if (!b->sh[c][f])
            continue;
        while ((rc = dchan_put_test(b->sh[c][f])) == 0)
            wait_round(ctx, &spins, &deadline,
                       "waiting for a face's put to complete locally");
        if (rc < 0)
            app_die_dchan("dchan_put_test", rc);
    }
}

/* Where block bi packs its faces of iteration it (all faces with a
 * neighbour): msg's pack[it & 1], once the sends of iteration it-2 from
 * there are done; dchan pack's face_target; nowhere for dchan subarray
 * (out all NULL: the puts read the block array itself). */
static void pack_targets(dchan_ctx_t *ctx, struct domain *dm, int bi, int it,
                         double *out[NFACES])
{
    struct block *b = &dm->blk[bi];
    const int p = it & 1;

    if (dm->mode == MODE_MSG)
        MPI_Waitall(NFACES, &dm->sreq[p][bi * NFACES], MPI_STATUSES_IGNORE);
    for (int f = 0; f < NFACES; f++) {
        if (b->nb_rank[f] < 0)
            out[f] = NULL;
        else if (dm->mode == MODE_MSG)
            out[f] = b->pack[p][f];
        else if (dm->faces == FACES_PACK)
            out[f] = face_target(ctx, b->sh[0][f]);
        else
            out[f] = NULL;
    }
}

/* The channel that carries the faces of iteration it, and how many faces
 * it carried before them. */
static int chan_of(const struct domain *dm, int it)
{
    return dm->faces == FACES_PACK ? 0 : it & 1;
}

static int before_on_chan(const struct domain *dm, int it)
{
    return dm->faces == FACES_PACK ? it : it >> 1;
}

/* dchan_put, waiting for credit where there is none yet (subarray: the
 * credit is taken by the put itself; pack took it in face_target). */
static void put_face(dchan_ctx_t *ctx, dchan_handle_t *sh)
{
    double deadline = 0.0;
    unsigned spins = 0;
    int rc;

    while ((rc = dchan_put(sh)) == DCHAN_ERR_AGAIN)
        wait_round(ctx, &spins, &deadline,
                   "waiting for credit: a neighbour did not hand back its slot");
    if (rc != DCHAN_SUCCESS)
        app_die_dchan("dchan_put", rc);
}

/* Sends block bi's faces of iteration it (packed, or in arr[it & 1] for
 * subarray), faces to other ranks first (theirs is the longer way). */
static void send_faces(dchan_ctx_t *ctx, struct domain *dm, int bi, int it)
{
    struct block *b = &dm->blk[bi];
    const int c = chan_of(dm, it);

    for (int pass = 0; pass < 2; pass++)
        for (int f = 0; f < NFACES; f++) {
            if (b->nb_rank[f] < 0 || (b->nb_rank[f] == dm->me) != pass)
                continue;
            if (dm->mode == MODE_MSG)
                msg_send(dm, bi, f, it);
            else
                put_face(ctx, b->sh[c][f]);
        }
}

/* Whether a face of iteration it (counted from 0 since the channels were
 * created) is still missing on block b. */
static int faces_missing(const struct domain *dm, const struct block *b, int it)
{
    const int c = chan_of(dm, it), n = before_on_chan(dm, it);

    for (int f = 0; f < NFACES; f++)
        if (b->rh[c][f] && b->arrived[c][f] <= n)
            return 1;
    return 0;
}

/* Waits for block bi's faces of iteration it and says where they are. */
static void wait_faces(dchan_ctx_t *ctx, struct domain *dm, int bi, int it,
                       const double *face[NFACES])
{
    struct block *b = &dm->blk[bi];
    const int p = it & 1;
    int rc;

    switch (dm->mode) {
    case MODE_MSG:
        MPI_Waitall(NFACES, &dm->rreq[p][bi * NFACES], MPI_STATUSES_IGNORE);
        for (int f = 0; f < NFACES; f++)
            face[f] = b->nb_rank[f] >= 0 ? b->recv[p][f] : b->bface[f];
        break;
    case MODE_DCHAN:
        /* Callbacks (app_count_arrival) run only inside our dchan_wait and
         * dchan_progress calls. */
        while (faces_missing(dm, b, it))
            check_progress(dchan_wait(ctx, WAIT_TIMEOUT_MS), "waiting for neighbour faces");
        for (int f = 0; f < NFACES; f++) {
            dchan_handle_t *rh = b->rh[chan_of(dm, it)][f];
            void *slot;

            if (!rh) {
                face[f] = b->bface[f];
                continue;
            }
            if ((rc = dchan_slot(rh, &slot)) != DCHAN_SUCCESS)
                app_die_dchan("dchan_slot", rc);
            face[f] = slot;
        }
        break;
    default:
        for (int f = 0; f < NFACES; f++)
            face[f] = b->nb_rank[f] >= 0 ? b->recv[0][f] : b->bface[f];
        break;
    }
}

/* dchan: block bi is done with the slots of iteration it: hand them back. */
static void release_faces(struct domain *dm, int bi, int it)
{
    const int c = chan_of(dm, it);
    int rc;

    for (int f = 0; f < NFACES; f++)
        if (dm->blk[bi].rh[c][f] && (rc = dchan_ready(dm->blk[bi].rh[c][f])) != DCHAN_SUCCESS)
            app_die_dchan("dchan_ready", rc);
}

/*
 * Iterations [first, end) of iters; returns the squared update of the last
 * iteration (0 when it is not among these) and adds the time spent in the
 * exchange to dm->comm (in ticks()).
 *
 * The faces a block sends in iteration it are the planes next to its faces
 * of the values computed in iteration it-1, and those planes are computed
 * in the boundary sweep (they are next to an exchanged face). So the
 * boundary sweep of iteration it-1 packs them as it computes them
 * (sweep_box's out), and the block sends them right after its sweep; only
 * iteration 0 packs the initial values with pack_face. (dchan subarray
 * packs nothing: the puts gather the planes from the block array.) In
 * iteration it a rank
 *   - (msg) posts the receives of iteration it+1;
 *   - sweeps the interior of every block, which reads no exchanged face,
 *     while the faces of iteration it are in flight;
 *   - block by block (those with the most faces from other ranks first,
 *     so that their next faces leave early):
 *       waits for the block's faces of iteration it and finds where to
 *       pack its faces of iteration it+1: msg's pack buffer of that
 *       parity; dchan_put_ptr's target, the neighbour block's slot itself
 *       where it is mapped here, else the send buffer; (dchan subarray)
 *       makes sure the array the sweep writes is no longer read by a put;
 *       sweeps the block's boundary layer, packing;
 *       (dchan) hands the block's slots back (dchan_ready);
 *       sends: MPI_Isend, or dchan_put.
 * The exchange time is all of it but the sweeps (the fused pack is part of
 * the sweep; only iteration 0 packs apart).
 *
 * dchan: each face has one credited channel of depth 2: the receiver's
 * buffer holds two slots, the n-th put lands in slot n mod 2, and the
 * sender may put only into a slot that the receiver handed back. The
 * library enforces the credit, so a put never overwrites a slot the
 * receiver still reads. It almost never makes a rank wait: the face of
 * iteration it+1 goes into the slot that held iteration it-1's, and the
 * neighbour block handed that back before it put its face of iteration
 * it, which this block waited for just before. When dchan_put_ptr still
 * answers DCHAN_ERR_AGAIN (a credit written by the neighbour's transport
 * but not landed yet), face_target drives progress until it lands.
 * Per-face arrival counts tell iterations apart: a neighbour may already
 * have put its face of iteration it+1 into the other slot, while another's
 * face of iteration it is still on the way.
 *
 * dchan subarray: a send handle is bound to one array for good, and the
 * faces of iteration it are planes of arr[it & 1] (u in iteration it), so
 * each face has two channels of depth 1, channel c bound to arr[c] and
 * carrying the faces of the iterations of parity c; the same credit
 * argument holds per channel (the put of iteration it+2 on channel c
 * follows the neighbour's release of iteration it on it). Such a put reads
 * the array itself, on providers that complete it asynchronously (mpi:
 * an MPI_Isend of a datatype over the plane) after dchan_put returned, so
 * nothing may write those planes before the put completed locally. The
 * faces of iteration it+1, put from arr[(it+1) & 1] at the end of
 * iteration it, are read by iteration it+1's sweep (reading is harmless)
 * and next written by iteration it+2, which writes arr[(it+1) & 1] again:
 *   - its interior sweep writes no face plane (every sent plane lies next
 *     to an exchanged face, outside the interior box), so it overlaps the
 *     puts still in flight;
 *   - its boundary sweep of a block comes after the block's faces of
 *     iteration it+2 arrived; the neighbour sent each of them after it
 *     had received this block's face of iteration it+1 (the put in
 *     question), so that put has long landed, and sends_reusable's
 *     dchan_put_test, which makes it certain, costs one look per face.
 * The initial values (iteration 0's faces, put from arr[0]) are written
 * first by iteration 1, under the same rule.
 */
static double run(dchan_ctx_t *ctx, struct domain *dm, int first, int end, int iters)
{
    double res = 0.0, t;

    for (int it = first; it < end; it++) {
        const int more = it + 1 < iters; /* is there a next iteration to send for */
        const double *face[NFACES];
        double *out[NFACES];

        t = ticks();
        if (dm->mode == MODE_MSG) {
            if (it == 0)
                msg_post(dm, 0);
            if (more)
                msg_post(dm, it + 1);
        }
        if (it == 0 && dm->mode != MODE_NONE)
            for (int bi = 0; bi < dm->L.nlocal; bi++) {
                pack_targets(ctx, dm, bi, 0, out);
                for (int f = 0; f < NFACES; f++)
                    if (out[f])
                        pack_face(&dm->blk[bi], dm->blk[bi].u, f, out[f]);
                send_faces(ctx, dm, bi, 0);
            }
        if (dm->mode != MODE_NONE)
            dm->comm += ticks() - t;
        for (int bi = 0; bi < dm->L.nlocal; bi++) {
            interior_faces(&dm->blk[bi], face);
            sweep_interior(&dm->blk[bi], face);
        }
        for (int w = 0; w < dm->L.nlocal; w++) {
            const int bi = dm->wait_order[w];

            if (dm->mode == MODE_NONE) {
                wait_faces(ctx, dm, bi, it, face);
                sweep_boundary(&dm->blk[bi], face, NULL);
                continue;
            }
            t = ticks();
            wait_faces(ctx, dm, bi, it, face);
            if (more)
                pack_targets(ctx, dm, bi, it + 1, out);
            /* Also when nothing more is sent: the sweep writes the array. */
            if (dm->mode == MODE_DCHAN && dm->faces == FACES_SUBARRAY)
                sends_reusable(ctx, dm, bi, (it + 1) & 1);
            dm->comm += ticks() - t;
            sweep_boundary(&dm->blk[bi], face, more ? out : NULL);
            t = ticks();
            if (dm->mode == MODE_DCHAN)
                release_faces(dm, bi, it);
            if (more)
                send_faces(ctx, dm, bi, it + 1);
            dm->comm += ticks() - t;
        }
        if (it == iters - 1)
            for (int bi = 0; bi < dm->L.nlocal; bi++)
                res += residual(&dm->blk[bi]);
        for (int bi = 0; bi < dm->L.nlocal; bi++) {
            double *x = dm->blk[bi].u;
            dm->blk[bi].u = dm->blk[bi].v;
            dm->blk[bi].v = x;
        }
    }
    if (end == iters && dm->mode == MODE_MSG)
        MPI_Waitall(2 * dm->L.nlocal * NFACES, dm->sreq[0], MPI_STATUSES_IGNORE);
    return res;
}

/* Receive channels this rank takes from the peer that sends it most: each
 * needs a credit word on that peer. This rank's own channels count only
 * when DCHAN_PROVIDER names a provider, which then serves them too: the
 * self provider, which serves them otherwise, keeps as many words as they
 * need. */
static int most_channels_from_one_peer(const struct domain *dm, int nranks)
{
    int *count = calloc(nranks, sizeof *count), most = 0;
    const char *named = getenv("DCHAN_PROVIDER");
    const int count_own = named && *named;

    if (!count)
        app_die("out of memory");
    for (int bi = 0; bi < dm->L.nlocal; bi++)
        for (int f = 0; f < NFACES; f++)
            if (dm->blk[bi].nb_rank[f] >= 0 && (count_own || dm->blk[bi].nb_rank[f] != dm->me) &&
                (count[dm->blk[bi].nb_rank[f]] += dm->nchan) > most)
                most = count[dm->blk[bi].nb_rank[f]];
    free(count);
    return most;
}

/* The allocator of a face buffer: dchan_alloc for faces to and from other
 * ranks (under shm the neighbour maps them and packs straight into the
 * slots), the heap for self channels and in the other modes. */
static dchan_ctx_t *face_ctx(dchan_ctx_t *ctx, const struct domain *dm, const struct block *b,
                             int f)
{
    return b->nb_rank[f] == dm->me ? NULL : ctx;
}

/* subarray: the plane of the block array next to face f, as a subarray
 * in C order: the message is in pack_face's layout ([j][k], [i][k],
 * [i][j]), the layout of the neighbour's opposite face. */
static void face_subarray(const struct block *b, int f, size_t sizes[3], size_t sub[3],
                          size_t starts[3])
{
    const int d = f / 2;

    for (int e = 0; e < 3; e++) {
        sizes[e] = sub[e] = (size_t)b->n[e];
        starts[e] = 0;
    }
    sub[d] = 1;
    starts[d] = f & 1 ? (size_t)b->n[d] - 1 : 0;
}

/* Creates the channels and their buffers. Wires travel by MPI, once: one
 * message per face, holding its nchan wires. */
static void setup_channels(dchan_ctx_t *ctx, struct domain *dm)
{
    const int nc = dm->nchan, n = dm->L.nlocal * NFACES * nc;
    dchan_wire_t *mine = malloc(n * sizeof *mine), *theirs = malloc(n * sizeof *theirs);
    MPI_Request *req = malloc(2 * n * sizeof *req);
    dchan_handle_attr_t hattr;
    int nreq = 0, rc;

    if (!mine || !theirs || !req)
        app_die("out of memory");
    dchan_handle_attr_init(&hattr);
    hattr.credit = 1;
    /* subarray: one channel per array, each one slot deep (see run()). */
    hattr.depth = dm->faces == FACES_PACK ? DEPTH : 1;
    for (int bi = 0; bi < dm->L.nlocal; bi++) {
        struct block *b = &dm->blk[bi];

        for (int f = 0; f < NFACES; f++) {
            const int x = (bi * NFACES + f) * nc;

            if (b->nb_rank[f] < 0)
                continue;
            if (dm->faces == FACES_PACK)
                b->sbuf[f] = app_buf_alloc(face_ctx(ctx, dm, b, f), b->fsize[f]);
            for (int c = 0; c < nc; c++) {
                b->slots[c][f] = app_buf_alloc(face_ctx(ctx, dm, b, f),
                                               (size_t)hattr.depth * b->fsize[f]);
                /* A neighbour on this rank makes it a self channel. */
                rc = dchan_create_handle_attr(ctx, b->nb_rank[f], b->slots[c][f],
                                              b->fsize[f] * sizeof(double), SENTINEL_OOB,
                                              app_count_arrival, &b->arrived[c][f], &hattr,
                                              &b->rh[c][f]);
                if (rc == DCHAN_ERR_UNSUPPORTED)
                    app_die("dchan_create_handle_attr: the provider serving a neighbour offers "
                            "no credited channels, which dchan mode needs");
                if (rc == DCHAN_ERR_NO_MEMORY)
                    app_die("dchan_create_handle_attr: out of credit words; raise "
                            "DCHAN_CREDIT_WORDS to the channels a rank receives from one peer");
                if (rc == DCHAN_SUCCESS)
                    rc = dchan_handle_export(b->rh[c][f], &mine[x + c]);
                if (rc != DCHAN_SUCCESS)
                    app_die_dchan("dchan_create_handle_attr", rc);
            }
            MPI_Isend(&mine[x], (int)(nc * sizeof *mine), MPI_BYTE, b->nb_rank[f],
                      face_tag(bi, f), MPI_COMM_WORLD, &req[nreq++]);
            /* The wires of the neighbour's receive channels for the
             * opposite face: this block's face f goes there. */
            MPI_Irecv(&theirs[x], (int)(nc * sizeof *theirs), MPI_BYTE, b->nb_rank[f],
                      face_tag(b->nb_idx[f], OPPOSITE(f)), MPI_COMM_WORLD, &req[nreq++]);
        }
    }
    MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE);
    for (int bi = 0; bi < dm->L.nlocal; bi++) {
        struct block *b = &dm->blk[bi];

        for (int f = 0; f < NFACES; f++) {
            const int x = (bi * NFACES + f) * nc;

            if (b->nb_rank[f] < 0)
                continue;
            if (dm->faces == FACES_PACK) {
                rc = dchan_assoc_local(ctx, &theirs[x], b->sbuf[f],
                                       b->fsize[f] * sizeof(double), &b->sh[0][f]);
                if (rc != DCHAN_SUCCESS)
                    app_die_dchan("dchan_assoc_local", rc);
                continue;
            }
            size_t sizes[3], sub[3], starts[3];

            face_subarray(b, f, sizes, sub, starts);
            for (int c = 0; c < nc; c++) {
                rc = dchan_assoc_local_subarray(ctx, &theirs[x + c], b->arr[c], 3, sizes, sub,
                                                starts, sizeof(double), &b->sh[c][f]);
                if (rc != DCHAN_SUCCESS)
                    app_die_dchan("dchan_assoc_local_subarray", rc);
            }
        }
    }
    free(req);
    free(theirs);
    free(mine);
}

static void teardown_channels(dchan_ctx_t *ctx, struct domain *dm)
{
    /* Every put has arrived (each receiver waited for all of them), but the
     * senders' local completion may lag; then no handle or buffer may go
     * while a neighbour could still touch it, hence the barrier. */
    for (int bi = 0; bi < dm->L.nlocal; bi++)
        for (int c = 0; c < dm->nchan; c++)
            for (int f = 0; f < NFACES; f++)
                if (dm->blk[bi].sh[c][f])
                    app_wait_put_done(dm->blk[bi].sh[c][f]);
    app_barrier(ctx);
    for (int bi = 0; bi < dm->L.nlocal; bi++) {
        struct block *b = &dm->blk[bi];

        for (int f = 0; f < NFACES; f++) {
            for (int c = 0; c < dm->nchan; c++) {
                if (b->sh[c][f])
                    dchan_handle_destroy(b->sh[c][f]);
                if (b->rh[c][f])
                    dchan_handle_destroy(b->rh[c][f]);
                if (b->slots[c][f])
                    app_buf_free(face_ctx(ctx, dm, b, f), b->slots[c][f]);
            }
            if (b->sbuf[f])
                app_buf_free(face_ctx(ctx, dm, b, f), b->sbuf[f]);
        }
    }
}

/* This rank's blocks, their buffers (but dchan's), and the orders. */
static void domain_init(struct domain *dm, const struct layout *L, int me, int mode, int faces)
{
    const int nb = L->nlocal;

    memset(dm, 0, sizeof *dm);
    dm->L = *L;
    dm->me = me;
    dm->mode = mode;
    dm->faces = faces;
    dm->nchan = faces == FACES_PACK ? 1 : 2;
    dm->blk = calloc(nb, sizeof *dm->blk);
    dm->wait_order = malloc(nb * sizeof *dm->wait_order);
    /* One array for both parities' sends: run() waits for all at once. */
    dm->sreq[0] = malloc(2 * nb * NFACES * sizeof **dm->sreq);
    dm->rreq[0] = malloc(2 * nb * NFACES * sizeof **dm->rreq);
    if (!dm->blk || !dm->wait_order || !dm->sreq[0] || !dm->rreq[0])
        app_die("out of memory");
    dm->sreq[1] = dm->sreq[0] + nb * NFACES;
    dm->rreq[1] = dm->rreq[0] + nb * NFACES;
    for (int x = 0; x < 2 * nb * NFACES; x++)
        dm->sreq[0][x] = dm->rreq[0][x] = MPI_REQUEST_NULL;

    for (int bi = 0; bi < nb; bi++) {
        struct block *b = &dm->blk[bi];

        block_init(b, L, me, bi);
        for (int f = 0; f < NFACES; f++) {
            if (b->nb_rank[f] < 0) {
                b->bface[f] = app_xalloc(b->fsize[f]);
                fill_boundary_face(b, L->grid, f, b->bface[f]);
            } else if (mode == MODE_MSG) {
                for (int p = 0; p < 2; p++) {
                    b->pack[p][f] = app_xalloc(b->fsize[f]);
                    b->recv[p][f] = app_xalloc(b->fsize[f]);
                }
            } else if (mode == MODE_NONE) {
                b->recv[0][f] = app_xalloc(b->fsize[f]);
                memset(b->recv[0][f], 0, b->fsize[f] * sizeof(double));
            }
        }
    }
    for (int bi = 0; bi < nb; bi++) {
        const size_t cells = (size_t)dm->blk[bi].n[0] * dm->blk[bi].n[1] * dm->blk[bi].n[2];

        dm->blk[bi].u = app_xalloc(cells);
        dm->blk[bi].v = app_xalloc(cells);
        memset(dm->blk[bi].u, 0, cells * sizeof(double));
        memset(dm->blk[bi].v, 0, cells * sizeof(double));
        dm->blk[bi].arr[0] = dm->blk[bi].u;
        dm->blk[bi].arr[1] = dm->blk[bi].v;
    }
    /* Blocks by faces from other ranks, most first, stable. */
    int w = 0;
    for (int want = NFACES; want >= 0; want--)
        for (int bi = 0; bi < nb; bi++) {
            int remote = 0;

            for (int f = 0; f < NFACES; f++)
                remote += dm->blk[bi].nb_rank[f] >= 0 && dm->blk[bi].nb_rank[f] != me;
            if (remote == want)
                dm->wait_order[w++] = bi;
        }
}

static void domain_free(struct domain *dm)
{
    for (int bi = 0; bi < dm->L.nlocal; bi++) {
        struct block *b = &dm->blk[bi];

        for (int f = 0; f < NFACES; f++) {
            free(b->bface[f]);
            for (int p = 0; p < 2; p++) {
                free(b->pack[p][f]);
                free(b->recv[p][f]);
            }
        }
        free(b->u);
        free(b->v);
    }
    free(dm->blk);
    free(dm->wait_order);
    free(dm->rreq[0]);
    free(dm->sreq[0]);
}

/* ---- verification --------------------------------------------------------- */

/* Gathers the blocks on rank 0 and compares them with a serial run of the
 * same problem. Returns 1 if verified (on every rank), 0 if not. */
static int verify(const struct options *o, const struct domain *dm, int nranks,
                  double *maxdiff_out)
{
    const struct layout *L = &dm->L;
    const size_t total = (size_t)o->grid[0] * o->grid[1] * o->grid[2];
    size_t local = 0;
    int *counts = NULL, *displs = NULL, ok = 0;
    double *all = NULL, *mine, maxdiff = 0.0;

    /* This rank's blocks one after the other, in their order. */
    for (int bi = 0; bi < L->nlocal; bi++)
        local += (size_t)dm->blk[bi].n[0] * dm->blk[bi].n[1] * dm->blk[bi].n[2];
    mine = app_xalloc(local);
    for (size_t at = 0, bi = 0; bi < (size_t)L->nlocal; bi++) {
        const struct block *b = &dm->blk[bi];
        const size_t cells = (size_t)b->n[0] * b->n[1] * b->n[2];

        memcpy(mine + at, b->u, cells * sizeof(double));
        at += cells;
    }
    if (app_rank == 0) {
        counts = calloc(nranks, sizeof *counts);
        displs = malloc(nranks * sizeof *displs);
        all = app_xalloc(total);
        if (!counts || !displs)
            app_die("out of memory");
        size_t at = 0;
        for (int r = 0; r < nranks; r++) {
            displs[r] = (int)at;
            for (int bi = 0; bi < L->nlocal; bi++) {
                struct block rb;
                block_init(&rb, L, r, bi);
                counts[r] += rb.n[0] * rb.n[1] * rb.n[2];
            }
            at += counts[r];
        }
    }
    MPI_Gatherv(mine, (int)local, MPI_DOUBLE, all, counts, displs, MPI_DOUBLE, 0, MPI_COMM_WORLD);

    if (app_rank == 0) {
        /* The serial reference: one block covering the whole grid. */
        struct layout one;
        struct block g;
        double *s = app_xalloc(total), *t = app_xalloc(total), *bface[NFACES];
        const double *face[NFACES];
        const int ones[3] = { 1, 1, 1 };

        layout_init(&one, o->grid, ones, 1);
        block_init(&g, &one, 0, 0);
        for (int f = 0; f < NFACES; f++) {
            bface[f] = app_xalloc(g.fsize[f]);
            fill_boundary_face(&g, o->grid, f, bface[f]);
            face[f] = bface[f];
        }
        memset(s, 0, total * sizeof *s);
        for (int it = 0; it < o->c.iters; it++) {
            sweep_box(&g, s, t, face, NULL, g.lo, g.hi);
            double *x = s;
            s = t;
            t = x;
        }
        for (int r = 0; r < nranks; r++) {
            const double *blk = all + displs[r];

            for (int bi = 0; bi < L->nlocal; bi++) {
                struct block rb;

                block_init(&rb, L, r, bi);
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
                blk += (size_t)rb.n[0] * rb.n[1] * rb.n[2];
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
    free(mine);
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
            "  --blocks B          blocks per rank (default 1); each rank's part is split\n"
            "                      into BX*BY*BZ = B blocks, chosen to cut the least face\n"
            "                      area with at least one unknown per block along each\n"
            "                      axis, and every block exchanges its faces with its\n"
            "                      neighbour blocks, on this rank or another\n"
            "  --iters N           Jacobi iterations (default 100)\n"
            "  --mode msg|dchan|none\n"
            "                      face exchange: MPI_Isend/MPI_Irecv, dchan channels, or\n"
            "                      none at all (the compute floor; not verified)\n"
            "                      (default dchan)\n"
            "  --modes LIST        run several modes side by side in this one process, each\n"
            "                      on its own copy of the grid: LIST is a comma list of\n"
            "                      msg, dchan and none (each once), and replaces --mode;\n"
            "                      the timed iterations are split into --rounds turns, and\n"
            "                      in each round every mode runs its turn (the order\n"
            "                      rotated from round to round), so that the modes meet\n"
            "                      the same machine; one RESULT line per mode, in LIST's\n"
            "                      order, each with rounds=R\n"
            "  --rounds R          with --modes: turns per mode (default 5, at most the\n"
            "                      timed iterations)\n"
            "  --faces subarray|pack\n"
            "                      how dchan mode sends a face: subarray (default): no\n"
            "                      packing, each face's send side is the plane of the block\n"
            "                      array next to it (dchan_assoc_local_subarray), gathered\n"
            "                      by the library at each put, two channels of depth 1 per\n"
            "                      face (one per array of the u/v pair); pack: one channel\n"
            "                      of depth 2 per face, the sweep packs the face straight\n"
            "                      into the neighbour's slot where it is mapped here\n"
            "                      (dchan_put_ptr), else into the send buffer\n"
            "  --verify            compare with a serial run on rank 0 (gathered grid); the\n"
            "                      results must agree exactly; exit 1 if they do not\n"
            "  --detect auto|sentinel|flag|event\n"
            "                      dchan arrival detection (default: DCHAN_DETECT, else auto)\n"
            "  --help              this text\n"
            "Solves the Laplace equation with fixed boundary values by Jacobi sweeps,\n"
            "starting from zero; each block's interior is swept while its faces are in\n"
            "flight. The last line on stdout is a RESULT line: iter_time_s is the mean\n"
            "time of one iteration on the slowest rank (the first iteration, which pays\n"
            "for first contact, is not timed); comm_share is the part of the iteration\n"
            "spent in the calls of the face exchange, the sweeps (which pack) excluded\n"
            "(mean over the ranks);\n"
            "residual is the 2-norm of the last iteration's update over the whole grid,\n"
            "sqrt(sum (u_new - u_old)^2).\n");
}

/* --modes: 0, or -1 for a name it does not know or one named twice. */
static int parse_modes(const char *list, struct options *o)
{
    static const struct { const char *name; int mode; } known[] = {
        { "msg", MODE_MSG }, { "dchan", MODE_DCHAN }, { "none", MODE_NONE }
    };
    const char *p = list;

    o->nmodes = 0;
    for (;;) {
        size_t len = strcspn(p, ",");
        int m = -1;

        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            if (strlen(known[k].name) == len && !strncmp(p, known[k].name, len))
                m = known[k].mode;
        if (m < 0 || o->nmodes == 3)
            return -1;
        for (int i = 0; i < o->nmodes; i++)
            if (o->modes[i] == m)
                return -1;
        o->modes[o->nmodes++] = m;
        if (!p[len])
            return 0;
        p += len + 1;
    }
}

/* Returns 0 to run, 1 for --help, -1 for an error (message printed on rank 0). */
static int parse_args(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        { "grid", required_argument, NULL, 'g' },  { "procs", required_argument, NULL, 'p' },
        { "iters", required_argument, NULL, 'i' }, { "mode", required_argument, NULL, 'm' },
        { "verify", no_argument, NULL, 'v' },      { "detect", required_argument, NULL, 'd' },
        { "blocks", required_argument, NULL, 'b' }, { "help", no_argument, NULL, 'h' },
        { "faces", required_argument, NULL, 'f' }, { "modes", required_argument, NULL, 'M' },
        { "rounds", required_argument, NULL, 'r' }, { NULL, 0, NULL, 0 }
    };
    int c;

    *o = (struct options){ .grid = { 64, 64, 64 }, .blocks = 1, .faces = FACES_SUBARRAY,
                           .c = { .iters = 100, .mode = MODE_DCHAN, .detect = -1,
                                  .none_ok = 1 } };
    int rounds = 0; /* not given */
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        const char *bad = NULL;

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
            if (app_parse_positive(optarg, &o->blocks))
                bad = "--blocks wants a positive integer";
            break;
        case 'M':
            if (parse_modes(optarg, o))
                bad = "--modes wants a comma list of msg, dchan and none, each at most once";
            break;
        case 'r':
            if (app_parse_positive(optarg, &rounds))
                bad = "--rounds wants a positive integer";
            break;
        case 'f':
            if (!strcmp(optarg, "subarray"))
                o->faces = FACES_SUBARRAY;
            else if (!strcmp(optarg, "pack"))
                o->faces = FACES_PACK;
            else
                bad = "--faces wants subarray or pack";
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
    /* Iteration 0 is not timed when there are more (see main). */
    const int timed = o->c.iters > 1 ? o->c.iters - 1 : 1;
    const char *bad = NULL;
    o->modes_given = o->nmodes > 0;
    if (rounds && !o->modes_given)
        bad = "--rounds goes with --modes";
    else if (rounds > timed)
        bad = "--rounds: more rounds than timed iterations (--iters less one)";
    if (bad) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d: %s\n", bad);
        return -1;
    }
    if (o->modes_given) {
        o->rounds = rounds ? rounds : (timed < 5 ? timed : 5);
    } else {
        o->modes[0] = o->c.mode;
        o->nmodes = o->rounds = 1;
    }
    return 0;
}

static int check_decomposition(struct options *o, int nranks, struct layout *L)
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
    if (layout_init(L, o->grid, o->procs, o->blocks)) {
        if (app_rank == 0)
            fprintf(stderr,
                    "jacobi3d: --blocks %d: no split of each rank's part (grid %d,%d,%d over "
                    "procs %d,%d,%d) into %d blocks leaves every block at least one unknown "
                    "along each axis\n",
                    o->blocks, o->grid[0], o->grid[1], o->grid[2], o->procs[0], o->procs[1],
                    o->procs[2], o->blocks);
        return -1;
    }
    /* Message and wire tags number a rank's block faces. */
    int *tag_ub, flag;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
    if (flag && (long long)o->blocks * NFACES - 1 > *tag_ub) {
        if (app_rank == 0)
            fprintf(stderr, "jacobi3d: --blocks %d: more block faces than MPI tags (%d)\n",
                    o->blocks, *tag_ub);
        return -1;
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
    struct layout L;
    struct domain dm[3], *dchan_dm = NULL;
    dchan_ctx_t *ctx = NULL;
    const char *dchan_provider = "dchan";
    int nranks, rc, failed = 0;

    app_name = "jacobi3d";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &app_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    /* Every rank parses the same arguments and reaches the same verdict. */
    rc = parse_args(argc, argv, &o);
    if (rc == 0)
        rc = check_decomposition(&o, nranks, &L);
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }

    /* One domain per mode run (--modes: several side by side, each with
     * its own copy of the grid, channels and requests). */
    for (int m = 0; m < o.nmodes; m++)
        domain_init(&dm[m], &L, app_rank, o.modes[m], o.faces);
    /* dchan mode: the context first; setup_channels() takes the faces'
     * buffers from it (dchan_alloc), so that neighbours on the host write
     * them directly. Every receive channel holds a credit word on its
     * sender: with many blocks and a provider named for every peer, one
     * peer (this rank itself, mostly) may send more channels than dchan's
     * default allows, so raise the limit unless the environment set it. */
    for (int m = 0; m < o.nmodes; m++) {
        if (o.modes[m] != MODE_DCHAN)
            continue;
        int need = most_channels_from_one_peer(&dm[m], nranks), most;

        MPI_Allreduce(&need, &most, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (most > CREDIT_WORDS_DEFAULT && !getenv("DCHAN_CREDIT_WORDS")) {
            char val[16];
            snprintf(val, sizeof val, "%d", most);
            setenv("DCHAN_CREDIT_WORDS", val, 1);
        }
        ctx = app_dchan_init(&o.c);
        dchan_provider = dchan_provider_name(ctx);
        setup_channels(ctx, &dm[m]);
        dchan_dm = &dm[m];
    }
    if (app_rank == 0) {
        char how[128] = "", blocks[128] = "", modes[64] = "";
        if (dchan_dm) {
            int d = -1;
            /* That of a channel from another rank where there is one. */
            for (int pass = 0; pass < 2 && d < 0; pass++)
                for (int bi = 0; bi < L.nlocal && d < 0; bi++)
                    for (int f = 0; f < NFACES && d < 0; f++)
                        if (dchan_dm->blk[bi].rh[0][f] &&
                            (pass || dchan_dm->blk[bi].nb_rank[f] != app_rank))
                            d = dchan_handle_detect(dchan_dm->blk[bi].rh[0][f]);
            snprintf(how, sizeof how, ", provider %s, detection %s, faces %s", dchan_provider,
                     d >= 0 ? app_detect_name(d) : "none (no neighbours)",
                     o.faces == FACES_PACK ? "packed" : "gathered from the block (subarray)");
        }
        if (o.blocks > 1)
            snprintf(blocks, sizeof blocks, ", %d blocks per rank (%d,%d,%d; %d,%d,%d in all)",
                     o.blocks, L.bpr[0], L.bpr[1], L.bpr[2], L.nblk[0], L.nblk[1], L.nblk[2]);
        for (int m = 0; m < o.nmodes; m++)
            snprintf(modes + strlen(modes), sizeof modes - strlen(modes), "%s%s", m ? "," : "",
                     app_mode_name(o.modes[m]));
        /* One write, so that the line stays whole in mpirun's output. */
        fprintf(stderr,
                "jacobi3d: grid %d,%d,%d on %d ranks (%d,%d,%d)%s, %d iterations, mode%s %s%s%s\n",
                o.grid[0], o.grid[1], o.grid[2], nranks, o.procs[0], o.procs[1], o.procs[2],
                blocks, o.c.iters, o.nmodes > 1 ? "s" : "", modes,
                o.nmodes > 1 ? " side by side, turns in rounds" : "", how);
    }

    /* Iteration 0 is not timed when there are more: it pays for first
     * contact (connections, first touch of buffers) in either mode. The
     * timed iterations [untimed, iters) go in o.rounds turns per mode; in
     * round r the modes take their turns from the (r mod nmodes)-th on, so
     * that none always follows the same one. A barrier starts each turn. */
    const int untimed = o.c.iters > 1;
    double res[3] = { 0.0 }, elapsed[3] = { 0.0 }, busy[3] = { 0.0 }, comm[3] = { 0.0 };
    for (int m = 0; m < o.nmodes && untimed; m++)
        res[m] += run(ctx, &dm[m], 0, 1, o.c.iters);
    for (int r = 0; r < o.rounds; r++) {
        const int timed = o.c.iters - untimed;
        const int first = untimed + (int)((long)timed * r / o.rounds);
        const int end = untimed + (int)((long)timed * (r + 1) / o.rounds);

        for (int k = 0; k < o.nmodes; k++) {
            const int m = (r + k) % o.nmodes;

            app_barrier(ctx); /* NULL outside dchan mode: MPI_Barrier */
            dm[m].comm = 0.0;
            double t0 = MPI_Wtime(), k0 = ticks();
            res[m] += run(ctx, &dm[m], first, end, o.c.iters);
            elapsed[m] += MPI_Wtime() - t0;
            busy[m] += ticks() - k0;
            comm[m] += dm[m].comm;
        }
    }
    for (int m = 0; m < o.nmodes; m++) {
        const int mode = o.modes[m];
        const double share = busy[m] > 0.0 ? comm[m] / busy[m] : 0.0;
        double slowest, sum_res, sum_share;

        MPI_Reduce(&elapsed[m], &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(&share, &sum_share, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        MPI_Allreduce(&res[m], &sum_res, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

        const char *verified = "skipped";
        double maxdiff = 0.0;
        if (o.c.verify && mode == MODE_NONE) {
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d: --mode none exchanges no faces: not verified\n");
        } else if (o.c.verify) {
            int ok = verify(&o, &dm[m], nranks, &maxdiff);
            verified = ok ? "yes" : "no";
            failed |= !ok;
            if (app_rank == 0)
                fprintf(stderr, "jacobi3d: %s%slargest difference from the serial run: %.3e (%s)\n",
                        o.modes_given ? app_mode_name(mode) : "", o.modes_given ? ": " : "",
                        maxdiff, ok ? "verified" : "NOT verified");
        }
        if (app_rank == 0) {
            char extra[64] = "";
            /* blocks= only where it is not 1, faces= only where it is not
             * the default, rounds= only with --modes, so that the line of
             * a run with --faces pack (or not in dchan mode) stays the
             * Fortran driver's. */
            if (o.blocks > 1)
                snprintf(extra, sizeof extra, " blocks=%d", o.blocks);
            if (mode == MODE_DCHAN && o.faces == FACES_PACK)
                strcat(extra, " faces=pack");
            printf("RESULT app=jacobi3d provider=%s mode=%s ranks=%d grid=%d,%d,%d procs=%d,%d,%d%s "
                   "iters=%d iter_time_s=%.6e comm_share=%.3f residual=%.6e verified=%s",
                   mode == MODE_DCHAN ? dchan_provider : mode == MODE_NONE ? "none" : "mpi",
                   app_mode_name(mode), nranks, o.grid[0], o.grid[1], o.grid[2], o.procs[0],
                   o.procs[1], o.procs[2], extra, o.c.iters,
                   slowest / (o.c.iters - untimed), sum_share / nranks, sqrt(sum_res), verified);
            if (o.modes_given)
                printf(" rounds=%d", o.rounds);
            printf("\n");
            fflush(stdout);
        }
    }

    if (ctx) {
        teardown_channels(ctx, dchan_dm);
        if ((rc = dchan_finalize(ctx)) != DCHAN_SUCCESS)
            fprintf(stderr, "jacobi3d: rank %d: dchan_finalize: %s\n", app_rank,
                    dchan_strerror(rc));
    }
    for (int m = 0; m < o.nmodes; m++)
        domain_free(&dm[m]);
    MPI_Finalize();
    return failed;
}
