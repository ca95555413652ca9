/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Gathered puts and get on the verbs provider against the device's limits,
 * launched by tests/mprun with DCHAN_PROVIDER=verbs (providers/verbs/scenarios).
 * Every byte of every message and version is checked.
 *
 *   gather  every rank puts to every rank (itself included) five gathered
 *           layouts: odd-sized segments whose tail straddles four of them,
 *           segments longer than DCHAN_VERBS_MAX_MSG listed from the highest
 *           address down, 3000 segments of 8 bytes (more WRs than the send
 *           queue: staged), segments on both sides of an unmapped page (no
 *           one registration covers them), and a 3-D subarray. With the
 *           simulation's DCHAN_VSIM_MAX_SGE the SGE lists split by max_sge.
 *   get     every rank publishes a source per size for every rank (itself
 *           included) and gets each version of every source meant for it;
 *           sizes above DCHAN_VERBS_MAX_MSG x the send queue are read in
 *           batches. Then the sources are destroyed: every getter fails
 *           with DCHAN_ERR_PEER.
 *   get-killed  as get, but the last rank _exit()s halfway through its
 *           versions: the others' getters from it and sources for it fail
 *           with DCHAN_ERR_PEER, every other channel completes.
 *
 * --env NAME=VALUE sets a variable before dchan_init.
 */
#include "config.h"

#include <getopt.h>
#include <sys/mman.h>

#define OOB 0x5a5a5a5a5a5a5a5aull
#include "mptest.h"

#define MAXSIZES 8
#define NL 5 /* gathered layouts */

static dchan_ctx_t *ctx;
static long iters = 20;
static int victim = -1;
static unsigned long long limit_ns; /* mpt_time_limit_ns(), set by main */

static void deadline(unsigned long long t0, const char *what)
{
    if (now_ns() - t0 > limit_ns)
        die("timed out waiting for %s", what);
}

/* ---- gather ------------------------------------------------------------------------------- */

struct layout {
    dchan_iov_t *seg;
    int nseg;
    size_t total;
    unsigned char *arena; /* where the segments lie (subarray: the array) */
    size_t arena_len;
    int mapped; /* arena from mmap (the layout with a hole) */
};

struct gchan {
    int peer, l;
    struct layout lay; /* send side */
    dchan_handle_t *sh, *rh;
    unsigned char *rbuf, *expect;
    long arrivals;
};

static struct gchan *gch; /* [peer * NL + l] */
/* 3-D subarray of 8-byte elements */
static const size_t sa_sizes[3] = {6, 10, 12}, sa_sub[3] = {4, 7, 5}, sa_start[3] = {1, 2, 3};

static size_t layout_total(int l)
{
    static const size_t t[NL] = {0, 30008, 24000, 4096, 4 * 7 * 5 * 8};
    if (l == 0) {
        struct layout tmp;
        size_t total = 0, k = 0;
        (void)tmp;
        while (total < 4000) {
            total += 1 + (k * 7) % 13;
            k++;
        }
        if (total % 8)
            total += 8 - total % 8;
        return total + 8;
    }
    return t[l];
}

