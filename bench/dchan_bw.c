/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_bw: sustained put bandwidth with K channels in flight, beside an
 * MPI_Isend/MPI_Irecv window of the same depth, on 2 ranks (rank 0 sends).
 *
 * One round of dchan: rank 0 puts into all K channels; rank 1 waits for the
 * K arrivals, checks and re-arms each, then acknowledges with an 8-byte put
 * on a channel of its own; rank 0 waits for that before the next round (the
 * re-arm contract: no put before the receiver is ready again). One round of
 * MPI is the same: K Isends; the receiver waits for all, checks them,
 * re-posts its K receives and sends an 8-byte ack. Bandwidth is K * size *
 * rounds over the time rank 0 took, in MB/s (10^6 bytes); the median over
 * --reps repetitions is reported, with min and max on stderr.
 *
 * dchan's receive buffers (data and ack) come from its context's
 * dchan_alloc, as a user after speed would take them (under shm: the shared
 * segment, where a put is one memcpy), except under a "-heap" pseudo
 * provider (bench.c), which keeps them on the heap like MPI's. Every impl
 * sends from the same heap buffers, as an application sends from its own
 * arrays: only where the data goes differs. (Sources in the shm segment
 * copied 10-15 % slower than heap ones here, cause not found.)
 *
 * memcpy is the physical reference for large puts into shared memory: rank
 * 0 alone copies K messages per round from its K send buffers into K private,
 * touched buffers of the size (no peer, no signalling), counted like the
 * others. It walks as much memory as the puts do: copying one pair again and
 * again would run from the cache at sizes where the puts cannot.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define TAG_BW 21
#define TAG_ACK 22
#define MAX_WINDOW 128

enum kind { B_DCHAN, B_MPI, B_MEMCPY };

struct impl {
    enum kind kind;
    const char *name;
    struct bench_combo *combo;
    int index;
    dchan_handle_t *rh[MAX_WINDOW], *sh[MAX_WINDOW], *ack_rh, *ack_sh;
    int arrived, ack_arrived;
    MPI_Request reqs[MAX_WINDOW + 1];
    uint64_t round;
};

static struct bench_opts o = {
    .prog = "dchan_bw",
    .iters = 1000,
    .warmup = 20,
    .reps = 10,
    .timeout_s = 60,
};
static int window = 16;
static double max_inflight = 512.0 * 1024 * 1024; /* bytes of one window, at most */
static double budget = 256.0 * 1024 * 1024;       /* bytes per repetition */
static int peer, K;
static size_t size;
/* The current impl's: rank 0's send buffers, rank 1's receive buffers, and
 * the ack. They point at the heap ones below, or at a dchan impl's own. */
static unsigned char *bufs[MAX_WINDOW];
static uint64_t *ack_buf;
static unsigned char *heap_bufs[MAX_WINDOW];
static uint64_t *heap_ack;
/* memcpy: K destinations private to rank 0 (the sources are bufs[]). */
static unsigned char *copy_dst[MAX_WINDOW];

static unsigned data_stream(const struct impl *m, int k)
{
    return (unsigned)(m->index << 8 | k);
}

static unsigned ack_stream(const struct impl *m)
{
    return (unsigned)(m->index << 8 | 0xff);
}

static int agree(int rc)
{
    int lo;
    MPI_Allreduce(&rc, &lo, 1, MPI_INT, MPI_MIN, bench_comm);
    return lo;
}

/* What each arrival's check covers besides the ends: the body too with
 * --check full, and in the one verified round that ends every size. */
static int body_check = BENCH_BODY_NONE;

static int body_mode(void)
{
    return body_check;
}

/* ---- dchan -------------------------------------------------------------------------- */

static void on_data(dchan_handle_t *h, void *arg)
{
    ((struct impl *)arg)->arrived++;
}

static void on_ack(dchan_handle_t *h, void *arg)
{
    ((struct impl *)arg)->ack_arrived++;
}

static void progress_until(struct impl *m, int *counter, int want, const char *what)
{
    struct bench_spin sp;
    bench_spin_init(&sp, what);
    while (*counter < want) {
        int rc = dchan_progress(m->combo->ctx);
        if (rc < 0)
            bench_fatal("dchan_progress: %s", dchan_strerror(rc));
        bench_spin(&sp);
    }
    if (*counter != want)
        bench_fatal("%d arrivals where %d were due (%s)", *counter, want, what);
    *counter = 0;
}

