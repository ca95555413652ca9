/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Targeted tests of the verbs provider, launched by tests/mprun with
 * DCHAN_PROVIDER=verbs (providers/verbs/scenarios). Every rank exchanges
 * with every rank, itself included (a QP connected to itself), over two
 * channel sets used on alternate iterations, and checks every byte. Halfway,
 * at a point where nothing is in flight, one fault is injected:
 *
 *   exchange   none: splits (--env DCHAN_VERBS_MAX_MSG=...), a tiny send
 *              queue (--env DCHAN_VERBS_SQ_DEPTH=...), both EVENT paths
 *   rkey       rank 0 associates a wire for rank 1 whose rkey was corrupted
 *              (and the checksum recomputed) and puts: error_fn reports
 *              DCHAN_ERR_HANDLE on that handle only, the QP pair is rebuilt
 *              and every other channel, those on that QP included, goes on
 *   destroyed  rank 1 destroys one receive handle (its memory region is
 *              deregistered); rank 0's next put on it fails the same way,
 *              on that handle only
 *   killed     the last rank _exit()s; the others get DCHAN_ERR_PEER on
 *              every handle to and from it, nothing else, and go on
 *   wire       forged provider fields (with a valid checksum) are refused
 *
 * --env NAME=VALUE sets a variable before dchan_init (provider parameters,
 * or the simulation's DCHAN_VSIM_DEVICES=roce). --bad-env NAME=VALUE first
 * runs a dchan_init with that set, which must fail with
 * DCHAN_ERR_INVALID_ARG and name the variable on stderr. --depth K makes every
 * channel credited with K slots (DESIGN §7): each put waits for credit,
 * each arrival is checked in its slot through dchan_slot, and the faults
 * then also meet credit writes (flushed and written again after a rebuild,
 * lost with a dead peer, pending on a destroyed handle). Built with MPI (the mpi
 * bootstrap) and without (_nompi, the pmix one); it links the core
 * statically to forge wires (lib/wire.h).
 */
#include "config.h"

#include <getopt.h>

#define OOB 0xc3c3c3c3c3c3c3c3ull
#include "mptest.h"
#include "wire.h"

#define PER 2      /* channels per ordered pair of ranks and set */
#define MAXSIZES 16
#define W_RKEY (48 + 8) /* wire byte of the verbs rkey (lib/wire.h, verbs_rma.c) */
#define W_QPN (48 + 12)

static int detect;
static int depth; /* 0: plain channels; K: credited, K slots */
static int victim = -1; /* killed: the rank that exits */
static long iters = 200;
static unsigned long long limit_ns; /* mpt_time_limit_ns(), set by main */

/* ---- channels ------------------------------------------------------------------------------ */

/* Both ends between this rank and 'peer': receive from it, send to it. */
struct chan {
    int peer, set, id;
    size_t size;
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    long arrivals;
    long sent;        /* iterations put so far (a fault may put one early) */
    int rerr, serr;   /* error_fn codes seen on each end */
    int rgone, sgone; /* the end no longer takes part */
};

static struct chan *chans;
static int nchans;
static int errors_seen;
static dchan_handle_t *extra_handle; /* the forged one (rkey) */
static int extra_err;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    if (h != c->rh)
        die("callback of channel %d got another handle", c->id);
    c->arrivals++;
}

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    (void)arg;
    errors_seen++;
    if (h == extra_handle) {
        extra_err = rc;
        return;
    }
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        if (h == c->rh) {
            c->rerr = rc;
            c->rgone = 1;
            return;
        }
        if (h == c->sh) {
            c->serr = rc;
            c->sgone = 1;
            return;
        }
    }
    die("error %s on a handle that is no channel's", dchan_strerror(rc));
}

static size_t mode_size(size_t n)
{
    return detect == DCHAN_DETECT_SENTINEL ? (n < 8 ? 8 : (n + 7) & ~(size_t)7) : n;
}

/* The channel id of (sender, receiver, set, k): the same on both ranks. */
static int chan_id(int from, int to, int set, int k)
{
    return ((from * nranks + to) * 2 + set) * PER + k;
}

static dchan_wire_t *all_wires; /* [owner][slot], slot = chan_id of the receive end */
static int nslots;