static void layout_make(struct layout *L, int l)
{
    L->total = layout_total(l);
    switch (l) {
    case 0: { /* odd lengths, gaps, a tail over segments 3+1+2+2 */
        L->arena_len = 3 * L->total;
        L->arena = xalloc(L->arena_len);
        L->seg = calloc(4096, sizeof *L->seg);
        size_t at = 0, total = 0, k = 0;
        while (total < 4000) {
            size_t len = 1 + (k * 7) % 13;
            L->seg[L->nseg++] = (dchan_iov_t){L->arena + at, len};
            at += len + 1 + k % 5;
            total += len;
            k++;
        }
        if (total % 8) {
            size_t len = 8 - total % 8;
            L->seg[L->nseg++] = (dchan_iov_t){L->arena + at, len};
            at += len + 3;
            total += len;
        }
        static const size_t tail[4] = {3, 1, 2, 2};
        for (int i = 0; i < 4; i++) {
            L->seg[L->nseg++] = (dchan_iov_t){L->arena + at, tail[i]};
            at += tail[i] + 5;
        }
        break;
    }
    case 1: /* longer than a WR may be, from the highest address down */
        L->arena_len = 40000;
        L->arena = xalloc(L->arena_len);
        L->seg = calloc(4, sizeof *L->seg);
        L->nseg = 4;
        for (int i = 0; i < 3; i++)
            L->seg[i] = (dchan_iov_t){L->arena + 20200 - (size_t)i * 10100, 10000};
        L->seg[3] = (dchan_iov_t){L->arena + 30300, 8};
        break;
    case 2: /* many: more WRs than the send queue */
        L->arena_len = 48000;
        L->arena = xalloc(L->arena_len);
        L->seg = calloc(3000, sizeof *L->seg);
        L->nseg = 3000;
        for (int i = 0; i < 3000; i++)
            L->seg[i] = (dchan_iov_t){L->arena + (size_t)i * 16, 8};
        break;
    case 3: { /* on both sides of an unmapped page */
        long pg = sysconf(_SC_PAGESIZE);
        L->arena_len = (size_t)pg * 3;
        L->arena = mmap(NULL, L->arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
        if (L->arena == MAP_FAILED)
            die("mmap");
        munmap(L->arena + pg, (size_t)pg);
        L->mapped = 1;
        L->seg = calloc(2, sizeof *L->seg);
        L->nseg = 2;
        L->seg[0] = (dchan_iov_t){L->arena + 100, 2900};
        L->seg[1] = (dchan_iov_t){L->arena + 2 * pg, 1196};
        break;
    }
    default: /* the subarray: its segments are the rows the library derives */
        L->arena_len = sa_sizes[0] * sa_sizes[1] * sa_sizes[2] * 8;
        L->arena = xalloc(L->arena_len);
        break;
    }
    size_t sum = 0;
    for (int i = 0; i < L->nseg; i++)
        sum += L->seg[i].len;
    if (L->nseg && sum != L->total)
        die("layout %d: %zu bytes, expected %zu", l, sum, L->total);
}

/* The message (expect) into the layout's segments. */
static void scatter(struct layout *L, int l, const unsigned char *msg)
{
    if (l == NL - 1) {
        size_t pos = 0;
        for (size_t i = 0; i < sa_sub[0]; i++)
            for (size_t j = 0; j < sa_sub[1]; j++) {
                size_t off = (((sa_start[0] + i) * sa_sizes[1] + sa_start[1] + j) * sa_sizes[2] +
                              sa_start[2]) * 8;
                memcpy(L->arena + off, msg + pos, sa_sub[2] * 8);
                pos += sa_sub[2] * 8;
            }
        return;
    }
    size_t pos = 0;
    for (int i = 0; i < L->nseg; i++) {
        memcpy((void *)L->seg[i].base, msg + pos, L->seg[i].len);
        pos += L->seg[i].len;
    }
}

static void g_arrival(dchan_handle_t *h, void *arg)
{
    struct gchan *c = arg;
    if (h != c->rh)
        die("arrival of another handle");
    c->arrivals++;
}

static void g_error(dchan_handle_t *h, int rc, void *arg)
{
    (void)h;
    (void)arg;
    die("asynchronous error: %s", dchan_strerror(rc));
}

static int test_gather(void)
{
    int n = nranks * NL;
    gch = calloc((size_t)n, sizeof *gch);
    dchan_wire_t *mine = calloc((size_t)n, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)n * (size_t)nranks, sizeof *all);
    for (int k = 0; k < n; k++) {
        struct gchan *c = &gch[k];
        c->peer = k / NL;
        c->l = k % NL;
        size_t total = layout_total(c->l);
        c->rbuf = xalloc(total);
        c->expect = xalloc(total);
        CHECK(dchan_create_handle(ctx, c->peer, c->rbuf, total, OOB, g_arrival, c, &c->rh));
        CHECK(dchan_handle_export(c->rh, &mine[k]));
    }
    CHECK(dchan_allgather(ctx, mine, all, (size_t)n * sizeof *mine));
    for (int k = 0; k < n; k++) {
        struct gchan *c = &gch[k];
        /* The wire of c->peer's receive handle from this rank, layout l. */
        const dchan_wire_t *w = &all[(size_t)c->peer * (size_t)n + (size_t)me * NL + (size_t)c->l];
        layout_make(&c->lay, c->l);
        if (c->l == NL - 1)
            CHECK(dchan_assoc_local_subarray(ctx, w, c->lay.arena, 3, sa_sizes, sa_sub, sa_start,
                                             8, &c->sh));
        else
            CHECK(dchan_assoc_local_iov(ctx, w, c->lay.seg, c->lay.nseg, &c->sh));
    }
    CHECK(dchan_barrier(ctx));
    for (long it = 0; it < iters; it++) {
        for (int k = 0; k < n; k++) {
            struct gchan *c = &gch[k];
            /* What this rank sends to c->peer on layout l: channel id me*NL+l there. */
            fill(c->expect, c->lay.total, me, c->peer * NL + c->l, it);
            scatter(&c->lay, c->l, c->expect);
            CHECK(dchan_put(c->sh));
        }
        unsigned long long t0 = now_ns();
        for (int k = 0; k < n; k++) {
            struct gchan *c = &gch[k];
            while (c->arrivals <= it) {
                CHECK(dchan_progress(ctx));
                deadline(t0, "gathered puts");
            }
            verify(c->rbuf, layout_total(c->l), c->peer, me * NL + c->l, it);
            CHECK(dchan_ready(c->rh));
        }
        /* Every receiver re-armed before the next round's puts. */
        CHECK(dchan_barrier(ctx));
    }
    for (int k = 0; k < n; k++) {
        struct gchan *c = &gch[k];
        CHECK(dchan_handle_destroy(c->sh));
        CHECK(dchan_handle_destroy(c->rh));
        if (c->lay.mapped) {
            long pg = sysconf(_SC_PAGESIZE);
            munmap(c->lay.arena, (size_t)pg);
            munmap(c->lay.arena + 2 * pg, (size_t)pg);
        } else {
            free(c->lay.arena);
        }
        free(c->lay.seg);
        free(c->rbuf);
        free(c->expect);
    }
    CHECK(dchan_barrier(ctx));
    free(gch);
    free(mine);
    free(all);
    return 0;
}

