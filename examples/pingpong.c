/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A two-rank exchange with dchan: each rank publishes one receive buffer,
 * the ranks ping-pong a message through them, every arrival is checked,
 * and the same exchange is timed with MPI_Send/MPI_Recv for comparison.
 *
 *   mpirun -np 2 ./pingpong [bytes] [iterations]
 *
 * The re-arm contract holds by construction: a rank puts only after it got
 * the peer's reply, which the peer sends after re-arming its buffer.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dchan.h>

static volatile int arrived;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    arrived = 1;
}

static void fill(unsigned char *b, size_t n, int rank, int iter)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(rank * 131 + iter * 7 + i);
}

static int check(const unsigned char *b, size_t n, int rank, int iter)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(rank * 131 + iter * 7 + i))
            return 0;
    return 1;
}

static int wait_arrival(dchan_ctx_t *ctx)
{
    while (!arrived) {
        int rc = dchan_wait(ctx, 10000);
        if (rc < 0) {
            fprintf(stderr, "dchan_wait: %s\n", dchan_strerror(rc));
            return rc;
        }
    }
    arrived = 0;
    return 0;
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoul(argv[1], NULL, 0) : 4096;
    int iters = argc > 2 ? atoi(argv[2]) : 2000, rank, nranks, bad = 0;
    dchan_ctx_t *ctx;
    dchan_handle_t *rh, *sh;
    dchan_wire_t mine, theirs;
    dchan_attr_t attr;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2 || size < 8 || iters < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 %s [bytes >= 8] [iterations >= 1]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    size = (size + 7) & ~(size_t)7; /* sentinel mode needs a multiple of 8 */
    int peer = 1 - rank;
    unsigned char *rbuf = aligned_alloc(64, size), *sbuf = aligned_alloc(64, size);

    dchan_attr_init(&attr);
    int rc = dchan_init(&attr, &ctx);
    if (rc != DCHAN_SUCCESS) {
        fprintf(stderr, "dchan_init: %s\n", dchan_strerror(rc));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Receiver side: publish the buffer, send its wire form to the peer. */
    rc = dchan_create_handle(ctx, peer, rbuf, size, 0xdeadbeefcafef00dull, on_arrival, NULL, &rh);
    if (rc == DCHAN_SUCCESS)
        rc = dchan_handle_export(rh, &mine);
    MPI_Sendrecv(&mine, sizeof mine, MPI_BYTE, peer, 0, &theirs, sizeof theirs, MPI_BYTE, peer, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    /* Sender side: bind the send buffer to the peer's receive buffer. */
    if (rc == DCHAN_SUCCESS)
        rc = dchan_assoc_local(ctx, &theirs, sbuf, size, &sh);
    if (rc != DCHAN_SUCCESS) {
        fprintf(stderr, "rank %d: channel setup: %s\n", rank, dchan_strerror(rc));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    double t0 = MPI_Wtime();
    for (int i = 0; i < iters && !bad; i++) {
        if (rank == 0) {
            fill(sbuf, size, rank, i);
            if ((rc = dchan_put(sh)) || (rc = wait_arrival(ctx)))
                break;
            bad |= !check(rbuf, size, peer, i);
            dchan_ready(rh);
        } else {
            if ((rc = wait_arrival(ctx)))
                break;
            bad |= !check(rbuf, size, peer, i);
            dchan_ready(rh); /* re-arm before replying: the contract */
            fill(sbuf, size, rank, i);
            if ((rc = dchan_put(sh)))
                break;
        }
    }
    double t_dchan = (MPI_Wtime() - t0) / iters / 2;

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = MPI_Wtime();
    for (int i = 0; i < iters && !bad && !rc; i++) {
        if (rank == 0) {
            fill(sbuf, size, rank, i);
            MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            fill(sbuf, size, rank, i);
            MPI_Send(sbuf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        }
        bad |= !check(rbuf, size, peer, i);
    }
    double t_mpi = (MPI_Wtime() - t0) / iters / 2;

    int all_bad = 0;
    MPI_Allreduce(&bad, &all_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (rank == 0) {
        fprintf(stderr, "dchan over %s (%s detection): %.2f us one way; MPI_Send/Recv: %.2f us\n",
                dchan_provider_name(ctx), dchan_handle_detect(rh) == DCHAN_DETECT_EVENT ? "event"
                : dchan_handle_detect(rh) == DCHAN_DETECT_FLAG ? "flag" : "sentinel",
                t_dchan * 1e6, t_mpi * 1e6);
        printf("RESULT app=pingpong provider=%s mode=dchan ranks=2 bytes=%zu iters=%d "
               "dchan_us=%.3f mpi_us=%.3f ratio=%.3f verified=%s\n",
               dchan_provider_name(ctx), size, iters, t_dchan * 1e6, t_mpi * 1e6,
               t_dchan / t_mpi, all_bad || rc ? "no" : "yes");
    }
    dchan_handle_destroy(sh);
    dchan_handle_destroy(rh);
    dchan_finalize(ctx);
    free(rbuf);
    free(sbuf);
    MPI_Finalize();
    return all_bad || rc ? 1 : 0;
}
