/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Multi-process channel tests, launched by mpirun through tests/mprun.
 *
 * Built twice: with MPI (the program initialises MPI, so dchan bootstraps
 * through it) and without (USE_MPI undefined: the PMIx bootstrap of a
 * program started by mpirun). Wires travel through dchan_allgather in both
 * builds, so the scenarios are the same code.
 *
 * Every byte of every put is checked against a pattern carrying the sender,
 * the channel and the iteration. Each scenario keeps the re-arm contract
 * through its own structure (see the comment above each), never a barrier
 * per iteration.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>

#define OOB 0xa5a5a5a5a5a5a5a5ull
#include "mptest.h"

#define MAXCH 64

static int detect_mode;
static unsigned long long t_limit_ns; /* mpt_time_limit_ns(), set by main */

/* ---- channels ------------------------------------------------------------------ */

struct chan {
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    size_t size;
    int from, to; /* peer ranks of the receive and send ends */
    int id;       /* pattern channel number */
    long arrivals;
};

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    if (h != c->rh)
        die("callback for channel %d got another handle", c->id);
    c->arrivals++;
}

static int errors_seen, last_error;
static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    errors_seen++;
    last_error = rc;
}

static size_t round_size(size_t n)
{
    return detect_mode == DCHAN_DETECT_SENTINEL ? (n < 8 ? 8 : (n + 7) & ~(size_t)7) : n;
}

/*
 * Create the receive ends of n channels, exchange wires with dchan_allgather
 * and associate the send ends. Channel k of this rank receives from
 * c[k].from and sends to c[k].to; the channel a rank sends on is matched to
 * the receive end by (sender, receiver, id), which every rank can compute.
 */
/* --hosts N: ranks in blocks of N claim one host each (DCHAN_HOST), so
 * that routing sends some peers over shm and the others over the network;
 * --no-cma: shm must step aside. 0: no expectation. */
static int hosts_block, no_cma;

/* The provider serving a handle must be the one routing promises. */
static void check_route(const dchan_handle_t *h, int peer)
{
    const char *p = dchan_handle_provider(h);
    if (!p)
        die("no provider for a live handle");
    if (hosts_block > 0 && peer != me) {
        int same = peer / hosts_block == me / hosts_block;
        if (same != (strcmp(p, "shm") == 0) || strcmp(p, "self") == 0)
            die("rank %d (%s host) served by %s", peer, same ? "same" : "another", p);
    }
    if ((hosts_block > 0 || no_cma) && peer == me && strcmp(p, "self") != 0)
        die("own channel served by %s, not self", p);
    if (no_cma && strcmp(p, "shm") == 0)
        die("shm serves rank %d with Cross Memory Attach refused", peer);
}

static void setup(dchan_ctx_t *ctx, struct chan *c, int n)
{
    /* Ranks may have different channel counts: size the table for the most. */
    int *counts = calloc((size_t)nranks, sizeof *counts), most = 0;
    if (!counts)
        die("out of memory");
    CHECK(dchan_allgather(ctx, &n, counts, sizeof n));
    for (int r = 0; r < nranks; r++)
        most = counts[r] > most ? counts[r] : most;
    free(counts);
    size_t per = (size_t)most, total = (size_t)nranks * per;
    dchan_wire_t *mine = calloc(total, sizeof *mine);
    dchan_wire_t *all = calloc(total * (size_t)nranks, sizeof *all);
    int *ids = calloc(total, sizeof *ids), *all_ids = calloc(total * (size_t)nranks, sizeof *ids);
    if (!mine || !all || !ids || !all_ids)
        die("out of memory");
    for (size_t i = 0; i < total; i++)
        ids[i] = -1;
    /* Slot [sender][k]: the k-th receive end this rank has for that sender. */
    int *used = calloc((size_t)nranks, sizeof *used);
    for (int k = 0; k < n; k++) {
        c[k].rbuf = buf_alloc(c[k].size);
        c[k].sbuf = buf_alloc(c[k].size);
        CHECK(dchan_create_handle(ctx, c[k].from, c[k].rbuf, c[k].size, OOB, on_arrival, &c[k],
                                  &c[k].rh));
        size_t slot = (size_t)c[k].from * per + (size_t)used[c[k].from]++;
        CHECK(dchan_handle_export(c[k].rh, &mine[slot]));
        ids[slot] = c[k].id;
    }
    CHECK(dchan_allgather(ctx, mine, all, total * sizeof *mine));
    CHECK(dchan_allgather(ctx, ids, all_ids, total * sizeof *ids));
    for (int k = 0; k < n; k++) {
        const dchan_wire_t *w = NULL;
        for (size_t s = 0; s < per && !w; s++) {
            size_t at = (size_t)c[k].to * total + (size_t)me * per + s;
            if (all_ids[at] == c[k].id)
                w = &all[at];
        }
        if (!w)
            die("no wire from rank %d for channel %d", c[k].to, c[k].id);
        CHECK(dchan_assoc_local(ctx, w, c[k].sbuf, c[k].size, &c[k].sh));
        check_route(c[k].sh, c[k].to);
        check_route(c[k].rh, c[k].from);
    }
    free(used);
    free(mine);
    free(all);
    free(ids);
    free(all_ids);
}

