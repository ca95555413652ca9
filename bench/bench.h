/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared parts of the dchan benchmarks (see bench/README.md): options, the
 * provider x detection combinations to measure, timing and statistics, and
 * the stamps that let a receiver prove that what it timed arrived whole.
 */
#ifndef DCHAN_BENCH_H
#define DCHAN_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <mpi.h>

#include <dchan.h>

/* Options every benchmark takes. */
struct bench_opts {
    const char *prog;      /* program name, for messages */
    const char *providers; /* --provider: comma-separated, one context each */
    const char *detects;   /* --detect: comma-separated modes */
    int all;               /* --all: every provider name x sentinel, flag, event */
    const char *exclude;   /* --exclude: provider[/mode] entries not to open */
    const char *impls;     /* --impls: comma-separated implementations to run */
    size_t *sizes;         /* --sizes, or the program's defaults */
    int nsizes;
    long iters;            /* --iters: base count at small sizes (program-defined) */
    long warmup;           /* --warmup */
    int reps;              /* --reps: repetitions the median is taken over */
    int check_full;        /* --check full: every byte, every iteration */
    int yield;             /* --yield: spin loops give the core away (oversubscribed runs) */
    double timeout_s;      /* --timeout: a wait longer than this is an error */
};

/* Option codes of the shared long options (getopt_long values). */
enum {
    BENCH_OPT_PROVIDER = 0x100,
    BENCH_OPT_DETECT,
    BENCH_OPT_ALL,
    BENCH_OPT_EXCLUDE,
    BENCH_OPT_IMPLS,
    BENCH_OPT_SIZES,
    BENCH_OPT_ITERS,
    BENCH_OPT_WARMUP,
    BENCH_OPT_REPS,
    BENCH_OPT_CHECK,
    BENCH_OPT_YIELD,
    BENCH_OPT_TIMEOUT,
    BENCH_OPT_LIST,
    BENCH_OPT_HELP,
    BENCH_OPT_FIRST_PRIVATE /* a program's own options start here */
};

#define BENCH_LONGOPTS                                                                     \
    {"provider", required_argument, NULL, BENCH_OPT_PROVIDER},                             \
        {"detect", required_argument, NULL, BENCH_OPT_DETECT},                             \
        {"all", no_argument, NULL, BENCH_OPT_ALL},                                         \
        {"exclude", required_argument, NULL, BENCH_OPT_EXCLUDE},                           \
        {"impls", required_argument, NULL, BENCH_OPT_IMPLS},                               \
        {"sizes", required_argument, NULL, BENCH_OPT_SIZES},                               \
        {"iters", required_argument, NULL, BENCH_OPT_ITERS},                               \
        {"warmup", required_argument, NULL, BENCH_OPT_WARMUP},                             \
        {"reps", required_argument, NULL, BENCH_OPT_REPS},                                 \
        {"check", required_argument, NULL, BENCH_OPT_CHECK},                               \
        {"yield", no_argument, NULL, BENCH_OPT_YIELD},                                     \
        {"timeout", required_argument, NULL, BENCH_OPT_TIMEOUT},                           \
        {"list-providers", no_argument, NULL, BENCH_OPT_LIST},                             \
    {                                                                                      \
        "help", no_argument, NULL, BENCH_OPT_HELP                                          \
    }

/* Help text of the shared options. */
extern const char bench_common_help[];

/* Handles one shared option; returns 0 when c was one, 1 when it was not,
 * and exits (before MPI_Init) on a malformed value. --help and
 * --list-providers are the caller's to handle. */
int bench_common_opt(struct bench_opts *o, int c, const char *arg);
/* Parses a size list ("100,4K,1M": K, M, G are powers of 1024). */
int bench_parse_sizes(const char *s, size_t **out, int *n);
/* One byte count ("64K") for option what; exits 2 (before MPI_Init) on
 * anything else. */
double bench_parse_bytes(const struct bench_opts *o, const char *arg, const char *what);
/* Prints every provider name --all tries, one a line. */
void bench_list_providers(FILE *f);
/* Is name in the comma-separated list (NULL list: everything)? */
int bench_in_list(const char *list, const char *name);

/* MPI state the benchmarks share. */
extern int bench_rank, bench_nranks;
extern MPI_Comm bench_comm; /* a private duplicate of MPI_COMM_WORLD */
void bench_mpi_init(int *argc, char ***argv, const struct bench_opts *o);
void bench_mpi_finalize(void);

/* Messages: only rank 0 prints unless the rank is named. */
void bench_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void bench_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A provider x detection combination with its own dchan context. */
struct bench_combo {
    const char *want_provider; /* as asked; NULL: DCHAN_PROVIDER or automatic */
    int want_detect;           /* DCHAN_DETECT_*, or -1: DCHAN_DETECT or automatic */
    dchan_ctx_t *ctx;          /* NULL on ranks that do not take part (singleton self) */
    int singleton;             /* a one-process context on rank 0 (self provider) */
    int heap_buffers;          /* a "-heap" pseudo provider: buffers from bench_alloc */
    char provider[48];         /* label: the provider in use */
    char detect[16];           /* label: the resolved mode, once a handle exists */
};

