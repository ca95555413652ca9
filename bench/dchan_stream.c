/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_stream: a sender that runs ahead. Rank 0 streams messages to rank 1
 * over one credited dchan channel of depth D (8 by default): it puts until
 * dchan_put says DCHAN_ERR_AGAIN (no credit: D messages not yet released),
 * then progresses and puts again. Rank 1 consumes in its arrival callback:
 * dchan_slot, a check of the stamped ends of the slot, dchan_ready (which
 * returns the credit). Beside it, in the same run, MPI with a window of W
 * messages (W = D by default), two ways:
 *
 *   mpi-window  rounds of W: W MPI_Isend; the receiver, which pre-posted W
 *               MPI_Irecv, waits for all, checks them, re-posts all and
 *               sends an 8-byte ack that the sender waits for before the
 *               next round (dchan_bw's scheme)
 *   mpi-stream  continuous: the receiver keeps W receives posted and
 *               re-posts each as soon as it checked its message; the sender
 *               keeps W sends in flight from W buffers, waiting for the
 *               oldest before it rewrites its buffer (no other flow
 *               control: small messages run eagerly ahead, as MPI allows)
 *
 * A repetition streams N messages and ends when the sender has the
 * receiver's 8-byte acknowledgement that it consumed them all (a dchan
 * channel back for dchan, an MPI message for MPI); the rate is N over
 * rank 0's time. Implementations take turns repetition by repetition; a
 * result is the median over repetitions. One RESULT line per dchan provider,
 * mode and size carries dchan's rate, both MPI rates and the ratios.
 *
 * dchan's receive slots come from dchan_alloc on its context (under shm:
 * the shared segment, where a put is one memcpy by the sender), except
 * under a "-heap" pseudo provider; its sender writes each message into the
 * channel's one send buffer (once the last put from it completed locally),
 * MPI's into the buffer of the send it is about to start (W of them), both
 * on the heap: each as an application would use it.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"

#define TAG_WIN 41
#define TAG_STR 42
#define TAG_WIN_ACK 43
#define TAG_STR_ACK 44
#define MAX_WINDOW 64

enum kind { S_DCHAN, S_WINDOW, S_STREAM };

struct impl {
    enum kind kind;
    const char *name;
    struct bench_combo *combo;
    int on;
    unsigned stream, ack_stream;
    uint64_t tx_seq, rx_seq, ack_seq;
    /* dchan: data from rank 0 (sh) to rank 1 (rh), ack back (ack) */
    unsigned char *sbuf, *rbuf;
    uint64_t *ackbuf;
    dchan_handle_t *dh, *ack;
    long consumed;
    int ack_arrived;
    long refused, puts;
    /* MPI: W buffers on each side, their requests, the ack */
    unsigned char *mbuf[MAX_WINDOW];
    MPI_Request req[MAX_WINDOW + 1];
    uint64_t *mack;
    /* results at the current size */
    double *samples;
    double med, min, max;
};

static struct bench_opts o = {
    .prog = "dchan_stream",
    .iters = 20000,
    .warmup = 2000,
    .reps = 15,
    .timeout_s = 60,
};
static int depth = 8, window = 0;        /* window 0: the depth */
static double budget = 128.0 * 1024 * 1024; /* bytes per repetition */
static size_t size;
static int body_check = BENCH_BODY_NONE;

static const size_t default_sizes[] = {8,         64,         512,         4096,
                                       64 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024};

/* ---- dchan -------------------------------------------------------------------------- */

static void on_data(dchan_handle_t *h, void *arg)
{
    struct impl *m = arg;
    void *slot;
    int rc = dchan_slot(h, &slot);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_slot in the arrival callback: %s", dchan_strerror(rc));
    bench_check(slot, size, m->stream, ++m->rx_seq, body_check, m->name);
    if ((rc = dchan_ready(h)) != DCHAN_SUCCESS)
        bench_fatal("dchan_ready in the arrival callback: %s", dchan_strerror(rc));
    m->consumed++;
}