static void teardown(struct chan *c, int n)
{
    for (int k = 0; k < n; k++) {
        CHECK(dchan_handle_destroy(c[k].sh));
        CHECK(dchan_handle_destroy(c[k].rh));
        buf_free(c[k].rbuf);
        buf_free(c[k].sbuf);
    }
}

/* Progress until every listed channel reached its arrival count. */
static void wait_all(dchan_ctx_t *ctx, struct chan **cs, int n, const long *want)
{
    unsigned long long start = now_ns();
    for (;;) {
        int done = 1;
        for (int k = 0; k < n && done; k++)
            done = cs[k]->arrivals >= want[k];
        if (done)
            break;
        int rc = dchan_wait(ctx, 1000);
        if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
            die("dchan_wait: %s", dchan_strerror(rc));
        if (now_ns() - start > t_limit_ns) {
            for (int k = 0; k < n; k++)
                fprintf(stderr, "mp_exchange[%d]: channel %d from rank %d: %ld of %ld arrivals\n",
                        me, cs[k]->id, cs[k]->from, cs[k]->arrivals, want[k]);
            die("no arrival for %llu s", t_limit_ns / 1000000000ull);
        }
    }
    for (int k = 0; k < n; k++)
        if (cs[k]->arrivals != want[k])
            die("channel %d: %ld callbacks, expected %ld (exactly once per arrival)", cs[k]->id,
                cs[k]->arrivals, want[k]);
}

/* The send buffer may be refilled only once the previous put completed. */
static void send_done(struct chan *c)
{
    unsigned long long start = now_ns();
    unsigned idle = 0;
    int rc;
    while ((rc = dchan_put_test(c->sh)) == 0) {
        if (now_ns() - start > t_limit_ns)
            die("put on channel %d never completed", c->id);
        mpt_idle(&idle, 0); /* completion can take the peer's progress: let it run */
    }
    if (rc < 0)
        die("dchan_put_test: %s", dchan_strerror(rc));
}

/* ---- bad calls in the middle of an exchange ------------------------------------ */