/* Flags of bench_combos_open. */
enum {
    BENCH_SELF_SINGLETON = 1 /* "self" is measured in a one-process context on rank 0 */
};

/* Opens one context per requested combination, collectively. Those whose
 * dchan_init says DCHAN_ERR_UNSUPPORTED are reported (stderr, and a SKIP
 * line on stdout) and left out; any other failure is reported and counted
 * in *failed, and the run goes on with the rest. */
int bench_combos_open(const struct bench_opts *o, const char *bench, int flags,
                      struct bench_combo **out, int *n, int *failed);
void bench_combos_close(struct bench_combo *c, int n);
/* Sets the detect label from a handle of the combination's context. */
void bench_combo_label(struct bench_combo *c, const dchan_handle_t *h);
/* A dchan impl's buffer: dchan_alloc on the combination's context (in the
 * shared segment under shm), or bench_alloc for a "-heap" pseudo provider;
 * zeroed and touched either way. Freed with bench_combo_free, which must
 * come after the handles using it are destroyed and before the context is
 * finalized. */
void *bench_combo_alloc(const struct bench_combo *c, size_t size);
void bench_combo_free(const struct bench_combo *c, void *p);

const char *bench_detect_word(int mode);
/* "DCHAN_ERR_SIZE" and so on, for messages and SKIP lines. */
const char *bench_rc_name(int rc);

/* Time. */
static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spin-wait bookkeeping: yields with --yield, fails after --timeout
 * seconds of the waiter's CPU time. */
struct bench_spin {
    uint64_t start; /* CPU time, ns (0: not started) */
    uint64_t wall;  /* wall clock then, for the message */
    unsigned long n;
    const char *what;
};
void bench_spin_init(struct bench_spin *s, const char *what);
void bench_spin_slow(struct bench_spin *s);
static inline void bench_spin(struct bench_spin *s)
{
    /* The clock and the yield only every so often: the fast path is a
     * counter, so that the wait loop costs the same in every impl. */
    if (__builtin_expect((++s->n & 0x3f) == 0, 0))
        bench_spin_slow(s);
}

/* Median, minimum and maximum of v[0..n) (v is reordered). */
void bench_stats(double *v, int n, double *med, double *min, double *max);

/* v with the given decimals, or with three significant digits where those
 * decimals would print a value that is not 0 as 0 (a ratio or a rate
 * under heavy load): a RESULT line never shows a measurement as 0. */
const char *bench_fmt(char *buf, size_t len, double v, int decimals);

/* Iterations at a size: the base count, cut so that no more than budget
 * bytes move in one direction, never fewer than min. */
long bench_scale(long base, size_t size, double budget, long min);

/* Page-aligned, zeroed, touched memory (no page faults while timing). */
void *bench_alloc(size_t size);
void bench_free(void *p);

/*
 * Stamps. Every message carries a 64-bit stamp that changes every iteration
 * in its first and (inverted) its last 8 bytes; the body between holds a
 * pattern (fixed per stream, or per stamp with --check full). The receiver
 * checks the ends on every arrival, and the whole buffer at the end of a
 * size (or on every arrival with --check full), so no timed iteration can
 * count an arrival that was not whole. A stamp's top byte is 0xd5 and an
 * inverted one's 0x2a, so neither can equal the sentinel oob pattern below.
 */
#define BENCH_OOB 0xdeadbeefcafef00dull
static inline uint64_t bench_stamp(unsigned stream, uint64_t seq)
{
    return 0xd5ull << 56 | (uint64_t)(stream & 0xffffu) << 40 | (seq & 0xffffffffffull);
}
/* What bench_check compares besides the two stamped ends. */
enum {
    BENCH_BODY_NONE = 0,  /* the ends only (every iteration by default) */
    BENCH_BODY_FIXED = 1, /* the body written once by bench_fill_body */
    BENCH_BODY_SEQ = 2    /* the body bench_fill wrote for this seq (--check full) */
};
/* Writes the fixed body pattern of a stream (once, at set-up). */
void bench_fill_body(void *buf, size_t size, unsigned stream);
/* Writes the stamps of message seq, and its own body when full. */
void bench_fill(void *buf, size_t size, unsigned stream, uint64_t seq, int full);
/* Checks message seq of stream. On a mismatch, reports what differed and
 * aborts the job with exit status 3. */
void bench_check(const void *buf, size_t size, unsigned stream, uint64_t seq, int body,
                 const char *impl);

#endif /* DCHAN_BENCH_H */