static void on_ack(dchan_handle_t *h, void *arg)
{
    ((struct impl *)arg)->ack_arrived++;
}

static int dchan_setup(struct impl *m)
{
    struct bench_combo *cb = m->combo;
    if (bench_rank == 0)
        m->sbuf = bench_alloc(size);
    else
        m->rbuf = bench_combo_alloc(cb, (size_t)depth * size);
    m->ackbuf = bench_combo_alloc(cb, 64);
    if (bench_rank == 0)
        bench_fill_body(m->sbuf, size, m->stream);
    int rc = bench_chan_open(cb->ctx, 0, 1, depth, m->sbuf, m->rbuf, size, on_data, m, &m->dh);
    if (rc == DCHAN_SUCCESS) {
        rc = bench_chan_open(cb->ctx, 1, 0, 1, m->ackbuf, m->ackbuf, 8, on_ack, m, &m->ack);
        if (rc != DCHAN_SUCCESS)
            bench_chan_destroy(m->dh, "setup");
        else if (bench_rank == 1)
            bench_combo_label(cb, m->dh);
        MPI_Bcast(cb->detect, sizeof cb->detect, MPI_CHAR, 1, bench_comm);
    }
    if (rc != DCHAN_SUCCESS) {
        if (bench_rank == 0)
            bench_free(m->sbuf);
        else
            bench_combo_free(cb, m->rbuf);
        bench_combo_free(cb, m->ackbuf);
    }
    return rc;
}

static void dchan_rounds(struct impl *m, long n)
{
    dchan_ctx_t *ctx = m->combo->ctx;
    struct bench_spin sp;
    int rc;
    if (bench_rank == 0) {
        for (long i = 0; i < n; i++) {
            bench_wait_sent(m->dh);
            bench_fill(m->sbuf, size, m->stream, ++m->tx_seq, o.check_full);
            m->refused += bench_put_credited(ctx, m->dh);
            m->puts++;
        }
        bench_spin_init(&sp, "the dchan acknowledgement");
        while (!m->ack_arrived) {
            bench_progress(ctx);
            bench_spin(&sp);
        }
        m->ack_arrived = 0;
        bench_check(m->ackbuf, 8, m->ack_stream, ++m->ack_seq, BENCH_BODY_NONE, "dchan ack");
        if ((rc = dchan_ready(m->ack)) != DCHAN_SUCCESS)
            bench_fatal("dchan_ready (ack): %s", dchan_strerror(rc));
    } else {
        long target = m->consumed + n;
        bench_spin_init(&sp, "dchan arrivals");
        while (m->consumed < target) {
            bench_progress(ctx);
            bench_spin(&sp);
        }
        if (m->consumed != target)
            bench_fatal("%ld messages consumed where %ld were due", m->consumed, target);
        bench_wait_sent(m->ack);
        bench_fill(m->ackbuf, 8, m->ack_stream, ++m->ack_seq, 0);
        if ((rc = dchan_put(m->ack)) != DCHAN_SUCCESS)
            bench_fatal("dchan_put (ack): %s", dchan_strerror(rc));
    }
}

static void dchan_teardown(struct impl *m)
{
    struct bench_combo *cb = m->combo;
    bench_chan_destroy(bench_rank == 0 ? m->dh : m->ack, "send");
    MPI_Barrier(bench_comm);
    bench_chan_destroy(bench_rank == 0 ? m->ack : m->dh, "receive");
    MPI_Barrier(bench_comm);
    if (bench_rank == 0)
        bench_free(m->sbuf);
    else
        bench_combo_free(cb, m->rbuf);
    bench_combo_free(cb, m->ackbuf);
}

/* ---- MPI ---------------------------------------------------------------------------- */

