/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Thread levels on a real job (DESIGN §3 "Threads"), launched by mpirun
 * through tests/mprun. Ranks pair up (0,1), (2,3), ...; an odd rank out
 * talks to itself. The channels form T groups; each group has two sets of
 * N channels to the partner (and N from it), used on alternate iterations
 * as in mp_exchange's halo: a rank puts on set s at iteration i+2 only
 * after it received the partner's iteration i+1 data, which the partner
 * sent after re-arming set s.
 *
 *   --level multiple    T threads on one context, each driving its own
 *                       group: puts, re-arms and progress at once; a
 *                       callback runs on whichever thread progressed.
 *   --level serialized  T threads take turns (a mutex and a turn counter
 *                       of this program); each turn one thread drives every
 *                       group by one iteration, so every handle is used
 *                       from every thread, never from two at once.
 *   --level funneled    only the main thread calls dchan; T threads fill
 *                       the send buffers and check the receive buffers
 *                       between its calls.
 *
 * Every byte of every put is checked against the pattern of mptest.h, and
 * the counts of puts, arrivals and callbacks must come out exact. Built
 * with MPI (initialised at the thread level asked for) and without (the
 * PMIx bootstrap).
 */
#include "config.h"

#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define OOB 0x5a5a5a5a5a5a5a5aull
#include "mptest.h"

#define MAXT 16
#define MAXN 8

enum { L_MULTIPLE, L_SERIALIZED, L_FUNNELED };
static const char *const level_name[] = {"multiple", "serialized", "funneled"};
static const int level_dchan[] = {DCHAN_THREAD_MULTIPLE, DCHAN_THREAD_SERIALIZED,
                                  DCHAN_THREAD_FUNNELED};

static int level, nthreads = 4, nch = 2, partner, detect_mode;
static long iters = 1000;
static long sizes[8] = {8, 1001, 4096, 40000};
static int nsizes = 4;
static unsigned long long t_limit_ns; /* mpt_time_limit_ns(), set by main */
static dchan_ctx_t *ctx;
static pthread_t main_thread;

struct chan {
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    size_t size;
    int id, set, owner; /* pattern channel number, set, owning group */
    atomic_long arrivals;
};

/* chans[g][s][k]: group g, set s, channel k. */
static struct chan chans[MAXT][2][MAXN];
static atomic_long cb_foreign; /* callbacks run by a thread other than the group's */
static _Thread_local int my_group = -1; /* the group a MULTIPLE thread drives */

/* No error is expected: any is fatal, on whichever thread reports it. */
static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    die("asynchronous error on a channel: %s", dchan_strerror(rc));
}

/*
 * The n-th arrival on a channel of set s carries iteration s + 2n. Its
 * data stays put until the group re-arms, which it does only after it saw
 * this callback's count (release here, acquire there).
 */
static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct chan *c = arg;
    long n = atomic_load_explicit(&c->arrivals, memory_order_relaxed);
    if (h != c->rh)
        die("callback of channel %d got another channel's handle", c->id);
    if (level == L_FUNNELED && !pthread_equal(pthread_self(), main_thread))
        die("FUNNELED: callback of channel %d ran off the main thread", c->id);
    /* Under FUNNELED the worker threads check the data (after the callback). */
    if (level != L_FUNNELED)
        verify(c->rbuf, c->size, partner, c->id, c->set + 2 * n);
    /* Refused from inside a callback, whichever thread runs it. */
    EXPECT(dchan_progress(ctx), DCHAN_ERR_STATE);
    if (level == L_MULTIPLE && my_group != c->owner)
        atomic_fetch_add_explicit(&cb_foreign, 1, memory_order_relaxed);
    atomic_store_explicit(&c->arrivals, n + 1, memory_order_release);
}

/* ---- channels ---------------------------------------------------------------------- */

static size_t round_size(long n)
{
    return detect_mode == DCHAN_DETECT_SENTINEL ? (size_t)(n < 8 ? 8 : (n + 7) & ~7l) : (size_t)n;
}

