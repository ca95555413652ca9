/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Get channels (DESIGN §7), launched by tests/mprun.
 *
 * Every rank publishes one source per size for the next rank of a ring
 * and gets the previous rank's. The source's owner writes version n into
 * its buffer, publishes it (creation, then dchan_ready from done_fn), and
 * the getter pulls each version once; every byte of every version is
 * checked. Checked too: dchan_get answers DCHAN_ERR_AGAIN until the next
 * version is published, done_fn and arrival_fn run once per version, bad
 * input (wires of the other kind, a wrong size, calls on the wrong kind of
 * handle) gets its code, and a destroyed source makes dchan_get fail with
 * DCHAN_ERR_PEER while the rest of the job goes on.
 *
 * Then a source is destroyed while its getter lives on, with a get in
 * flight, and a new source and getter are made between the same ranks
 * (the new source takes the old one's slot): every byte of every version
 * of the new pair must be right, and the stale getter must fail with
 * DCHAN_ERR_PEER, never receiving the new pair's data (on mpi, whose get
 * is an emulation by tagged messages, the stale getter once kept receives
 * posted on the tags the new pair then used).
 */
#include "config.h"

#include <getopt.h>

#define OOB 0x6b6b6b6b6b6b6b6bull
#include "mptest.h"

#define MAXCH 8

struct chan {
    int id;
    size_t size;
    dchan_handle_t *src, *get;
    unsigned char *sbuf, *gbuf;
    long published, taken; /* source side */
    long got, again;       /* getter side */
};

static struct chan ch[MAXCH];
static int nch;
static long iters = 300;
static dchan_ctx_t *ctx;

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    /* The destroyed source's getter reports DCHAN_ERR_PEER: expected there. */
    if (rc != DCHAN_ERR_PEER)
        die("asynchronous error on a %s handle: %s", dchan_handle_provider(h),
            dchan_strerror(rc));
}

static void on_done(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    if (h != c->src)
        die("done_fn got another handle");
    if (++c->taken != c->published)
        die("size %zu: done_fn for version %ld, %ld published", c->size, c->taken, c->published);
    if (c->published == iters)
        return;
    /* The buffer is ours again: the next version, published. */
    fill(c->sbuf, c->size, me, c->id, c->published);
    CHECK(dchan_ready(h));
    c->published++;
    EXPECT(dchan_ready(h), DCHAN_ERR_STATE); /* not taken yet */
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    if (h != c->get)
        die("arrival_fn got another handle");
    verify(c->gbuf, c->size, (me + nranks - 1) % nranks, c->id, c->got);
    c->got++;
}

static void bad_input(struct chan *c, const dchan_wire_t *w)
{
    dchan_handle_t *h = (dchan_handle_t *)&h;
    EXPECT(dchan_assoc_local(ctx, w, c->gbuf, c->size, &h), DCHAN_ERR_HANDLE);
    EXPECT(dchan_assoc_local_iov(ctx, w, &(dchan_iov_t){c->gbuf, c->size}, 1, &h),
           DCHAN_ERR_HANDLE);
    EXPECT(dchan_assoc_remote(ctx, w, c->gbuf, c->size + 1, on_arrival, c, &h), DCHAN_ERR_SIZE);
    EXPECT(dchan_assoc_remote(ctx, w, NULL, c->size, on_arrival, c, &h), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_assoc_remote(ctx, w, c->gbuf, c->size, NULL, c, &h), DCHAN_ERR_INVALID_ARG);
    dchan_wire_t bad = *w;
    bad.bytes[5] ^= 1;
    EXPECT(dchan_assoc_remote(ctx, &bad, c->gbuf, c->size, on_arrival, c, &h), DCHAN_ERR_HANDLE);
    if (h != (dchan_handle_t *)&h)
        die("a failed association wrote its out-parameter");
}

/* ---- a stale getter beside a new pair --------------------------------------------- */

#define RSIZE 4104 /* not a power of two */
#define RVERSIONS 20

struct rchan {
    int id;
    dchan_handle_t *src, *get;
    unsigned char *sbuf, *gbuf;
    long published, taken, got;
};

static void r_done(dchan_handle_t *h, void *arg)
{
    struct rchan *c = arg;
    if (h != c->src)
        die("done_fn got another handle");
    c->taken++;
}

static void r_arrival(dchan_handle_t *h, void *arg)
{
    struct rchan *c = arg;
    if (h != c->get)
        die("arrival_fn got another handle");
    /* The pattern of this pair's source: data of another pair fails here. */
    verify(c->gbuf, RSIZE, (me + nranks - 1) % nranks, c->id, c->got);
    c->got++;
}

