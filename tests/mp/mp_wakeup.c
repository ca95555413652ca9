/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The wake-up descriptor (DESIGN §7, dchan_wakeup_fd(3)), launched by
 * tests/mprun on every provider and detection mode. Two sides, A and B:
 * ranks 0 and 1, or (one rank, the self provider) the main thread and a
 * helper thread of a DCHAN_THREAD_MULTIPLE context. A side that waits
 * sleeps in poll() on the descriptor after dchan_wakeup_arm returned
 * DCHAN_SUCCESS; every sleep is bounded by 10 s, and a sleep that runs out
 * while its event was due is a lost wake-up: the test fails.
 *
 *   --test pingpong  cycles of a put A <- B at a random moment around A's
 *                    arm (none, a yield, or a spin of up to 40 us, and a few
 *                    of 50 ms, which A surely sleeps through), then an
 *                    acknowledgement A -> B that B sleeps for (two ranks);
 *                    every byte checked. Then, on A: a sleep of 1 s must
 *                    cost under 1 % of a CPU (getrusage of the sleeping
 *                    thread), while B is busy on a channel to itself.
 *   --test credit    A sends on a credited channel of depth 1 and sleeps
 *                    until B, after a random delay, returns the credit.
 *   --test get       B owns a source that A gets: A sleeps until B, after a
 *                    random delay, publishes the next version (dchan_ready
 *                    on the source), and B sleeps until A took it (its
 *                    done_fn); every byte of every version checked.
 *   --test death     B is killed (SIGKILL) while A sleeps: A must wake and
 *                    get DCHAN_ERR_PEER through error_fn (tests/mprun runs
 *                    it under --enable-recovery, as peer-death*).
 * Bad input, each with its documented code and the channels working
 * afterwards: NULL and garbage contexts, arming before asking for the
 * descriptor, the descriptor asked for twice (the same one), arming and
 * dchan_progress_n from inside a callback, a finalised context.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>

#define OOB 0x3c3c3c3c3c3c3c3cull
#include "mptest.h"

#define SLEEP_MS 10000 /* a sleep longer than this is a lost wake-up */

enum { T_PINGPONG, T_CREDIT, T_DEATH, T_GET };

struct side {
    int id; /* 0: A, 1: B */
    dchan_handle_t *rh, *sh;
    dchan_handle_t *src, *gh; /* --test get: B's source, A's getter */
    unsigned char *rbuf, *sbuf;
    /* Counted by callbacks that may run on the other thread of a one-rank
     * run: read and written atomically (GOT, TAKEN, BUMP). */
    long got;   /* arrivals on rh (or gh) */
    long taken; /* --test get: done_fn calls on src */
    long sleeps;       /* polls that returned readable after a successful arm */
    unsigned rnd;
};

static dchan_ctx_t *ctx;
static int wfd = -1;
static int test = T_PINGPONG, threaded;
static long cycles = 1000;
static size_t size = 64;
static struct side sides[2];
static int errors, last_error; /* atomically, as got */
static int expect_errors;
static int cb_checked; /* likewise */
#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define BUMP(x) __atomic_add_fetch(&(x), 1, __ATOMIC_RELEASE)
/* One rank: B's thread may run A's callback; it tells A's sleep through
 * this eventfd, as a threaded application would. */
static int app_efd = -1;

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    if (!expect_errors)
        die("asynchronous error on a %s handle: %s", dchan_handle_provider(h),
            dchan_strerror(rc));
    __atomic_store_n(&last_error, rc, __ATOMIC_RELAXED);
    BUMP(errors);
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct side *s = arg;
    if (!LOAD(cb_checked)) {
        /* Calls a callback may not make, answered without harm. */
        __atomic_store_n(&cb_checked, 1, __ATOMIC_RELEASE);
        EXPECT(dchan_wakeup_arm(ctx), DCHAN_ERR_STATE);
        EXPECT(dchan_progress_n(ctx, 4), DCHAN_ERR_STATE);
        EXPECT(dchan_progress_n(ctx, 0), DCHAN_ERR_INVALID_ARG);
        int fd = -7;
        CHECK(dchan_wakeup_fd(ctx, &fd));
        if (fd != wfd)
            die("dchan_wakeup_fd in a callback gave %d, not %d", fd, wfd);
    }
    BUMP(s->got);
    if (threaded && s->id == 0) {
        uint64_t one = 1;
        if (write(app_efd, &one, sizeof one) < 0)
            die("eventfd write: %s", strerror(errno));
    }
}

