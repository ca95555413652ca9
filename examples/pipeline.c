/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A pipeline built on get channels: the consumer pulls each block when it
 * is ready for it, instead of the producer pushing it.
 *
 *   mpirun -np N ./pipeline [doubles per block] [steps]
 *
 * The ranks form a ring of stages. Rank 0 produces a block each step;
 * rank 1 pulls it, transforms it and publishes its result for rank 2, and
 * so on; rank 0 pulls what the last rank published and checks it against
 * the same chain of transformations computed locally. With one rank, rank
 * 0 pulls from itself (the self provider); on one host ranks use shm, and
 * the mpi provider (DCHAN_PROVIDER=mpi) emulates get with messages. The
 * ofi and verbs providers offer no get in this version.
 *
 * Each stage owns two buffers:
 *   out  its source buffer: dchan_create_source() publishes it for the next
 *        rank. Publishing is a promise not to touch it until the next rank
 *        took that version: the library runs done_fn then, and the stage
 *        may write the next version and publish it with dchan_ready().
 *   in   where it pulls the previous rank's block: dchan_assoc_remote()
 *        binds it to that rank's source, dchan_get() starts the read (or
 *        says DCHAN_ERR_AGAIN: nothing new published yet), and arrival_fn
 *        runs when the block is in `in`. A get handle needs no re-arm.
 * Nobody waits for anybody except for data: a stage is at most one block
 * ahead of the next (its source holds one version), and the ring never
 * holds more than one block per stage.
 *
 * A source publishes its buffer's contents at creation, so a stage creates
 * its source once its first block is ready: rank 0 after producing block
 * 0, the others after transforming the block 0 they pulled. The wires
 * (128 bytes each) travel by MPI, once, along the ring.
 *
 * Prints a RESULT line; exits 1 if any block came out wrong.
 */
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dchan.h>

/* What a stage knows; the callbacks get a pointer to it. */
struct stage {
    dchan_ctx_t *ctx;
    int rank, nranks;
    size_t n;              /* doubles per block */
    double *in, *out;      /* pulled from the previous rank, published for the next */
    dchan_handle_t *src;   /* source: out, for rank + 1 */
    dchan_handle_t *get;   /* getter: in, from rank - 1's source */
    int out_free;          /* done_fn ran: the next rank took the version in out */
    int in_full;           /* arrival_fn ran: a block is in `in`, not yet used */
    long produced, pulled; /* steps published from out, and pulled into in */
};

/* Block s of the producer: distinct in every element and every step. */
static double produce(long s, size_t i)
{
    return (double)s * 1000.0 + (double)i * 0.25;
}

/* Stage r's transformation of one element: exact in doubles (small
 * integers times powers of two), and different for every stage, so that a
 * stage skipped, repeated or taken from the wrong step shows. */
static double transform(int r, double x)
{
    return x * 2.0 + (double)r;
}

/* done_fn of the source: the next rank took the version in out. Only a
 * flag here; the main loop writes the next version (a callback may also
 * do it itself and call dchan_ready, see dchan_create_source(3)). */
static void taken(dchan_handle_t *h, void *arg)
{
    struct stage *st = arg;
    (void)h;
    st->out_free = 1;
}

/* arrival_fn of the getter: a block is in `in`. */
static void arrived(dchan_handle_t *h, void *arg)
{
    struct stage *st = arg;
    (void)h;
    st->in_full = 1;
    st->pulled++;
}