static void setup(dchan_ctx_t *ctx, size_t size)
{
    nchans = nranks * 2 * PER;
    nslots = nranks * nranks * 2 * PER;
    chans = calloc((size_t)nchans, sizeof *chans);
    dchan_wire_t *mine = calloc((size_t)nslots, sizeof *mine);
    all_wires = calloc((size_t)nslots * (size_t)nranks, sizeof *all_wires);
    if (!chans || !mine || !all_wires)
        die("out of memory");
    for (int peer = 0, k = 0; peer < nranks; peer++) {
        for (int set = 0; set < 2; set++) {
            for (int j = 0; j < PER; j++, k++) {
                struct chan *c = &chans[k];
                c->peer = peer;
                c->set = set;
                c->size = size;
                c->id = chan_id(peer, me, set, j); /* what arrives here */
                dchan_handle_attr_t ha;
                dchan_handle_attr_init(&ha);
                ha.credit = depth > 0;
                ha.depth = depth > 0 ? depth : 1;
                c->rbuf = xalloc(size * (size_t)ha.depth);
                c->sbuf = xalloc(size);
                CHECK(dchan_create_handle_attr(ctx, peer, c->rbuf, size, OOB, on_arrival, c, &ha,
                                               &c->rh));
                CHECK(dchan_handle_export(c->rh, &mine[c->id]));
            }
        }
    }
    CHECK(dchan_allgather(ctx, mine, all_wires, (size_t)nslots * sizeof *mine));
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        int sid = chan_id(me, c->peer, c->set, k % PER);
        CHECK(dchan_assoc_local(ctx, &all_wires[(size_t)c->peer * nslots + sid], c->sbuf, size,
                                &c->sh));
    }
    free(mine);
}

static void teardown(void)
{
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        /* A handle whose channel broke is still destroyed cleanly. */
        if (c->sh)
            CHECK(dchan_handle_destroy(c->sh));
        if (c->rh)
            CHECK(dchan_handle_destroy(c->rh));
        free(c->rbuf);
        free(c->sbuf);
    }
    free(chans);
    free(all_wires);
    chans = NULL;
    all_wires = NULL;
}

/* The send buffer may be rewritten once the last put completed locally
 * (or failed: the error reaches error_fn). */
static void send_done(dchan_handle_t *h)
{
    unsigned long long start = now_ns();
    while (dchan_put_test(h) == 0)
        if (now_ns() - start > limit_ns)
            die("a put never completed");
}

/* A put, after waiting for credit on a credited channel. */
static int put_credit(dchan_ctx_t *ctx, dchan_handle_t *h)
{
    unsigned long long start = now_ns();
    int rc;
    while ((rc = dchan_put(h)) == DCHAN_ERR_AGAIN) {
        int prc = dchan_progress(ctx);
        if (prc < 0)
            die("dchan_progress: %s", dchan_strerror(prc));
        if (now_ns() - start > limit_ns)
            die("no credit within the time limit");
    }
    return rc;
}

/* Where the n-th arrival (from 1) of c is: its slot on a credited channel,
 * which must be the oldest one held (dchan_slot). */
static unsigned char *arrived_at(struct chan *c, long n)
{
    if (!depth)
        return c->rbuf;
    void *p = NULL;
    CHECK(dchan_slot(c->rh, &p));
    unsigned char *want = c->rbuf + (size_t)((n - 1) % depth) * c->size;
    if (p != want)
        die("channel %d: arrival %ld in slot %p, expected %p", c->id, n, p, (void *)want);
    return want;
}

static void progress_until(dchan_ctx_t *ctx, int (*done)(void), const char *what)
{
    unsigned long long start = now_ns();
    while (!done()) {
        int rc = dchan_wait(ctx, 100);
        if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
            die("dchan_wait: %s", dchan_strerror(rc));
        if (now_ns() - start > limit_ns)
            die("%s did not happen within the time limit", what);
    }
}

static long want_now;
static int set_now;
static int arrivals_done(void)
{
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        if (c->set == set_now && !c->rgone && c->arrivals < want_now)
            return 0;
    }
    return 1;
}

/* Iteration i on set i%2: put everywhere, wait for everything, verify,
 * re-arm. The re-arm contract holds as in tests/mp's halo: a rank puts on
 * set s at i+2 only after it received the peer's i+1 data, which the peer
 * sent after re-arming set s at the end of i. */
static void iteration(dchan_ctx_t *ctx, long i)
{
    int s = (int)(i % 2);
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        if (c->set != s || c->sgone || c->sent > i)
            continue;
        send_done(c->sh);
        if (c->sgone)
            continue;
        fill(c->sbuf, c->size, me, chan_id(me, c->peer, s, k % PER), i);
        c->sent = i + 1;
        int rc = put_credit(ctx, c->sh);
        /* The dead rank's channels may fail before error_fn told us. */
        if (rc == DCHAN_ERR_PEER && c->peer == victim)
            c->sgone = 1;
        else if (rc < 0 && !c->sgone)
            die("put on channel to rank %d: %s", c->peer, dchan_strerror(rc));
    }
    want_now = i / 2 + 1;
    set_now = s;
    progress_until(ctx, arrivals_done, "the arrivals of an iteration");
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        if (c->set != s || c->rgone)
            continue;
        if (c->arrivals != want_now)
            die("channel %d: %ld arrivals, expected %ld", c->id, c->arrivals, want_now);
        verify(arrived_at(c, want_now), c->size, c->peer, c->id, i);
        CHECK(dchan_ready(c->rh));
    }
}

