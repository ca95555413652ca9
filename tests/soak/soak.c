/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Soak test (make soak; make check only builds it, so that it keeps
 * compiling). One provider, detection mode and buffer kind, as tests/mprun
 * sets them in the environment (tests/soak/run-soak runs every combination
 * usable here): a million puts or ten minutes, every byte verified, then the
 * books must balance: puts = arrivals = callbacks, none lost or duplicated,
 * the library's counters agreeing, and resident memory and open descriptors
 * flat after warm-up.
 *
 * Warm-up: descriptors are counted after 5% of the run (and two cycles of
 * every size), when every connection and lazily created resource exists,
 * and must not change after that. Resident memory must be flat over the
 * second half of the run: libfabric's tcp;ofi_rxm touches the pages of its
 * buffer pools a few at a time over each rank's first 150,000 or so
 * messages (some 11 MiB; bench/fi_rma_pingpong, without dchan, does the
 * same), which is not a leak but would hide one if the bound had to admit
 * it. A leak grows as much in the second half as in the first; what grew
 * between 5% and half-way is reported as rss_warmup_kib.
 *
 * Two ranks, each sender and receiver (or one rank on its own channels, the
 * self provider), one channel per size in each direction, the sizes a
 * geometric sequence from 8 B to 1 MiB. Rounds run in lockstep: in round r
 * each rank puts on the next W channels of the cycle, then waits for the
 * peer's W puts of round r, verifies them in the callback and re-arms those
 * channels. A channel comes back two rounds later at the earliest (the cycle
 * has at least 2W channels); by then this rank has seen the peer's round
 * r+1 puts, which the peer made after re-arming its round r channels. So
 * the CkDirect contract holds without acknowledgement puts, and every put
 * of the run carries data.
 *
 * Built with MPI and without (_nompi, for the singleton and PMIx
 * bootstraps), like tests/mp/mp_exchange.
 */
#include "config.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>

#define OOB 0x6b6b6b6b6b6b6b6bull
#include "mptest.h"

#define MAXCH 64
#define MAX_SIZE ((size_t)1 << 20)
/* Rounds between two agreements on the clock (an allgather): cheap next to
 * the 1024 puts a rank makes in them, and frequent enough that a time
 * limit stops the run within a second or so. */
#define EPOCH_ROUNDS 256
/* Resident memory may move by this much over the second half without a
 * leak: malloc keeps freed chunks and trims its heap top only past a
 * threshold (M_TRIM_THRESHOLD, 128 KiB by default), stdio and the
 * bootstrap's collectives allocate now and then, and the kernel's
 * accounting of shared pages lags. A leak of 4 bytes per put exceeds it
 * over the second half of a million puts. Descriptors have no such noise:
 * any growth fails. SOAK_RSS_TOLERANCE_KIB overrides it: on ofi-tcp, a
 * run of fewer than about 600,000 puts ends inside libfabric's warm-up
 * (see the top) and may need more. */
#define RSS_TOLERANCE_KIB 1024

struct chan {
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    size_t size;
    int id;
    int armed;        /* receive end re-armed, no arrival since */
    uint64_t sent;    /* puts on the send end */
    uint64_t arrived; /* arrivals on the receive end, duplicates excluded */
};

static struct chan chans[MAXCH];
static int nch, peer;
static uint64_t n_callbacks, n_dups, n_errors, bytes_in;
static int last_error;

/* Verify in the callback: the iteration the data must carry is the count of
 * arrivals before it, so a stale or repeated put fails the pattern. A
 * callback on a channel that has not been re-armed since its last arrival
 * is a duplicate. */
static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    n_callbacks++;
    if (h != c->rh || !c->armed) {
        n_dups++;
        return;
    }
    verify(c->rbuf, c->size, peer, c->id, (long)c->arrived);
    c->armed = 0;
    c->arrived++;
    bytes_in += c->size;
}

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    (void)h;
    (void)arg;
    n_errors++;
    last_error = rc;
}

