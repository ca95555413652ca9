/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A rank killed in the middle of an exchange (SIGKILL: it tells nobody).
 * Launched by tests/mprun as scenario peer-death (mpirun --enable-recovery,
 * so that the launcher lets the others run on); built with MPI and without
 * (the pmix bootstrap), wires through dchan_allgather.
 *
 * Every rank has two channels sets with every rank, itself included, used on
 * alternate iterations (an iteration waits for every arrival of its set, so
 * a set is re-armed before its next put). In iteration --die-at the last
 * rank puts to the lower half of the ranks only, then kills itself. The
 * survivors must then see:
 *   - DCHAN_ERR_PEER through error_fn on exactly the handles to and from the
 *     dead rank (both sets, both directions), and on later calls on them;
 *   - every other channel going on, every byte verified, to the last
 *     iteration;
 *   - dchan_barrier and dchan_finalize returning (DCHAN_ERR_PEER: nothing
 *     collective can include the dead rank).
 * With --quiesce the victim first takes in what the others sent it in that
 * iteration and waits until its own puts completed, then dies: libfabric's
 * shm provider (1.17) processes its completions in order, so a write that
 * a dead rank never answered would hold every later completion of the
 * survivor's endpoint (see dchan(7), "When a rank dies"); the ofi-shm runs
 * use it, everything else dies with writes to it unanswered.
 * With --in-barrier the victim dies instead of entering a dchan_barrier
 * that the others are in (after iteration --die-at): theirs returns
 * DCHAN_ERR_PEER, at once or DCHAN_DRAIN_TIMEOUT_MS (--drain-ms) after the
 * death was noticed, and the exchange goes on without the victim.
 * Rank 0 prints how long after the death the last error came (detect_ms),
 * as a measure, not a condition: no timing is asserted.
 */
#include "config.h"

#include <getopt.h>
#include <signal.h>

#define OOB 0x5c5c5c5c5c5c5c5cull
#include "mptest.h"

struct end {
    dchan_handle_t *h;
    unsigned char *buf;
    long arrivals;
    int err;      /* the code error_fn reported, 0 if none */
    int err_seen; /* error_fn calls for this handle */
};

/* ch[peer][set]: the receive end from peer, the send end to peer. */
struct chan {
    struct end r, s;
};

static struct chan (*ch)[2];
static int victim;
static size_t size;
static int errors_total;

static int chan_id(int from, int to, int set)
{
    return (from * nranks + to) * 2 + set;
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct end *e = arg;
    if (h != e->h)
        die("callback got another handle");
    e->arrivals++;
}

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    (void)arg;
    errors_total++;
    for (int q = 0; q < nranks; q++)
        for (int s = 0; s < 2; s++) {
            struct end *e[2] = {&ch[q][s].r, &ch[q][s].s};
            for (int k = 0; k < 2; k++)
                if (e[k]->h == h) {
                    e[k]->err = rc;
                    e[k]->err_seen++;
                    return;
                }
        }
    die("error_fn for a handle that is not one of ours (%s)", dchan_strerror(rc));
}

static void setup(dchan_ctx_t *ctx, int detect)
{
    size_t n = (size_t)nranks * 2;
    dchan_wire_t *mine = calloc(n, sizeof *mine), *all = calloc(n * (size_t)nranks, sizeof *all);
    ch = calloc((size_t)nranks, sizeof *ch);
    if (!mine || !all || !ch)
        die("out of memory");
    for (int q = 0; q < nranks; q++)
        for (int s = 0; s < 2; s++) {
            struct end *r = &ch[q][s].r;
            r->buf = buf_alloc(size);
            CHECK(dchan_create_handle(ctx, q, r->buf, size, OOB, on_arrival, r, &r->h));
            CHECK(dchan_handle_export(r->h, &mine[q * 2 + s]));
        }
    CHECK(dchan_allgather(ctx, mine, all, n * sizeof *mine));
    for (int q = 0; q < nranks; q++)
        for (int s = 0; s < 2; s++) {
            struct end *e = &ch[q][s].s;
            e->buf = buf_alloc(size);
            /* What q published for us: its receive end from rank me. */
            CHECK(dchan_assoc_local(ctx, &all[(size_t)q * n + (size_t)me * 2 + s], e->buf, size,
                                    &e->h));
        }
    if (dchan_handle_detect(ch[0][0].r.h) != detect && detect != DCHAN_DETECT_AUTO)
        die("detection mode %d, asked for %d", dchan_handle_detect(ch[0][0].r.h), detect);
    free(mine);
    free(all);
}