/* ---- get --------------------------------------------------------------------------------- */

struct src {
    int peer, i;
    size_t size;
    dchan_handle_t *h;
    unsigned char *buf;
    long published, taken;
    int err;
};

struct getter {
    int peer, i;
    size_t size;
    dchan_handle_t *h;
    unsigned char *buf;
    long got;
    int err;
};

static struct src *srcs;
static struct getter *gets;
static int nsz, nsrc;
static size_t sizes[MAXSIZES] = {8, 4096, 300000};
static int exiting;   /* the victim: leave at the next look */
static int finished;  /* this rank is done: later errors are other ranks leaving */

static int chan_id(int to, int i)
{
    return to * nsz + i;
}

static void s_done(dchan_handle_t *h, void *arg)
{
    struct src *s = arg;
    if (h != s->h)
        die("done_fn of another handle");
    if (++s->taken != s->published)
        die("source %d/%d: done_fn for version %ld, %ld published", s->peer, s->i, s->taken,
            s->published);
    if (me == victim && s->taken >= iters / 2)
        exiting = 1;
    if (s->published == iters)
        return;
    fill(s->buf, s->size, me, chan_id(s->peer, s->i), s->published);
    CHECK(dchan_ready(h));
    s->published++;
}

static void g_got(dchan_handle_t *h, void *arg)
{
    struct getter *g = arg;
    if (h != g->h)
        die("arrival_fn of another handle");
    verify(g->buf, g->size, g->peer, chan_id(me, g->i), g->got);
    g->got++;
}