/* ---- resources ------------------------------------------------------------------ */

/* Resident set in KiB, from /proc/self/statm read without stdio (whose
 * buffer would itself be a malloc). -1 where /proc is missing. */
static long rss_kib(void)
{
    char buf[128];
    long pages_total, pages_res;
    int fd = open("/proc/self/statm", O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "%ld %ld", &pages_total, &pages_res) != 2)
        return -1;
    return pages_res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Open descriptors (the directory's own not counted); -1 without /proc. */
static int fd_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (!d)
        return -1;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;
}

/* Say what the open descriptors are, for a count that moved. */
static void fd_list(const char *when)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char target[256];
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
            continue;
        ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "soak[%d]: %s: descriptor %s -> %s\n", me, when, e->d_name, target);
    }
    closedir(d);
}

/* ---- channels ------------------------------------------------------------------ */

/* 8, 16, 24, 40, 64, 96, ... 1 MiB: each half as large again as the last,
 * rounded up to 8 bytes (SENTINEL needs it), so mostly not powers of two.
 * Outside SENTINEL, every other size in between is cut by 3 bytes so that
 * partial last words are exercised too. */
static int make_sizes(size_t *sizes, int detect)
{
    int n = 0;
    for (size_t s = 8; n < MAXCH; s = ((s * 3 / 2) + 7) & ~(size_t)7) {
        if (s >= MAX_SIZE) {
            sizes[n++] = MAX_SIZE;
            break;
        }
        sizes[n++] = s;
    }
    if (detect != DCHAN_DETECT_SENTINEL)
        for (int k = 1; k < n - 1; k += 2)
            sizes[k] -= 3;
    return n;
}

static void setup(dchan_ctx_t *ctx, const size_t *sizes)
{
    dchan_wire_t *mine = calloc((size_t)nch, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)nch * (size_t)nranks, sizeof *all);
    if (!mine || !all)
        die("out of memory");
    for (int k = 0; k < nch; k++) {
        struct chan *c = &chans[k];
        c->size = sizes[k];
        c->id = k;
        c->rbuf = buf_alloc(c->size);
        c->sbuf = buf_alloc(c->size);
        CHECK(dchan_create_handle(ctx, peer, c->rbuf, c->size, OOB, on_arrival, c, &c->rh));
        CHECK(dchan_handle_export(c->rh, &mine[k]));
        c->armed = 1; /* armed at creation */
    }
    /* Every rank has the same channels, so wire k of the peer is channel k. */
    CHECK(dchan_allgather(ctx, mine, all, (size_t)nch * sizeof *mine));
    for (int k = 0; k < nch; k++)
        CHECK(dchan_assoc_local(ctx, &all[(size_t)peer * (size_t)nch + (size_t)k],
                                chans[k].sbuf, chans[k].size, &chans[k].sh));
    free(mine);
    free(all);
}

static void teardown(void)
{
    for (int k = 0; k < nch; k++) {
        CHECK(dchan_handle_destroy(chans[k].sh));
        CHECK(dchan_handle_destroy(chans[k].rh));
        buf_free(chans[k].rbuf);
        buf_free(chans[k].sbuf);
    }
}

/* The send buffer may be refilled only once the previous put completed. */
static void send_done(struct chan *c, unsigned long long stall_ns)
{
    unsigned long long start = now_ns();
    int rc;
    while ((rc = dchan_put_test(c->sh)) == 0)
        if (now_ns() - start > stall_ns)
            die("put %" PRIu64 " on channel %d (%zu bytes) never completed locally", c->sent - 1,
                c->id, c->size);
    if (rc < 0)
        die("dchan_put_test on channel %d: %s", c->id, dchan_strerror(rc));
}

/* Progress until the round's channels all had their arrival. An arrival
 * that has not come after stall_ns without any callback is lost. */