static void wait_sent(dchan_handle_t *h)
{
    struct bench_spin sp;
    int rc;
    bench_spin_init(&sp, "a dchan put to complete locally");
    while ((rc = dchan_put_test(h)) == 0)
        bench_spin(&sp);
    if (rc < 0)
        bench_fatal("dchan_put_test: %s", dchan_strerror(rc));
}

static int dchan_setup(struct impl *m)
{
    dchan_ctx_t *ctx = m->combo->ctx;
    dchan_wire_t wires[MAX_WINDOW], ack_wire;
    int rc = DCHAN_SUCCESS, made = 0;

    /* Receivers first: rank 1 the K data channels, rank 0 the ack channel. */
    if (bench_rank == 1) {
        for (int k = 0; k < K && rc == DCHAN_SUCCESS; k++) {
            rc = dchan_create_handle(ctx, peer, bufs[k], size, BENCH_OOB, on_data, m, &m->rh[k]);
            if (rc == DCHAN_SUCCESS) {
                made++;
                rc = dchan_handle_export(m->rh[k], &wires[k]);
            }
        }
    } else {
        rc = dchan_create_handle(ctx, peer, ack_buf, 8, BENCH_OOB, on_ack, m, &m->ack_rh);
        if (rc == DCHAN_SUCCESS) {
            made++;
            rc = dchan_handle_export(m->ack_rh, &ack_wire);
        }
    }
    int all = agree(rc);
    if (all != DCHAN_SUCCESS) {
        for (int k = 0; k < made; k++)
            dchan_handle_destroy(bench_rank == 1 ? m->rh[k] : m->ack_rh);
        return all;
    }
    if (bench_rank == 1) {
        MPI_Send(wires, K * (int)sizeof wires[0], MPI_BYTE, peer, TAG_BW, bench_comm);
        MPI_Recv(&ack_wire, sizeof ack_wire, MPI_BYTE, peer, TAG_ACK, bench_comm,
                 MPI_STATUS_IGNORE);
        rc = dchan_assoc_local(ctx, &ack_wire, ack_buf, 8, &m->ack_sh);
        bench_combo_label(m->combo, m->rh[0]);
    } else {
        MPI_Recv(wires, K * (int)sizeof wires[0], MPI_BYTE, peer, TAG_BW, bench_comm,
                 MPI_STATUS_IGNORE);
        MPI_Send(&ack_wire, sizeof ack_wire, MPI_BYTE, peer, TAG_ACK, bench_comm);
        for (int k = 0; k < K && rc == DCHAN_SUCCESS; k++)
            rc = dchan_assoc_local(ctx, &wires[k], bufs[k], size, &m->sh[k]);
        bench_combo_label(m->combo, m->ack_rh);
    }
    if ((all = agree(rc)) != DCHAN_SUCCESS)
        bench_fatal("dchan_assoc_local (%s, %zu bytes): %s", m->combo->provider, size,
                    dchan_strerror(all));
    MPI_Bcast(m->combo->detect, sizeof m->combo->detect, MPI_CHAR, 1, bench_comm);
    return DCHAN_SUCCESS;
}

static void dchan_rounds(struct impl *m, long rounds)
{
    for (long r = 0; r < rounds; r++) {
        uint64_t seq = ++m->round;
        int rc;
        if (bench_rank == 0) {
            for (int k = 0; k < K; k++) {
                wait_sent(m->sh[k]);
                bench_fill(bufs[k], size, data_stream(m, k), seq, o.check_full);
                if ((rc = dchan_put(m->sh[k])) != DCHAN_SUCCESS)
                    bench_fatal("dchan_put: %s", dchan_strerror(rc));
            }
            progress_until(m, &m->ack_arrived, 1, "the dchan ack");
            bench_check(ack_buf, 8, ack_stream(m), seq, BENCH_BODY_NONE, "dchan ack");
            if ((rc = dchan_ready(m->ack_rh)) != DCHAN_SUCCESS)
                bench_fatal("dchan_ready: %s", dchan_strerror(rc));
        } else {
            progress_until(m, &m->arrived, K, "dchan arrivals");
            for (int k = 0; k < K; k++) {
                bench_check(bufs[k], size, data_stream(m, k), seq, body_mode(), m->name);
                if ((rc = dchan_ready(m->rh[k])) != DCHAN_SUCCESS)
                    bench_fatal("dchan_ready: %s", dchan_strerror(rc));
            }
            wait_sent(m->ack_sh);
            bench_fill(ack_buf, 8, ack_stream(m), seq, 0);
            if ((rc = dchan_put(m->ack_sh)) != DCHAN_SUCCESS)
                bench_fatal("dchan_put (ack): %s", dchan_strerror(rc));
        }
    }
}