/* The source's done_fn: A took the version, B may write the next. */
static void on_taken(dchan_handle_t *h, void *arg)
{
    struct side *s = arg;
    if (h != s->src)
        die("done_fn got another handle");
    BUMP(s->taken);
}

static unsigned next_rand(struct side *s)
{
    s->rnd = s->rnd * 1103515245u + 12345u;
    return s->rnd >> 8;
}

/* A moment around the peer's arm: now, after a yield, or after a spin. */
static void random_delay(struct side *s, long cycle)
{
    unsigned r = next_rand(s);
    if (cycle % 2000 == 7) {
        struct timespec ts = {0, 50 * 1000000L}; /* the peer surely sleeps */
        nanosleep(&ts, NULL);
        return;
    }
    switch (r % 4) {
    case 0:
        break;
    case 1:
        sched_yield();
        break;
    default: {
        unsigned long long until = now_ns() + (r >> 4) % 40000;
        while (now_ns() < until)
            ;
    }
    }
}

/* Progress until done(arg), sleeping on the descriptor whenever arming
 * says it is safe. */
static void sleep_until(struct side *s, int (*done)(void *), void *arg, const char *what,
                        long cycle)
{
    for (;;) {
        int n;
        while ((n = dchan_progress(ctx)) > 0)
            ;
        CHECK(n);
        if (done(arg))
            return;
        int rc = dchan_wakeup_arm(ctx);
        if (rc == DCHAN_ERR_AGAIN)
            continue;
        CHECK(rc);
        struct pollfd p[2] = {{wfd, POLLIN, 0}, {app_efd, POLLIN, 0}};
        int r = poll(p, threaded ? 2 : 1, SLEEP_MS);
        if (threaded && p[1].revents) {
            uint64_t v;
            if (read(app_efd, &v, sizeof v) < 0)
                die("eventfd read: %s", strerror(errno));
        }
        if (r == 0)
            die("lost wake-up: waiting for %s in cycle %ld, asleep %d s with nothing", what,
                cycle, SLEEP_MS / 1000);
        if (r < 0 && errno != EINTR)
            die("poll: %s", strerror(errno));
        if (r > 0)
            s->sleeps++;
    }
}

/* The helper thread of a one-rank run spins instead: one sleeper per context. */
static void spin_until(int (*done)(void *), void *arg)
{
    unsigned idle = 0;
    while (!done(arg)) {
        int n = dchan_progress(ctx);
        CHECK(n);
        mpt_idle(&idle, n);
    }
}

struct got_arg {
    struct side *s;
    long want;
};

static int got_done(void *a)
{
    struct got_arg *g = a;
    return LOAD(g->s->got) >= g->want;
}

static int credit_done(void *a)
{
    int c = dchan_credits(a);
    CHECK(c);
    return c > 0;
}

/* A: the get of version want-1 started, if it is published, and landed. */
static int version_done(void *a)
{
    struct got_arg *g = a;
    if (LOAD(g->s->got) >= g->want)
        return 1;
    int rc = dchan_get(g->s->gh);
    if (rc != DCHAN_ERR_AGAIN)
        CHECK(rc);
    return LOAD(g->s->got) >= g->want;
}

static int taken_done(void *a)
{
    struct got_arg *g = a;
    return LOAD(g->s->taken) >= g->want;
}

static int error_done(void *a)
{
    return LOAD(errors) > 0;
}