static void wait_round(dchan_ctx_t *ctx, struct chan **cs, int n, unsigned long long stall_ns)
{
    unsigned long long last = now_ns();
    uint64_t seen = n_callbacks;
    for (;;) {
        int done = 1;
        for (int k = 0; k < n && done; k++)
            done = !cs[k]->armed;
        if (done)
            return;
        int rc = dchan_wait(ctx, 1000);
        if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
            die("dchan_wait: %s", dchan_strerror(rc));
        if (n_callbacks != seen) {
            seen = n_callbacks;
            last = now_ns();
        } else if (now_ns() - last > stall_ns) {
            for (int k = 0; k < n; k++)
                if (cs[k]->armed)
                    fprintf(stderr, "soak[%d]: channel %d (%zu bytes): put %" PRIu64
                            " from rank %d never arrived\n",
                            me, cs[k]->id, cs[k]->size, cs[k]->arrived, peer);
            die("lost: no arrival for %llu s (%" PRIu64 " asynchronous errors, last %s)",
                stall_ns / 1000000000ull, n_errors, n_errors ? dchan_strerror(last_error) : "none");
        }
    }
}

/* ---- main ---------------------------------------------------------------------- */

/* What each rank reports at the end; all fields 64-bit, so the allgather
 * needs no care about layout. */
struct tally {
    uint64_t puts, bytes_out, bytes_in, callbacks, dups, errors, early_round, half_round;
    uint64_t lib_puts, lib_arrivals, lib_callbacks, lib_errors;
    int64_t rss_early, rss_half, rss_end, fd_early, fd_end;
    uint64_t sent[MAXCH], arrived[MAXCH];
};

static void usage(void)
{
    fprintf(stderr,
            "usage: soak [--puts N (all ranks together; default $SOAK_PUTS or 1000000)]\n"
            "       [--minutes M (default $SOAK_MINUTES or 10; whichever comes first)]\n"
            "       [--window W (puts per rank and round, default 4)]\n"
            "       [--stall S (seconds without an arrival before one counts as lost, default 120)]\n");
    exit(2);
}

static const char *detect_name(int d)
{
    switch (d) {
    case DCHAN_DETECT_SENTINEL: return "sentinel";
    case DCHAN_DETECT_FLAG: return "flag";
    case DCHAN_DETECT_EVENT: return "event";
    default: return "unknown";
    }
}

/* The provider as run-soak names it: ofi and the verbs simulation carry
 * their variant (FI_PROVIDER, the placement), the others their own name. */
static void provider_label(const char *p, char *out, size_t len)
{
    const char *fi = getenv("FI_PROVIDER"), *placement = getenv("DCHAN_VSIM_PLACEMENT");
    if (strcmp(p, "ofi") == 0 && fi && *fi)
        snprintf(out, len, "ofi-%.*s", (int)strcspn(fi, ";,"), fi);
    else if (strcmp(p, "verbs") == 0 && placement && *placement)
        snprintf(out, len, "verbs-%s", placement);
    else
        snprintf(out, len, "%s", p);
}