static void mpi_setup(struct impl *m)
{
    int tag = m->kind == S_WINDOW ? TAG_WIN : TAG_STR;
    m->mack = bench_alloc(64);
    for (int k = 0; k < window; k++) {
        m->mbuf[k] = bench_alloc(size);
        if (bench_rank == 0)
            bench_fill_body(m->mbuf[k], size, m->stream);
        m->req[k] = MPI_REQUEST_NULL;
    }
    m->req[window] = MPI_REQUEST_NULL;
    for (int k = 0; bench_rank == 1 && k < window; k++)
        MPI_Irecv(m->mbuf[k], (int)size, MPI_BYTE, 0, tag, bench_comm, &m->req[k]);
}

static void window_rounds(struct impl *m, long n)
{
    for (long r = 0; r < n / window; r++) {
        if (bench_rank == 0) {
            MPI_Irecv(m->mack, 8, MPI_BYTE, 1, TAG_WIN_ACK, bench_comm, &m->req[window]);
            for (int k = 0; k < window; k++) {
                bench_fill(m->mbuf[k], size, m->stream, ++m->tx_seq, o.check_full);
                MPI_Isend(m->mbuf[k], (int)size, MPI_BYTE, 1, TAG_WIN, bench_comm, &m->req[k]);
            }
            MPI_Waitall(window + 1, m->req, MPI_STATUSES_IGNORE);
            bench_check(m->mack, 8, m->ack_stream, ++m->ack_seq, BENCH_BODY_NONE, "mpi ack");
        } else {
            MPI_Waitall(window, m->req, MPI_STATUSES_IGNORE);
            for (int k = 0; k < window; k++)
                bench_check(m->mbuf[k], size, m->stream, ++m->rx_seq, body_check, m->name);
            for (int k = 0; k < window; k++)
                MPI_Irecv(m->mbuf[k], (int)size, MPI_BYTE, 0, TAG_WIN, bench_comm, &m->req[k]);
            bench_fill(m->mack, 8, m->ack_stream, ++m->ack_seq, 0);
            MPI_Send(m->mack, 8, MPI_BYTE, 0, TAG_WIN_ACK, bench_comm);
        }
    }
}

static void stream_rounds(struct impl *m, long n)
{
    if (bench_rank == 0) {
        MPI_Irecv(m->mack, 8, MPI_BYTE, 1, TAG_STR_ACK, bench_comm, &m->req[window]);
        for (long i = 0; i < n; i++) {
            int k = (int)(m->tx_seq % (uint64_t)window);
            MPI_Wait(&m->req[k], MPI_STATUS_IGNORE);
            bench_fill(m->mbuf[k], size, m->stream, ++m->tx_seq, o.check_full);
            MPI_Isend(m->mbuf[k], (int)size, MPI_BYTE, 1, TAG_STR, bench_comm, &m->req[k]);
        }
        MPI_Waitall(window + 1, m->req, MPI_STATUSES_IGNORE);
        bench_check(m->mack, 8, m->ack_stream, ++m->ack_seq, BENCH_BODY_NONE, "mpi ack");
    } else {
        /* Receives match in the order they were posted: message j lands in
         * buffer j mod W. */
        for (long i = 0; i < n; i++) {
            int k = (int)(m->rx_seq % (uint64_t)window);
            MPI_Wait(&m->req[k], MPI_STATUS_IGNORE);
            bench_check(m->mbuf[k], size, m->stream, ++m->rx_seq, body_check, m->name);
            MPI_Irecv(m->mbuf[k], (int)size, MPI_BYTE, 0, TAG_STR, bench_comm, &m->req[k]);
        }
        bench_fill(m->mack, 8, m->ack_stream, ++m->ack_seq, 0);
        MPI_Send(m->mack, 8, MPI_BYTE, 0, TAG_STR_ACK, bench_comm);
    }
}