static struct chan *find(int peer, int set, int j)
{
    return &chans[(peer * 2 + set) * PER + j];
}

/* ---- faults ------------------------------------------------------------------------------ */

/* Rank 0's puts of iteration i to 'peer', made early, right behind a put
 * that fails on the same QP: they are flushed, and the provider must
 * re-issue them once the QP pair is rebuilt (the receiver checks them in
 * iteration i as usual). */
static void put_early(dchan_ctx_t *ctx, int peer, long i, const struct chan *skip)
{
    int s = (int)(i % 2);
    for (int j = 0; j < PER; j++) {
        struct chan *c = find(peer, s, j);
        if (c == skip || c->sgone)
            continue;
        send_done(c->sh);
        fill(c->sbuf, c->size, me, chan_id(me, peer, s, j), i);
        c->sent = i + 1;
        CHECK(put_credit(ctx, c->sh));
    }
}

static void reseal(dchan_wire_t *w)
{
    dchan_put_le64(w->bytes + 120, dchan_fnv1a64(w->bytes, 120));
}

static int extra_failed(void)
{
    return extra_err != 0;
}

static struct chan *victim_send;
static int victim_failed(void)
{
    return victim_send->serr != 0;
}

static void fault_rkey(dchan_ctx_t *ctx, size_t size, long i)
{
    if (me != 0 || nranks < 2)
        return;
    /* A copy of rank 1's wire for channel (0 -> 1, set 0, 0), rkey altered
     * in its low byte (the key part of an mlx5 mkey; the tag in the
     * simulation): the same memory region's index with a key that is not
     * its own, so no other region can match. */
    dchan_wire_t w = all_wires[(size_t)1 * nslots + chan_id(0, 1, 0, 0)];
    w.bytes[W_RKEY] ^= 0x5a;
    reseal(&w);
    unsigned char *buf = xalloc(size);
    extra_err = 0;
    fill(buf, size, 0, 999, 0);
    CHECK(dchan_assoc_local(ctx, &w, buf, size, &extra_handle));
    CHECK(put_credit(ctx, extra_handle));
    put_early(ctx, 1, i + 1, NULL);
    progress_until(ctx, extra_failed, "the error of the forged put");
    if (extra_err != DCHAN_ERR_HANDLE)
        die("forged rkey: error %s, expected %s", dchan_strerror(extra_err),
            dchan_strerror(DCHAN_ERR_HANDLE));
    EXPECT(dchan_put(extra_handle), DCHAN_ERR_HANDLE);
    CHECK(dchan_handle_destroy(extra_handle));
    extra_handle = NULL;
    free(buf);
    fprintf(stderr, "verbs_errors[0]: forged rkey refused with %s on its handle only\n",
            dchan_strerror(extra_err));
}

static void fault_destroyed(dchan_ctx_t *ctx, long i)
{
    if (nranks < 2)
        return;
    /* Rank 1 destroys its receive end of (0 -> 1, set of i+1, 0). */
    int set = (int)((i + 1) % 2);
    if (me == 1) {
        struct chan *c = find(0, set, 0);
        CHECK(dchan_handle_destroy(c->rh));
        c->rh = NULL;
        c->rgone = 1;
    }
    CHECK(dchan_barrier(ctx));
    if (me == 0) {
        victim_send = find(1, set, 0);
        fill(victim_send->sbuf, victim_send->size, 0, 998, i);
        CHECK(put_credit(ctx, victim_send->sh));
        put_early(ctx, 1, i + 1, victim_send);
        progress_until(ctx, victim_failed, "the error of the put to a destroyed handle");
        if (victim_send->serr != DCHAN_ERR_HANDLE)
            die("put to a destroyed handle: %s, expected %s", dchan_strerror(victim_send->serr),
                dchan_strerror(DCHAN_ERR_HANDLE));
        EXPECT(dchan_put(victim_send->sh), DCHAN_ERR_HANDLE);
        fprintf(stderr, "verbs_errors[0]: put to a destroyed handle failed with %s\n",
                dchan_strerror(victim_send->serr));
    }
}

