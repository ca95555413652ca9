/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the multi-process test programs share (tests/mp, tests/ofi,
 * tests/verbs): a fatal error that stops the whole job, checks of return
 * codes, a clock, buffers, and the data pattern every put carries, which
 * changes with the sender, the channel, the iteration and the position, so
 * that a byte from anywhere else is caught. Define OOB, the sentinel
 * pattern the program uses, before including this file: the pattern never
 * produces it.
 */
#ifndef DCHAN_MPTEST_H
#define DCHAN_MPTEST_H

#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef USE_MPI
#include <mpi.h>
#endif

#include <dchan.h>

#ifndef OOB
#error "define OOB before including mptest.h"
#endif

static const char *mpt_prog = "test"; /* set by main, for messages */
static int me = -1, nranks;

static inline void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s[%d]: FAIL: ", mpt_prog, me);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(NULL);
#ifdef USE_MPI
    MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    _exit(1); /* not exit: a test may die from inside a dchan callback */
}

#define CHECK(call)                                                                        \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ < 0)                                                                       \
            die("%s:%d: %s: %s", __FILE__, __LINE__, #call, dchan_strerror(rc_));           \
    } while (0)

#define EXPECT(call, want)                                                                 \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_ != (want))                                                                 \
            die("%s:%d: %s returned %d (%s), expected %s", __FILE__, __LINE__, #call, rc_, \
                dchan_strerror(rc_), #want);                                               \
    } while (0)

/* A poll that found nothing to do gives the core away: with more ranks
 * than cores (4 on 2 in make check) a rank that spins keeps the peer it
 * waits for off the core. First by yielding, which is enough when that
 * peer shares our core; after a long run of empty polls by short naps.
 * Waits of milliseconds are common here (the verbs simulation's stalls and
 * delayed placements, a peer that the tests running beside it keep off
 * the cores), and a rank that yields through them burns a core in system
 * calls that the other tests of make check -j2 need. *idle counts the
 * empty polls in a row: a poll that moved something (moved != 0) sets it
 * back to 0 and gives nothing away. */
enum { MPT_YIELDS = 256, MPT_NAP_NS = 20000 };

static inline void mpt_idle(unsigned *idle, int moved)
{
    if (moved) {
        *idle = 0;
    } else if (*idle < MPT_YIELDS) {
        ++*idle;
        sched_yield();
    } else {
        struct timespec ts = {0, MPT_NAP_NS};
        nanosleep(&ts, NULL);
    }
}

/* One dchan_progress for a loop that polls: when it ran no callback and
 * the caller's pass moved nothing either (moved == 0), give the core away
 * (mpt_idle, with a count per thread). */
static inline void mpt_progress(dchan_ctx_t *ctx, int moved)
{
    static __thread unsigned idle;
    int n = dchan_progress(ctx);
    CHECK(n);
    mpt_idle(&idle, n != 0 || moved);
}

static inline unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* How long a wait may take before the test fails: MP_TIME_LIMIT seconds
 * where the runner sets it, else 120. */
static inline unsigned long long mpt_time_limit_ns(void)
{
    const char *s = getenv("MP_TIME_LIMIT");
    return (s ? strtoull(s, NULL, 0) : 120ull) * 1000000000ull;
}

/* An option NAME=VALUE that sets NAME in the environment; 0 when the
 * argument has no '=' in it. */
static inline int mpt_setenv_arg(char *arg)
{
    char *eq = strchr(arg, '=');
    if (!eq)
        return 0;
    *eq = '\0';
    setenv(arg, eq + 1, 1);
    return 1;
}

/* Zeroed, 64-byte aligned (so 8-byte aligned, as SENTINEL buffers must be). */
static inline unsigned char *xalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1))
        die("out of memory (%zu bytes)", n);
    memset(p, 0, n);
    return p;
}

/* This process's rank before dchan_init: from MPI, or from the launcher. */
static inline int mpt_launcher_rank(void)
{
    int r = 0;
#ifdef USE_MPI
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
#else
    const char *e = getenv("PMIX_RANK") ? getenv("PMIX_RANK") : getenv("OMPI_COMM_WORLD_RANK");
    r = e ? atoi(e) : 0;
#endif
    return r;
}