static void dchan_teardown(struct impl *m)
{
    int rc = DCHAN_SUCCESS;
    for (int k = 0; bench_rank == 0 && k < K && rc == DCHAN_SUCCESS; k++)
        rc = dchan_handle_destroy(m->sh[k]);
    if (bench_rank == 1 && rc == DCHAN_SUCCESS)
        rc = dchan_handle_destroy(m->ack_sh);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_destroy (send): %s", dchan_strerror(rc));
    MPI_Barrier(bench_comm);
    for (int k = 0; bench_rank == 1 && k < K && rc == DCHAN_SUCCESS; k++)
        rc = dchan_handle_destroy(m->rh[k]);
    if (bench_rank == 0)
        rc = dchan_handle_destroy(m->ack_rh);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_destroy (receive): %s", dchan_strerror(rc));
}

/* ---- MPI -------------------------------------------------------------------------------- */

static void mpi_post(struct impl *m)
{
    for (int k = 0; k < K; k++)
        MPI_Irecv(bufs[k], (int)size, MPI_BYTE, peer, TAG_BW, bench_comm, &m->reqs[k]);
}

static void mpi_rounds(struct impl *m, long rounds)
{
    for (long r = 0; r < rounds; r++) {
        uint64_t seq = ++m->round;
        if (bench_rank == 0) {
            MPI_Irecv(ack_buf, 8, MPI_BYTE, peer, TAG_ACK, bench_comm, &m->reqs[K]);
            for (int k = 0; k < K; k++) {
                bench_fill(bufs[k], size, data_stream(m, k), seq, o.check_full);
                MPI_Isend(bufs[k], (int)size, MPI_BYTE, peer, TAG_BW, bench_comm, &m->reqs[k]);
            }
            MPI_Waitall(K + 1, m->reqs, MPI_STATUSES_IGNORE);
            bench_check(ack_buf, 8, ack_stream(m), seq, BENCH_BODY_NONE, "mpi ack");
        } else {
            MPI_Waitall(K, m->reqs, MPI_STATUSES_IGNORE);
            for (int k = 0; k < K; k++)
                bench_check(bufs[k], size, data_stream(m, k), seq, body_mode(), m->name);
            mpi_post(m); /* before the ack, like dchan's re-arm */
            bench_fill(ack_buf, 8, ack_stream(m), seq, 0);
            MPI_Send(ack_buf, 8, MPI_BYTE, peer, TAG_ACK, bench_comm);
        }
    }
}

static void mpi_teardown(struct impl *m)
{
    for (int k = 0; bench_rank == 1 && k < K; k++) {
        MPI_Cancel(&m->reqs[k]);
        MPI_Wait(&m->reqs[k], MPI_STATUS_IGNORE);
    }
}

/* ---- memcpy ----------------------------------------------------------------------------- */

static void memcpy_rounds(struct impl *m, long rounds)
{
    if (bench_rank != 0)
        return;
    for (long r = 0; r < rounds; r++) {
        uint64_t seq = ++m->round;
        for (int k = 0; k < K; k++) {
            /* Stamped like a put, checked like an arrival: the copy cannot
             * be skipped, and costs what the others' bookkeeping costs. */
            bench_fill(bufs[k], size, data_stream(m, k), seq, o.check_full);
            memcpy(copy_dst[k], bufs[k], size);
            __asm__ __volatile__("" ::: "memory");
            bench_check(copy_dst[k], size, data_stream(m, k), seq, body_mode(), m->name);
        }
    }
}

