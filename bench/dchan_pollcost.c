/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_pollcost: what armed but idle channels cost the receiver.
 *
 * For each provider x detection mode and each count N of armed channels:
 *   progress_ns  one dchan_progress call with N armed, idle channels (mean
 *                over a timed batch; median over --reps batches);
 *   detect_ns    one arrival among N armed channels, from the put to the
 *                callback and the re-arm: for self, put + progress until the
 *                callback + dchan_ready in one thread; for a network provider,
 *                half the round trip of a 64-byte pingpong whose receivers
 *                both have N armed channels. The channel used rotates through
 *                all N, so its place in the polling queue is not favoured.
 * and, per provider x mode, the heap allocations per dchan_put and per
 * dchan_progress in steady state, counted by a malloc interposer in this
 * program (alloc_count.c); the target is zero.
 *
 * Channels of self live in a one-process context on rank 0. Those of a
 * network provider are between the 2 ranks; the peer never puts on the idle
 * ones. Each receive buffer starts a page of its own (--stride), as separate
 * application buffers would.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "bench.h"

#define TAG_PC 31

static struct bench_opts o = {
    .prog = "dchan_pollcost",
    .iters = 2000,
    .warmup = 200,
    .reps = 11,
    .timeout_s = 60,
};
static size_t chan_size = 64, stride = 4096;
static long *armed;
static int narmed;

/* The channels of one combination. */
struct chans {
    struct bench_combo *combo;
    int net;   /* channels to the peer rather than to self */
    int other; /* the rank at the far end */
    int n;     /* created so far */
    unsigned char *rbufs, *sbufs;
    dchan_handle_t **rh, **sh;
    uint64_t *tx_seq, *rx_seq;
    dchan_handle_t *fired;
    int nfired;
    int count_checked;
    int count_broken; /* the counter saw nothing where the library must allocate */
};

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chans *c = arg;
    c->fired = h;
    c->nfired++;
}

static unsigned char *rbuf(struct chans *c, int i)
{
    return c->rbufs + (size_t)i * stride;
}

static unsigned char *sbuf(struct chans *c, int i)
{
    return c->sbufs + (size_t)i * ((chan_size + 63) & ~(size_t)63);
}

static void check_rc(int rc, const char *what)
{
    if (rc < 0)
        bench_fatal("%s: %s (%s)", what, dchan_strerror(rc), bench_rc_name(rc));
}

/* Adds channels up to n (collective for a network provider). */
static void grow(struct chans *c, int n)
{
    int from = c->n;
    dchan_wire_t *mine, *theirs;
    if (n <= from)
        return;
    mine = malloc((size_t)(n - from) * sizeof *mine);
    theirs = malloc((size_t)(n - from) * sizeof *theirs);
    if (!mine || !theirs)
        bench_fatal("out of memory");
    for (int i = from; i < n; i++) {
        /* The first creation must allocate (the handle itself): if the
         * counter saw nothing, it is not in the path and its zeros mean
         * nothing. */
        int probe = !c->count_checked && alloc_count_available();
        if (probe) {
            alloc_count_reset();
            alloc_count_on();
        }
        int rc = dchan_create_handle(c->combo->ctx, c->other, rbuf(c, i), chan_size, BENCH_OOB,
                                     on_arrival, c, &c->rh[i]);
        if (probe) {
            alloc_count_off();
            c->count_checked = 1;
            c->count_broken = alloc_count_total() == 0;
            alloc_count_reset();
        }
        check_rc(rc, "dchan_create_handle");
        check_rc(dchan_handle_export(c->rh[i], &mine[i - from]), "dchan_handle_export");
        c->tx_seq[i] = c->rx_seq[i] = 0;
        bench_fill_body(sbuf(c, i), chan_size, (unsigned)i);
    }
    if (c->net)
        MPI_Sendrecv(mine, (n - from) * (int)sizeof *mine, MPI_BYTE, c->other, TAG_PC, theirs,
                     (n - from) * (int)sizeof *theirs, MPI_BYTE, c->other, TAG_PC, bench_comm,
                     MPI_STATUS_IGNORE);
    else
        memcpy(theirs, mine, (size_t)(n - from) * sizeof *mine);
    for (int i = from; i < n; i++)
        check_rc(dchan_assoc_local(c->combo->ctx, &theirs[i - from], sbuf(c, i), chan_size,
                                   &c->sh[i]),
                 "dchan_assoc_local");
    if (from == 0)
        bench_combo_label(c->combo, c->rh[0]);
    c->n = n;
    free(mine);
    free(theirs);
}