static void mpi_teardown(struct impl *m)
{
    for (int k = 0; bench_rank == 1 && k < window; k++) {
        MPI_Cancel(&m->req[k]);
        MPI_Wait(&m->req[k], MPI_STATUS_IGNORE);
    }
    MPI_Barrier(bench_comm);
    for (int k = 0; k < window; k++)
        bench_free(m->mbuf[k]);
    bench_free(m->mack);
}

/* ---- driver ------------------------------------------------------------------------- */

static void impl_rounds(struct impl *m, long n)
{
    switch (m->kind) {
    case S_DCHAN:
        dchan_rounds(m, n);
        break;
    case S_WINDOW:
        window_rounds(m, n);
        break;
    case S_STREAM:
        stream_rounds(m, n);
        break;
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np 2 dchan_stream [options]\n"
            "Message rate and bandwidth of a sender running ahead over one credited dchan\n"
            "channel of depth D, beside MPI_Isend/MPI_Irecv with a window of W messages\n"
            "(mpi-window: W then an ack; mpi-stream: W receives re-posted continuously,\n"
            "W sends in flight). Implementations (--impls): dchan, mpi-window, mpi-stream.\n"
            "Default sizes: 8 64 512 4K (message rate) 64K 256K 1M 4M (bandwidth).\n"
            "--iters (default 20000) messages per repetition, fewer at large sizes so that\n"
            "a repetition moves about --budget bytes (default 128M), never fewer than 4 W;\n"
            "--reps (default 15); --warmup (default 2000) messages, cut likewise.\n\n%s"
            "  --depth D         slots of the dchan channel, 1 .. %d (default 8)\n"
            "  --window W        MPI messages in flight, 1 .. %d (default: the depth)\n"
            "  --budget BYTES    bytes per repetition\n",
            bench_common_help, DCHAN_MAX_DEPTH, MAX_WINDOW);
}

static int parse_int(const char *arg, int lo, int hi, const char *what)
{
    char *end;
    long v = strtol(arg, &end, 10);
    if (end == arg || *end || v < lo || v > hi) {
        fprintf(stderr, "%s: %s wants %d .. %d, not '%s'\n", o.prog, what, lo, hi, arg);
        exit(2);
    }
    return (int)v;
}

/* A rate for the RESULT line, or "-". */
static const char *fmt(char *buf, size_t len, const struct impl *m, double scale)
{
    if (!m || !m->on)
        return "-";
    return bench_fmt(buf, len, m->med * scale, 4);
}