static void get_error(dchan_handle_t *h, int rc, void *arg)
{
    (void)arg;
    for (int k = 0; k < nsrc; k++) {
        struct src *s = &srcs[k];
        struct getter *g = &gets[k];
        if (h == s->h || h == g->h) {
            int peer = h == s->h ? s->peer : g->peer;
            /* A survivor that finished may leave before this rank ran the
             * done_fn of the last version it took: all were published. */
            int complete = h == s->h ? s->taken == iters || (victim >= 0 && s->published == iters)
                                     : g->got == iters;
            if (rc != DCHAN_ERR_PEER || (peer != victim && !complete && !finished))
                die("%s %d/%d: unexpected %s", h == s->h ? "source for" : "getter from", peer,
                    h == s->h ? s->i : g->i, dchan_strerror(rc));
            if (h == s->h)
                s->err = rc;
            else
                g->err = rc;
            return;
        }
    }
    die("error %s on no channel's handle", dchan_strerror(rc));
}

static void get_setup(void)
{
    nsrc = nranks * nsz;
    srcs = calloc((size_t)nsrc, sizeof *srcs);
    gets = calloc((size_t)nsrc, sizeof *gets);
    dchan_wire_t *mine = calloc((size_t)nsrc, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)nsrc * (size_t)nranks, sizeof *all);
    for (int k = 0; k < nsrc; k++) {
        struct src *s = &srcs[k];
        s->peer = k / nsz;
        s->i = k % nsz;
        s->size = sizes[s->i];
        s->buf = xalloc(s->size);
        fill(s->buf, s->size, me, chan_id(s->peer, s->i), 0);
        CHECK(dchan_create_source(ctx, s->peer, s->buf, s->size, s_done, s, &s->h));
        s->published = 1;
        CHECK(dchan_handle_export(s->h, &mine[k]));
    }
    CHECK(dchan_allgather(ctx, mine, all, (size_t)nsrc * sizeof *mine));
    for (int k = 0; k < nsrc; k++) {
        struct getter *g = &gets[k];
        g->peer = k / nsz;
        g->i = k % nsz;
        g->size = sizes[g->i];
        g->buf = xalloc(g->size);
        const dchan_wire_t *w = &all[(size_t)g->peer * (size_t)nsrc + (size_t)chan_id(me, g->i)];
        CHECK(dchan_assoc_remote(ctx, w, g->buf, g->size, g_got, g, &g->h));
    }
    CHECK(dchan_barrier(ctx));
    free(mine);
    free(all);
}

/* One look at every getter, then progress; the victim leaves when told. */
static void get_round(void)
{
    for (int k = 0; k < nsrc; k++) {
        struct getter *g = &gets[k];
        if (g->got < iters && !g->err) {
            int rc = dchan_get(g->h);
            if (rc != DCHAN_ERR_AGAIN && rc != DCHAN_ERR_PEER)
                CHECK(rc);
        }
    }
    CHECK(dchan_progress(ctx));
    if (exiting) {
        fflush(NULL);
        _exit(0); /* no finalize: the others see a dead peer */
    }
}

static int get_complete(void)
{
    for (int k = 0; k < nsrc; k++) {
        if (srcs[k].peer == victim ? !srcs[k].err
                                   : srcs[k].taken < iters && !(srcs[k].err && srcs[k].published == iters))
            return 0;
        if (gets[k].peer == victim ? !gets[k].err : gets[k].got < iters)
            return 0;
    }
    return 1;
}