static void fault_wire(dchan_ctx_t *ctx, size_t size)
{
    dchan_wire_t w = all_wires[(size_t)me * nslots + chan_id(me, me, 0, 0)];
    unsigned char *buf = xalloc(size);
    dchan_handle_t *h = NULL;

    /* The QP named is another one, a reserved byte is set: refused. */
    dchan_wire_t f = w;
    f.bytes[W_QPN] ^= 1;
    reseal(&f);
    EXPECT(dchan_assoc_local(ctx, &f, buf, size, &h), DCHAN_ERR_HANDLE);
    f = w;
    f.bytes[48 + 40] = 1;
    reseal(&f);
    EXPECT(dchan_assoc_local(ctx, &f, buf, size, &h), DCHAN_ERR_HANDLE);
    /* A sequence word address on a mode that has none, or none on FLAG. */
    f = w;
    f.bytes[48 + 16] ^= detect == DCHAN_DETECT_FLAG ? 0 : 8;
    if (detect == DCHAN_DETECT_FLAG)
        memset(f.bytes + 48 + 16, 0, 8);
    reseal(&f);
    EXPECT(dchan_assoc_local(ctx, &f, buf, size, &h), DCHAN_ERR_HANDLE);
    /* An unknown flag, or the in-order flag on another mode than SENTINEL. */
    f = w;
    f.bytes[48 + 28] |= detect == DCHAN_DETECT_SENTINEL ? 2 : 1;
    reseal(&f);
    EXPECT(dchan_assoc_local(ctx, &f, buf, size, &h), DCHAN_ERR_HANDLE);
    /* The untouched wire still works (a second sender handle is fine). */
    CHECK(dchan_assoc_local(ctx, &w, buf, size, &h));
    CHECK(dchan_handle_destroy(h));
    free(buf);
}

/* ---- after a peer died: no collective may include it -------------------------------------- */

static int dead_errors_complete(void)
{
    for (int k = 0; k < nchans; k++) {
        struct chan *c = &chans[k];
        if (c->peer == victim && (!c->rerr || !c->serr))
            return 0;
    }
    return 1;
}

static int leader_peer;
static int leader_sees_exit(void)
{
    for (int k = 0; k < nchans; k++)
        if (chans[k].peer == leader_peer && !chans[k].rerr)
            return 0;
    return 1;
}

static struct chan *wait_chan;
static long wait_want;
static int chan_arrived(void)
{
    return wait_chan->arrivals >= wait_want;
}

/* Survivors end without dchan_finalize (its barrier would wait for the
 * dead rank): each tells rank 0 it is done, rank 0 answers each, and stays
 * until every other survivor is gone, so that no answer is lost with an
 * exiting sender. Iteration i's channels: re-armed at i-2 like any other. */
static void survivors_end(dchan_ctx_t *ctx, long i)
{
    int s = (int)(i % 2);

    wait_want = i / 2 + 1;
    if (me != 0) {
        struct chan *c = find(0, s, 0);
        send_done(c->sh);
        fill(c->sbuf, c->size, me, chan_id(me, 0, s, 0), i);
        CHECK(put_credit(ctx, c->sh));
        wait_chan = c;
        progress_until(ctx, chan_arrived, "rank 0's answer");
        verify(arrived_at(c, wait_want), c->size, 0, c->id, i);
        fflush(NULL);
        _exit(0);
    }
    for (int r = 1; r < nranks; r++) {
        if (r == victim)
            continue;
        wait_chan = find(r, s, 0);
        progress_until(ctx, chan_arrived, "a survivor's last message");
        verify(arrived_at(wait_chan, wait_want), wait_chan->size, r, wait_chan->id, i);
    }
    for (int r = 1; r < nranks; r++) {
        if (r == victim)
            continue;
        struct chan *c = find(r, s, 0);
        send_done(c->sh);
        fill(c->sbuf, c->size, 0, chan_id(0, r, s, 0), i);
        CHECK(put_credit(ctx, c->sh));
    }
    for (int r = 1; r < nranks; r++) {
        if (r == victim)
            continue;
        leader_peer = r;
        progress_until(ctx, leader_sees_exit, "the exit of another survivor");
    }
    printf("RESULT test=killed ranks=%d survivors=%d verified=yes\n", nranks, nranks - 1);
    fflush(NULL);
    _exit(0);
}