static int alive(int q, int dead_known)
{
    return !(dead_known && q == victim);
}

/* Put iteration i to every rank in [0, upto), skipping the dead one. */
static void put_all(long i, int upto, int dead_known)
{
    int s = (int)(i % 2);
    for (int q = 0; q < upto; q++) {
        struct end *e = &ch[q][s].s;
        if (!alive(q, dead_known) || e->err)
            continue;
        fill(e->buf, size, me, chan_id(me, q, s), i);
        int rc = dchan_put(e->h);
        /* The victim may be gone before its death is seen: the put then
         * lands in memory nobody reads, or fails with DCHAN_ERR_PEER. */
        if (rc != DCHAN_SUCCESS && !(q == victim && rc == DCHAN_ERR_PEER))
            die("put to rank %d, iteration %ld: %s", q, i, dchan_strerror(rc));
    }
}

/* Wait for iteration i from every rank but skip: an arrival, or (from
 * the victim only) an error. Verify and re-arm what arrived. */
static void collect(dchan_ctx_t *ctx, long i, int dead_known, int skip)
{
    int s = (int)(i % 2);
    long want = i / 2 + 1;
    unsigned long long t0 = now_ns();
    for (int q = 0; q < nranks; q++) {
        struct end *r = &ch[q][s].r;
        if (!alive(q, dead_known) || q == skip)
            continue;
        while (r->arrivals < want && !r->err) {
            int rc = dchan_wait(ctx, 1000);
            if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
                die("dchan_wait: %s", dchan_strerror(rc));
            if (now_ns() - t0 > 120ull * 1000000000ull)
                die("iteration %ld: nothing from rank %d after 120 s", i, q);
        }
        if (r->err) {
            if (q != victim)
                die("error %s on the channel from live rank %d", dchan_strerror(r->err), q);
            continue;
        }
        if (r->arrivals != want)
            die("%ld arrivals from rank %d on set %d, expected %ld", r->arrivals, q, s, want);
        verify(r->buf, size, q, chan_id(q, me, s), i);
        CHECK(dchan_ready(r->h));
    }
}

