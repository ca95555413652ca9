/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_credit: what credit costs on the latency path. The one-way latency
 * (half the round trip) of a pingpong over credited channels
 * (dchan_create_handle_attr, credit 1, depth 1) beside the same pingpong
 * over plain ones (dchan_create_handle), on 2 ranks, in the same run and
 * the same dchan context, one context per provider x detection mode.
 *
 * Both variants run the same code: the sender waits for local completion
 * of its last put, stamps its buffer and puts (on the credited channel,
 * while dchan_put says DCHAN_ERR_AGAIN: one dchan_progress and again, each
 * refusal counted); the receiver progresses until the arrival callback,
 * checks the stamps and re-arms with dchan_ready (which, credited, hands
 * the sender its credit back) before it answers. Repetitions take turns
 * (plain, credited, credited, plain, ...) so that a change of machine state
 * hits both alike; a result is the median over repetitions of each, and
 * the ratio credited / plain of the medians. One RESULT line per provider,
 * mode and size carries both and the ratio. A provider without credit
 * support yet (dchan_create_handle_attr: DCHAN_ERR_UNSUPPORTED) is reported
 * as a SKIP line.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"

struct variant {
    const char *name;
    int credit;
    struct bench_combo *combo;
    unsigned tx_stream, rx_stream;
    unsigned char *sbuf, *rbuf;
    dchan_handle_t *sh, *rh;
    uint64_t tx_seq, rx_seq;
    int arrived;
    long refused, puts;
    double *samples;
};

static struct bench_opts o = {
    .prog = "dchan_credit",
    .iters = 100000,
    .warmup = 5000,
    .reps = 51,
    .timeout_s = 60,
};
static double budget = 256.0 * 1024 * 1024; /* bytes per direction, per variant and size */
static size_t size;
static int body_check = BENCH_BODY_NONE;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct variant *v = arg;
    if (h != v->rh)
        bench_fatal("arrival callback for a handle that is not the channel's");
    v->arrived++;
}

static void v_send(struct variant *v)
{
    bench_wait_sent(v->sh);
    bench_fill(v->sbuf, size, v->tx_stream, ++v->tx_seq, o.check_full);
    v->refused += bench_put_credited(v->combo->ctx, v->sh);
    v->puts++;
}

static void v_recv(struct variant *v)
{
    struct bench_spin sp;
    int rc;
    bench_spin_init(&sp, "a dchan arrival");
    while (!v->arrived) {
        bench_progress(v->combo->ctx);
        bench_spin(&sp);
    }
    if (v->arrived != 1)
        bench_fatal("%d arrival callbacks for one put", v->arrived);
    v->arrived = 0;
    bench_check(v->rbuf, size, v->rx_stream, ++v->rx_seq, body_check, v->name);
    /* Re-armed before the reply: on the credited channel this is the
     * credit that lets the peer put again. */
    if ((rc = dchan_ready(v->rh)) != DCHAN_SUCCESS)
        bench_fatal("dchan_ready: %s", dchan_strerror(rc));
}

static void v_run(struct variant *v, long n)
{
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            v_send(v);
            v_recv(v);
        } else {
            v_recv(v);
            v_send(v);
        }
    }
}

/* Both channels of a variant; DCHAN_SUCCESS, or why not (agreed). */
static int v_setup(struct variant *v)
{
    v->sbuf = bench_combo_alloc(v->combo, size);
    v->rbuf = bench_combo_alloc(v->combo, size);
    bench_fill_body(v->sbuf, size, v->tx_stream);
    v->tx_seq = v->rx_seq = 0;
    v->arrived = 0;
    v->refused = v->puts = 0;
    dchan_handle_t *h0 = NULL, *h1 = NULL;
    int rc = bench_chan_open(v->combo->ctx, 0, v->credit, 1, v->sbuf, v->rbuf, size, on_arrival,
                             v, &h0);
    if (rc == DCHAN_SUCCESS) {
        rc = bench_chan_open(v->combo->ctx, 1, v->credit, 1, v->sbuf, v->rbuf, size, on_arrival,
                             v, &h1);
        if (rc != DCHAN_SUCCESS)
            bench_chan_destroy(h0, "setup");
    }
    if (rc != DCHAN_SUCCESS) {
        bench_combo_free(v->combo, v->sbuf);
        bench_combo_free(v->combo, v->rbuf);
        return rc;
    }
    v->sh = bench_rank == 0 ? h0 : h1;
    v->rh = bench_rank == 0 ? h1 : h0;
    return DCHAN_SUCCESS;
}