static void wait_got(struct side *s, long want, const char *what, long cycle)
{
    struct got_arg g = {s, want};
    if (threaded && s->id == 1)
        spin_until(got_done, &g);
    else
        sleep_until(s, got_done, &g, what, cycle);
}

/* ---- set-up ------------------------------------------------------------------------ */

static int peer_rank(void)
{
    return threaded ? 0 : 1 - me;
}

/* Receive handles first (A's from B, B's from A), then the send handles
 * from the other side's wire. */
static void make_channels(int credit)
{
    dchan_wire_t w[2], all[2];
    dchan_handle_attr_t ha;
    dchan_handle_attr_init(&ha);
    ha.credit = credit;
    int lo = threaded ? 0 : me, hi = threaded ? 1 : me;
    for (int i = lo; i <= hi; i++) {
        struct side *s = &sides[i];
        s->id = i;
        s->rnd = 777u + 31u * (unsigned)i;
        s->rbuf = buf_alloc(size);
        s->sbuf = buf_alloc(size);
        if (test == T_GET) {
            if (i == 1) {
                /* Version 0, published at creation. */
                fill(s->sbuf, size, 1, 0, 0);
                CHECK(dchan_create_source(ctx, peer_rank(), s->sbuf, size, on_taken, s, &s->src));
                CHECK(dchan_handle_export(s->src, &w[i]));
            }
            continue;
        }
        /* test credit: only B receives (A -> B); pingpong: both */
        if (test == T_CREDIT && i == 0)
            continue;
        CHECK(dchan_create_handle_attr(ctx, peer_rank(), s->rbuf, size, OOB, on_arrival, s, &ha,
                                       &s->rh));
        CHECK(dchan_handle_export(s->rh, &w[i]));
    }
    if (threaded) {
        all[0] = w[0];
        all[1] = w[1];
    } else {
        CHECK(dchan_allgather(ctx, &w[me], all, sizeof all[0]));
    }
    for (int i = lo; i <= hi; i++) {
        struct side *s = &sides[i];
        if (test == T_GET) {
            if (i == 0)
                CHECK(dchan_assoc_remote(ctx, &all[1], s->rbuf, size, on_arrival, s, &s->gh));
            continue;
        }
        if (test == T_CREDIT && i == 1)
            continue;
        CHECK(dchan_assoc_local(ctx, &all[1 - i], s->sbuf, size, &s->sh));
    }
}

static void destroy_channels(void)
{
    for (int i = 0; i < 2; i++) {
        struct side *s = &sides[i];
        if (s->rh)
            CHECK(dchan_handle_destroy(s->rh));
        if (s->sh)
            CHECK(dchan_handle_destroy(s->sh));
        if (s->gh)
            CHECK(dchan_handle_destroy(s->gh));
        if (s->src)
            CHECK(dchan_handle_destroy(s->src));
        if (s->rbuf)
            buf_free(s->rbuf);
        if (s->sbuf)
            buf_free(s->sbuf);
    }
}

/* ---- bad input ----------------------------------------------------------------------- */

static void bad_input_before_fd(void)
{
    int fd = -7;
    struct {
        uint32_t magic;
        char junk[256];
    } garbage;
    memset(&garbage, 0x5a, sizeof garbage);
    EXPECT(dchan_wakeup_arm(ctx), DCHAN_ERR_STATE); /* no descriptor yet */
    EXPECT(dchan_wakeup_fd(NULL, &fd), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_wakeup_fd(ctx, NULL), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_wakeup_fd((dchan_ctx_t *)&garbage, &fd), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_wakeup_arm(NULL), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_wakeup_arm((dchan_ctx_t *)&garbage), DCHAN_ERR_INVALID_ARG);
    if (fd != -7)
        die("a failed dchan_wakeup_fd wrote its out-parameter");
}