/* Channel id on this rank receives from the partner and sends to it; the
 * wire of the partner's receive end with the same id comes through an
 * allgather in which every rank lists its wires by id. */
static void setup(void)
{
    int n = nthreads * 2 * nch;
    dchan_wire_t *mine = calloc((size_t)n, sizeof *mine);
    dchan_wire_t *all = calloc((size_t)n * (size_t)nranks, sizeof *all);
    if (!mine || !all)
        die("out of memory");
    for (int g = 0; g < nthreads; g++) {
        for (int s = 0; s < 2; s++) {
            for (int k = 0; k < nch; k++) {
                struct chan *c = &chans[g][s][k];
                c->id = (g * 2 + s) * nch + k;
                c->set = s;
                c->owner = g;
                c->size = round_size(sizes[c->id % nsizes]);
                c->rbuf = buf_alloc(c->size);
                c->sbuf = buf_alloc(c->size);
                atomic_init(&c->arrivals, 0);
                CHECK(dchan_create_handle(ctx, partner, c->rbuf, c->size, OOB, on_arrival, c,
                                          &c->rh));
                CHECK(dchan_handle_export(c->rh, &mine[c->id]));
            }
        }
    }
    CHECK(dchan_allgather(ctx, mine, all, (size_t)n * sizeof *mine));
    for (int g = 0; g < nthreads; g++)
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < nch; k++) {
                struct chan *c = &chans[g][s][k];
                CHECK(dchan_assoc_local(ctx, &all[(size_t)partner * (size_t)n + (size_t)c->id],
                                        c->sbuf, c->size, &c->sh));
            }
    free(mine);
    free(all);
}

static void *teardown_group(void *arg)
{
    int g = (int)(intptr_t)arg;
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < nch; k++) {
            struct chan *c = &chans[g][s][k];
            CHECK(dchan_handle_destroy(c->sh));
            CHECK(dchan_handle_destroy(c->rh));
            buf_free(c->rbuf);
            buf_free(c->sbuf);
        }
    return NULL;
}

/* Under MULTIPLE each thread destroys its own group, all at once. */
static void teardown(void)
{
    pthread_t tid[MAXT];
    for (int g = 0; g < nthreads; g++)
        if (level != L_MULTIPLE)
            teardown_group((void *)(intptr_t)g);
        else if (pthread_create(&tid[g], NULL, teardown_group, (void *)(intptr_t)g))
            die("pthread_create failed");
    for (int g = 0; g < nthreads && level == L_MULTIPLE; g++)
        pthread_join(tid[g], NULL);
}

/* ---- one group's steps, from whichever thread may call dchan ------------------------- */

/* The send buffer may be refilled only once the previous put completed. */
static void send_done(struct chan *c)
{
    unsigned long long start = now_ns();
    unsigned idle = 0;
    int rc;
    while ((rc = dchan_put_test(c->sh)) == 0) {
        if (now_ns() - start > t_limit_ns)
            die("put on channel %d never completed", c->id);
        mpt_idle(&idle, 0);
    }
    if (rc < 0)
        die("dchan_put_test on channel %d: %s", c->id, dchan_strerror(rc));
}

static void put_set(int g, long i, int fill_too)
{
    for (int k = 0; k < nch; k++) {
        struct chan *c = &chans[g][i % 2][k];
        if (fill_too) {
            send_done(c);
            fill(c->sbuf, c->size, me, c->id, i);
        }
        CHECK(dchan_put(c->sh));
    }
}

/* Progress until every channel of group g's set for iteration i has had
 * its callback; odd groups under MULTIPLE go through dchan_wait. */