/* Every misuse must get its code and leave the channels working. */
static void bad_calls(dchan_ctx_t *ctx, struct chan *c)
{
    dchan_wire_t w, junk;
    dchan_handle_t *tmp;
    unsigned char small[64];

    EXPECT(dchan_put(NULL), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_ready(NULL), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_create_handle(ctx, nranks, small, 8, OOB, on_arrival, c, &tmp),
           DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_create_handle(ctx, me, NULL, 8, OOB, on_arrival, c, &tmp),
           DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_create_handle(ctx, me, small, 0, OOB, on_arrival, c, &tmp),
           DCHAN_ERR_INVALID_ARG);
    /* c->rh is armed (the caller re-armed it): ready again is a state error. */
    EXPECT(dchan_ready(c->rh), DCHAN_ERR_STATE);
    EXPECT(dchan_ready_mark(c->rh), DCHAN_ERR_STATE);
    EXPECT(dchan_put(c->rh), DCHAN_ERR_STATE);        /* put on a receive end */
    EXPECT(dchan_handle_export(c->sh, &w), DCHAN_ERR_STATE);
    EXPECT(dchan_progress(NULL), DCHAN_ERR_INVALID_ARG);

    /* Wires: a size mismatch, corrupted bytes, garbage, another job's. */
    CHECK(dchan_create_handle(ctx, me, small, sizeof small, OOB, on_arrival, c, &tmp));
    CHECK(dchan_handle_export(tmp, &w));
    dchan_handle_t *y = NULL;
    EXPECT(dchan_assoc_local(ctx, &w, small, 32, &y), DCHAN_ERR_SIZE);
    for (int i = 0; i < DCHAN_WIRE_SIZE; i += 7) {
        junk = w;
        junk.bytes[i] ^= 0x40;
        dchan_handle_t *x = NULL;
        EXPECT(dchan_assoc_local(ctx, &junk, small, sizeof small, &x), DCHAN_ERR_HANDLE);
    }
    memset(&junk, 0xff, sizeof junk);
    dchan_handle_t *x = NULL;
    EXPECT(dchan_assoc_local(ctx, &junk, small, sizeof small, &x), DCHAN_ERR_HANDLE);
    {
        /* A second context is another job as far as wires go. */
        dchan_ctx_t *other;
        dchan_attr_t a;
        dchan_attr_init(&a);
        CHECK(dchan_init(&a, &other));
        EXPECT(dchan_assoc_local(other, &w, small, sizeof small, &x), DCHAN_ERR_HANDLE);
        CHECK(dchan_finalize(other));
    }
    /* Calls on a destroyed handle. */
    CHECK(dchan_handle_destroy(tmp));
    EXPECT(dchan_ready(tmp), DCHAN_ERR_STATE);
    EXPECT(dchan_ready_pollq(tmp), DCHAN_ERR_STATE);
    EXPECT(dchan_handle_export(tmp, &w), DCHAN_ERR_STATE);
    EXPECT(dchan_handle_destroy(tmp), DCHAN_ERR_STATE);
    /* A put whose tail equals the oob pattern is refused and sends nothing. */
    if (detect_mode == DCHAN_DETECT_SENTINEL) {
        uint64_t save, oob = OOB;
        send_done(c);
        memcpy(&save, c->sbuf + c->size - 8, 8);
        memcpy(c->sbuf + c->size - 8, &oob, 8);
        EXPECT(dchan_put(c->sh), DCHAN_ERR_SENTINEL);
        memcpy(c->sbuf + c->size - 8, &save, 8);
    }
    if (errors_seen)
        die("bad calls raised %d asynchronous errors (last %s)", errors_seen,
            dchan_strerror(last_error));
}

/* ---- scenarios -------------------------------------------------------------------- */

/*
 * Halo: every rank exchanges with both ring neighbours over two channel sets
 * used on alternate iterations. A rank puts on set s at iteration i+2 only
 * after it received the neighbour's iteration i+1 data, which the neighbour
 * sent after re-arming set s at the end of iteration i.
 */