static void bad_input_after_fd(void)
{
    int fd2 = -7;
    CHECK(dchan_wakeup_fd(ctx, &fd2));
    if (fd2 != wfd)
        die("dchan_wakeup_fd asked twice gave %d then %d", wfd, fd2);
    /* Armed twice in a row: the second starts over. */
    int rc = dchan_wakeup_arm(ctx);
    if (rc != DCHAN_SUCCESS && rc != DCHAN_ERR_AGAIN)
        die("dchan_wakeup_arm: %s", dchan_strerror(rc));
    rc = dchan_wakeup_arm(ctx);
    if (rc != DCHAN_SUCCESS && rc != DCHAN_ERR_AGAIN)
        die("dchan_wakeup_arm again: %s", dchan_strerror(rc));
    CHECK(dchan_progress(ctx));
}

/* A context of its own (one rank, self), finalised: both calls refuse it
 * without touching it. */
static void bad_input_finalised(void)
{
    dchan_attr_t a;
    dchan_ctx_t *c2;
    int fd = -7;
    dchan_attr_init(&a);
    a.bootstrap = DCHAN_BOOT_SINGLETON;
    a.provider = "self";
    a.error_fn = on_error;
    CHECK(dchan_init(&a, &c2));
    CHECK(dchan_wakeup_fd(c2, &fd));
    CHECK(dchan_finalize(c2));
    fd = -7;
    EXPECT(dchan_wakeup_fd(c2, &fd), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_wakeup_arm(c2), DCHAN_ERR_INVALID_ARG);
    if (fd != -7)
        die("dchan_wakeup_fd on a finalised context wrote its out-parameter");
}

/* ---- the tests ---------------------------------------------------------------------- */

static void pingpong_a(void)
{
    struct side *s = &sides[0];
    for (long i = 0; i < cycles; i++) {
        wait_got(s, i + 1, "an arrival", i);
        verify(s->rbuf, size, 1, 0, i);
        CHECK(dchan_ready(s->rh));
        fill(s->sbuf, size, 0, 1, i);
        CHECK(dchan_put(s->sh));
    }
}

static void pingpong_b(void)
{
    struct side *s = &sides[1];
    for (long i = 0; i < cycles; i++) {
        random_delay(s, i);
        fill(s->sbuf, size, 1, 0, i);
        CHECK(dchan_put(s->sh));
        wait_got(s, i + 1, "an acknowledgement", i);
        verify(s->rbuf, size, 0, 1, i);
        CHECK(dchan_ready(s->rh));
    }
}

static void credit_a(void)
{
    struct side *s = &sides[0];
    for (long i = 0; i < cycles; i++) {
        sleep_until(s, credit_done, s->sh, "a credit", i);
        fill(s->sbuf, size, 0, 0, i);
        CHECK(dchan_put(s->sh));
    }
}

static void credit_b(void)
{
    struct side *s = &sides[1];
    for (long i = 0; i < cycles; i++) {
        wait_got(s, i + 1, "an arrival", i);
        verify(s->rbuf, size, 0, 0, i);
        random_delay(s, i);
        CHECK(dchan_ready(s->rh));
    }
}

static void get_a(void)
{
    struct side *s = &sides[0];
    for (long i = 0; i < cycles; i++) {
        struct got_arg g = {s, i + 1};
        sleep_until(s, version_done, &g, "a published version", i);
        verify(s->rbuf, size, 1, 0, i);
    }
}

static void get_b(void)
{
    struct side *s = &sides[1];
    for (long i = 0; i < cycles; i++) {
        struct got_arg g = {s, i + 1};
        if (threaded)
            spin_until(taken_done, &g);
        else
            sleep_until(s, taken_done, &g, "the version taken", i);
        if (i + 1 == cycles)
            break;
        random_delay(s, i);
        fill(s->sbuf, size, 1, 0, i + 1);
        CHECK(dchan_ready(s->src));
    }
}

static double thread_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* A asleep for 1 s with nothing to do: under 1 % of a CPU. Woken early
 * (a periodic look, mpi) it goes back to sleep until the second is over. */