static int victim_errors_complete(void)
{
    for (int s = 0; s < 2; s++)
        if (!ch[victim][s].r.err || !ch[victim][s].s.err)
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    long iters = 40, die_at = -1;
    int opt, in_barrier = 0, quiesce = 0;
    static const struct option opts[] = {{"size", required_argument, 0, 's'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"die-at", required_argument, 0, 'd'},
                                         {"in-barrier", no_argument, 0, 'b'},
                                         {"quiesce", no_argument, 0, 'q'},
                                         {"drain-ms", required_argument, 0, 'm'},
                                         {0, 0, 0, 0}};
    mpt_prog = "mp_peerdeath";
    size = 4096;
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 's':
            size = strtoul(optarg, NULL, 0);
            break;
        case 'i':
            iters = atol(optarg);
            break;
        case 'd':
            die_at = atol(optarg);
            break;
        case 'b':
            in_barrier = 1;
            break;
        case 'q':
            quiesce = 1;
            break;
        case 'm':
            setenv("DCHAN_DRAIN_TIMEOUT_MS", optarg, 1);
            break;
        default:
            fprintf(stderr, "usage: mp_peerdeath [--size N] [--iters N] [--die-at I] "
                            "[--in-barrier] [--quiesce] [--drain-ms MS]\n");
            return 2;
        }
    }
    if (die_at < 0)
        die_at = iters / 3;
    if (iters < 4 || die_at < 2 || die_at >= iters - 2 || size < 8)
        die("need iters >= 4, 2 <= die-at < iters - 2, size >= 8");
    size = (size + 7) & ~(size_t)7; /* SENTINEL */

    dchan_ctx_t *ctx = mpt_init(on_error);
    if (nranks < 3)
        die("needs 3 ranks or more, has %d", nranks);
    victim = nranks - 1;
    const char *d = getenv("DCHAN_DETECT");
    int detect = !d                           ? DCHAN_DETECT_AUTO
                 : strcmp(d, "sentinel") == 0 ? DCHAN_DETECT_SENTINEL
                 : strcmp(d, "flag") == 0     ? DCHAN_DETECT_FLAG
                 : strcmp(d, "event") == 0    ? DCHAN_DETECT_EVENT
                                              : DCHAN_DETECT_AUTO;
    setup(ctx, detect);
    CHECK(dchan_barrier(ctx));
    if (me == 0)
        fprintf(stderr, "mp_peerdeath: %d ranks on %s, %zu bytes, rank %d dies in iteration "
                        "%ld of %ld\n",
                nranks, dchan_provider_name(ctx), size, victim, die_at, iters);

    unsigned long long t_death = 0, t_known = 0;
    for (long i = 0; i < iters; i++) {
        int dead_known = i > die_at;
        if (me == victim && i == die_at && !in_barrier) {
            /* In the middle of the exchange: half the puts, then gone. */
            put_all(i, nranks / 2, 0);
            if (quiesce) {
                collect(ctx, i, 0, me); /* it made no put to itself */
                for (int q = 0; q < nranks / 2; q++)
                    while (dchan_put_test(ch[q][i % 2].s.h) == 0)
                        ;
            }
            fflush(NULL);
            raise(SIGKILL);
        }
        if (i == die_at)
            t_death = now_ns(); /* near enough: the victim is about to die */
        put_all(i, nranks, dead_known);
        collect(ctx, i, dead_known, -1);
        if (i == die_at && in_barrier) {
            if (me == victim) {
                fflush(NULL);
                raise(SIGKILL);
            }
            t_death = now_ns();
            /* The victim never comes: the others' barrier must end. */
            EXPECT(dchan_barrier(ctx), DCHAN_ERR_PEER);
        }
        if (i == die_at) {
            /* Every handle to and from the dead rank fails, through error_fn. */
            while (!victim_errors_complete()) {
                int rc = dchan_wait(ctx, 1000);
                if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
                    die("dchan_wait: %s", dchan_strerror(rc));
                if (now_ns() - t_death > 120ull * 1000000000ull)
                    die("no DCHAN_ERR_PEER on every handle of rank %d after 120 s", victim);
            }
            t_known = now_ns();
        }
    }

    /* Errors exactly there, each reported once, and later calls say so too. */
    for (int q = 0; q < nranks; q++)
        for (int s = 0; s < 2; s++) {
            struct chan *c = &ch[q][s];
            int want = q == victim ? DCHAN_ERR_PEER : 0;
            if (c->r.err != want || c->s.err != want || c->r.err_seen != !!want ||
                c->s.err_seen != !!want)
                die("rank %d, set %d: errors %s (%d reports) / %s (%d reports), expected %s",
                    q, s, dchan_strerror(c->r.err), c->r.err_seen, dchan_strerror(c->s.err),
                    c->s.err_seen, dchan_strerror(want));
        }
    if (errors_total != 4)
        die("%d error reports, expected 4", errors_total);
    EXPECT(dchan_put(ch[victim][0].s.h), DCHAN_ERR_PEER);
    EXPECT(dchan_ready(ch[victim][1].r.h), DCHAN_ERR_PEER);
    EXPECT(dchan_barrier(ctx), DCHAN_ERR_PEER);

    for (int q = 0; q < nranks; q++)
        for (int s = 0; s < 2; s++) {
            /* Destroying a failed handle releases it; its error was reported. */
            CHECK(dchan_handle_destroy(ch[q][s].r.h));
            CHECK(dchan_handle_destroy(ch[q][s].s.h));
            buf_free(ch[q][s].r.buf);
            buf_free(ch[q][s].s.buf);
        }
    EXPECT(dchan_finalize(ctx), DCHAN_ERR_PEER);
    /* The launcher ignores exit codes under --enable-recovery: tests/mprun
     * counts these lines instead, one per survivor. */
    printf("SURVIVOR OK rank=%d\n", me);
    if (me == 0)
        printf("RESULT test=peer-death ranks=%d survivors=%d size=%zu iters=%ld "
               "detect_ms=%.1f verified=yes\n",
               nranks, nranks - 1, size, iters, (double)(t_known - t_death) / 1e6);
    fflush(NULL);
    /* Not MPI_Finalize: it would wait for the dead rank. */
    _exit(0);
}