int main(int argc, char **argv)
{
    const char *e;
    unsigned long long target = 1000000, stall_s = 120;
    double minutes = 10;
    long rss_tolerance = RSS_TOLERANCE_KIB;
    int window = 4, opt;
    static const struct option opts[] = {
        {"puts", required_argument, 0, 'p'}, {"minutes", required_argument, 0, 'm'},
        {"window", required_argument, 0, 'w'}, {"stall", required_argument, 0, 's'},
        {0, 0, 0, 0}};

    mpt_prog = "soak";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    /* The scenario line is fixed; quick runs come through the environment. */
    if ((e = getenv("SOAK_PUTS")) && *e)
        target = strtoull(e, NULL, 0);
    if ((e = getenv("SOAK_MINUTES")) && *e)
        minutes = strtod(e, NULL);
    if ((e = getenv("SOAK_RSS_TOLERANCE_KIB")) && *e)
        rss_tolerance = strtol(e, NULL, 0);
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'p': target = strtoull(optarg, NULL, 0); break;
        case 'm': minutes = strtod(optarg, NULL); break;
        case 'w': window = atoi(optarg); break;
        case 's': stall_s = strtoull(optarg, NULL, 0); break;
        default: usage();
        }
    }
    if (target < 1 || !(minutes > 0) || window < 1 || stall_s < 1 || optind != argc)
        usage();

    int fd_start = fd_count();
    dchan_ctx_t *ctx = mpt_init(on_error);
    /* Lockstep with one peer is what makes re-arming safe (see the top). */
    if (nranks > 2)
        die("soak runs on 1 or 2 ranks, not %d", nranks);
    peer = (me + 1) % nranks;

    /* The detection mode in use, from a probe handle. */
    int detect;
    {
        static unsigned char probe[8];
        dchan_handle_t *h;
        CHECK(dchan_create_handle(ctx, peer, probe, sizeof probe, OOB, on_arrival, NULL, &h));
        detect = dchan_handle_detect(h);
        CHECK(detect);
        CHECK(dchan_handle_destroy(h));
    }
    size_t sizes[MAXCH];
    nch = make_sizes(sizes, detect);
    if (nch < 2 * window)
        die("%d sizes cannot carry a window of %d (at least 2 rounds apart)", nch, window);
    setup(ctx, sizes);

    char label[64];
    provider_label(dchan_handle_provider(chans[0].sh), label, sizeof label);
    const char *buf_kind = mpt_buf_ctx ? "alloc" : "heap";
    uint64_t per_rank = (target + (uint64_t)nranks - 1) / (uint64_t)nranks;
    uint64_t rounds = (per_rank + (uint64_t)window - 1) / (uint64_t)window;
    /* Samples (see the top): after 5% of the run and at least two cycles
     * of every size (or 5% of the time limit, on a slow provider), so that
     * every buffer and every lazily created provider resource exists; then
     * half-way (in rounds or in time); then at the end. */
    uint64_t cycle = ((uint64_t)nch + (uint64_t)window - 1) / (uint64_t)window;
    uint64_t warm_rounds = rounds / 20 > 2 * cycle ? rounds / 20 : 2 * cycle;
    unsigned long long limit_ns = (unsigned long long)(minutes * 60e9);
    unsigned long long stall_ns = stall_s * 1000000000ull;
    if (me == 0)
        fprintf(stderr,
                "soak: %s %s buf=%s, %d ranks, %d channels each way of %zu..%zu bytes, window %d: "
                "%" PRIu64 " rounds (%" PRIu64 " puts) or %.1f minutes\n",
                label, detect_name(detect), buf_kind, nranks, nch, sizes[0], sizes[nch - 1], window,
                rounds, rounds * (uint64_t)window * (uint64_t)nranks, minutes);

    struct tally t;
    memset(&t, 0, sizeof t);
    int early = 0, half = 0, stopped_by_time = 0;
    struct chan *cs[MAXCH];
    uint64_t r;
    unsigned long long start = now_ns(), last_report = start;
    CHECK(dchan_barrier(ctx));
    for (r = 0; r < rounds; r++) {
        for (int j = 0; j < window; j++) {
            struct chan *c = &chans[(r * (uint64_t)window + (uint64_t)j) % (uint64_t)nch];
            if (c->sent)
                send_done(c, stall_ns);
            fill(c->sbuf, c->size, me, c->id, (long)c->sent);
            CHECK(dchan_put(c->sh));
            c->sent++;
            t.puts++;
            t.bytes_out += c->size;
            cs[j] = c; /* the peer puts on the same channels this round */
        }
        wait_round(ctx, cs, window, stall_ns);
        for (int j = 0; j < window; j++) {
            cs[j]->armed = 1;
            CHECK(dchan_ready(cs[j]->rh));
        }
        if ((r + 1) % EPOCH_ROUNDS || r + 1 == rounds)
            continue;
        /* Agree on the clock: any rank past the limit stops all. */
        unsigned long long el = now_ns() - start;
        int32_t mine[3] = {el >= limit_ns, el >= limit_ns / 20, el >= limit_ns / 2}, all[2 * 3];
        CHECK(dchan_allgather(ctx, mine, all, sizeof mine));
        int time_up = 0, early_time = 0, half_time = 0;
        for (int k = 0; k < nranks; k++) {
            time_up |= all[3 * k];
            early_time |= all[3 * k + 1];
            half_time |= all[3 * k + 2];
        }
        if (!early && (r + 1 >= warm_rounds || early_time)) {
            early = 1;
            t.early_round = r + 1;
            t.rss_early = rss_kib();
            t.fd_early = fd_count();
        }
        if (early && !half && (r + 1 >= rounds / 2 || half_time)) {
            half = 1;
            t.half_round = r + 1;
            t.rss_half = rss_kib();
        }
        if (me == 0 && now_ns() - last_report > 10000000000ull) {
            last_report = now_ns();
            fprintf(stderr,
                    "soak: %" PRIu64 " of %" PRIu64 " rounds, %.0f s, resident %ld KiB, %d descriptors\n",
                    r + 1, rounds, (double)el / 1e9, rss_kib(), fd_count());
        }
        if (time_up) {
            stopped_by_time = 1;
            r++;
            break;
        }
    }
    double seconds = (double)(now_ns() - start) / 1e9;
    if (!early) { /* too short a run to compare much */
        t.early_round = r;
        t.rss_early = rss_kib();
        t.fd_early = fd_count();
    }
    if (!half) {
        t.half_round = r;
        t.rss_half = rss_kib();
    }
    t.rss_end = rss_kib();
    t.fd_end = fd_count();

    /* Anything still arriving now is a duplicate: progress a while after
     * every rank stopped putting. */
    CHECK(dchan_barrier(ctx));
    for (unsigned long long d = now_ns(); now_ns() - d < 200000000ull;) {
        int rc = dchan_wait(ctx, 50);
        if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
            die("dchan_wait: %s", dchan_strerror(rc));
    }
    CHECK(dchan_barrier(ctx));

    dchan_stats_t st;
    CHECK(dchan_get_stats(ctx, &st));
    t.bytes_in = bytes_in;
    t.callbacks = n_callbacks;
    t.dups = n_dups;
    t.errors = n_errors;
    t.lib_puts = st.puts;
    t.lib_arrivals = st.arrivals;
    t.lib_callbacks = st.callbacks;
    t.lib_errors = st.errors;
    for (int k = 0; k < nch; k++) {
        t.sent[k] = chans[k].sent;
        t.arrived[k] = chans[k].arrived;
    }
    struct tally *all = calloc((size_t)nranks, sizeof *all);
    if (!all)
        die("out of memory");
    CHECK(dchan_allgather(ctx, &t, all, sizeof t));

    /* The books, the same on every rank: what rank q put on channel k must
     * have arrived exactly once at its peer. */
    uint64_t puts = 0, arrivals = 0, callbacks = 0, bytes = 0, bytes_rx = 0, lost = 0, dup = 0;
    long rss_growth = 0, rss_warmup = 0, fd_growth = 0;
    int fail = 0, no_proc = 0;
    for (int q = 0; q < nranks; q++) {
        const struct tally *a = &all[q], *b = &all[(q + 1) % nranks];
        puts += a->puts;
        arrivals += a->lib_arrivals;
        callbacks += a->callbacks;
        bytes += a->bytes_out;
        bytes_rx += a->bytes_in;
        dup += a->dups;
        for (int k = 0; k < nch; k++) {
            lost += a->sent[k] > b->arrived[k] ? a->sent[k] - b->arrived[k] : 0;
            dup += b->arrived[k] > a->sent[k] ? b->arrived[k] - a->sent[k] : 0;
        }
        if (a->lib_puts != a->puts || a->lib_callbacks != a->callbacks) {
            fail = 1;
            if (me == 0)
                fprintf(stderr,
                        "soak: rank %d: library counts %" PRIu64 " puts and %" PRIu64
                        " callbacks, the program %" PRIu64 " and %" PRIu64 "\n",
                        q, a->lib_puts, a->lib_callbacks, a->puts, a->callbacks);
        }
        if (a->errors || a->lib_errors) {
            fail = 1;
            if (me == 0)
                fprintf(stderr, "soak: rank %d: %" PRIu64 " asynchronous errors\n", q,
                        a->errors > a->lib_errors ? a->errors : a->lib_errors);
        }
        if (a->rss_early < 0 || a->fd_early < 0 || a->rss_end < 0 || a->fd_end < 0) {
            no_proc = 1;
            continue;
        }
        if (a->rss_end - a->rss_half > rss_growth)
            rss_growth = (long)(a->rss_end - a->rss_half);
        if (a->rss_half - a->rss_early > rss_warmup)
            rss_warmup = (long)(a->rss_half - a->rss_early);
        if (a->fd_end - a->fd_early > fd_growth)
            fd_growth = (long)(a->fd_end - a->fd_early);
        if (me == 0)
            fprintf(stderr,
                    "soak: rank %d: resident %" PRId64 " KiB at round %" PRIu64 ", %" PRId64
                    " KiB at round %" PRIu64 ", %" PRId64 " KiB at the end; descriptors %" PRId64
                    " then %" PRId64 "\n",
                    q, a->rss_early, a->early_round, a->rss_half, a->half_round, a->rss_end,
                    a->fd_early, a->fd_end);
    }
    if (lost || dup || puts != arrivals || arrivals != callbacks || bytes != bytes_rx)
        fail = 1;
    if (rss_growth > rss_tolerance) {
        fail = 1;
        if (me == 0)
            fprintf(stderr,
                    "soak: resident memory grew by %ld KiB over the second half (tolerance %ld)\n",
                    rss_growth, rss_tolerance);
    }
    if (fd_growth > 0) {
        fail = 1;
        if (me == 0)
            fprintf(stderr, "soak: %ld descriptors more than after warm-up\n", fd_growth);
    }
    free(all);

    teardown();
    CHECK(dchan_finalize(ctx));
    /* Not a failure (MPI and libfabric may keep descriptors for the
     * process's life), but worth seeing next to the steady state. */
    int fd_after = fd_count();
    if (fd_start >= 0 && fd_after >= 0 && fd_after != fd_start) {
        fprintf(stderr, "soak[%d]: %+d descriptors after dchan_finalize than before dchan_init\n",
                me, fd_after - fd_start);
        fd_list("after dchan_finalize");
    }
    if (me == 0) {
        char rss_s[24], warm_s[24], fd_s[24];
        snprintf(rss_s, sizeof rss_s, no_proc ? "unknown" : "%ld", rss_growth);
        snprintf(warm_s, sizeof warm_s, no_proc ? "unknown" : "%ld", rss_warmup);
        snprintf(fd_s, sizeof fd_s, no_proc ? "unknown" : "%ld", fd_growth);
        printf("RESULT soak=%s-%s-%s provider=%s detect=%s buf=%s ranks=%d puts=%" PRIu64
               " arrivals=%" PRIu64 " callbacks=%" PRIu64 " lost=%" PRIu64 " dup=%" PRIu64
               " bytes=%" PRIu64 " rss_warmup_kib=%s rss_growth_kib=%s fd_growth=%s seconds=%.1f"
               " stop=%s"
               " verified=yes status=%s\n",
               label, detect_name(detect), buf_kind, label, detect_name(detect), buf_kind, nranks,
               puts, arrivals, callbacks, lost, dup, bytes, warm_s, rss_s, fd_s, seconds,
               stopped_by_time ? "minutes" : "puts", fail ? "fail" : "pass");
        fflush(stdout);
    }
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return fail;
}