static void idle_a(double *cpu, double *wall, long *wakes)
{
    double c0 = thread_cpu_s();
    unsigned long long t0 = now_ns(), end = t0 + 1000000000ull;
    *wakes = 0;
    while (now_ns() < end) {
        CHECK(dchan_progress(ctx));
        int rc = dchan_wakeup_arm(ctx);
        if (rc == DCHAN_ERR_AGAIN)
            continue;
        CHECK(rc);
        unsigned long long now = now_ns();
        int ms = now < end ? (int)((end - now + 999999) / 1000000) : 0;
        struct pollfd p = {wfd, POLLIN, 0};
        if (poll(&p, 1, ms) > 0)
            ++*wakes;
    }
    *cpu = thread_cpu_s() - c0;
    *wall = (double)(now_ns() - t0) / 1e9;
}

/* B meanwhile: puts and progress on a channel to itself, for 1.2 s. */
static void busy_b(void)
{
    unsigned char *rb = buf_alloc(size), *sb = buf_alloc(size);
    dchan_handle_t *rh, *sh;
    dchan_wire_t w;
    struct side loop = {.id = 1};
    CHECK(dchan_create_handle(ctx, me, rb, size, OOB, on_arrival, &loop, &rh));
    CHECK(dchan_handle_export(rh, &w));
    CHECK(dchan_assoc_local(ctx, &w, sb, size, &sh));
    unsigned long long end = now_ns() + 1200000000ull;
    long n = 0;
    while (now_ns() < end) {
        fill(sb, size, 1, 9, n);
        CHECK(dchan_put(sh));
        while (LOAD(loop.got) <= n)
            CHECK(dchan_progress(ctx));
        verify(rb, size, 1, 9, n);
        CHECK(dchan_ready(rh));
        n++;
    }
    CHECK(dchan_handle_destroy(rh));
    CHECK(dchan_handle_destroy(sh));
    buf_free(rb);
    buf_free(sb);
    fprintf(stderr, "mp_wakeup[%d]: %ld puts to itself while the peer slept\n", me, n);
}

static void *thread_b(void *arg)
{
    if (test == T_CREDIT)
        credit_b();
    else if (test == T_GET)
        get_b();
    else
        pingpong_b();
    return NULL;
}

static void sync_all(void)
{
    if (!threaded)
        CHECK(dchan_barrier(ctx));
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"test", required_argument, NULL, 't'},
                                         {"cycles", required_argument, NULL, 'n'},
                                         {"size", required_argument, NULL, 's'},
                                         {NULL, 0, NULL, 0}};
    int c;
    mpt_prog = "mp_wakeup";
    while ((c = getopt_long(argc, argv, "t:n:s:", opts, NULL)) != -1) {
        switch (c) {
        case 't':
            test = strcmp(optarg, "credit") == 0  ? T_CREDIT
                   : strcmp(optarg, "death") == 0 ? T_DEATH
                   : strcmp(optarg, "get") == 0   ? T_GET
                                                  : T_PINGPONG;
            break;
        case 'n':
            cycles = atol(optarg);
            break;
        case 's':
            size = (size_t)atol(optarg);
            break;
        default:
            die("usage: mp_wakeup [--test pingpong|credit|get|death] [--cycles N] [--size B]");
        }
    }
