/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Credited channels of depth k (DESIGN §7), launched by tests/mprun.
 *
 * Every rank sends to the next one of a ring and receives from the one
 * before, on one channel per depth asked for. The producer puts as fast as
 * credit allows (DCHAN_ERR_AGAIN means: progress and try again), every
 * other message written through dchan_put_ptr; the consumer holds a random
 * number of slots and sleeps at random before it releases them, so the
 * producer meets every state of the credit window. Checked:
 *   - every message, every byte, in order, in slot n mod k (dchan_slot);
 *   - no overrun or other error, ever;
 *   - dchan_credits == k at the start and never above k, 0 after k puts
 *     the receiver has not released;
 *   - per-handle counters: puts, bytes, arrivals, stalls (each refusal the
 *     test saw), copied (0 for a message written in the mapped slot);
 *   - a second round on new handles, so credit words are reused (a new
 *     channel must not take the old one's count).
 */
#include "config.h"

#include <getopt.h>

#define OOB 0x5a5a5a5a5a5a5a5aull
#include "mptest.h"

#define MAXK 8

struct chan {
    int k, id;
    size_t size;
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    long sent, recvd, released;
    long stalls, in_place;
    int held; /* slots the consumer holds */
};

static struct chan ch[MAXK];
static int nch;
static dchan_ctx_t *ctx;
static unsigned rnd = 12345;

static unsigned next_rand(void)
{
    rnd = rnd * 1103515245u + 12345u;
    return rnd >> 16;
}

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    die("asynchronous error on a %s handle: %s", dchan_handle_provider(h), dchan_strerror(rc));
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    void *p = NULL;
    if (h != c->rh)
        die("callback for channel %d got another handle", c->id);
    /* The slot just delivered is the newest held one: check it through
     * dchan_slot only when nothing older is held. */
    if (c->held == 0) {
        CHECK(dchan_slot(h, &p));
        unsigned char *want = c->rbuf + (size_t)(c->recvd % c->k) * c->size;
        if (p != want)
            die("k=%d message %ld: dchan_slot gave %p, expected slot %ld at %p", c->k, c->recvd,
                p, c->recvd % c->k, (void *)want);
    }
    mpt_verify_when = " at its arrival";
    verify(c->rbuf + (size_t)(c->recvd % c->k) * c->size, c->size, (me + nranks - 1) % nranks,
           c->id, c->recvd);
    c->recvd++;
    c->held++;
}

/* Release held slots, oldest first, each checked again (nothing may have
 * written over a held slot) and through dchan_slot. */
static void release(struct chan *c, int n)
{
    while (n-- > 0 && c->held > 0) {
        void *p = NULL;
        long idx = c->released;
        CHECK(dchan_slot(c->rh, &p));
        if (p != c->rbuf + (size_t)(idx % c->k) * c->size)
            die("k=%d: dchan_slot does not give the oldest held slot", c->k);
        mpt_verify_when = " before its release";
        verify(p, c->size, (me + nranks - 1) % nranks, c->id, idx);
        CHECK(dchan_ready(c->rh));
        c->released++;
        c->held--;
    }
    if (c->held == 0) {
        void *p = (void *)&p;
        EXPECT(dchan_slot(c->rh, &p), DCHAN_ERR_STATE);
        if (p != (void *)&p)
            die("dchan_slot wrote its out-parameter on failure");
    }
}

static void setup(int round, const int *ks, size_t size)
{
    dchan_wire_t *mine = calloc((size_t)nch, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)nch * (size_t)nranks, sizeof *all);
    int from = (me + nranks - 1) % nranks, to = (me + 1) % nranks;
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        memset(c, 0, sizeof *c);
        c->k = ks[i];
        c->id = round * 100 + i;
        c->size = size;
        c->rbuf = buf_alloc(size * (size_t)c->k);
        c->sbuf = buf_alloc(size);
        dchan_handle_attr_t ha;
        dchan_handle_attr_init(&ha);
        ha.credit = 1;
        ha.depth = c->k;
        CHECK(dchan_create_handle_attr(ctx, from, c->rbuf, size, OOB, on_arrival, c, &ha, &c->rh));
        CHECK(dchan_handle_export(c->rh, &mine[i]));
    }
    CHECK(dchan_allgather(ctx, mine, all, (size_t)nch * sizeof *mine));
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        CHECK(dchan_assoc_local(ctx, &all[(size_t)to * (size_t)nch + (size_t)i], c->sbuf, size,
                                &c->sh));
        EXPECT(dchan_credits(c->sh), c->k);
        void *p = (void *)&p;
        EXPECT(dchan_put_ptr(c->rh, &p), DCHAN_ERR_STATE); /* a receive handle */
        EXPECT(dchan_credits(c->rh), DCHAN_ERR_STATE);
        if (p != (void *)&p)
            die("dchan_put_ptr wrote its out-parameter on failure");
    }
    free(mine);
    free(all);
}

