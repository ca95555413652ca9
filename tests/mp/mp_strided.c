/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Gathered send sides and the sender's completion callback (DESIGN §7),
 * launched by tests/mprun.
 *
 * Every rank sends to the next one of a ring and receives from the one
 * before, on one credited channel per shape below (depth 1 and 2 in turn,
 * so slot offsets are exercised); the receive side is contiguous. Shapes:
 *   iov-tail   segments in reverse memory order, zero-length ones among
 *              them, the last 8 bytes straddling three segments;
 *   iov-many   600 segments of 8 bytes (more than one iovec batch);
 *   iov-big    256 KiB in 5 segments;
 *   1d, 2d     a 1-D slice and a 2-D block with offsets;
 *   x, y, z    the three faces of a 24^3 block of doubles (one run, 24 runs
 *              of a row, 576 runs of one element).
 * The sender writes each message into the scattered source so that the
 * gathered message is the test pattern; the receiver checks every byte.
 * dchan_set_completion counts completions, which must come one per put, in
 * put order, and the source is rewritten only after the last completed.
 * Bad input (each with its code, the channels working afterwards) comes
 * first.
 */
#include "config.h"

#include <getopt.h>

#define OOB 0x3c3c3c3c3c3c3c3cull
#include "mptest.h"

#define N3 24 /* edge of the 3-D block */
#define MAXCH 16

struct chan {
    const char *name;
    int id, depth;
    size_t size;
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf;
    unsigned char *pool;   /* memory the send side's segments live in */
    dchan_iov_t *iov;      /* the segments, in message order */
    int niov;
    long sent, recvd, completed;
    long scattered; /* the message the source holds: sent, once written */
};

static struct chan ch[MAXCH];
static int nch;
static dchan_ctx_t *ctx;

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    die("asynchronous error on a %s handle: %s", dchan_handle_provider(h), dchan_strerror(rc));
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    void *p = NULL;
    if (h != c->rh)
        die("%s: arrival callback got another handle", c->name);
    CHECK(dchan_slot(h, &p));
    if (p != c->rbuf + (size_t)(c->recvd % c->depth) * c->size)
        die("%s: message %ld not in slot %ld", c->name, c->recvd, c->recvd % c->depth);
    verify(p, c->size, (me + nranks - 1) % nranks, c->id, c->recvd);
    c->recvd++;
    CHECK(dchan_ready(h));
}

static void on_complete(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    if (h != c->sh)
        die("%s: completion callback got another handle", c->name);
    /* One per put, in order: never more than were made. */
    if (++c->completed > c->sent)
        die("%s: %ld completions for %ld puts", c->name, c->completed, c->sent);
}

/* The segments of one channel: lengths in message order, placed in the pool
 * in reverse order with 16-byte gaps, so that no two merge. */
static void iov_shape(struct chan *c, const size_t *lens, int n)
{
    size_t total = 0, span = 0;
    for (int i = 0; i < n; i++) {
        total += lens[i];
        span += lens[i] + 16;
    }
    c->pool = xalloc(span + 16);
    c->iov = calloc((size_t)n, sizeof *c->iov);
    c->niov = n;
    size_t off = 16;
    for (int i = n; i-- > 0;) {
        c->iov[i].base = lens[i] ? c->pool + off : NULL;
        c->iov[i].len = lens[i];
        off += lens[i] + 16;
    }
    c->size = total;
}

/* A subarray as its runs, element by element (elements of 8 bytes). */
static void sub_shape(struct chan *c, int nd, const size_t *sz, const size_t *sub,
                      const size_t *st)
{
    size_t s3[3] = {1, 1, 1}, b3[3] = {1, 1, 1}, o3[3] = {0, 0, 0}, all = 8;
    for (int i = 0; i < nd; i++) {
        s3[3 - nd + i] = sz[i];
        b3[3 - nd + i] = sub[i];
        o3[3 - nd + i] = st[i];
        all *= sz[i];
    }
    c->pool = xalloc(all);
    c->niov = (int)(b3[0] * b3[1] * b3[2]);
    c->iov = calloc((size_t)c->niov, sizeof *c->iov);
    int k = 0;
    for (size_t i = 0; i < b3[0]; i++)
        for (size_t j = 0; j < b3[1]; j++)
            for (size_t l = 0; l < b3[2]; l++) {
                size_t e = ((o3[0] + i) * s3[1] + o3[1] + j) * s3[2] + o3[2] + l;
                c->iov[k].base = c->pool + e * 8;
                c->iov[k++].len = 8;
            }
    c->size = (size_t)c->niov * 8;
}