static int test_get(void)
{
    get_setup();
    unsigned long long t0 = now_ns();
    while (!get_complete()) {
        get_round();
        deadline(t0, "every version");
    }
    for (int k = 0; k < nsrc; k++) {
        struct getter *g = &gets[k];
        if (g->peer != victim) {
            int rc = dchan_get(g->h);
            /* Every version was taken; with a victim, another survivor may
             * have finished and left already. */
            if (rc != DCHAN_ERR_AGAIN && !(victim >= 0 && rc == DCHAN_ERR_PEER && g->peer != me))
                die("getter from %d/%d after the last version: %s", g->peer, g->i,
                    dchan_strerror(rc));
        } else {
            if (g->got >= iters)
                die("getter from the dead rank got every version");
            EXPECT(dchan_get(g->h), DCHAN_ERR_PEER);
        }
    }
    if (victim >= 0) {
        /* No collective may include the dead rank: each survivor is done
         * with the others once its sources are taken and its getters have
         * everything, which every survivor reaches; what comes after (a
         * survivor leaving) is not an error of ours. */
        finished = 1;
        /* Destroying a getter completes its last taken word first. */
        for (int k = 0; k < nsrc; k++)
            CHECK(dchan_handle_destroy(gets[k].h));
        if (me == 0)
            printf("RESULT test=get-killed ranks=%d survivors=%d verified=yes\n", nranks,
                   nranks - 1);
        fflush(NULL);
        _exit(0);
    }
    CHECK(dchan_barrier(ctx));
    /* Destroyed sources: their getters fail. */
    for (int k = 0; k < nsrc; k++)
        CHECK(dchan_handle_destroy(srcs[k].h));
    CHECK(dchan_barrier(ctx));
    for (int k = 0; k < nsrc; k++) {
        struct getter *g = &gets[k];
        int rc;
        t0 = now_ns();
        while ((rc = dchan_get(g->h)) == DCHAN_ERR_AGAIN) {
            CHECK(dchan_progress(ctx));
            deadline(t0, "a destroyed source's getter to fail");
        }
        EXPECT(rc, DCHAN_ERR_PEER);
        CHECK(dchan_handle_destroy(g->h));
    }
    CHECK(dchan_barrier(ctx));
    for (int k = 0; k < nsrc; k++) {
        free(srcs[k].buf);
        free(gets[k].buf);
    }
    free(srcs);
    free(gets);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: verbs_getgather --test gather|get|get-killed [--sizes a,b] "
                    "[--iters N] [--env NAME=VALUE]...\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *test = NULL;
    int opt;
    static const struct option opts[] = {{"test", required_argument, 0, 't'},
                                         {"sizes", required_argument, 0, 's'},
                                         {"iters", required_argument, 0, 'i'},
                                         {"env", required_argument, 0, 'e'},
                                         {0, 0, 0, 0}};
    mpt_prog = "verbs_getgather";
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    nsz = 3;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 't':
            test = optarg;
            break;
        case 's': {
            char *p = optarg;
            nsz = 0;
            while (*p && nsz < MAXSIZES) {
                sizes[nsz++] = (size_t)strtol(p, &p, 0);
                if (*p == ',')
                    p++;
            }
            break;
        }
        case 'i':
            iters = atol(optarg);
            break;
        case 'e':
            if (!mpt_setenv_arg(optarg))
                usage();
            break;
        default:
            usage();
        }
    }
    if (!test || iters < 4)
        usage();
    limit_ns = mpt_time_limit_ns();
    int killed = strcmp(test, "get-killed") == 0;
    ctx = mpt_init(strcmp(test, "gather") == 0 ? g_error : get_error);
    if (strcmp(dchan_provider_name(ctx), "verbs") != 0)
        die("provider %s, expected verbs", dchan_provider_name(ctx));
    if (killed) {
        if (nranks < 2)
            die("get-killed needs 2 ranks or more");
        victim = nranks - 1;
    }
    if (strcmp(test, "gather") == 0)
        test_gather();
    else if (strcmp(test, "get") == 0 || killed)
        test_get();
    else
        usage();
    CHECK(dchan_finalize(ctx));
    if (me == 0)
        printf("RESULT test=%s ranks=%d iters=%ld verified=yes\n", test, nranks, iters);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