/* A source for the next rank, and a getter of the previous rank's. */
static void r_open(struct rchan *c, int id)
{
    dchan_wire_t mine, *all = calloc((size_t)nranks, sizeof *all);
    memset(c, 0, sizeof *c);
    c->id = id;
    c->sbuf = buf_alloc(RSIZE);
    c->gbuf = buf_alloc(RSIZE);
    fill(c->sbuf, RSIZE, me, id, 0);
    CHECK(dchan_create_source(ctx, (me + 1) % nranks, c->sbuf, RSIZE, r_done, c, &c->src));
    c->published = 1;
    CHECK(dchan_handle_export(c->src, &mine));
    CHECK(dchan_allgather(ctx, &mine, all, sizeof mine));
    CHECK(dchan_assoc_remote(ctx, &all[(me + nranks - 1) % nranks], c->gbuf, RSIZE, r_arrival, c,
                             &c->get));
    free(all);
}

/* Gets and publishes until n versions went through c both ways. */
static void r_run(struct rchan *c, long n, const char *what)
{
    unsigned long long deadline = now_ns() + mpt_time_limit_ns();
    while (c->got < n || c->taken < n) {
        if (c->got < n) {
            int rc = dchan_get(c->get);
            if (rc != DCHAN_ERR_AGAIN)
                CHECK(rc);
        }
        CHECK(dchan_progress(ctx));
        if (c->taken == c->published && c->published < n) {
            fill(c->sbuf, RSIZE, me, c->id, c->published);
            CHECK(dchan_ready(c->src));
            c->published++;
        }
        if (now_ns() > deadline)
            die("%s: stalled at %ld versions got, %ld taken of %ld", what, c->got, c->taken, n);
    }
}

/* A barrier that runs no dchan progress where MPI is there (a source then
 * answers no request meanwhile). */
static void quiet_barrier(void)
{
#ifdef USE_MPI
    MPI_Barrier(MPI_COMM_WORLD);
#else
    CHECK(dchan_barrier(ctx));
#endif
}

static void stale_getter(void)
{
    struct rchan a, b;
    int rc;

    r_open(&a, 100);
    r_run(&a, 1, "first pair");
    /* Version 1 published, and its get started by dchan_get alone (which
     * runs no source's side): on mpi the request stays unanswered. */
    fill(a.sbuf, RSIZE, me, a.id, 1);
    CHECK(dchan_ready(a.src));
    a.published++;
    quiet_barrier();
    {
        unsigned long long deadline = now_ns() + mpt_time_limit_ns();
        while ((rc = dchan_get(a.get)) == DCHAN_ERR_AGAIN)
            if (now_ns() > deadline)
                die("version 1 of the first pair never published");
        CHECK(rc);
    }
    quiet_barrier();
    /* The source goes, its getter stays; progress lets the getter see the
     * end (and re-post whatever it keeps posted). */
    CHECK(dchan_handle_destroy(a.src));
    a.src = NULL;
    CHECK(dchan_barrier(ctx));
    for (int i = 0; i < 100; i++)
        CHECK(dchan_progress(ctx));
    CHECK(dchan_barrier(ctx));
    /* A new pair between the same ranks: its source takes a's slot. */
    r_open(&b, 101);
    r_run(&b, RVERSIONS, "new pair beside a stale getter");
    /* The stale getter: the source's end, never the new pair's data
     * (r_arrival would have caught it). A get that raced the destruction
     * may have delivered version 1 of a, checked too. */
    {
        unsigned long long deadline = now_ns() + mpt_time_limit_ns();
        while ((rc = dchan_get(a.get)) == DCHAN_ERR_AGAIN) {
            CHECK(dchan_progress(ctx));
            if (now_ns() > deadline)
                die("the stale getter never saw its source's end");
        }
        EXPECT(rc, DCHAN_ERR_PEER);
        EXPECT(dchan_get(a.get), DCHAN_ERR_PEER);
    }
    if (a.got > 2)
        die("the stale getter got %ld versions of a source that published 2", a.got);
    /* The new pair still works after the stale getter failed. */
    r_run(&b, RVERSIONS + 5, "new pair after the stale getter failed");
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_handle_destroy(a.get));
    CHECK(dchan_handle_destroy(b.get));
    CHECK(dchan_handle_destroy(b.src));
    CHECK(dchan_barrier(ctx));
    buf_free(a.sbuf);
    buf_free(a.gbuf);
    buf_free(b.sbuf);
    buf_free(b.gbuf);
}