/* The message for iteration n, scattered into the segments. */
static void scatter(struct chan *c, long n)
{
    unsigned char *msg = xalloc(c->size);
    fill(msg, c->size, me, c->id, n);
    size_t off = 0;
    for (int i = 0; i < c->niov; i++) {
        if (c->iov[i].len)
            memcpy((void *)c->iov[i].base, msg + off, c->iov[i].len);
        off += c->iov[i].len;
    }
    free(msg);
}

struct shape {
    const char *name;
    int nd; /* 0: an iov list */
    size_t sz[3], sub[3], st[3];
};

static const struct shape shapes[] = {
    {"iov-tail", 0, {0}, {0}, {0}},
    {"iov-many", 0, {0}, {0}, {0}},
    {"iov-big", 0, {0}, {0}, {0}},
    {"1d", 1, {100}, {37}, {11}},
    {"2d", 2, {7, 12}, {3, 5}, {2, 4}},
    {"x", 3, {N3, N3, N3}, {1, N3, N3}, {5, 0, 0}},
    {"y", 3, {N3, N3, N3}, {N3, 1, N3}, {0, 5, 0}},
    {"z", 3, {N3, N3, N3}, {N3, N3, 1}, {0, 0, 5}},
    {"z-inner", 3, {N3, N3, N3}, {N3 - 2, N3 - 2, 1}, {1, 1, N3 - 2}},
};

static void make_shape(struct chan *c, const struct shape *s)
{
    if (strcmp(s->name, "iov-tail") == 0) {
        /* 4096 bytes; the last 8 are 2 of one segment, then 3 and 3, with
         * empty segments between. */
        size_t lens[] = {0, 4086, 0, 4, 3, 0, 3, 0};
        iov_shape(c, lens, (int)(sizeof lens / sizeof *lens));
    } else if (strcmp(s->name, "iov-many") == 0) {
        size_t lens[600];
        for (int i = 0; i < 600; i++)
            lens[i] = 8;
        iov_shape(c, lens, 600);
    } else if (strcmp(s->name, "iov-big") == 0) {
        size_t lens[] = {65536, 1000, 120000, 0, 75608};
        iov_shape(c, lens, (int)(sizeof lens / sizeof *lens));
    } else {
        sub_shape(c, s->nd, s->sz, s->sub, s->st);
    }
}

static dchan_handle_t *assoc(struct chan *c, const struct shape *s, const dchan_wire_t *w)
{
    dchan_handle_t *h = NULL;
    if (s->nd == 0) {
        CHECK(dchan_assoc_local_iov(ctx, w, c->iov, c->niov, &h));
    } else {
        size_t st[3];
        /* The subarray's own origin: the element of its first run. */
        for (int i = 0; i < s->nd; i++)
            st[i] = s->st[i];
        CHECK(dchan_assoc_local_subarray(ctx, w, c->pool, s->nd, s->sz, s->sub, st, 8, &h));
    }
    return h;
}

/* Bad input on a live channel; nothing of it may stick. */
static void bad_input(struct chan *c, const dchan_wire_t *w)
{
    dchan_handle_t *h = (dchan_handle_t *)&h;
    dchan_iov_t one[2] = {{c->pool, c->size - 8}, {NULL, 0}};
    EXPECT(dchan_assoc_local_iov(ctx, w, one, 2, &h), DCHAN_ERR_SIZE);
    dchan_iov_t ovl[2] = {{c->pool, c->size - 8}, {c->pool + 4, 8}};
    EXPECT(dchan_assoc_local_iov(ctx, w, ovl, 2, &h), DCHAN_ERR_INVALID_ARG);
    dchan_iov_t nul[1] = {{NULL, c->size}};
    EXPECT(dchan_assoc_local_iov(ctx, w, nul, 1, &h), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_assoc_local_iov(ctx, w, one, 0, &h), DCHAN_ERR_INVALID_ARG);
    dchan_iov_t empty[1] = {{NULL, 0}};
    EXPECT(dchan_assoc_local_iov(ctx, w, empty, 1, &h), DCHAN_ERR_SIZE);
    size_t sz[1] = {c->size / 8}, sub[1] = {c->size / 8}, st[1] = {1};
    EXPECT(dchan_assoc_local_subarray(ctx, w, c->pool, 1, sz, sub, st, 8, &h),
           DCHAN_ERR_INVALID_ARG); /* past the end */
    st[0] = 0;
    EXPECT(dchan_assoc_local_subarray(ctx, w, c->pool, 4, sz, sub, st, 8, &h),
           DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_assoc_local_subarray(ctx, w, c->pool, 1, sz, sub, st, 4, &h), DCHAN_ERR_SIZE);
    dchan_wire_t bad = *w;
    bad.bytes[60] ^= 1;
    EXPECT(dchan_assoc_local_iov(ctx, &bad, c->iov, c->niov, &h), DCHAN_ERR_HANDLE);
    if (h != (dchan_handle_t *)&h)
        die("a failed association wrote its out-parameter");
    EXPECT(dchan_set_completion(c->rh, on_complete, c), DCHAN_ERR_STATE);
    EXPECT(dchan_set_completion(NULL, on_complete, c), DCHAN_ERR_INVALID_ARG);
}