/* ---- driver ---------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np 2 dchan_bw [options]\n"
            "Put bandwidth with K channels in flight beside an MPI_Isend/MPI_Irecv window\n"
            "of the same depth. Implementations (--impls): dchan, mpi-sendrecv, memcpy\n"
            "(rank 0 copying K messages a round into K private buffers: the physical\n"
            "reference for large puts into shared memory). Default sizes: 4 KiB .. 64 MiB\n"
            "in powers of two. --iters (default 1000) rounds per repetition, fewer at\n"
            "large sizes so that a repetition moves about 256 MiB (--budget); --reps\n"
            "(default 10); --warmup (default 20) rounds, cut likewise.\n\n%s"
            "  --window K        channels (messages) in flight, at most %d (default 16)\n"
            "  --max-inflight B  cap on K * size; K is lowered at large sizes (default 512M)\n"
            "  --budget BYTES    bytes per repetition\n",
            bench_common_help, MAX_WINDOW);
}

int main(int argc, char **argv)
{
    enum { OPT_WINDOW = BENCH_OPT_FIRST_PRIVATE, OPT_MAXINF, OPT_BUDGET };
    static const struct option longopts[] = {BENCH_LONGOPTS,
                                             {"window", required_argument, NULL, OPT_WINDOW},
                                             {"max-inflight", required_argument, NULL, OPT_MAXINF},
                                             {"budget", required_argument, NULL, OPT_BUDGET},
                                             {0}};
    int c, list = 0;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (bench_common_opt(&o, c, optarg) == 0)
            continue;
        switch (c) {
        case BENCH_OPT_HELP:
            usage(stdout);
            return 0;
        case BENCH_OPT_LIST:
            list = 1;
            break;
        case OPT_WINDOW:
            window = atoi(optarg);
            if (window < 1 || window > MAX_WINDOW) {
                fprintf(stderr, "%s: --window wants 1 .. %d\n", o.prog, MAX_WINDOW);
                return 2;
            }
            break;
        case OPT_MAXINF:
            max_inflight = bench_parse_bytes(&o, optarg, "--max-inflight");
            break;
        case OPT_BUDGET:
            budget = bench_parse_bytes(&o, optarg, "--budget");
            break;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    if (list) {
        bench_list_providers(stdout);
        return 0;
    }
    if (!o.sizes) {
        o.nsizes = 0;
        o.sizes = malloc(16 * sizeof *o.sizes);
        if (!o.sizes)
            return 1;
        for (size_t s = 4096; s <= 64u << 20; s *= 2)
            o.sizes[o.nsizes++] = s;
    }
    for (int i = 0; i < o.nsizes; i++) {
        if (o.sizes[i] > (size_t)1 << 30) {
            fprintf(stderr, "%s: sizes above 1 GiB are not supported\n", o.prog);
            return 2;
        }
    }

    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
    bench_mpi_init(&argc, &argv, &o);
    if (bench_nranks != 2)
        bench_fatal("needs exactly 2 ranks (mpirun -np 2), not %d", bench_nranks);
    peer = 1 - bench_rank;

    struct bench_combo *combos = NULL;
    int ncombos = 0, failed = 0, nimpl = 0;
    if (bench_in_list(o.impls, "dchan"))
        bench_combos_open(&o, "bw", 0, &combos, &ncombos, &failed);
    struct impl *impls = calloc((size_t)ncombos + 2, sizeof *impls);
    double *samples = calloc((size_t)o.reps, sizeof(double));
    if (!impls || !samples)
        bench_fatal("out of memory");
    for (int i = 0; i < ncombos; i++) {
        impls[nimpl] = (struct impl){.kind = B_DCHAN, .name = "dchan", .combo = &combos[i]};
        nimpl++;
    }
    if (bench_in_list(o.impls, "mpi-sendrecv"))
        impls[nimpl++] = (struct impl){.kind = B_MPI, .name = "mpi-sendrecv"};
    if (bench_in_list(o.impls, "memcpy"))
        impls[nimpl++] = (struct impl){.kind = B_MEMCPY, .name = "memcpy"};
    for (int i = 0; i < nimpl; i++)
        impls[i].index = i;
    heap_ack = bench_alloc(64);

    for (int si = 0; si < o.nsizes; si++) {
        size = o.sizes[si];
        K = window;
        if ((double)K * (double)size > max_inflight)
            K = (int)(max_inflight / (double)size) > 0 ? (int)(max_inflight / (double)size) : 1;
        long rounds = bench_scale(o.iters, (size_t)K * size, budget, 2);
        long warm = o.warmup > 0 ? (o.warmup * rounds + o.iters - 1) / o.iters : 0;
        for (int k = 0; k < K; k++)
            heap_bufs[k] = bench_alloc(size);
        for (int i = 0; i < nimpl; i++) {
            struct impl *m = &impls[i];
            /* dchan's receive buffers from its context, allocated and touched
             * before timing; every impl sends from the same heap buffers. */
            int own = m->kind == B_DCHAN && !m->combo->heap_buffers;
            int own_data = own && bench_rank == 1;
            for (int k = 0; k < K; k++)
                bufs[k] = own_data ? bench_combo_alloc(m->combo, size) : heap_bufs[k];
            ack_buf = own ? bench_combo_alloc(m->combo, 64) : heap_ack;
            for (int k = 0; m->kind == B_MEMCPY && bench_rank == 0 && k < K; k++)
                copy_dst[k] = bench_alloc(size);
            /* The fixed body depends on the stream: rewrite it per impl. */
            for (int k = 0; bench_rank == 0 && k < K; k++)
                bench_fill_body(bufs[k], size, data_stream(m, k));
            m->round = 0;
            m->arrived = m->ack_arrived = 0;
            if (m->kind == B_DCHAN) {
                int rc = dchan_setup(m);
                if (rc != DCHAN_SUCCESS) {
                    bench_note("%s: dchan over %s (%s) at %zu bytes: %s; skipped\n", o.prog,
                               m->combo->provider, m->combo->detect, size, dchan_strerror(rc));
                    if (bench_rank == 0)
                        printf("SKIP bench=bw impl=dchan provider=%s detect=%s size=%zu "
                               "reason=%s\n",
                               m->combo->provider, m->combo->detect, size, bench_rc_name(rc));
                    for (int k = 0; own_data && k < K; k++)
                        bench_combo_free(m->combo, bufs[k]);
                    if (own)
                        bench_combo_free(m->combo, ack_buf);
                    continue;
                }
            } else if (m->kind == B_MPI && bench_rank == 1) {
                mpi_post(m);
            }
            void (*rounds_fn)(struct impl *, long) = m->kind == B_DCHAN   ? dchan_rounds
                                                     : m->kind == B_MPI ? mpi_rounds
                                                                        : memcpy_rounds;
            rounds_fn(m, warm);
            MPI_Barrier(bench_comm);
            for (int r = 0; r < o.reps; r++) {
                uint64_t t0 = bench_now_ns();
                rounds_fn(m, rounds);
                double ns = (double)(bench_now_ns() - t0);
                samples[r] = (double)K * (double)size * (double)rounds / ns * 1000;
            }
            /* One more round, untimed, whose messages are checked whole where
             * the timed ones were checked (before a re-arm rewrites a sentinel). */
            body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_FIXED;
            rounds_fn(m, 1);
            body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
            if (m->kind == B_DCHAN)
                dchan_teardown(m);
            else if (m->kind == B_MPI)
                mpi_teardown(m);
            MPI_Barrier(bench_comm);
            /* After the handles, before the context goes. */
            for (int k = 0; own_data && k < K; k++)
                bench_combo_free(m->combo, bufs[k]);
            if (own)
                bench_combo_free(m->combo, ack_buf);
            for (int k = 0; m->kind == B_MEMCPY && bench_rank == 0 && k < K; k++)
                bench_free(copy_dst[k]);
            if (bench_rank == 0) {
                double med, mn, mx;
                bench_stats(samples, o.reps, &med, &mn, &mx);
                printf("RESULT bench=bw impl=%s provider=%s detect=%s size=%zu window=%d "
                       "mbps=%.1f\n",
                       m->name, m->kind == B_DCHAN ? m->combo->provider : "-",
                       m->kind == B_DCHAN ? m->combo->detect : "-", size, K, med);
                fflush(stdout);
                if (m->kind == B_DCHAN)
                    fprintf(stderr, "%9zu B x %3d  dchan:%s/%s", size, K, m->combo->provider,
                            m->combo->detect);
                else
                    fprintf(stderr, "%9zu B x %3d  %s", size, K, m->name);
                fprintf(stderr, "  %.0f MB/s [%.0f-%.0f]  (%ld rounds x %d reps)\n", med, mn,
                        mx, rounds, o.reps);
            }
        }
        for (int k = 0; k < K; k++)
            bench_free(heap_bufs[k]);
    }

    bench_free(heap_ack);
    free(samples);
    free(impls);
    bench_combos_close(combos, ncombos);
    free(o.sizes);
    bench_mpi_finalize();
    return failed ? 1 : 0;
}