static void wait_sent(dchan_handle_t *h)
{
    struct bench_spin sp;
    int rc;
    bench_spin_init(&sp, "a put to complete locally");
    while ((rc = dchan_put_test(h)) == 0)
        bench_spin(&sp);
    check_rc(rc, "dchan_put_test");
}

/* Allocation counts of one combination. */
struct allocs {
    unsigned long put, put_calls, progress, progress_calls, ready, ready_calls;
};

static int count_on; /* count the calls below (the untimed pass) */
static struct allocs tally;

static void counted_put(struct chans *c, int i)
{
    if (count_on) {
        alloc_count_reset();
        alloc_count_on();
    }
    int rc = dchan_put(c->sh[i]);
    if (count_on) {
        alloc_count_off();
        tally.put += alloc_count_total();
        tally.put_calls++;
        if (alloc_count_total())
            alloc_count_report(stderr, "    put allocated at ");
    }
    check_rc(rc, "dchan_put");
}

static void counted_wait(struct chans *c, int i)
{
    struct bench_spin sp;
    bench_spin_init(&sp, "an arrival");
    while (!c->nfired) {
        if (count_on) {
            alloc_count_reset();
            alloc_count_on();
        }
        int rc = dchan_progress(c->combo->ctx);
        if (count_on) {
            alloc_count_off();
            tally.progress += alloc_count_total();
            tally.progress_calls++;
            if (alloc_count_total())
                alloc_count_report(stderr, "    progress allocated at ");
        }
        check_rc(rc, "dchan_progress");
        bench_spin(&sp);
    }
    if (c->nfired != 1 || c->fired != c->rh[i])
        bench_fatal("arrival on the wrong channel (or %d callbacks) for channel %d", c->nfired, i);
    c->nfired = 0;
}

static void counted_ready(struct chans *c, int i)
{
    if (count_on) {
        alloc_count_reset();
        alloc_count_on();
    }
    int rc = dchan_ready(c->rh[i]);
    if (count_on) {
        alloc_count_off();
        tally.ready += alloc_count_total();
        tally.ready_calls++;
    }
    check_rc(rc, "dchan_ready");
}

/* One detection cycle on channel i (see the top of the file). */
static void cycle(struct chans *c, int i)
{
    int body = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
    if (!c->net || bench_rank == 0) {
        wait_sent(c->sh[i]);
        bench_fill(sbuf(c, i), chan_size, (unsigned)i, ++c->tx_seq[i], o.check_full);
        counted_put(c, i);
        counted_wait(c, i);
        bench_check(rbuf(c, i), chan_size, (unsigned)i, ++c->rx_seq[i], body, "dchan");
        counted_ready(c, i);
    } else {
        counted_wait(c, i);
        bench_check(rbuf(c, i), chan_size, (unsigned)i, ++c->rx_seq[i], body, "dchan");
        counted_ready(c, i);
        wait_sent(c->sh[i]);
        bench_fill(sbuf(c, i), chan_size, (unsigned)i, ++c->tx_seq[i], o.check_full);
        counted_put(c, i);
    }
}