static void halo(dchan_ctx_t *ctx, int nch, size_t size, long iters, int bad)
{
    int left = (me + nranks - 1) % nranks, right = (me + 1) % nranks;
    int n = 2 * 2 * nch; /* direction x set x channel */
    struct chan *c = calloc((size_t)n, sizeof *c);
    struct chan **set[2];
    long *want = calloc((size_t)n, sizeof *want);
    size = round_size(size);
    for (int dir = 0; dir < 2; dir++) {
        for (int s = 0; s < 2; s++) {
            for (int k = 0; k < nch; k++) {
                struct chan *x = &c[(dir * 2 + s) * nch + k];
                x->size = size;
                x->id = (dir * 2 + s) * nch + k;
                /* dir 1 carries data rightwards, dir 0 leftwards */
                x->to = dir ? right : left;
                x->from = dir ? left : right;
            }
        }
    }
    setup(ctx, c, n);
    for (int s = 0; s < 2; s++) {
        set[s] = calloc((size_t)(2 * nch), sizeof **set);
        for (int dir = 0; dir < 2; dir++)
            for (int k = 0; k < nch; k++)
                set[s][dir * nch + k] = &c[(dir * 2 + s) * nch + k];
    }
    for (long i = 0; i < iters; i++) {
        struct chan **cs = set[i % 2];
        for (int k = 0; k < 2 * nch; k++) {
            send_done(cs[k]);
            fill(cs[k]->sbuf, size, me, cs[k]->id, i);
            CHECK(dchan_put(cs[k]->sh));
            /* Absolute: a neighbour may already be one iteration ahead. */
            want[k] = i / 2 + 1;
        }
        wait_all(ctx, cs, 2 * nch, want);
        for (int k = 0; k < 2 * nch; k++) {
            verify(cs[k]->rbuf, size, cs[k]->from, cs[k]->id, i);
            CHECK(dchan_ready(cs[k]->rh));
        }
        if (bad && i == iters / 2)
            bad_calls(ctx, cs[0]);
    }
    if (errors_seen)
        die("%d asynchronous errors (last %s)", errors_seen, dchan_strerror(last_error));
    CHECK(dchan_barrier(ctx));
    teardown(c, n);
    free(set[0]);
    free(set[1]);
    free(want);
    free(c);
}

/*
 * Ring: data flows rightwards only; the receiver returns an 8-byte credit
 * leftwards after verifying and re-arming, and the sender waits for it
 * before the next put on that channel.
 */
static void ring(dchan_ctx_t *ctx, int nch, size_t size, long iters)
{
    int left = (me + nranks - 1) % nranks, right = (me + 1) % nranks;
    struct chan *c = calloc((size_t)(2 * nch), sizeof *c);
    struct chan **data = calloc((size_t)nch, sizeof *data),
                **cred = calloc((size_t)nch, sizeof *cred);
    long *want = calloc((size_t)nch, sizeof *want);
    size = round_size(size);
    for (int k = 0; k < nch; k++) {
        c[k] = (struct chan){.size = size, .id = k, .to = right, .from = left};
        c[nch + k] = (struct chan){.size = 8, .id = MAXCH + k, .to = left, .from = right};
        data[k] = &c[k];
        cred[k] = &c[nch + k];
    }
    setup(ctx, c, 2 * nch);
    for (long i = 0; i < iters; i++) {
        for (int k = 0; k < nch; k++) {
            if (i > 0) { /* credit i-1 says the right neighbour re-armed */
                want[k] = i;
                wait_all(ctx, &cred[k], 1, &want[k]);
                verify(cred[k]->rbuf, 8, right, cred[k]->id, i - 1);
                CHECK(dchan_ready(cred[k]->rh));
            }
            send_done(data[k]);
            fill(data[k]->sbuf, size, me, k, i);
            CHECK(dchan_put(data[k]->sh));
        }
        for (int k = 0; k < nch; k++)
            want[k] = i + 1;
        wait_all(ctx, data, nch, want);
        for (int k = 0; k < nch; k++) {
            verify(data[k]->rbuf, size, left, k, i);
            CHECK(dchan_ready(data[k]->rh));
            send_done(cred[k]);
            fill(cred[k]->sbuf, 8, me, cred[k]->id, i);
            CHECK(dchan_put(cred[k]->sh));
        }
    }
    for (int k = 0; k < nch; k++)
        want[k] = iters;
    wait_all(ctx, cred, nch, want);
    if (errors_seen)
        die("%d asynchronous errors (last %s)", errors_seen, dchan_strerror(last_error));
    CHECK(dchan_barrier(ctx));
    teardown(c, 2 * nch);
    free(data);
    free(cred);
    free(want);
    free(c);
}