#ifdef USE_MPI
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#endif
    dchan_attr_t attr;
    dchan_attr_init(&attr);
    attr.error_fn = on_error;
    /* One rank: the peer is a thread of this process. */
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    threaded = !np || atoi(np) == 1;
    if (threaded)
        attr.thread_level = DCHAN_THREAD_MULTIPLE;
    int rc = dchan_init(&attr, &ctx);
    if (rc != DCHAN_SUCCESS)
        die("dchan_init: %s", dchan_strerror(rc));
    me = dchan_rank(ctx);
    nranks = dchan_nranks(ctx);
    mpt_buf_init(ctx);
    if (nranks != (threaded ? 1 : 2))
        die("runs on 2 ranks, or on 1 with a thread (got %d)", nranks);
    if (test == T_DEATH && threaded)
        die("--test death needs 2 ranks");
    if (threaded && (app_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        die("eventfd: %s", strerror(errno));

    bad_input_before_fd();
    CHECK(dchan_wakeup_fd(ctx, &wfd));
    if (wfd < 0)
        die("dchan_wakeup_fd gave %d", wfd);
    bad_input_after_fd();
    if (me == 0)
        bad_input_finalised();
    make_channels(test == T_CREDIT);
    sync_all();

    if (test == T_DEATH) {
        expect_errors = 1;
        if (me == 1) {
            struct timespec ts = {0, 100 * 1000000L}; /* rank 0 sleeps by now */
            nanosleep(&ts, NULL);
            raise(SIGKILL);
        }
        sleep_until(&sides[0], error_done, NULL, "the death of rank 1", 0);
        if (LOAD(last_error) != DCHAN_ERR_PEER)
            die("rank 1 died: error %s, expected DCHAN_ERR_PEER",
                dchan_strerror(LOAD(last_error)));
        printf("SURVIVOR OK rank=%d\n", me);
        printf("RESULT test=wakeup-death provider=%s woke=yes sleeps=%ld\n",
               dchan_provider_name(ctx), sides[0].sleeps);
        fflush(NULL);
        EXPECT(dchan_finalize(ctx), DCHAN_ERR_PEER);
        _exit(0); /* not MPI_Finalize: it would wait for the dead rank */
    }

    pthread_t th;
    if (threaded && pthread_create(&th, NULL, thread_b, NULL) != 0)
        die("pthread_create");
    if (me == 0)
        (test == T_CREDIT ? credit_a : test == T_GET ? get_a : pingpong_a)();
    else if (!threaded)
        (test == T_CREDIT ? credit_b : test == T_GET ? get_b : pingpong_b)();
    if (threaded)
        pthread_join(th, NULL);
    if (!LOAD(cb_checked) && (threaded || (test != T_CREDIT && test != T_GET) || me == (test == T_GET ? 0 : 1)))
        die("no callback ran"); /* the checks inside it did not run */
    struct side *sl = &sides[threaded ? 0 : me];
    /* A few cycles wait 50 ms before the put: A slept through them. */
    if (me == 0 && sl->sleeps == 0 && cycles > 7)
        die("%ld cycles and never asleep when the event came", cycles);
    fprintf(stderr, "mp_wakeup[%d]: %ld cycles, %ld wake-ups from poll\n", me, cycles,
            sl->sleeps);
    sync_all();

    double cpu = 0, wall = 0;
    long wakes = 0;
    if (test == T_PINGPONG) {
        if (me == 0)
            idle_a(&cpu, &wall, &wakes);
        else
            busy_b();
        sync_all();
        if (me == 0 && cpu > 0.01 * wall)
            die("asleep %.3f s on the descriptor cost %.1f ms of CPU (%ld wake-ups): over 1 %%",
                wall, cpu * 1e3, wakes);
    }
    int det = sides[0].rh   ? dchan_handle_detect(sides[0].rh)
              : sides[0].sh ? dchan_handle_detect(sides[0].sh)
                            : dchan_handle_detect(sides[0].gh);
    destroy_channels();
    if (me == 0)
        printf("RESULT test=wakeup-%s provider=%s detect=%d cycles=%ld size=%zu sleeps=%ld "
               "idle_cpu_ms=%.2f idle_wall_s=%.2f idle_wakes=%ld verified=yes\n",
               test == T_CREDIT ? "credit" : test == T_GET ? "get" : "pingpong",
               dchan_provider_name(ctx),
               det, cycles, size, sl->sleeps,
               cpu * 1e3, wall, wakes);
    CHECK(dchan_finalize(ctx));
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return 0;
}