static double progress_cost(struct chans *c, double *samples)
{
    dchan_ctx_t *ctx = c->combo->ctx;
    double med, mn, mx;
    for (int i = 0; i < 1000; i++)
        check_rc(dchan_progress(ctx), "dchan_progress");
    /* Batches of about 2 ms, so that the clock is negligible. */
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < 100; i++)
        check_rc(dchan_progress(ctx), "dchan_progress");
    double per = (double)(bench_now_ns() - t0) / 100;
    long m = per > 0 ? (long)(2e6 / per) : 1000000;
    m = m < 100 ? 100 : m > 1000000 ? 1000000 : m;
    for (int r = 0; r < o.reps; r++) {
        t0 = bench_now_ns();
        for (long i = 0; i < m; i++)
            check_rc(dchan_progress(ctx), "dchan_progress");
        samples[r] = (double)(bench_now_ns() - t0) / (double)m;
    }
    bench_stats(samples, o.reps, &med, &mn, &mx);
    if (c->nfired)
        bench_fatal("%d callbacks while every channel was idle", c->nfired);
    /* Untimed: the same calls, counted. */
    for (int i = 0; i < 1000; i++) {
        alloc_count_reset();
        alloc_count_on();
        int rc = dchan_progress(ctx);
        alloc_count_off();
        check_rc(rc, "dchan_progress");
        tally.progress += alloc_count_total();
        tally.progress_calls++;
        if (alloc_count_total())
            alloc_count_report(stderr, "    idle progress allocated at ");
    }
    return med;
}

static double detect_cost(struct chans *c, int n, double progress_ns, double *samples)
{
    double med, mn, mx;
    long cycles = o.iters;
    /* Keep slow modes (a poll over many requests) to about a second. */
    double est = 4 * progress_ns + 2000;
    if ((double)cycles * est > 1e9)
        cycles = (long)(1e9 / est);
    long per = cycles / o.reps > 0 ? cycles / o.reps : 1;
    long warm = o.warmup < per * o.reps ? o.warmup : per * o.reps;
    int k = 0;

    for (long i = 0; i < warm; i++, k = (k + 1) % n)
        cycle(c, k);
    if (c->net)
        MPI_Barrier(bench_comm);
    for (int r = 0; r < o.reps; r++) {
        uint64_t t0 = bench_now_ns();
        for (long i = 0; i < per; i++, k = (k + 1) % n)
            cycle(c, k);
        samples[r] = (double)(bench_now_ns() - t0) / (double)per / (c->net ? 2 : 1);
    }
    bench_stats(samples, o.reps, &med, &mn, &mx);
    /* Untimed: steady-state cycles with every put and progress counted. */
    count_on = 1;
    for (long i = 0; i < (per < 200 ? per : 200); i++, k = (k + 1) % n)
        cycle(c, k);
    count_on = 0;
    if (c->net)
        MPI_Barrier(bench_comm);
    return med;
}