/*
 * The ReadyMark/ReadyPollQ split: the receiver marks its data channel,
 * tells the sender "go", the sender puts the data and then "sent". The
 * receiver sees "sent", progresses without the data channel on the queue
 * (no callback may fire), then calls ready_pollq: exactly one callback.
 * Ranks pair up (0,1), (2,3), ...; an odd rank out talks to itself.
 */
static void split(dchan_ctx_t *ctx, size_t size, long iters)
{
    int partner = me % 2 == 0 ? me + 1 : me - 1;
    if (partner >= nranks)
        partner = me;
    int recv_side = me % 2 == 1 || partner == me;
    int send_side = me % 2 == 0 || partner == me;
    struct chan c[3]; /* data (even -> odd), go (odd -> even), sent (even -> odd) */
    long want;
    size = round_size(size);
    memset(c, 0, sizeof c);
    int even = me % 2 == 0 ? me : partner, odd = me % 2 == 0 ? partner : me;
    /* Both ends of each channel exist on both ranks; each uses its direction. */
    c[0] = (struct chan){.size = size, .id = 0, .from = partner, .to = partner};
    c[1] = (struct chan){.size = 8, .id = 1, .from = partner, .to = partner};
    c[2] = (struct chan){.size = 8, .id = 2, .from = partner, .to = partner};
    setup(ctx, c, 3);
    struct chan *data = &c[0], *go = &c[1], *sent = &c[2];
    for (long i = 0; i < iters; i++) {
        if (recv_side) {
            if (i > 0) {
                CHECK(dchan_ready_mark(data->rh)); /* mark only: off the queue */
            }
            send_done(go);
            fill(go->sbuf, 8, me, go->id, i);
            CHECK(dchan_put(go->sh));
        }
        if (send_side) {
            want = i + 1;
            wait_all(ctx, &go, 1, &want);
            verify(go->rbuf, 8, odd, go->id, i);
            CHECK(dchan_ready(go->rh));
            send_done(data);
            fill(data->sbuf, size, me, data->id, i);
            CHECK(dchan_put(data->sh));
            send_done(sent);
            fill(sent->sbuf, 8, me, sent->id, i);
            CHECK(dchan_put(sent->sh));
        }
        if (recv_side) {
            want = i + 1;
            wait_all(ctx, &sent, 1, &want);
            verify(sent->rbuf, 8, even, sent->id, i);
            CHECK(dchan_ready(sent->rh));
            if (i > 0) {
                long before = data->arrivals;
                for (int k = 0; k < 200; k++)
                    CHECK(dchan_progress(ctx));
                if (data->arrivals != before)
                    die("callback fired for a channel marked but not on the polling queue");
                CHECK(dchan_ready_pollq(data->rh));
                CHECK(dchan_ready_pollq(data->rh)); /* a no-op when already queued */
            }
            want = i + 1;
            wait_all(ctx, &data, 1, &want);
            verify(data->rbuf, size, even, data->id, i);
        }
    }
    if (errors_seen)
        die("%d asynchronous errors (last %s)", errors_seen, dchan_strerror(last_error));
    CHECK(dchan_barrier(ctx));
    teardown(c, 3);
}

/*
 * Multicast: rank 0 associates one send buffer with a channel to every
 * other rank; receivers return a credit after re-arming.
 */