static void die(struct stage *st, const char *what, int rc)
{
    fprintf(stderr, "pipeline: rank %d: %s: %s\n", st->rank, what, dchan_strerror(rc));
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/*
 * One round of the loop: ask for the next block if `in` is free (a
 * DCHAN_ERR_AGAIN means the previous rank has not published it yet: ask
 * again next round), and run the callbacks of whatever completed. This
 * example spins (yielding the core when nothing happened); see
 * dchan_wakeup_fd(3) for sleeping instead, and what wakes a sleeper.
 */
static void poll_once(struct stage *st)
{
    int rc;

    if (!st->in_full && st->get) {
        rc = dchan_get(st->get);
        if (rc != DCHAN_SUCCESS && rc != DCHAN_ERR_AGAIN)
            die(st, "dchan_get", rc);
    }
    rc = dchan_progress(st->ctx);
    if (rc < 0)
        die(st, "dchan_progress", rc);
    if (rc == 0)
        sched_yield(); /* nothing happened: let a rank sharing this core run */
}

/* Makes the source for rank + 1 from out (its first version) and sends
 * its wire there; the send completes when rank + 1 posted its receive. */
static void publish_first(struct stage *st, MPI_Request *req, dchan_wire_t *wire)
{
    int rc = dchan_create_source(st->ctx, (st->rank + 1) % st->nranks, st->out,
                                 st->n * sizeof(double), taken, st, &st->src);
    if (rc == DCHAN_SUCCESS)
        rc = dchan_handle_export(st->src, wire);
    if (rc != DCHAN_SUCCESS)
        die(st, "dchan_create_source (get needs the self, shm or mpi provider)", rc);
    st->produced = 1;
    MPI_Isend(wire, sizeof *wire, MPI_BYTE, (st->rank + 1) % st->nranks, 0, MPI_COMM_WORLD, req);
}

/* Binds `in` to the source of rank - 1, whose wire is `wire`. */
static void bind_input(struct stage *st, const dchan_wire_t *wire)
{
    int rc = dchan_assoc_remote(st->ctx, wire, st->in, st->n * sizeof(double), arrived, st,
                                &st->get);
    if (rc != DCHAN_SUCCESS)
        die(st, "dchan_assoc_remote", rc);
}

int main(int argc, char **argv)
{
    struct stage st = {0};
    long steps;
    long bad = 0;
    int rank, nranks, rc;
    dchan_attr_t attr;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    st.rank = rank;
    st.nranks = nranks;
    st.n = argc > 1 ? strtoul(argv[1], NULL, 0) : 1000;
    steps = argc > 2 ? atol(argv[2]) : 200;
    if (st.n < 1 || steps < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N %s [doubles per block >= 1] [steps >= 1]\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }
    dchan_attr_init(&attr);
    if ((rc = dchan_init(&attr, &st.ctx)) != DCHAN_SUCCESS)
        die(&st, "dchan_init", rc);
    /* From dchan_alloc: under shm the peers read them without a system
     * call (elsewhere it is plain memory). */
    if ((rc = dchan_alloc(st.ctx, st.n * sizeof(double), (void **)&st.in)) != DCHAN_SUCCESS ||
        (rc = dchan_alloc(st.ctx, st.n * sizeof(double), (void **)&st.out)) != DCHAN_SUCCESS)
        die(&st, "dchan_alloc", rc);

    /* ---- setup, along the ring ---- */
    dchan_wire_t my_wire, prev_wire;
    MPI_Request send_req, recv_req;
    const int prev = (rank + nranks - 1) % nranks;

    if (rank == 0) {
        /* Block 0, published; then wait for the last stage's wire while
         * serving our source (on mpi a get needs the source's progress). */
        MPI_Irecv(&prev_wire, sizeof prev_wire, MPI_BYTE, prev, 0, MPI_COMM_WORLD, &recv_req);
        for (size_t i = 0; i < st.n; i++)
            st.out[i] = produce(0, i);
        publish_first(&st, &send_req, &my_wire);
        for (int flag = 0; !flag;) {
            MPI_Test(&recv_req, &flag, MPI_STATUS_IGNORE);
            poll_once(&st);
        }
        bind_input(&st, &prev_wire);
    } else {
        /* Nothing to serve yet: a plain receive of the wire will do. */
        MPI_Recv(&prev_wire, sizeof prev_wire, MPI_BYTE, prev, 0, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
        bind_input(&st, &prev_wire);
        while (!st.in_full)
            poll_once(&st); /* pulls block 0 */
        for (size_t i = 0; i < st.n; i++)
            st.out[i] = transform(rank, st.in[i]);
        st.in_full = 0; /* `in` may take the next block */
        publish_first(&st, &send_req, &my_wire);
    }

    /* ---- the pipeline ---- */
    double t0 = MPI_Wtime();
    for (;;) {
        /* The next rank took our last version: write the next one, if we
         * have what it is made of, and publish it. */
        if (st.out_free && st.produced < steps && (rank == 0 || st.in_full)) {
            if (rank == 0) {
                for (size_t i = 0; i < st.n; i++)
                    st.out[i] = produce(st.produced, i);
            } else {
                for (size_t i = 0; i < st.n; i++)
                    st.out[i] = transform(rank, st.in[i]);
                st.in_full = 0; /* `in` may take the next block */
            }
            st.out_free = 0;
            if ((rc = dchan_ready(st.src)) != DCHAN_SUCCESS)
                die(&st, "dchan_ready (publish)", rc);
            st.produced++;
        }
        /* Rank 0 checks what came round the ring: block s of the
         * producer, through every stage in order. */
        if (rank == 0 && st.in_full) {
            const long s = st.pulled - 1;
            for (size_t i = 0; i < st.n; i++) {
                double want = produce(s, i);
                for (int r = 1; r < nranks; r++)
                    want = transform(r, want);
                if (st.in[i] != want && bad++ < 5)
                    fprintf(stderr, "pipeline: step %ld element %zu: %.17g, expected %.17g\n", s,
                            i, st.in[i], want);
            }
            st.in_full = 0;
        }
        /* Done when every step went through here and our last version was
         * taken (destroying a source whose version is still wanted would
         * fail the next rank's get with DCHAN_ERR_PEER). */
        if (st.pulled == steps && !st.in_full && st.produced == steps && st.out_free)
            break;
        poll_once(&st);
    }
    double elapsed = MPI_Wtime() - t0;

    /* ---- teardown ---- */
    MPI_Wait(&send_req, MPI_STATUS_IGNORE);
    if (rank == 0)
        MPI_Wait(&recv_req, MPI_STATUS_IGNORE);
    /* Every get finished before a source goes. dchan's barrier, not
     * MPI's: a neighbour's last get may still need this rank's progress
     * (a source answers gets from its progress on some fabrics). */
    if ((rc = dchan_barrier(st.ctx)) != DCHAN_SUCCESS)
        die(&st, "dchan_barrier", rc);
    dchan_handle_destroy(st.get);
    dchan_handle_destroy(st.src);
    long all_bad = 0;
    MPI_Allreduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        fprintf(stderr, "pipeline: %ld blocks of %zu doubles through %d stages over %s, "
                        "%.2f us per block\n",
                steps, st.n, nranks, dchan_provider_name(st.ctx), elapsed / steps * 1e6);
        printf("RESULT app=pipeline provider=%s mode=dchan ranks=%d doubles=%zu steps=%ld "
               "us_per_block=%.3f verified=%s\n",
               dchan_provider_name(st.ctx), nranks, st.n, steps, elapsed / steps * 1e6,
               all_bad ? "no" : "yes");
    }
    dchan_free(st.ctx, st.in);
    dchan_free(st.ctx, st.out);
    dchan_finalize(st.ctx);
    MPI_Finalize();
    return all_bad ? 1 : 0;
}