/* Claim a host of its own for every block of 'block' ranks (DCHAN_HOST),
 * so that routing treats the other blocks as remote. */
static inline void mpt_fake_hosts(int block)
{
    char host[32];
    snprintf(host, sizeof host, "testhost%d", mpt_launcher_rank() / block);
    setenv("DCHAN_HOST", host, 1);
}

/* Channel buffers: from dchan_alloc when DCHAN_TEST_BUF=alloc (tests/mprun
 * sets it for shm-alloc runs: puts land in the shared segment), else from
 * the heap. mpt_buf_init decides, after dchan_init. */
static dchan_ctx_t *mpt_buf_ctx;

static inline void mpt_buf_init(dchan_ctx_t *ctx)
{
    const char *b = getenv("DCHAN_TEST_BUF");
    mpt_buf_ctx = b && strcmp(b, "alloc") == 0 ? ctx : NULL;
}

/* dchan_init with NAME=VALUE set (then unset again; value NULL: set
 * nothing): it must fail with want, leave its out-parameter unwritten and
 * say want_text on stderr (captured, then passed on). Collective, as
 * dchan_init is. */
/* What the process writes to stderr from mpt_capture to mpt_captured goes
 * to text (len bytes at most, the rest dropped), then to stderr. */
static inline FILE *mpt_capture(int *saved)
{
    FILE *log = tmpfile();
    fflush(stderr);
    *saved = dup(2);
    if (!log || *saved < 0 || dup2(fileno(log), 2) < 0)
        die("cannot capture stderr");
    return log;
}

static inline void mpt_captured(FILE *log, int saved, char *text, size_t len)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(log);
    size_t n = fread(text, 1, len - 1, log);
    text[n] = 0;
    fclose(log);
    fputs(text, stderr);
}

static inline void mpt_init_must_fail(const char *name, const char *value, int want,
                                      const char *want_text)
{
    char text[4096] = "";
    int saved;
    if (value)
        setenv(name, value, 1);
    FILE *log = mpt_capture(&saved);
    dchan_attr_t attr;
    dchan_ctx_t *c = (dchan_ctx_t *)&attr;
    dchan_attr_init(&attr);
    int rc = dchan_init(&attr, &c);
    mpt_captured(log, saved, text, sizeof text);
    if (value)
        unsetenv(name);
    if (rc != want || c != (dchan_ctx_t *)&attr)
        die("dchan_init with %s%s%s returned %d (%s)%s, expected %s", name,
            value ? "=" : " unset here", value ? value : "", rc, dchan_strerror(rc),
            c != (dchan_ctx_t *)&attr ? " and wrote *ctx" : "", dchan_strerror(want));
    if (!strstr(text, want_text))
        die("dchan_init with %s%s%s: stderr lacks '%s': '%s'", name, value ? "=" : " unset here",
            value ? value : "", want_text, text);
}

/* A test's --bad-env NAME=VALUE options, kept by mpt_bad_env_add (0 when
 * malformed or one too many), then run by mpt_bad_env: a dchan_init with
 * each set fails with DCHAN_ERR_INVALID_ARG and names NAME on stderr. */
static char *mpt_bad_envs[8];
static int mpt_nbad_envs;

static inline int mpt_bad_env_add(char *nv)
{
    if (mpt_nbad_envs == 8 || !strchr(nv, '='))
        return 0;
    mpt_bad_envs[mpt_nbad_envs++] = nv;
    return 1;
}

static inline void mpt_bad_env(void)
{
    for (int i = 0; i < mpt_nbad_envs; i++) {
        char *nv = mpt_bad_envs[i], *eq = strchr(nv, '=');
        *eq = '\0';
        mpt_init_must_fail(nv, eq + 1, DCHAN_ERR_INVALID_ARG, nv);
        *eq = '=';
    }
}

/* The context of a test program: dchan_init with error_fn, this rank and
 * the job's size in me and nranks, the buffer kind chosen (mpt_buf_init). */
