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
 *
 * With -w LO,HI two checks come first. With LO != HI, the
 * even ranks set DCHAN_CREDIT_WORDS to LO and the odd ones to HI: dchan_init
 * must fail on every rank with DCHAN_ERR_INVALID_ARG, leave *ctx unwritten
 * and say why on stderr (a receiver's credit word would lie beyond its
 * sender's area).
 * Then every rank runs with LO words, and each sender is offered forged
 * wires of a credited channel, resealed, whose credit word index is LO and
 * 65535, beyond its area for the receiver: dchan_assoc_local must refuse
 * them with DCHAN_ERR_HANDLE, and the genuine wire then carries every
 * message, checked, with exact credit.
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
        unsigned idle = 0;
        while (dchan_put_test(c->sh) == 0)
            mpt_idle(&idle, 0);
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
    unsigned idle = 0;
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
        mpt_idle(&idle, moved);
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

/* -w: see the header. Wire bytes as lib/wire.c lays them out: the credit
 * word index (16 bits, little-endian) and the FNV-1a checksum of what
 * precedes it. */
#define WIRE_OFF_CIDX 114
#define WIRE_OFF_SUM 120
#define FORGED_SIZE 64
#define FORGED_MSGS 40

static void wire_set_index(dchan_wire_t *w, unsigned idx)
{
    w->bytes[WIRE_OFF_CIDX] = (unsigned char)idx;
    w->bytes[WIRE_OFF_CIDX + 1] = (unsigned char)(idx >> 8);
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < WIRE_OFF_SUM; i++) {
        h ^= w->bytes[i];
        h *= 0x100000001b3ull;
    }
    for (int i = 0; i < 8; i++)
        w->bytes[WIRE_OFF_SUM + i] = (unsigned char)(h >> (8 * i));
}

/* dchan_init with DCHAN_CREDIT_WORDS set to this rank's value: it must
 * fail, and say so. */
static void words_mismatch(const int words[2])
{
    int r = mpt_launcher_rank();
    char v[16];
    snprintf(v, sizeof v, "%d", words[r % 2]);
    mpt_init_must_fail("DCHAN_CREDIT_WORDS", v, DCHAN_ERR_INVALID_ARG, "DCHAN_CREDIT_WORDS");
}

static long forged_got;
static unsigned char *forged_rbuf;

static void on_forged_arrival(dchan_handle_t *h, void *arg)
{
    void *p;
    CHECK(dchan_slot(h, &p));
    if (p != forged_rbuf + (size_t)(forged_got % 2) * FORGED_SIZE)
        die("forged: message %ld in the wrong slot", forged_got);
    mpt_verify_when = " at its arrival";
    verify(p, FORGED_SIZE, (me + nranks - 1) % nranks, 77, forged_got);
    forged_got++;
    CHECK(dchan_ready(h));
}

/* Forged credit word indices (words: every rank's DCHAN_CREDIT_WORDS). */
static void forged_index(int words)
{
    const int from = (me + nranks - 1) % nranks, to = (me + 1) % nranks;
    dchan_wire_t w[3], *all = calloc((size_t)nranks * 3, sizeof *all);
    dchan_handle_attr_t ha;
    dchan_handle_t *rh, *sh = NULL;
    if (!all)
        die("out of memory");
    forged_rbuf = buf_alloc(2 * FORGED_SIZE);
    unsigned char *sbuf = buf_alloc(FORGED_SIZE);
    dchan_handle_attr_init(&ha);
    ha.credit = 1;
    ha.depth = 2;
    CHECK(dchan_create_handle_attr(ctx, from, forged_rbuf, FORGED_SIZE, OOB, on_forged_arrival,
                                   NULL, &ha, &rh));
    CHECK(dchan_handle_export(rh, &w[0]));
    w[1] = w[2] = w[0];
    wire_set_index(&w[1], (unsigned)words);
    wire_set_index(&w[2], 65535);
    CHECK(dchan_allgather(ctx, w, all, sizeof w));
    for (int i = 1; i < 3; i++) {
        EXPECT(dchan_assoc_local(ctx, &all[to * 3 + i], sbuf, FORGED_SIZE, &sh), DCHAN_ERR_HANDLE);
        if (sh)
            die("a refused dchan_assoc_local returned a handle");
    }
    CHECK(dchan_assoc_local(ctx, &all[to * 3], sbuf, FORGED_SIZE, &sh));
    const unsigned long long deadline = now_ns() + mpt_time_limit_ns();
    long sent = 0;
    while (sent < FORGED_MSGS || forged_got < FORGED_MSGS) {
        int moved = 0, cr = dchan_credits(sh);
        if (cr < 0 || cr > 2)
            die("forged: dchan_credits %d on a channel of depth 2", cr);
        if (sent < FORGED_MSGS && cr > 0 && dchan_put_test(sh) == 1) {
            fill(sbuf, FORGED_SIZE, me, 77, sent);
            CHECK(dchan_put(sh));
            sent++;
            moved++;
        }
        mpt_progress(ctx, moved);
        if (now_ns() > deadline)
            die("forged: %ld sent, %ld arrived after %llu s", sent, forged_got,
                mpt_time_limit_ns() / 1000000000ull);
    }
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_handle_destroy(sh));
    CHECK(dchan_handle_destroy(rh));
    buf_free(sbuf);
    buf_free(forged_rbuf);
    free(all);
    fprintf(stderr, "rank %d: forged credit word indices %d and 65535 refused; %d messages on "
            "the genuine wire\n", me, words, FORGED_MSGS);
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
    int rounds = 2, max_sleep_us = 200, words[2] = {0, 0};
    mpt_prog = "mp_credit";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    nch = 4;
    int opt;
    while ((opt = getopt(argc, argv, "k:n:s:r:z:w:")) != -1) {
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
        case 'w':
            if (sscanf(optarg, "%d,%d", &words[0], &words[1]) != 2 || words[0] < 1 ||
                words[1] < 1)
                die("-w wants LO,HI, two positive numbers of credit words");
            break;
        default:
            die("usage: mp_credit [-k 1,2,8,64] [-n iters] [-s size] [-r rounds] [-z max_sleep_us] "
                "[-w LO,HI]");
        }
    }
    if (words[0] && words[0] != words[1])
        words_mismatch(words);
    if (words[0]) {
        char v[16];
        snprintf(v, sizeof v, "%d", words[0]);
        setenv("DCHAN_CREDIT_WORDS", v, 1);
    }
    ctx = mpt_init(on_error);
    if (words[0])
        forged_index(words[0]);
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