int main(int argc, char **argv)
{
    enum { OPT_DEPTH = BENCH_OPT_FIRST_PRIVATE, OPT_WINDOW, OPT_BUDGET };
    static const struct option longopts[] = {BENCH_LONGOPTS,
                                             {"depth", required_argument, NULL, OPT_DEPTH},
                                             {"window", required_argument, NULL, OPT_WINDOW},
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
        case OPT_DEPTH:
            depth = parse_int(optarg, 1, DCHAN_MAX_DEPTH, "--depth");
            break;
        case OPT_WINDOW:
            window = parse_int(optarg, 1, MAX_WINDOW, "--window");
            break;
        case OPT_BUDGET: {
            budget = bench_parse_bytes(&o, optarg, "--budget");
            break;
        }
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
    if (window == 0)
        window = depth <= MAX_WINDOW ? depth : MAX_WINDOW;
    if (!o.sizes) {
        o.nsizes = (int)(sizeof default_sizes / sizeof default_sizes[0]);
        o.sizes = malloc(sizeof default_sizes);
        if (!o.sizes)
            return 1;
        memcpy(o.sizes, default_sizes, sizeof default_sizes);
    }
    for (int i = 0; i < o.nsizes; i++) {
        if (o.sizes[i] > (size_t)256 << 20) {
            fprintf(stderr, "%s: sizes above 256 MiB are not supported\n", o.prog);
            return 2;
        }
    }

    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
    bench_mpi_init(&argc, &argv, &o);
    if (bench_nranks != 2)
        bench_fatal("needs exactly 2 ranks (mpirun -np 2), not %d", bench_nranks);

    struct bench_combo *combos = NULL;
    int ncombos = 0, failed = 0, nimpl = 0;
    if (bench_in_list(o.impls, "dchan"))
        bench_combos_open(&o, "stream", 0, &combos, &ncombos, &failed);
    struct impl *impls = calloc((size_t)ncombos + 2, sizeof *impls);
    double *samples = calloc(((size_t)ncombos + 2) * (size_t)o.reps, sizeof(double));
    if (!impls || !samples)
        bench_fatal("out of memory");
    struct impl *win = NULL, *str = NULL;
    for (int i = 0; i < ncombos; i++)
        impls[nimpl++] = (struct impl){.kind = S_DCHAN, .name = "dchan", .combo = &combos[i]};
    if (bench_in_list(o.impls, "mpi-window")) {
        win = &impls[nimpl];
        impls[nimpl++] = (struct impl){.kind = S_WINDOW, .name = "mpi-window"};
    }
    if (bench_in_list(o.impls, "mpi-stream")) {
        str = &impls[nimpl];
        impls[nimpl++] = (struct impl){.kind = S_STREAM, .name = "mpi-stream"};
    }
    for (int i = 0; i < nimpl; i++) {
        impls[i].stream = (unsigned)(2 * i);
        impls[i].ack_stream = (unsigned)(2 * i + 1);
        impls[i].samples = samples + (size_t)i * (size_t)o.reps;
    }
    bench_note("%s: %d implementation(s), %d size(s), depth %d, MPI window %d, %d repetitions%s\n",
               o.prog, nimpl, o.nsizes, depth, window, o.reps,
               o.check_full ? ", every byte checked (timings not comparable)" : "");

    for (int si = 0; si < o.nsizes; si++) {
        size = o.sizes[si];
        int lot = depth > window ? depth : window;
        long n = bench_scale(o.iters, size, budget, 4L * lot);
        n -= n % window; /* whole MPI windows */
        long warm = o.warmup > 0 ? (o.warmup * n + o.iters - 1) / o.iters : 0;
        warm += window - warm % window;

        for (int i = 0; i < nimpl; i++) {
            struct impl *m = &impls[i];
            m->tx_seq = m->rx_seq = m->ack_seq = 0;
            m->consumed = m->ack_arrived = 0;
            m->on = 1;
            if (m->kind != S_DCHAN) {
                mpi_setup(m);
                continue;
            }
            int rc = dchan_setup(m);
            if (rc != DCHAN_SUCCESS) {
                m->on = 0;
                bench_note("%s: dchan over %s (%s) at %zu bytes, depth %d: %s; skipped\n",
                           o.prog, m->combo->provider, m->combo->detect, size, depth,
                           dchan_strerror(rc));
                if (bench_rank == 0)
                    printf("SKIP bench=stream provider=%s detect=%s size=%zu reason=%s\n",
                           m->combo->provider, m->combo->detect, size, bench_rc_name(rc));
                fflush(stdout);
            }
        }
        for (int i = 0; i < nimpl; i++)
            if (impls[i].on)
                impl_rounds(&impls[i], warm);
        for (int i = 0; i < nimpl; i++)
            impls[i].refused = impls[i].puts = 0;
        MPI_Barrier(bench_comm);
        /* Taking turns, starting with a different one each repetition. */
        for (int r = 0; r < o.reps; r++) {
            for (int j = 0; j < nimpl; j++) {
                struct impl *m = &impls[(r + j) % nimpl];
                if (!m->on)
                    continue;
                uint64_t t0 = bench_now_ns();
                impl_rounds(m, n);
                m->samples[r] = (double)n / ((double)(bench_now_ns() - t0) * 1e-9);
            }
        }
        /* One more stretch, untimed, checked whole. */
        body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_FIXED;
        for (int i = 0; i < nimpl; i++)
            if (impls[i].on)
                impl_rounds(&impls[i], window);
        body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
        for (int i = 0; i < nimpl; i++) {
            struct impl *m = &impls[i];
            if (!m->on)
                continue;
            if (m->kind == S_DCHAN)
                dchan_teardown(m);
            else
                mpi_teardown(m);
            if (bench_rank == 0)
                bench_stats(m->samples, o.reps, &m->med, &m->min, &m->max);
        }

        if (bench_rank == 0) {
            char b[6][32];
            int printed = 0;
            for (int i = 0; i < nimpl; i++) {
                struct impl *m = &impls[i];
                if (!m->on)
                    continue;
                if (m->kind == S_DCHAN)
                    fprintf(stderr, "%9zu B  dchan:%s/%s", size, m->combo->provider,
                            m->combo->detect);
                else
                    fprintf(stderr, "%9zu B  %s", size, m->name);
                fprintf(stderr, "  %.3f Mmsg/s [%.3f-%.3f]  %.0f MB/s", m->med * 1e-6,
                        m->min * 1e-6, m->max * 1e-6, m->med * (double)size * 1e-6);
                if (m->kind == S_DCHAN)
                    fprintf(stderr, "  (%.3f credit refusals per put)",
                            m->puts ? (double)m->refused / (double)m->puts : 0);
                fprintf(stderr, "  [%ld msgs x %d reps]\n", n, o.reps);
            }
            for (int i = 0; i <= nimpl; i++) {
                struct impl *d = i < nimpl ? &impls[i] : NULL;
                if (d && (d->kind != S_DCHAN || !d->on))
                    continue;
                if (!d && printed)
                    break;
                /* Without any dchan result, the MPI rates alone. */
                double best = 0;
                if (win && win->on)
                    best = win->med;
                if (str && str->on && str->med > best)
                    best = str->med;
                char rw[32] = "-", rs[32] = "-", rb[32] = "-";
                if (d && win && win->on)
                    bench_fmt(rw, sizeof rw, d->med / win->med, 3);
                if (d && str && str->on)
                    bench_fmt(rs, sizeof rs, d->med / str->med, 3);
                if (d && best > 0)
                    bench_fmt(rb, sizeof rb, d->med / best, 3);
                char stalls[32] = "-";
                if (d)
                    snprintf(stalls, sizeof stalls, "%.3f",
                             d->puts ? (double)d->refused / (double)d->puts : 0);
                printf("RESULT bench=stream provider=%s detect=%s size=%zu depth=%d window=%d "
                       "msgs=%ld dchan_mmsgs=%s mpi_window_mmsgs=%s mpi_stream_mmsgs=%s "
                       "dchan_mbps=%s mpi_window_mbps=%s mpi_stream_mbps=%s ratio_window=%s "
                       "ratio_stream=%s ratio_best=%s stalls_per_put=%s\n",
                       d ? d->combo->provider : "-", d ? d->combo->detect : "-", size, depth,
                       window, n, fmt(b[0], 32, d, 1e-6), fmt(b[1], 32, win, 1e-6),
                       fmt(b[2], 32, str, 1e-6), fmt(b[3], 32, d, (double)size * 1e-6),
                       fmt(b[4], 32, win, (double)size * 1e-6),
                       fmt(b[5], 32, str, (double)size * 1e-6), rw, rs, rb, stalls);
                printed++;
                if (d)
                    fprintf(stderr, "%9zu B  dchan:%s/%s / best MPI: %s (window %s, stream %s)\n",
                            size, d->combo->provider, d->combo->detect, rb, rw, rs);
            }
            fflush(stdout);
        }
    }

    free(samples);
    free(impls);
    bench_combos_close(combos, ncombos);
    free(o.sizes);
    bench_mpi_finalize();
    return failed ? 1 : 0;
}
