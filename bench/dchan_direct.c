/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_direct: writing a message straight into the receiver's slot.
 * Rank 0 streams messages (1 MiB by default) to rank 1 over one credited
 * channel of depth D (1 by default), two ways on the same channel, taking
 * turns repetition by repetition:
 *
 *   direct  dchan_put_ptr gives where the next message goes (on shm, with
 *           the receive buffer from dchan_alloc and a mode other than
 *           SENTINEL: the receiver's slot itself), the sender writes the
 *           message there, dchan_put delivers it (only the signal, when the
 *           slot was written in place)
 *   copy    the sender writes the message into its send buffer and
 *           dchan_put delivers it (the library copies it into the slot)
 *
 * "Writing the message" is the same in both: a memset of the whole message
 * with a byte that changes every message, then the stamps of its first and
 * last 8 bytes (bench.h). A third row, fill, is that writing alone: rank 0
 * writing D private buffers in turn, no dchan: the floor of both. The
 * receiver consumes in its arrival callback: dchan_slot, a check of the
 * stamped ends, dchan_ready (the sender's credit). A repetition of N
 * messages ends when the sender has the receiver's acknowledgement (a
 * plain dchan channel back); the time per message is rank 0's time over N,
 * the median over repetitions. dchan_handle_stats' `copied` shows what the
 * library copied per put in each way, and `mapped` whether dchan_put_ptr
 * gave the slot (1) or the send buffer (0: nothing to gain, e.g. SENTINEL
 * or a provider that does not map the receiver's memory).
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"

enum kind { D_DIRECT, D_COPY, D_FILL };
#define NKIND 3
static const char *const kind_name[NKIND] = {"direct", "copy", "fill"};

struct chan {
    struct bench_combo *combo;
    unsigned stream, ack_stream;
    unsigned char *sbuf, *rbuf;
    uint64_t *ackbuf;
    dchan_handle_t *dh, *ack;
    uint64_t tx_seq, rx_seq, ack_seq;
    long consumed;
    int ack_arrived;
    /* rank 0, per kind, over the timed repetitions */
    long puts[NKIND], in_place[NKIND], refused[NKIND];
    uint64_t copied[NKIND];
};

static struct bench_opts o = {
    .prog = "dchan_direct",
    .iters = 10000,
    .warmup = 1000,
    .reps = 21,
    .timeout_s = 60,
};
static int depth = 1;
static double budget = 256.0 * 1024 * 1024; /* bytes per repetition */
static size_t size;
static int body_check = BENCH_BODY_NONE;
static unsigned char *fill_buf[DCHAN_MAX_DEPTH]; /* the fill row's private buffers */

static unsigned char msg_byte(unsigned stream, uint64_t seq)
{
    return (unsigned char)(seq * 37u + stream * 17u + 1u);
}

/* The message both ways write: every byte, then the stamped ends. */
static void msg_write(void *p, unsigned stream, uint64_t seq)
{
    memset(p, msg_byte(stream, seq), size);
    bench_fill(p, size, stream, seq, 0);
}

static void msg_check(const void *p, unsigned stream, uint64_t seq, int body)
{
    bench_check(p, size, stream, seq, BENCH_BODY_NONE, "dchan_direct");
    if (body == BENCH_BODY_NONE)
        return;
    const unsigned char *b = p, want = msg_byte(stream, seq);
    for (size_t i = size >= 16 ? 8 : 0; i < size - 8; i++)
        if (b[i] != want)
            bench_fatal("VERIFICATION FAILED: message %llu, byte %zu is 0x%02x, expected 0x%02x",
                        (unsigned long long)seq, i, b[i], want);
}

static void on_data(dchan_handle_t *h, void *arg)
{
    struct chan *ch = arg;
    void *slot;
    int rc = dchan_slot(h, &slot);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_slot in the arrival callback: %s", dchan_strerror(rc));
    msg_check(slot, ch->stream, ++ch->rx_seq, body_check);
    if ((rc = dchan_ready(h)) != DCHAN_SUCCESS)
        bench_fatal("dchan_ready in the arrival callback: %s", dchan_strerror(rc));
    ch->consumed++;
}

static void on_ack(dchan_handle_t *h, void *arg)
{
    ((struct chan *)arg)->ack_arrived++;
}

static int chan_setup(struct chan *ch)
{
    struct bench_combo *cb = ch->combo;
    if (bench_rank == 0)
        ch->sbuf = bench_alloc(size);
    else
        ch->rbuf = bench_combo_alloc(cb, (size_t)depth * size);
    ch->ackbuf = bench_combo_alloc(cb, 64);
    int rc = bench_chan_open(cb->ctx, 0, 1, depth, ch->sbuf, ch->rbuf, size, on_data, ch, &ch->dh);
    if (rc == DCHAN_SUCCESS) {
        rc = bench_chan_open(cb->ctx, 1, 0, 1, ch->ackbuf, ch->ackbuf, 8, on_ack, ch, &ch->ack);
        if (rc != DCHAN_SUCCESS)
            bench_chan_destroy(ch->dh, "setup");
        else if (bench_rank == 1)
            bench_combo_label(cb, ch->dh);
        MPI_Bcast(cb->detect, sizeof cb->detect, MPI_CHAR, 1, bench_comm);
    }
    if (rc != DCHAN_SUCCESS) {
        if (bench_rank == 0)
            bench_free(ch->sbuf);
        else
            bench_combo_free(cb, ch->rbuf);
        bench_combo_free(cb, ch->ackbuf);
    }
    return rc;
}

static void chan_teardown(struct chan *ch)
{
    bench_chan_destroy(bench_rank == 0 ? ch->dh : ch->ack, "send");
    MPI_Barrier(bench_comm);
    bench_chan_destroy(bench_rank == 0 ? ch->ack : ch->dh, "receive");
    MPI_Barrier(bench_comm);
    if (bench_rank == 0)
        bench_free(ch->sbuf);
    else
        bench_combo_free(ch->combo, ch->rbuf);
    bench_combo_free(ch->combo, ch->ackbuf);
}

/* N messages one way, then the acknowledgement. */
static void rounds(struct chan *ch, enum kind k, long n)
{
    dchan_ctx_t *ctx = ch->combo->ctx;
    struct bench_spin sp;
    int rc;

    if (k == D_FILL) {
        static uint64_t fill_seq;
        for (long i = 0; bench_rank == 0 && i < n; i++) {
            msg_write(fill_buf[i % depth], ch->stream, ++fill_seq);
            __asm__ __volatile__("" ::: "memory");
        }
        return;
    }
    if (bench_rank == 1) {
        long target = ch->consumed + n;
        bench_spin_init(&sp, "dchan arrivals");
        while (ch->consumed < target) {
            bench_progress(ctx);
            bench_spin(&sp);
        }
        if (ch->consumed != target)
            bench_fatal("%ld messages consumed where %ld were due", ch->consumed, target);
        bench_wait_sent(ch->ack);
        bench_fill(ch->ackbuf, 8, ch->ack_stream, ++ch->ack_seq, 0);
        if ((rc = dchan_put(ch->ack)) != DCHAN_SUCCESS)
            bench_fatal("dchan_put (ack): %s", dchan_strerror(rc));
        return;
    }
    dchan_handle_stats_t s0, s1;
    bench_hstats(ch->dh, &s0);
    for (long i = 0; i < n; i++) {
        if (k == D_DIRECT) {
            void *p = bench_put_ptr(ctx, ch->dh, &ch->refused[k]);
            ch->in_place[k] += p != ch->sbuf;
            msg_write(p, ch->stream, ++ch->tx_seq);
            /* The credit dchan_put_ptr saw is still there. */
            if ((rc = dchan_put(ch->dh)) != DCHAN_SUCCESS)
                bench_fatal("dchan_put after dchan_put_ptr: %s (%s)", dchan_strerror(rc),
                            bench_rc_name(rc));
        } else {
            bench_wait_sent(ch->dh);
            msg_write(ch->sbuf, ch->stream, ++ch->tx_seq);
            ch->refused[k] += bench_put_credited(ctx, ch->dh);
        }
    }
    bench_hstats(ch->dh, &s1);
    ch->puts[k] += n;
    ch->copied[k] += s1.copied - s0.copied;
    bench_spin_init(&sp, "the dchan acknowledgement");
    while (!ch->ack_arrived) {
        bench_progress(ctx);
        bench_spin(&sp);
    }
    ch->ack_arrived = 0;
    bench_check(ch->ackbuf, 8, ch->ack_stream, ++ch->ack_seq, BENCH_BODY_NONE, "dchan ack");
    if ((rc = dchan_ready(ch->ack)) != DCHAN_SUCCESS)
        bench_fatal("dchan_ready (ack): %s", dchan_strerror(rc));
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np 2 dchan_direct [options]\n"
            "Time per message of a sender writing each message straight into the\n"
            "receiver's slot (dchan_put_ptr, then dchan_put) beside writing it into the\n"
            "send buffer and dchan_put (the library copies it), on one credited channel;\n"
            "and the writing alone (fill). Default size: 1 MiB. --iters (default 10000)\n"
            "messages per repetition, fewer at large sizes so that a repetition writes\n"
            "about --budget bytes (default 256M), never fewer than 8; --reps (default 21);\n"
            "--warmup (default 1000) messages, cut likewise.\n\n%s"
            "  --depth D         slots of the channel, 1 .. %d (default 1)\n"
            "  --budget BYTES    bytes per repetition\n",
            bench_common_help, DCHAN_MAX_DEPTH);
}

int main(int argc, char **argv)
{
    enum { OPT_DEPTH = BENCH_OPT_FIRST_PRIVATE, OPT_BUDGET };
    static const struct option longopts[] = {BENCH_LONGOPTS,
                                             {"depth", required_argument, NULL, OPT_DEPTH},
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
        case OPT_DEPTH: {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (end == optarg || *end || v < 1 || v > DCHAN_MAX_DEPTH) {
                fprintf(stderr, "%s: --depth wants 1 .. %d, not '%s'\n", o.prog,
                        DCHAN_MAX_DEPTH, optarg);
                return 2;
            }
            depth = (int)v;
            break;
        }
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
    if (!o.sizes) {
        o.sizes = malloc(sizeof *o.sizes);
        if (!o.sizes)
            return 1;
        o.sizes[0] = (size_t)1 << 20;
        o.nsizes = 1;
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
    int ncombos = 0, failed = 0;
    bench_combos_open(&o, "direct", 0, &combos, &ncombos, &failed);
    double *samples = calloc(NKIND * (size_t)o.reps, sizeof(double));
    if (!samples)
        bench_fatal("out of memory");
    bench_note("%s: %d dchan context(s), %d size(s), depth %d, %d repetitions%s\n", o.prog,
               ncombos, o.nsizes, depth, o.reps,
               o.check_full ? ", every byte checked (timings not comparable)" : "");

    for (int ci = 0; ci < ncombos; ci++) {
        struct bench_combo *cb = &combos[ci];
        for (int si = 0; si < o.nsizes; si++) {
            size = o.sizes[si];
            long n = bench_scale(o.iters, size, budget, 8);
            long warm = o.warmup > 0 ? (o.warmup * n + o.iters - 1) / o.iters : 0;
            struct chan ch = {.combo = cb, .stream = 1, .ack_stream = 2};
            int rc = chan_setup(&ch);
            if (rc != DCHAN_SUCCESS) {
                bench_note("%s: dchan over %s (%s) at %zu bytes, depth %d: %s; skipped\n",
                           o.prog, cb->provider, cb->detect, size, depth, dchan_strerror(rc));
                if (bench_rank == 0)
                    printf("SKIP bench=direct provider=%s detect=%s size=%zu reason=%s\n",
                           cb->provider, cb->detect, size, bench_rc_name(rc));
                fflush(stdout);
                continue;
            }
            for (int k = 0; bench_rank == 0 && k < depth; k++)
                fill_buf[k] = bench_alloc(size);

            for (int k = 0; k < NKIND; k++)
                rounds(&ch, (enum kind)k, warm);
            memset(ch.puts, 0, sizeof ch.puts);
            memset(ch.in_place, 0, sizeof ch.in_place);
            memset(ch.refused, 0, sizeof ch.refused);
            memset(ch.copied, 0, sizeof ch.copied);
            MPI_Barrier(bench_comm);
            for (int r = 0; r < o.reps; r++) {
                for (int j = 0; j < NKIND; j++) {
                    int k = (r + j) % NKIND; /* a different one first each time */
                    uint64_t t0 = bench_now_ns();
                    rounds(&ch, (enum kind)k, n);
                    samples[k * o.reps + r] = (double)(bench_now_ns() - t0) / (double)n / 1000;
                }
            }
            /* A few more of each dchan way, untimed, checked whole (not counted). */
            struct chan timed = ch;
            body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_FIXED;
            rounds(&ch, D_DIRECT, depth + 1);
            rounds(&ch, D_COPY, depth + 1);
            body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
            chan_teardown(&ch);
            for (int k = 0; bench_rank == 0 && k < depth; k++)
                bench_free(fill_buf[k]);

            if (bench_rank == 0) {
                double med[NKIND], mn[NKIND], mx[NKIND];
                for (int k = 0; k < NKIND; k++) {
                    bench_stats(&samples[k * o.reps], o.reps, &med[k], &mn[k], &mx[k]);
                    fprintf(stderr, "%s/%s %9zu B  %-6s %9.3f us [%.3f-%.3f]", cb->provider,
                            cb->detect, size, kind_name[k], med[k], mn[k], mx[k]);
                    if (k != D_FILL)
                        fprintf(stderr, "  copied %.0f B/put, %.3f credit refusals per put",
                                (double)timed.copied[k] / (double)timed.puts[k],
                                (double)timed.refused[k] / (double)timed.puts[k]);
                    fprintf(stderr, "\n");
                }
                /* 1: every message written in the slot; 0: in the send buffer */
                double mapped = (double)timed.in_place[D_DIRECT] / (double)timed.puts[D_DIRECT];
                fprintf(stderr, "%s/%s %9zu B  direct / copy %.3f, direct / fill %.3f%s\n",
                        cb->provider, cb->detect, size, med[D_DIRECT] / med[D_COPY],
                        med[D_DIRECT] / med[D_FILL],
                        mapped == 1 ? ""
                                    : " (dchan_put_ptr gave the send buffer, not the slot)");
                char ratio[32];
                printf("RESULT bench=direct provider=%s detect=%s size=%zu depth=%d "
                       "direct_us=%.3f copy_us=%.3f fill_us=%.3f ratio=%s mapped=%.2f "
                       "copied_direct=%.0f copied_copy=%.0f\n",
                       cb->provider, cb->detect, size, depth, med[D_DIRECT], med[D_COPY],
                       med[D_FILL], bench_fmt(ratio, sizeof ratio, med[D_DIRECT] / med[D_COPY], 3),
                       mapped,
                       (double)timed.copied[D_DIRECT] / (double)timed.puts[D_DIRECT],
                       (double)timed.copied[D_COPY] / (double)timed.puts[D_COPY]);
                fflush(stdout);
            }
        }
    }

    free(samples);
    bench_combos_close(combos, ncombos);
    free(o.sizes);
    bench_mpi_finalize();
    return failed ? 1 : 0;
}