static void wait_set(int g, long i)
{
    long want = i / 2 + 1; /* absolute: the partner may be an iteration ahead */
    unsigned long long start = now_ns();
    unsigned idle = 0;
    for (;;) {
        int done = 1;
        for (int k = 0; k < nch && done; k++)
            done = atomic_load_explicit(&chans[g][i % 2][k].arrivals, memory_order_acquire) >=
                   want;
        if (done)
            break;
        int rc = level == L_MULTIPLE && g % 2 ? dchan_wait(ctx, 10) : dchan_progress(ctx);
        if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
            die("progress: %s", dchan_strerror(rc));
        mpt_idle(&idle, rc > 0); /* more threads than cores: let the partner's run */
        if (now_ns() - start > t_limit_ns)
            die("group %d, iteration %ld: no arrival for %llu s", g, i,
                t_limit_ns / 1000000000ull);
    }
    for (int k = 0; k < nch; k++) {
        struct chan *c = &chans[g][i % 2][k];
        if (atomic_load(&c->arrivals) != want)
            die("channel %d: %ld callbacks, expected %ld (once per arrival)", c->id,
                atomic_load(&c->arrivals), want);
    }
}

static void check_set(int g, long i)
{
    for (int k = 0; k < nch; k++) {
        struct chan *c = &chans[g][i % 2][k];
        verify(c->rbuf, c->size, partner, c->id, i);
    }
}

/* Even channels re-arm in one call, odd ones mark, progress, then queue. */
static void rearm_set(int g, long i)
{
    for (int k = 0; k < nch; k++) {
        struct chan *c = &chans[g][i % 2][k];
        if (k % 2 == 0) {
            CHECK(dchan_ready(c->rh));
        } else {
            CHECK(dchan_ready_mark(c->rh));
            CHECK(dchan_progress(ctx));
            CHECK(dchan_ready_pollq(c->rh));
        }
    }
}

/* ---- MULTIPLE: every thread drives its own group at once ------------------------------ */

static void *multiple_worker(void *arg)
{
    int g = (int)(intptr_t)arg;
    my_group = g;
    for (long i = 0; i < iters; i++) {
        put_set(g, i, 1);
        wait_set(g, i);
        check_set(g, i);
        rearm_set(g, i);
    }
    return NULL;
}

/* ---- SERIALIZED: threads take turns; the turn's holder drives every group ------------ */

static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cond = PTHREAD_COND_INITIALIZER;
static long turn;                      /* under turn_lock */
static long turns_by[MAXT], puts_by[MAXT]; /* under turn_lock */

/* Turn k: take in iteration k-1 (wait, check, re-arm every group), then
 * put iteration k; the re-arm of k-1 before the put of k is what lets the
 * partner put k+1 on that set. Thread (k / 2) mod T holds turn k, so that
 * the turns of each set go round all threads. */
static int turn_owner(long k)
{
    return (int)(k / 2 % nthreads);
}

static void *serialized_worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    pthread_mutex_lock(&turn_lock);
    for (;;) {
        while (turn <= iters && turn_owner(turn) != t)
            pthread_cond_wait(&turn_cond, &turn_lock);
        if (turn > iters)
            break;
        long k = turn;
        for (int g = 0; g < nthreads && k > 0; g++) {
            wait_set(g, k - 1);
            check_set(g, k - 1);
            rearm_set(g, k - 1);
        }
        for (int g = 0; g < nthreads && k < iters; g++) {
            put_set(g, k, 1);
            puts_by[t] += nch;
        }
        turns_by[t]++;
        turn++;
        pthread_cond_broadcast(&turn_cond);
    }
    pthread_mutex_unlock(&turn_lock);
    return NULL;
}

/* ---- FUNNELED: the main thread calls dchan, the others touch the buffers ------------- */

static pthread_barrier_t phase_begin, phase_end;
static long phase; /* the turn the workers work on, published by the barrier */
static long checked_by[MAXT], filled_by[MAXT];

static void *funneled_worker(void *arg)
{
    int g = (int)(intptr_t)arg;
    for (;;) {
        pthread_barrier_wait(&phase_begin);
        long k = phase;
        if (k > iters)
            break;
        if (k > 0) {
            check_set(g, k - 1);
            checked_by[g] += nch;
        }
        if (k < iters) {
            for (int j = 0; j < nch; j++) {
                struct chan *c = &chans[g][k % 2][j];
                fill(c->sbuf, c->size, me, c->id, k);
            }
            filled_by[g] += nch;
        }
        pthread_barrier_wait(&phase_end);
    }
    return NULL;
}