static void v_teardown(struct variant *v)
{
    /* One more round trip, untimed, checked whole. */
    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_FIXED;
    v_run(v, 1);
    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
    bench_chan_destroy(v->sh, "send");
    MPI_Barrier(bench_comm);
    bench_chan_destroy(v->rh, "receive");
    MPI_Barrier(bench_comm);
    bench_combo_free(v->combo, v->sbuf);
    bench_combo_free(v->combo, v->rbuf);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np 2 dchan_credit [options]\n"
            "One-way latency of a dchan pingpong over credited channels (credit 1, depth 1)\n"
            "beside the same over plain channels, in one context per provider x mode.\n"
            "Default size: 8 bytes. --iters (default 100000) round trips of each variant\n"
            "per size, spread over --reps (default 51) repetitions, plain and credited\n"
            "taking turns; fewer at large sizes so that at most --budget bytes (default\n"
            "256M) go each way; --warmup (default 5000) round trips of each first, cut\n"
            "likewise.\n\n%s"
            "  --budget BYTES    bytes per direction per variant and size\n",
            bench_common_help);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        BENCH_LONGOPTS, {"budget", required_argument, NULL, BENCH_OPT_FIRST_PRIVATE}, {0}};
    int c, list = 0;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (bench_common_opt(&o, c, optarg) == 0)
            continue;
        if (c == BENCH_OPT_HELP) {
            usage(stdout);
            return 0;
        } else if (c == BENCH_OPT_LIST) {
            list = 1;
        } else if (c == BENCH_OPT_FIRST_PRIVATE) {
            budget = bench_parse_bytes(&o, optarg, "--budget");
        } else {
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
        o.sizes[0] = 8;
        o.nsizes = 1;
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

    struct bench_combo *combos = NULL;
    int ncombos = 0, failed = 0;
    bench_combos_open(&o, "credit", 0, &combos, &ncombos, &failed);
    double *samples = calloc(2 * (size_t)o.reps, sizeof(double));
    if (!samples)
        bench_fatal("out of memory");
    bench_note("%s: %d dchan context(s), %d size(s), %d repetitions of each variant%s\n", o.prog,
               ncombos, o.nsizes, o.reps,
               o.check_full ? ", every byte checked (timings not comparable)" : "");

    for (int ci = 0; ci < ncombos; ci++) {
        struct bench_combo *cb = &combos[ci];
        for (int si = 0; si < o.nsizes; si++) {
            size = o.sizes[si];
            long n = bench_scale(o.iters, size, budget, o.reps);
            long per = n / o.reps > 0 ? n / o.reps : 1;
            long warm = o.warmup > 0 ? (o.warmup * per * o.reps + o.iters - 1) / o.iters : 0;
            struct variant v[2] = {
                {.name = "dchan-plain", .credit = 0, .combo = cb, .samples = samples},
                {.name = "dchan-credit", .credit = 1, .combo = cb, .samples = samples + o.reps},
            };
            for (int k = 0; k < 2; k++) {
                v[k].tx_stream = (unsigned)(2 * k + bench_rank);
                v[k].rx_stream = (unsigned)(2 * k + 1 - bench_rank);
            }
            int rc = v_setup(&v[0]);
            if (rc == DCHAN_SUCCESS && (rc = v_setup(&v[1])) != DCHAN_SUCCESS)
                v_teardown(&v[0]);
            if (rc != DCHAN_SUCCESS) {
                bench_note("%s: dchan over %s (%s) at %zu bytes, %s channel: %s; skipped\n",
                           o.prog, cb->provider, cb->detect, size,
                           v[0].sh ? "credited" : "plain", dchan_strerror(rc));
                if (bench_rank == 0)
                    printf("SKIP bench=credit provider=%s detect=%s size=%zu reason=%s\n",
                           cb->provider, cb->detect, size, bench_rc_name(rc));
                fflush(stdout);
                continue;
            }
            bench_combo_label(cb, v[1].rh);

            v_run(&v[0], warm);
            v_run(&v[1], warm);
            v[0].refused = v[1].refused = v[0].puts = v[1].puts = 0;
            MPI_Barrier(bench_comm);
            for (int r = 0; r < o.reps; r++) {
                /* plain, credited; then credited, plain: neither always goes first */
                for (int j = 0; j < 2; j++) {
                    struct variant *w = &v[(r & 1) ^ j];
                    uint64_t t0 = bench_now_ns();
                    v_run(w, per);
                    w->samples[r] = (double)(bench_now_ns() - t0) / (double)per / 2 / 1000;
                }
            }
            long refused = v[1].refused, puts = v[1].puts, all_refused = 0, all_puts = 0;
            MPI_Reduce(&refused, &all_refused, 1, MPI_LONG, MPI_SUM, 0, bench_comm);
            MPI_Reduce(&puts, &all_puts, 1, MPI_LONG, MPI_SUM, 0, bench_comm);
            v_teardown(&v[1]);
            v_teardown(&v[0]);

            if (bench_rank == 0) {
                double pm, pn, px, cm, cn, cx;
                bench_stats(v[0].samples, o.reps, &pm, &pn, &px);
                bench_stats(v[1].samples, o.reps, &cm, &cn, &cx);
                double stalls = all_puts ? (double)all_refused / (double)all_puts : 0;
                char ratio[32];
                printf("RESULT bench=credit provider=%s detect=%s size=%zu plain_us=%.4f "
                       "credit_us=%.4f ratio=%s plain_min_us=%.4f plain_max_us=%.4f "
                       "credit_min_us=%.4f credit_max_us=%.4f stalls_per_put=%.4f\n",
                       cb->provider, cb->detect, size, pm, cm,
                       bench_fmt(ratio, sizeof ratio, cm / pm, 3), pn, px, cn, cx, stalls);
                fflush(stdout);
                fprintf(stderr,
                        "%s/%s %9zu B: plain %.3f us [%.3f-%.3f]  credited %.3f us [%.3f-%.3f]"
                        "  ratio %.3f  (%ld round trips x %d reps; %.4f credit refusals per "
                        "put)\n",
                        cb->provider, cb->detect, size, pm, pn, px, cm, cn, cx, cm / pm, per,
                        o.reps, stalls);
            }
        }
    }

    free(samples);
    bench_combos_close(combos, ncombos);
    free(o.sizes);
    bench_mpi_finalize();
    return failed ? 1 : 0;
}