static inline dchan_ctx_t *mpt_init(dchan_error_fn on_error)
{
    dchan_ctx_t *ctx;
    dchan_attr_t attr;
    dchan_attr_init(&attr);
    attr.error_fn = on_error;
    int rc = dchan_init(&attr, &ctx);
    if (rc != DCHAN_SUCCESS)
        die("dchan_init: %s", dchan_strerror(rc));
    me = dchan_rank(ctx);
    nranks = dchan_nranks(ctx);
    mpt_buf_init(ctx);
    return ctx;
}

static inline unsigned char *buf_alloc(size_t n)
{
    void *p = NULL;
    if (!mpt_buf_ctx)
        return xalloc(n);
    int rc = dchan_alloc(mpt_buf_ctx, n ? n : 1, &p);
    if (rc != DCHAN_SUCCESS)
        die("dchan_alloc(%zu): %s", n, dchan_strerror(rc));
    if ((uintptr_t)p % 64)
        die("dchan_alloc(%zu) returned %p, not 64-byte aligned", n, p);
    memset(p, 0, n);
    return p;
}

static inline void buf_free(void *p)
{
    if (!mpt_buf_ctx) {
        free(p);
        return;
    }
    int rc = dchan_free(mpt_buf_ctx, p);
    if (rc != DCHAN_SUCCESS)
        die("dchan_free(%p): %s", p, dchan_strerror(rc));
}

/* Word k of what rank 'from' puts on channel 'chan' in iteration 'iter'. */
static inline uint64_t word_of(int from, int chan, long iter, size_t k)
{
    uint64_t x = ((uint64_t)(unsigned)from << 48) ^ ((uint64_t)(unsigned)chan << 36) ^
                 ((uint64_t)iter << 8) ^ (k * 0x9e3779b97f4a7c15ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    return x == OOB ? x ^ 1 : x; /* a SENTINEL put ending in OOB would be refused */
}

/* Whole words go through fixed-size copies, which compile to plain loads
 * and stores (also under the sanitizers, where a call per word to their
 * memcpy and memcmp made the large runs take minutes); only a short last
 * word takes a call. */
static inline void fill(unsigned char *b, size_t n, int from, int chan, long iter)
{
    for (size_t k = 0; k < n; k += 8) {
        uint64_t w = word_of(from, chan, iter, k / 8);
        if (n - k >= 8)
            memcpy(b + k, &w, 8);
        else
            memcpy(b + k, &w, n - k);
    }
}

/* Set by a test to say when it checks (at arrival, before a release...),
 * so that a failure says which check saw it. */
static const char *mpt_verify_when = "";

/* Every byte, or die saying where the first wrong word is. */
static inline void verify(const unsigned char *b, size_t n, int from, int chan, long iter)
{
    for (size_t k = 0; k < n; k += 8) {
        uint64_t w = word_of(from, chan, iter, k / 8), got = 0;
        size_t len = n - k < 8 ? n - k : 8;
        if (len == 8) {
            memcpy(&got, b + k, 8);
            if (got == w)
                continue;
        } else if (memcmp(b + k, &w, len) == 0) {
            continue;
        }
        memcpy(&got, b + k, len);
        /* A second look some time later tells a write still landing from
         * one that ended wrong, and the next word what lies beside it. */
        uint64_t later = 0, next = 0;
        usleep(50000);
        memcpy(&later, b + k, len);
        fprintf(stderr, "%s[%d]: the word read %016llx again 50 ms later", mpt_prog, me,
                (unsigned long long)later);
        if (k + 16 <= n) {
            memcpy(&next, b + k + 8, 8);
            fprintf(stderr, "; the next word %016llx", (unsigned long long)next);
        }
        fputc('\n', stderr);
        /* The address too: a word that straddles an 8-byte boundary may
         * land in two pieces on hardware, which a torn word would tell. */
        die("data from rank %d, channel %d, iteration %ld (%zu bytes)%s: bytes %zu..%zu are "
            "%016llx, expected %016llx (at %p)",
            from, chan, iter, n, mpt_verify_when, k, k + len - 1, (unsigned long long)got,
            (unsigned long long)w, (const void *)(b + k));
    }
}

#endif