static void setup(const size_t *sizes)
{
    dchan_wire_t *mine = calloc((size_t)nch * 2, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)nch * 2 * (size_t)nranks, sizeof *all);
    int from = (me + nranks - 1) % nranks, to = (me + 1) % nranks;
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        c->id = i;
        c->size = sizes[i];
        c->sbuf = buf_alloc(c->size);
        c->gbuf = buf_alloc(c->size);
        fill(c->sbuf, c->size, me, c->id, 0);
        CHECK(dchan_create_source(ctx, to, c->sbuf, c->size, on_done, c, &c->src));
        c->published = 1;
        EXPECT(dchan_ready(c->src), DCHAN_ERR_STATE); /* version 0 not taken */
        EXPECT(dchan_put(c->src), DCHAN_ERR_STATE);
        EXPECT(dchan_get(c->src), DCHAN_ERR_STATE);
        EXPECT(dchan_ready_mark(c->src), DCHAN_ERR_STATE);
        EXPECT(dchan_set_completion(c->src, on_done, c), DCHAN_ERR_STATE);
        CHECK(dchan_handle_export(c->src, &mine[2 * i]));
    }
    /* A put channel from the previous rank too, whose wire a getter must refuse. */
    dchan_handle_t *rh;
    unsigned char *rb = xalloc(64);
    CHECK(dchan_create_handle(ctx, from, rb, 64, OOB, on_arrival, NULL, &rh));
    CHECK(dchan_handle_export(rh, &mine[1]));
    CHECK(dchan_allgather(ctx, mine, all, (size_t)nch * 2 * sizeof *mine));
    {
        dchan_handle_t *h = (dchan_handle_t *)&h;
        EXPECT(dchan_assoc_remote(ctx, &all[(size_t)to * (size_t)nch * 2 + 1], rb, 64, on_arrival,
                                  NULL, &h),
               DCHAN_ERR_HANDLE);
        if (h != (dchan_handle_t *)&h)
            die("a failed dchan_assoc_remote wrote its out-parameter");
    }
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        const dchan_wire_t *w = &all[(size_t)from * (size_t)nch * 2 + 2 * (size_t)i];
        bad_input(c, w);
        CHECK(dchan_assoc_remote(ctx, w, c->gbuf, c->size, on_arrival, c, &c->get));
        EXPECT(dchan_put(c->get), DCHAN_ERR_STATE);
        EXPECT(dchan_ready(c->get), DCHAN_ERR_STATE);
        EXPECT(dchan_handle_export(c->get, &mine[0]), DCHAN_ERR_STATE);
    }
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_handle_destroy(rh));
    free(rb);
    free(mine);
    free(all);
}

int main(int argc, char **argv)
{
    size_t sizes[MAXCH] = {8, 1000, 4096, 65536, 1048576};
    mpt_prog = "mp_get";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    nch = 5;
    int opt;
    while ((opt = getopt(argc, argv, "n:s:")) != -1) {
        if (opt == 'n') {
            iters = atol(optarg);
        } else if (opt == 's') {
            nch = 0;
            for (char *t = strtok(optarg, ","); t && nch < MAXCH; t = strtok(NULL, ","))
                sizes[nch++] = (size_t)atol(t);
        } else {
            die("usage: mp_get [-n iters] [-s sizes]");
        }
    }
    ctx = mpt_init(on_error);
    setup(sizes);
    for (;;) {
        int done = 1, started = 0;
        for (int i = 0; i < nch; i++) {
            struct chan *c = &ch[i];
            if (c->got < iters) {
                int rc = dchan_get(c->get);
                if (rc == DCHAN_ERR_AGAIN) {
                    c->again++;
                } else {
                    CHECK(rc);
                    started++;
                }
            }
        }
        mpt_progress(ctx, started);
        for (int i = 0; i < nch; i++)
            if (ch[i].got < iters || ch[i].taken < iters)
                done = 0;
        if (done)
            break;
    }
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        /* Every version was taken: nothing more to get. */
        EXPECT(dchan_get(c->get), DCHAN_ERR_AGAIN);
        if (c->got != iters || c->published != iters)
            die("size %zu: %ld got, %ld published", c->size, c->got, c->published);
    }
    /* A destroyed source: its getter fails, the job goes on. */
    CHECK(dchan_barrier(ctx));
    for (int i = 0; i < nch; i++)
        CHECK(dchan_handle_destroy(ch[i].src));
    CHECK(dchan_barrier(ctx));
    for (int i = 0; i < nch; i++) {
        /* Where the source's end is a message (mpi), it may still be on
         * its way: nothing new until then. */
        int rc;
        while ((rc = dchan_get(ch[i].get)) == DCHAN_ERR_AGAIN)
            CHECK(dchan_progress(ctx));
        EXPECT(rc, DCHAN_ERR_PEER);
        EXPECT(dchan_get(ch[i].get), DCHAN_ERR_PEER);
        CHECK(dchan_handle_destroy(ch[i].get));
        EXPECT(dchan_get(ch[i].get), DCHAN_ERR_STATE);
        buf_free(ch[i].sbuf);
        buf_free(ch[i].gbuf);
    }
    CHECK(dchan_barrier(ctx));
    stale_getter();
    CHECK(dchan_finalize(ctx));
    if (me == 0)
        printf("RESULT app=mp_get provider=%s ranks=%d channels=%d iters=%ld verified=yes\n",
               getenv("DCHAN_PROVIDER") ? getenv("DCHAN_PROVIDER") : "auto", nranks, nch, iters);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