static void measure(struct bench_combo *combo)
{
    long nmax = armed[narmed - 1];
    struct chans c = {.combo = combo, .net = !combo->singleton};
    double *prog = calloc((size_t)narmed, sizeof *prog), *det = calloc((size_t)narmed, sizeof *det);
    double *samples = calloc((size_t)o.reps, sizeof *samples);

    c.other = c.net ? 1 - bench_rank : 0;
    c.rh = calloc((size_t)nmax + 1, sizeof *c.rh);
    c.sh = calloc((size_t)nmax + 1, sizeof *c.sh);
    c.tx_seq = calloc((size_t)nmax + 1, sizeof *c.tx_seq);
    c.rx_seq = calloc((size_t)nmax + 1, sizeof *c.rx_seq);
    c.rbufs = bench_alloc((size_t)nmax * stride + 1);
    c.sbufs = bench_alloc((size_t)nmax * ((chan_size + 63) & ~(size_t)63) + 1);
    if (!prog || !det || !samples || !c.rh || !c.sh || !c.tx_seq || !c.rx_seq)
        bench_fatal("out of memory");
    memset(&tally, 0, sizeof tally);

    /* The resolved mode names the results from 0 armed channels on: learn
     * it from a handle made and destroyed before measuring. */
    if (strcmp(combo->detect, "auto") == 0) {
        dchan_handle_t *h;
        check_rc(dchan_create_handle(combo->ctx, c.other, c.rbufs, chan_size, BENCH_OOB,
                                     on_arrival, &c, &h),
                 "dchan_create_handle");
        bench_combo_label(combo, h);
        check_rc(dchan_handle_destroy(h), "dchan_handle_destroy");
    }

    for (int a = 0; a < narmed; a++) {
        int n = (int)armed[a];
        grow(&c, n);
        if (c.net)
            MPI_Barrier(bench_comm);
        if (bench_rank == 0)
            prog[a] = progress_cost(&c, samples);
        if (c.net)
            MPI_Barrier(bench_comm); /* the peer idles meanwhile */
        if (c.net)
            MPI_Bcast(&prog[a], 1, MPI_DOUBLE, 0, bench_comm);
        det[a] = n > 0 ? detect_cost(&c, n, prog[a], samples) : -1;
        bench_note("  %s/%s armed %6d: progress %9.1f ns, detect %9.1f ns\n", combo->provider,
                   combo->detect, n, prog[a], det[a]);
    }

    /* Allocation counts from every rank that took part. */
    unsigned long mine[6] = {tally.put, tally.put_calls, tally.progress, tally.progress_calls,
                             tally.ready, tally.ready_calls},
                  sum[6];
    int broken = c.count_broken, any_broken = broken;
    if (c.net) {
        MPI_Reduce(mine, sum, 6, MPI_UNSIGNED_LONG, MPI_SUM, 0, bench_comm);
        MPI_Reduce(&broken, &any_broken, 1, MPI_INT, MPI_MAX, 0, bench_comm);
    } else {
        memcpy(sum, mine, sizeof sum);
    }

    if (bench_rank == 0) {
        for (int a = 0; a < narmed; a++) {
            char d[32];
            if (det[a] >= 0)
                snprintf(d, sizeof d, "%.1f", det[a]);
            else
                snprintf(d, sizeof d, "-");
            printf("RESULT bench=pollcost provider=%s detect=%s armed=%ld progress_ns=%.1f "
                   "detect_ns=%s\n",
                   combo->provider, combo->detect, armed[a], prog[a], d);
        }
        if (!alloc_count_available() || any_broken) {
            bench_note("  %s/%s: allocations not counted (%s)\n", combo->provider, combo->detect,
                       !alloc_count_available() ? "not in sanitizer builds"
                                                : "the interposer saw no allocation where "
                                                  "dchan_create_handle must make one");
            printf("RESULT bench=alloc provider=%s detect=%s allocs_per_put=- "
                   "allocs_per_progress=-\n",
                   combo->provider, combo->detect);
        } else {
            double pp = sum[1] ? (double)sum[0] / (double)sum[1] : 0;
            double pg = sum[3] ? (double)sum[2] / (double)sum[3] : 0;
            bench_note("  %s/%s: %lu allocations in %lu puts, %lu in %lu progress calls, %lu in "
                       "%lu dchan_ready calls\n",
                       combo->provider, combo->detect, sum[0], sum[1], sum[2], sum[3], sum[4],
                       sum[5]);
            printf("RESULT bench=alloc provider=%s detect=%s allocs_per_put=%.3f "
                   "allocs_per_progress=%.3f\n",
                   combo->provider, combo->detect, pp, pg);
        }
        fflush(stdout);
    }

    for (int i = 0; i < c.n; i++)
        check_rc(dchan_handle_destroy(c.sh[i]), "dchan_handle_destroy");
    if (c.net)
        MPI_Barrier(bench_comm);
    for (int i = 0; i < c.n; i++)
        check_rc(dchan_handle_destroy(c.rh[i]), "dchan_handle_destroy");
    bench_free(c.rbufs);
    bench_free(c.sbufs);
    free(c.rh);
    free(c.sh);
    free(c.tx_seq);
    free(c.rx_seq);
    free(prog);
    free(det);
    free(samples);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np 2 dchan_pollcost [options]   (1 rank: self only)\n"
            "Cost of dchan_progress against the number of armed idle channels, the time to\n"
            "detect one arrival among them, and heap allocations per put and per progress.\n"
            "--iters (default 2000) detection cycles, --warmup (default 200), --reps\n"
            "(default 11) batches. --sizes is not used.\n\n%s"
            "  --armed LIST      numbers of armed channels (default 0,1,10,100,1000,10000)\n"
            "  --chan-size B     bytes per channel (default 64; a multiple of 8)\n"
            "  --stride B        distance between receive buffers (default 4096)\n",
            bench_common_help);
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    enum { OPT_ARMED = BENCH_OPT_FIRST_PRIVATE, OPT_CSIZE, OPT_STRIDE };
    static const struct option longopts[] = {BENCH_LONGOPTS,
                                             {"armed", required_argument, NULL, OPT_ARMED},
                                             {"chan-size", required_argument, NULL, OPT_CSIZE},
                                             {"stride", required_argument, NULL, OPT_STRIDE},
                                             {0}};
    static const long default_armed[] = {0, 1, 10, 100, 1000, 10000};
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
        case OPT_ARMED: {
            free(armed);
            armed = NULL;
            narmed = 0;
            for (const char *p = optarg; *p;) {
                char *end;
                long v = strtol(p, &end, 10);
                long *na = realloc(armed, (size_t)(narmed + 1) * sizeof *armed);
                if (end == p || (*end && *end != ',') || v < 0 || v > 1000000 || !na) {
                    fprintf(stderr, "%s: --armed wants counts 0 .. 1000000, not '%s'\n", o.prog,
                            optarg);
                    return 2;
                }
                armed = na;
                armed[narmed++] = v;
                p = *end ? end + 1 : end;
            }
            break;
        }
        case OPT_CSIZE:
        case OPT_STRIDE: {
            size_t *v;
            int n;
            if (bench_parse_sizes(optarg, &v, &n) || n != 1 || v[0] < 8 || v[0] % 8) {
                fprintf(stderr, "%s: %s wants a multiple of 8 bytes, not '%s'\n", o.prog,
                        c == OPT_CSIZE ? "--chan-size" : "--stride", optarg);
                return 2;
            }
            *(c == OPT_CSIZE ? &chan_size : &stride) = v[0];
            free(v);
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
    if (!armed) {
        narmed = (int)(sizeof default_armed / sizeof default_armed[0]);
        armed = malloc(sizeof default_armed);
        if (!armed)
            return 1;
        memcpy(armed, default_armed, sizeof default_armed);
    }
    qsort(armed, (size_t)narmed, sizeof *armed, cmp_long);
    if (stride < chan_size) {
        fprintf(stderr, "%s: --stride must be at least --chan-size\n", o.prog);
        return 2;
    }

    bench_mpi_init(&argc, &argv, &o);
    if (bench_nranks > 2)
        bench_fatal("runs on 1 or 2 ranks, not %d", bench_nranks);
    if (!alloc_count_available())
        bench_note("%s: this build cannot count allocations (sanitizers)\n", o.prog);

    struct bench_combo *combos = NULL;
    int ncombos = 0, failed = 0;
    bench_combos_open(&o, "pollcost", BENCH_SELF_SINGLETON, &combos, &ncombos, &failed);
    for (int i = 0; i < ncombos; i++) {
        struct bench_combo *k = &combos[i];
        if (k->singleton) {
            if (bench_rank == 0)
                measure(k);
            MPI_Barrier(bench_comm);
        } else if (dchan_nranks(k->ctx) == 2) {
            measure(k);
        } else {
            /* The context serves only this rank: its channels are self's. */
            k->singleton = 1;
            measure(k);
        }
    }
    bench_combos_close(combos, ncombos);
    free(armed);
    bench_mpi_finalize();
    return failed ? 1 : 0;
}