static void multicast(dchan_ctx_t *ctx, size_t size, long iters)
{
    int nrecv = nranks - 1;
    if (nrecv < 1)
        die("multicast needs at least 2 ranks");
    size = round_size(size);
    unsigned char *shared = buf_alloc(size);
    dchan_handle_t **sh = calloc((size_t)nrecv, sizeof *sh);
    struct chan *cred = calloc((size_t)nrecv, sizeof *cred);
    struct chan data = {0};
    dchan_wire_t *all = calloc((size_t)nranks, sizeof *all), mine;
    dchan_stats_t st0, st1;
    long want;

    memset(&mine, 0, sizeof mine);
    if (me != 0) {
        data = (struct chan){.size = size, .id = 0, .from = 0, .to = 0};
        data.rbuf = buf_alloc(size);
        CHECK(dchan_create_handle(ctx, 0, data.rbuf, size, OOB, on_arrival, &data, &data.rh));
        CHECK(dchan_handle_export(data.rh, &mine));
    }
    CHECK(dchan_allgather(ctx, &mine, all, sizeof mine));
    CHECK(dchan_get_stats(ctx, &st0));
    if (me == 0)
        for (int r = 1; r < nranks; r++)
            CHECK(dchan_assoc_local(ctx, &all[r], shared, size, &sh[r - 1]));
    CHECK(dchan_get_stats(ctx, &st1));
    /* Providers that register memory register the shared buffer once (and,
     * in FLAG mode, maybe the chunk of sequence words the sends come from). */
    uint64_t allowed = 1 + (detect_mode == DCHAN_DETECT_FLAG);
    if (me == 0 && st1.registrations > st0.registrations + allowed)
        die("one send buffer for %d receivers made %llu registrations", nrecv,
            (unsigned long long)(st1.registrations - st0.registrations));
    if (me == 0 && st1.registrations > st0.registrations &&
        st1.reg_cache_hits < st0.reg_cache_hits + (uint64_t)(nrecv - 1))
        die("the registration cache was not used for the shared send buffer");
    /* Credits: receivers -> rank 0. */
    int ncred = me == 0 ? nrecv : 1;
    for (int k = 0; k < ncred; k++) {
        int peer = me == 0 ? k + 1 : 0;
        cred[k] = (struct chan){.size = 8, .id = 100 + (me == 0 ? peer : me), .from = peer, .to = peer};
    }
    setup(ctx, cred, ncred);
    for (long i = 0; i < iters; i++) {
        if (me == 0) {
            for (int k = 0; k < nrecv; k++) {
                unsigned idle = 0;
                while (dchan_put_test(sh[k]) == 0)
                    mpt_idle(&idle, 0);
            }
            fill(shared, size, 0, 0, i);
            for (int k = 0; k < nrecv; k++)
                CHECK(dchan_put(sh[k]));
            struct chan *cp[MAXCH];
            long w[MAXCH];
            for (int k = 0; k < nrecv; k++) {
                cp[k] = &cred[k];
                w[k] = i + 1;
            }
            wait_all(ctx, cp, nrecv, w);
            for (int k = 0; k < nrecv; k++) {
                verify(cred[k].rbuf, 8, k + 1, cred[k].id, i);
                CHECK(dchan_ready(cred[k].rh));
            }
        } else {
            struct chan *dp = &data;
            want = i + 1;
            wait_all(ctx, &dp, 1, &want);
            verify(data.rbuf, size, 0, 0, i);
            CHECK(dchan_ready(data.rh));
            send_done(&cred[0]);
            fill(cred[0].sbuf, 8, me, cred[0].id, i);
            CHECK(dchan_put(cred[0].sh));
        }
    }
    if (errors_seen)
        die("%d asynchronous errors (last %s)", errors_seen, dchan_strerror(last_error));
    CHECK(dchan_barrier(ctx));
    teardown(cred, ncred);
    if (me == 0)
        for (int k = 0; k < nrecv; k++)
            CHECK(dchan_handle_destroy(sh[k]));
    else
        CHECK(dchan_handle_destroy(data.rh));
    if (data.rbuf)
        buf_free(data.rbuf);
    buf_free(shared);
    free(sh);
    free(cred);
    free(all);
}