static void setup(long iters)
{
    dchan_wire_t *mine = calloc((size_t)nch, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)nch * (size_t)nranks, sizeof *all);
    int from = (me + nranks - 1) % nranks, to = (me + 1) % nranks;
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        c->name = shapes[i].name;
        c->id = i;
        c->scattered = -1;
        c->depth = 1 + i % 2;
        make_shape(c, &shapes[i]);
        c->rbuf = buf_alloc(c->size * (size_t)c->depth);
        dchan_handle_attr_t ha;
        dchan_handle_attr_init(&ha);
        ha.credit = 1;
        ha.depth = c->depth;
        CHECK(dchan_create_handle_attr(ctx, from, c->rbuf, c->size, OOB, on_arrival, c, &ha,
                                       &c->rh));
        CHECK(dchan_handle_export(c->rh, &mine[i]));
    }
    CHECK(dchan_allgather(ctx, mine, all, (size_t)nch * sizeof *mine));
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        const dchan_wire_t *w = &all[(size_t)to * (size_t)nch + (size_t)i];
        bad_input(c, w);
        c->sh = assoc(c, &shapes[i], w);
        void *p = (void *)&p;
        EXPECT(dchan_put_ptr(c->sh, &p), DCHAN_ERR_STATE); /* no one place to write */
        if (p != (void *)&p)
            die("dchan_put_ptr wrote its out-parameter on failure");
        CHECK(dchan_set_completion(c->sh, on_complete, c));
    }
    free(mine);
    free(all);
    (void)iters;
}

static int try_put(struct chan *c, long iters)
{
    if (c->sent == iters || c->completed < c->sent)
        return 0; /* the source is rewritten only once the last put left it */
    /* Written once per message: a put refused for credit leaves it as it
     * was, and the loop comes back here until the credit returns. */
    if (c->scattered != c->sent) {
        scatter(c, c->sent);
        c->scattered = c->sent;
    }
    int rc = dchan_put(c->sh);
    if (rc == DCHAN_ERR_AGAIN)
        return 0;
    CHECK(rc);
    c->sent++;
    return 1;
}

int main(int argc, char **argv)
{
    long iters = 200;
    mpt_prog = "mp_strided";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    int opt;
    nch = (int)(sizeof shapes / sizeof *shapes);
    while ((opt = getopt(argc, argv, "n:")) != -1) {
        if (opt == 'n')
            iters = atol(optarg);
        else
            die("usage: mp_strided [-n iters]");
    }
    ctx = mpt_init(on_error);
    setup(iters);
    for (;;) {
        int done = 1, sent = 0;
        for (int i = 0; i < nch; i++)
            sent += try_put(&ch[i], iters);
        mpt_progress(ctx, sent);
        for (int i = 0; i < nch; i++)
            if (ch[i].recvd < iters || ch[i].completed < iters)
                done = 0;
        if (done)
            break;
    }
    for (int i = 0; i < nch; i++) {
        struct chan *c = &ch[i];
        dchan_handle_stats_t s;
        s.struct_size = sizeof s;
        CHECK(dchan_handle_stats(c->sh, &s));
        if (s.puts != (uint64_t)iters || s.bytes != (uint64_t)iters * c->size)
            die("%s: %llu puts of %llu bytes", c->name, (unsigned long long)s.puts,
                (unsigned long long)s.bytes);
        /* Removed: later puts run no callback. */
        CHECK(dchan_set_completion(c->sh, NULL, NULL));
    }
    CHECK(dchan_barrier(ctx));
    for (int i = 0; i < nch; i++) {
        CHECK(dchan_handle_destroy(ch[i].sh));
        EXPECT(dchan_set_completion(ch[i].sh, on_complete, &ch[i]), DCHAN_ERR_STATE);
        CHECK(dchan_handle_destroy(ch[i].rh));
        buf_free(ch[i].rbuf);
        free(ch[i].pool);
        free(ch[i].iov);
    }
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_finalize(ctx));
    if (me == 0)
        printf("RESULT app=mp_strided provider=%s ranks=%d channels=%d iters=%ld verified=yes\n",
               getenv("DCHAN_PROVIDER") ? getenv("DCHAN_PROVIDER") : "auto", nranks, nch, iters);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