/* ---- main ------------------------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr, "usage: verbs_errors --test exchange|rkey|destroyed|killed|wire "
                    "[--sizes a,b] [--iters N] [--depth K] [--env NAME=VALUE]... "
                    "[--bad-env NAME=VALUE]...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *test = NULL;
    long sizes[MAXSIZES] = {4096};
    int nsizes = 1, opt;
    static const struct option opts[] = {{"test", required_argument, 0, 't'},
                                         {"sizes", required_argument, 0, 's'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"env", required_argument, 0, 'e'},
                                         {"depth", required_argument, 0, 'd'},
                                         {"bad-env", required_argument, 0, 'b'},
                                         {0, 0, 0, 0}};
    mpt_prog = "verbs_errors";

#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 't':
            test = optarg;
            break;
        case 's': {
            char *p = optarg;
            nsizes = 0;
            while (*p && nsizes < MAXSIZES) {
                sizes[nsizes++] = strtol(p, &p, 0);
                if (*p == ',')
                    p++;
            }
            break;
        }
        case 'i':
            iters = atol(optarg);
            break;
        case 'd':
            depth = atoi(optarg);
            if (depth < 1 || depth > 64)
                usage();
            break;
        case 'e':
            if (!mpt_setenv_arg(optarg))
                usage();
            break;
        case 'b':
            if (!mpt_bad_env_add(optarg))
                usage();
            break;
        default:
            usage();
        }
    }
    if (!test || iters < 4)
        usage();
    limit_ns = mpt_time_limit_ns();

    mpt_bad_env();
    dchan_ctx_t *ctx = mpt_init(on_error);
    if (strcmp(dchan_provider_name(ctx), "verbs") != 0)
        die("provider %s, expected verbs", dchan_provider_name(ctx));
    {
        static unsigned char probe[8];
        dchan_handle_t *h;
        CHECK(dchan_create_handle(ctx, me, probe, 8, OOB, on_arrival, NULL, &h));
        detect = dchan_handle_detect(h);
        CHECK(dchan_handle_destroy(h));
    }
    int killed = strcmp(test, "killed") == 0;
    if (killed && nranks < 3)
        die("killed needs 3 ranks or more");
    if (killed)
        victim = nranks - 1;

    for (int si = 0; si < nsizes; si++) {
        size_t size = mode_size((size_t)sizes[si]);
        long fault_at = iters / 2;
        setup(ctx, size);
        for (long i = 0; i < iters; i++) {
            iteration(ctx, i);
            if (i != fault_at)
                continue;
            /* Nothing in flight anywhere: every rank has every arrival of
             * iteration i. */
            CHECK(dchan_barrier(ctx));
            if (strcmp(test, "rkey") == 0)
                fault_rkey(ctx, size, i);
            else if (strcmp(test, "destroyed") == 0)
                fault_destroyed(ctx, i);
            else if (strcmp(test, "wire") == 0)
                fault_wire(ctx, size);
            if (killed) {
                if (me == victim) {
                    fprintf(stderr, "verbs_errors[%d]: exiting abruptly\n", me);
                    fflush(NULL);
                    _exit(0);
                }
            } else {
                CHECK(dchan_barrier(ctx));
            }
        }
        if (killed) {
            /* The put to the dead rank or a probe finds it gone. */
            progress_until(ctx, dead_errors_complete,
                           "DCHAN_ERR_PEER on every handle of the dead rank");
        }
        /* Errors exactly where the fault was, of the expected kind. */
        for (int k = 0; k < nchans; k++) {
            struct chan *c = &chans[k];
            int want_r = 0, want_s = 0;
            if (killed && c->peer == victim)
                want_r = want_s = DCHAN_ERR_PEER;
            if (strcmp(test, "destroyed") == 0 && me == 0 && c == victim_send)
                want_s = DCHAN_ERR_HANDLE;
            if (c->rerr != want_r || c->serr != want_s)
                die("channel with rank %d (set %d): errors %s / %s, expected %s / %s", c->peer,
                    c->set, dchan_strerror(c->rerr), dchan_strerror(c->serr),
                    dchan_strerror(want_r), dchan_strerror(want_s));
        }
        if (me == 0)
            fprintf(stderr, "verbs_errors: %s, %zu bytes, %ld iterations: ok\n", test, size,
                    iters);
        if (killed)
            survivors_end(ctx, iters);
        CHECK(dchan_barrier(ctx));
        teardown();
        victim_send = NULL;
    }
    int expect_errors = strcmp(test, "rkey") == 0 && me == 0 ? nsizes
                        : strcmp(test, "destroyed") == 0 && me == 0 ? nsizes
                                                                    : 0;
    if (errors_seen != expect_errors)
        die("%d asynchronous errors, expected %d", errors_seen, expect_errors);
    CHECK(dchan_finalize(ctx));
    if (me == 0)
        printf("RESULT test=%s ranks=%d verified=yes\n", test, nranks);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