/* A wire written by one job and imported by another is refused. */
static void foreign(dchan_ctx_t *ctx, const char *out, const char *in)
{
    static unsigned char buf[64];
    dchan_handle_t *h;
    dchan_wire_t w;
    if (out) {
        if (me == 0) {
            CHECK(dchan_create_handle(ctx, nranks - 1, buf, sizeof buf, OOB, on_arrival, NULL, &h));
            CHECK(dchan_handle_export(h, &w));
            FILE *f = fopen(out, "wb");
            if (!f || fwrite(&w, sizeof w, 1, f) != 1 || fclose(f))
                die("cannot write %s: %s", out, strerror(errno));
            CHECK(dchan_handle_destroy(h));
        }
    }
    if (in && me == nranks - 1) {
        FILE *f = fopen(in, "rb");
        if (!f || fread(&w, sizeof w, 1, f) != 1)
            die("cannot read %s", in);
        fclose(f);
        EXPECT(dchan_assoc_local(ctx, &w, buf, sizeof buf, &h), DCHAN_ERR_HANDLE);
    }
    CHECK(dchan_barrier(ctx));
}

/* ---- main ---------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: mp_exchange --test halo|ring|split|multicast|foreign [--channels a,b]\n"
            "       [--sizes a,b,...] [--iters N] [--bad] [--wire-out F] [--wire-in F]\n"
            "       [--hosts N (blocks of N ranks claim one host)] [--no-cma] [--shm-ring SLOTS]\n"
            "       [--max-bytes B (per channel and size; iterations are cut to fit, to 16\n"
            "        at least; default 256M, 0: no cap)]\n"
            "       [--odd-env NAME=VALUE (set on odd ranks only, before dchan_init; up to 8)]\n"
            "       [--bad-env NAME=VALUE (dchan_init with it set must fail and name it; up to 8)]\n"
            "       [--expect-warning TEXT ('+' for spaces: on rank 0's stderr from dchan_init)]\n"
            "       [--odd-bad-env NAME=VALUE (malformed on odd ranks: every dchan_init must fail)]\n");
    exit(2);
}

static int parse_list(const char *s, long *out, int max)
{
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        out[n++] = strtol(s, &end, 0);
        if (end == s)
            usage();
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *test = NULL, *wire_out = NULL, *wire_in = NULL;
    long sizes[32] = {4096}, chans[8] = {1}, iters = 1000;
    /* A thousand 4 MiB puts each way check nothing that 64 do not, and cost
     * minutes under the sanitizers. */
    long max_bytes = 256l << 20;
    int nsizes = 1, nchans = 1, bad = 0, opt;
    static const struct option opts[] = {
        {"test", required_argument, 0, 't'}, {"sizes", required_argument, 0, 's'},
        {"channels", required_argument, 0, 'c'}, {"iters", required_argument, 0, 'i'},
        {"bad", no_argument, 0, 'b'}, {"wire-out", required_argument, 0, 'o'},
        {"wire-in", required_argument, 0, 'n'}, {"hosts", required_argument, 0, 'h'},
        {"no-cma", no_argument, 0, 'm'}, {"shm-ring", required_argument, 0, 'r'},
        {"max-bytes", required_argument, 0, 'x'}, {"odd-env", required_argument, 0, 'e'},
        {"bad-env", required_argument, 0, 'B'}, {"expect-warning", required_argument, 0, 'W'},
        {"odd-bad-env", required_argument, 0, 'O'}, {0, 0, 0, 0}};
    char *odd_env[8], *warning = NULL, *odd_bad = NULL;
    int nodd = 0;

    mpt_prog = "mp_exchange";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 't': test = optarg; break;
        case 's': nsizes = parse_list(optarg, sizes, 32); break;
        case 'c': nchans = parse_list(optarg, chans, 8); break;
        case 'i': iters = atol(optarg); break;
        case 'b': bad = 1; break;
        case 'o': wire_out = optarg; break;
        case 'n': wire_in = optarg; break;
        case 'h': hosts_block = atoi(optarg); break;
        case 'm': no_cma = 1; break;
        case 'r': setenv("DCHAN_SHM_RING_SLOTS", optarg, 1); break; /* to make it overflow */
        case 'x': max_bytes = atol(optarg); break;
        case 'e':
            if (nodd == 8 || !strchr(optarg, '='))
                usage();
            odd_env[nodd++] = optarg;
            break;
        case 'B':
            if (!mpt_bad_env_add(optarg))
                usage();
            break;
        case 'O':
            if (!strchr(optarg, '='))
                usage();
            odd_bad = optarg;
            break;
        case 'W':
            /* '+' for a space: scenario arguments are split at spaces. */
            warning = optarg;
            for (char *c = warning; *c; c++)
                if (*c == '+')
                    *c = ' ';
            break;
        default: usage();
        }
    }
    if (!test || iters < 1 || max_bytes < 0)
        usage();
    t_limit_ns = mpt_time_limit_ns();

    if (hosts_block > 0)
        mpt_fake_hosts(hosts_block);
    if (no_cma)
        setenv("DCHAN_SHM_CMA", "0", 1);
    /* Settings that may differ between ranks: the odd ranks take these. */
    for (int i = 0; i < nodd && mpt_launcher_rank() % 2; i++)
        mpt_setenv_arg(odd_env[i]);
    mpt_bad_env();
    if (odd_bad) {
        /* Malformed on the odd ranks only: every rank's dchan_init fails,
         * the odd ones naming the variable, the others naming rank 1. */
        char *eq = strchr(odd_bad, '=');
        int odd = mpt_launcher_rank() % 2;
        *eq = '\0';
        mpt_init_must_fail(odd_bad, odd ? eq + 1 : NULL, DCHAN_ERR_INVALID_ARG,
                           odd ? odd_bad : "rank 1 could not start");
        *eq = '=';
    }

    char log[4096];
    int saved = 0;
    FILE *cap = warning ? mpt_capture(&saved) : NULL;
    dchan_ctx_t *ctx = mpt_init(on_error);
    if (cap) {
        /* Rank 0 warns, once for the job. */
        mpt_captured(cap, saved, log, sizeof log);
        if ((strstr(log, warning) != NULL) != (me == 0))
            die("dchan_init's stderr %s '%s': '%s'", me == 0 ? "lacks" : "has", warning, log);
    }

    /* The detection mode in use, from a probe handle to self. */
    {
        static unsigned char probe[8];
        dchan_handle_t *h;
        CHECK(dchan_create_handle(ctx, (me + 1) % nranks, probe, 8, OOB, on_arrival, NULL, &h));
        detect_mode = dchan_handle_detect(h);
        CHECK(dchan_handle_destroy(h));
    }
    if (me == 0)
        fprintf(stderr, "mp_exchange: %s on %d ranks, provider %s, detection %d\n", test, nranks,
                dchan_provider_name(ctx), detect_mode);

    for (int ci = 0; ci < nchans; ci++) {
        for (int si = 0; si < nsizes; si++) {
            if (chans[ci] < 1 || chans[ci] > MAXCH || sizes[si] < 1)
                usage();
            long n = iters;
            if (max_bytes && n > 16 && n > max_bytes / sizes[si])
                n = max_bytes / sizes[si] > 16 ? max_bytes / sizes[si] : 16;
            if (strcmp(test, "halo") == 0)
                halo(ctx, (int)chans[ci], (size_t)sizes[si], n, bad);
            else if (strcmp(test, "ring") == 0)
                ring(ctx, (int)chans[ci], (size_t)sizes[si], n);
            else if (strcmp(test, "split") == 0)
                split(ctx, (size_t)sizes[si], n);
            else if (strcmp(test, "multicast") == 0)
                multicast(ctx, (size_t)sizes[si], n);
            else if (strcmp(test, "foreign") == 0)
                foreign(ctx, wire_out, wire_in);
            else
                usage();
            if (me == 0)
                fprintf(stderr, "mp_exchange: %s channels=%ld size=%ld iters=%ld ok\n", test,
                        chans[ci], sizes[si], n);
        }
    }
    dchan_stats_t st;
    CHECK(dchan_get_stats(ctx, &st));
    CHECK(dchan_finalize(ctx));
    if (me == 0)
        printf("RESULT test=%s ranks=%d puts=%llu arrivals=%llu callbacks=%llu verified=yes\n",
               test, nranks, (unsigned long long)st.puts, (unsigned long long)st.arrivals,
               (unsigned long long)st.callbacks);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