/* Turn k as in SERIALIZED, with the buffer work handed to the group's
 * thread between two barriers. */
static void funneled_main(void)
{
    for (long k = 0; k <= iters; k++) {
        for (int g = 0; g < nthreads; g++) {
            if (k > 0)
                wait_set(g, k - 1);
            for (int j = 0; j < nch && k < iters; j++)
                send_done(&chans[g][k % 2][j]);
        }
        phase = k;
        pthread_barrier_wait(&phase_begin);
        pthread_barrier_wait(&phase_end);
        for (int g = 0; g < nthreads; g++) {
            if (k > 0)
                rearm_set(g, k - 1);
            if (k < iters)
                put_set(g, k, 0);
        }
    }
    phase = iters + 1;
    pthread_barrier_wait(&phase_begin);
}

/* ---- main ------------------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr, "usage: mp_threads --level multiple|serialized|funneled [--threads T]\n"
                    "       [--channels N (per set and thread)] [--sizes a,b,...] [--iters N]\n");
    exit(2);
}

static void run_level(void)
{
    pthread_t tid[MAXT];
    void *(*fn)(void *) = level == L_MULTIPLE     ? multiple_worker
                          : level == L_SERIALIZED ? serialized_worker
                                                  : funneled_worker;
    if (level == L_FUNNELED &&
        (pthread_barrier_init(&phase_begin, NULL, (unsigned)nthreads + 1) ||
         pthread_barrier_init(&phase_end, NULL, (unsigned)nthreads + 1)))
        die("pthread_barrier_init failed");
    for (int t = 0; t < nthreads; t++)
        if (pthread_create(&tid[t], NULL, fn, (void *)(intptr_t)t))
            die("pthread_create failed");
    if (level == L_FUNNELED)
        funneled_main();
    for (int t = 0; t < nthreads; t++)
        pthread_join(tid[t], NULL);
    if (level == L_FUNNELED) {
        pthread_barrier_destroy(&phase_begin);
        pthread_barrier_destroy(&phase_end);
    }
}

/* What each level promises, counted after the threads are joined. */
static void check_counts(void)
{
    long per_set[2] = {(iters + 1) / 2, iters / 2};
    long total = (long)nthreads * nch * iters;
    for (int g = 0; g < nthreads; g++)
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < nch; k++)
                if (atomic_load(&chans[g][s][k].arrivals) != per_set[s])
                    die("channel %d: %ld callbacks, expected %ld", chans[g][s][k].id,
                        atomic_load(&chans[g][s][k].arrivals), per_set[s]);
    for (int t = 0; t < nthreads; t++) {
        long turns = 0, puts = 0;
        for (long k = 0; k <= iters; k++)
            if (turn_owner(k) == t) {
                turns++;
                puts += k < iters ? (long)nthreads * nch : 0;
            }
        if (level == L_SERIALIZED && (turns_by[t] != turns || puts_by[t] != puts))
            die("thread %d held %ld turns and put %ld times, expected %ld and %ld", t,
                turns_by[t], puts_by[t], turns, puts);
        if (level == L_FUNNELED &&
            (checked_by[t] != (long)nch * iters || filled_by[t] != (long)nch * iters))
            die("thread %d checked %ld and filled %ld buffers, expected %ld", t, checked_by[t],
                filled_by[t], (long)nch * iters);
    }
    dchan_stats_t st;
    CHECK(dchan_get_stats(ctx, &st));
    if (st.puts != (uint64_t)total || st.arrivals != (uint64_t)total ||
        st.callbacks != (uint64_t)total || st.errors != 0)
        die("stats: %llu puts, %llu arrivals, %llu callbacks, %llu errors; expected %ld, no "
            "errors",
            (unsigned long long)st.puts, (unsigned long long)st.arrivals,
            (unsigned long long)st.callbacks, (unsigned long long)st.errors, total);
}