/* One put on c, if credit allows: 1 sent, 0 refused. */
static int try_put(struct chan *c, long iters)
{
    if (c->sent == iters)
        return 0;
    int cr = dchan_credits(c->sh);
    if (cr < 0 || cr > c->k)
        die("k=%d: dchan_credits %d", c->k, cr);
    unsigned char *dst = c->sbuf;
    if (c->sent % 2) {
        void *p = (void *)&p;
        int rc = dchan_put_ptr(c->sh, &p);
        if (rc == DCHAN_ERR_AGAIN) {
            if (p != (void *)&p)
                die("dchan_put_ptr wrote its out-parameter on failure");
            c->stalls++;
            return 0;
        }
        CHECK(rc);
        dst = p;
        if (dst != c->sbuf)
            c->in_place++;
    } else {
        /* The send buffer must be free before it is written again (on ofi
         * that can take the peer's progress: let it run). */
        while (dchan_put_test(c->sh) == 0)
            sched_yield();
    }
    fill(dst, c->size, me, c->id, c->sent);
    int rc = dchan_put(c->sh);
    if (rc == DCHAN_ERR_AGAIN) {
        if (dst != c->sbuf)
            die("k=%d: dchan_put refused a message dchan_put_ptr had credit for", c->k);
        if (cr != 0)
            die("k=%d: dchan_put refused with %d credits announced", c->k, cr);
        c->stalls++;
        return 0;
    }
    CHECK(rc);
    c->sent++;
    return 1;
}

static void run_round(long iters, int max_sleep_us)
{
    int done = 0;
    while (!done) {
        int moved = 0; /* puts sent, callbacks run, slots released */
        for (int i = 0; i < nch; i++)
            while (try_put(&ch[i], iters))
                moved++;
        int n = dchan_progress(ctx);
        CHECK(n);
        moved += n;
        for (int i = 0; i < nch; i++) {
            struct chan *c = &ch[i];
            /* Hold a random number of slots, up to all k, then release some. */
            if (c->held > 0 && (c->held == c->k || next_rand() % 4 == 0 || c->recvd == iters)) {
                if (max_sleep_us && next_rand() % 8 == 0)
                    usleep(next_rand() % (unsigned)max_sleep_us);
                release(c, 1 + (int)(next_rand() % (unsigned)c->held));
                moved++;
            }
        }
        /* As mpt_progress, but after the releases, which move things too. */
        if (!moved)
            sched_yield();
        done = 1;
        for (int i = 0; i < nch; i++)
            if (ch[i].sent < iters || ch[i].released < iters)
                done = 0;
    }
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        dchan_handle_stats_t s, r;
        s.struct_size = r.struct_size = sizeof s;
        CHECK(dchan_handle_stats(c->sh, &s));
        CHECK(dchan_handle_stats(c->rh, &r));
        if (s.puts != (uint64_t)iters || s.bytes != (uint64_t)iters * c->size ||
            s.credit_stalls != (uint64_t)c->stalls ||
            s.copied != (uint64_t)(iters - c->in_place) * c->size)
            die("k=%d: sender counters puts %llu bytes %llu stalls %llu (saw %ld) copied %llu "
                "(%ld in place)",
                c->k, (unsigned long long)s.puts, (unsigned long long)s.bytes,
                (unsigned long long)s.credit_stalls, c->stalls, (unsigned long long)s.copied,
                c->in_place);
        if (r.arrivals != (uint64_t)iters || r.overruns != 0)
            die("k=%d: receiver counters arrivals %llu overruns %llu", c->k,
                (unsigned long long)r.arrivals, (unsigned long long)r.overruns);
        if (c->stalls && s.credit_wait_ns == 0)
            die("k=%d: %ld stalls but no credit wait time", c->k, c->stalls);
        fprintf(stderr, "rank %d k=%d: %ld puts, %ld stalls, %ld in place\n", me, c->k, iters,
                c->stalls, c->in_place);
    }
}

static void teardown(void)
{
    /* Every rank finished its puts and released every arrival. */
    CHECK(dchan_barrier(ctx));
    for (int i = 0; i < nch; i++) {
        CHECK(dchan_handle_destroy(ch[i].sh));
        CHECK(dchan_handle_destroy(ch[i].rh));
        buf_free(ch[i].rbuf);
        buf_free(ch[i].sbuf);
    }
    CHECK(dchan_barrier(ctx));
}

int main(int argc, char **argv)
{
    int ks[MAXK] = {1, 2, 8, 64};
    long iters = 2000;
    size_t size = 4096;
    int rounds = 2, max_sleep_us = 200;
    mpt_prog = "mp_credit";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    nch = 4;
    int opt;
    while ((opt = getopt(argc, argv, "k:n:s:r:z:")) != -1) {
        switch (opt) {
        case 'k': {
            nch = 0;
            for (char *t = strtok(optarg, ","); t && nch < MAXK; t = strtok(NULL, ","))
                ks[nch++] = atoi(t);
            break;
        }
        case 'n':
            iters = atol(optarg);
            break;
        case 's':
            size = (size_t)atol(optarg);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'z':
            max_sleep_us = atoi(optarg);
            break;
        default:
            die("usage: mp_credit [-k 1,2,8,64] [-n iters] [-s size] [-r rounds] [-z max_sleep_us]");
        }
    }
    ctx = mpt_init(on_error);
    rnd ^= (unsigned)me * 2654435761u;
    for (int r = 0; r < rounds; r++) {
        setup(r, ks, size);
        run_round(iters, max_sleep_us);
        teardown();
    }
    CHECK(dchan_finalize(ctx));
    if (me == 0)
        printf("RESULT app=mp_credit provider=%s ranks=%d channels=%d iters=%ld size=%zu "
               "verified=yes\n",
               getenv("DCHAN_PROVIDER") ? getenv("DCHAN_PROVIDER") : "auto", nranks, nch, iters,
               size);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