int main(int argc, char **argv)
{
    const char *lname = NULL;
    int opt;
    static const struct option opts[] = {
        {"level", required_argument, 0, 'l'}, {"threads", required_argument, 0, 't'},
        {"channels", required_argument, 0, 'c'}, {"sizes", required_argument, 0, 's'},
        {"iters", required_argument, 0, 'i'}, {0, 0, 0, 0}};

    mpt_prog = "mp_threads";
    main_thread = pthread_self();
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'l': lname = optarg; break;
        case 't': nthreads = atoi(optarg); break;
        case 'c': nch = atoi(optarg); break;
        case 'i': iters = atol(optarg); break;
        case 's':
            nsizes = 0;
            for (char *p = optarg; *p && nsizes < 8;) {
                char *end;
                sizes[nsizes] = strtol(p, &end, 0);
                if (end == p || sizes[nsizes] < 1)
                    usage();
                nsizes++;
                p = *end == ',' ? end + 1 : end;
            }
            break;
        default: usage();
        }
    }
    level = -1;
    for (int l = 0; l < 3 && lname; l++)
        if (strcmp(lname, level_name[l]) == 0)
            level = l;
    if (level < 0 || nthreads < 1 || nthreads > MAXT || nch < 1 || nch > MAXN || iters < 1 ||
        nsizes < 1)
        usage();
    t_limit_ns = mpt_time_limit_ns();

    dchan_attr_t attr;
#ifdef USE_MPI
    /* DESIGN §3: MPI's thread level must be at least dchan's. */
    static const int mpi_level[] = {MPI_THREAD_MULTIPLE, MPI_THREAD_SERIALIZED,
                                    MPI_THREAD_FUNNELED};
    int provided;
    MPI_Init_thread(&argc, &argv, mpi_level[level], &provided);
    if (provided < mpi_level[level])
        die("MPI provides thread level %d, %s needs %d", provided, level_name[level],
            mpi_level[level]);
    if (provided < MPI_THREAD_MULTIPLE) {
        /* More than MPI gives is refused, on every rank alike. */
        dchan_ctx_t *x = NULL;
        dchan_attr_init(&attr);
        attr.thread_level = DCHAN_THREAD_MULTIPLE;
        attr.log_level = DCHAN_LOG_NONE; /* the refusal is expected */
        EXPECT(dchan_init(&attr, &x), DCHAN_ERR_UNSUPPORTED);
        if (x)
            die("dchan_init wrote its output although it failed");
    }
#endif
    dchan_attr_init(&attr);
    attr.thread_level = level_dchan[level];
    attr.error_fn = on_error;
    CHECK(dchan_init(&attr, &ctx));
    mpt_buf_init(ctx);
    me = dchan_rank(ctx);
    nranks = dchan_nranks(ctx);
    partner = me ^ 1;
    if (partner >= nranks)
        partner = me;

    /* The detection mode in use (SENTINEL needs sizes in whole words). */
    {
        static _Alignas(8) unsigned char probe[8];
        dchan_handle_t *h;
        CHECK(dchan_create_handle(ctx, partner, probe, 8, OOB, on_arrival, NULL, &h));
        detect_mode = dchan_handle_detect(h);
        CHECK(dchan_handle_destroy(h));
    }
    if (me == 0)
        fprintf(stderr, "mp_threads: %s, %d ranks, %d threads x 2 x %d channels, provider %s, "
                        "detection %d\n",
                level_name[level], nranks, nthreads, nch, dchan_provider_name(ctx), detect_mode);
    setup();
    run_level();
    check_counts();
    CHECK(dchan_barrier(ctx));
    teardown();
    CHECK(dchan_finalize(ctx));
    if (me == 0) {
        if (level == L_MULTIPLE)
            fprintf(stderr, "mp_threads: %ld callbacks ran on another group's thread\n",
                    atomic_load(&cb_foreign));
        printf("RESULT test=threads-%s ranks=%d threads=%d puts=%ld verified=yes\n",
               level_name[level], nranks, nthreads, (long)nthreads * nch * iters);
    }
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
