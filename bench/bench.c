/* SPDX-License-Identifier: BSD-3-Clause */
/* Shared parts of the dchan benchmarks; see bench.h. */
#include <errno.h>
#include <getopt.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/*
 * Every provider name the library accepts in DCHAN_PROVIDER, in its
 * automatic order. --all tries each with every detection mode; a name that
 * is not built into this library (or not usable here) makes dchan_init
 * return DCHAN_ERR_UNSUPPORTED and is reported and skipped. A new provider
 * is one more name here: bench/smoke.sh fails until every provider that
 * `dchan_info -p` lists is in this list.
 *
 * A name ending in "-heap" is a pseudo provider: the context is opened on
 * the provider named before the suffix, but the dchan impls' buffers come
 * from the heap (bench_alloc) instead of dchan_alloc, so that the two
 * placements of a provider that cares (shm: segment memcpy vs CMA) are
 * measured side by side and labelled apart.
 */
static const char *const provider_names[] = {"verbs", "ofi", "shm", "shm-heap", "mpi", "self"};
#define NPROVIDER_NAMES (sizeof provider_names / sizeof provider_names[0])
#define HEAP_SUFFIX "-heap"

static const int all_detects[] = {DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG, DCHAN_DETECT_EVENT};

int bench_rank = 0, bench_nranks = 1;
MPI_Comm bench_comm = MPI_COMM_NULL;
static const struct bench_opts *opts;

const char bench_common_help[] =
    "  --provider LIST   providers to measure, comma-separated, one dchan context each\n"
    "                    (default: DCHAN_PROVIDER, else the library's automatic choice)\n"
    "  --detect LIST     detection modes: auto, sentinel, flag, event (default: DCHAN_DETECT)\n"
    "  --all             every provider x sentinel, flag, event; unsupported ones are\n"
    "                    reported and skipped\n"
    "  --exclude LIST    provider or provider/mode entries not to measure (reported as\n"
    "                    skipped), e.g. ofi/sentinel,verbs\n"
    "  --impls LIST      implementations to run (default: all of this benchmark's)\n"
    "  --sizes LIST      message sizes in bytes, comma-separated (K, M, G: x1024)\n"
    "  --iters N         iterations at small sizes (cut down with size, see --help)\n"
    "  --warmup N        untimed iterations before timing (cut down likewise)\n"
    "  --reps N          repetitions the median, min and max are taken over\n"
    "  --check ends|full verify the stamped ends of every message (default), or every\n"
    "                    byte of every message (slow; timings are then not comparable)\n"
    "  --yield           yield the core in wait loops (for oversubscribed runs)\n"
    "  --timeout SEC     a wait in which this process spends SEC of CPU time with\n"
    "                    nothing arriving is an error (default 60)\n"
    "  --list-providers  print the provider names --all tries, and exit\n"
    "  --help            this help\n";

const char *bench_rc_name(int rc)
{
    static const char *const names[] = {
        "DCHAN_SUCCESS",        "DCHAN_ERR_INVALID_ARG", "DCHAN_ERR_NO_MEMORY",
        "DCHAN_ERR_STATE",      "DCHAN_ERR_SIZE",        "DCHAN_ERR_SENTINEL",
        "DCHAN_ERR_HANDLE",     "DCHAN_ERR_PEER",        "DCHAN_ERR_PROVIDER",
        "DCHAN_ERR_UNSUPPORTED", "DCHAN_ERR_AGAIN",      "DCHAN_ERR_TIMEOUT",
        "DCHAN_ERR_OVERRUN"};
    return rc <= 0 && -rc < (int)(sizeof names / sizeof names[0]) ? names[-rc] : "DCHAN_ERR_?";
}

const char *bench_detect_word(int mode)
{
    switch (mode) {
    case DCHAN_DETECT_SENTINEL:
        return "sentinel";
    case DCHAN_DETECT_FLAG:
        return "flag";
    case DCHAN_DETECT_EVENT:
        return "event";
    case DCHAN_DETECT_AUTO:
        return "auto";
    default:
        return "?";
    }
}

static int detect_from_word(const char *w, size_t n)
{
    static const int modes[] = {DCHAN_DETECT_AUTO, DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG,
                                DCHAN_DETECT_EVENT};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const char *m = bench_detect_word(modes[i]);
        if (strlen(m) == n && strncmp(m, w, n) == 0)
            return modes[i];
    }
    return -1;
}

/* ---- options ---------------------------------------------------------------- */

static void usage_error(const struct bench_opts *o, const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: ", o->prog);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see --help)\n");
    exit(2);
}

static long parse_long(const struct bench_opts *o, const char *arg, long min, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(arg, &end, 10);
    if (errno || end == arg || *end || v < min)
        usage_error(o, what, arg);
    return v;
}

double bench_parse_bytes(const struct bench_opts *o, const char *arg, const char *what)
{
    size_t *v;
    int n;
    if (bench_parse_sizes(arg, &v, &n) || n != 1) {
        fprintf(stderr, "%s: %s wants a byte count, not '%s'\n", o->prog, what, arg);
        exit(2);
    }
    double x = (double)v[0];
    free(v);
    return x;
}

int bench_parse_sizes(const char *s, size_t **out, int *n)
{
    size_t *v = NULL;
    int cnt = 0;
    while (*s) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(s, &end, 10);
        if (errno || end == s)
            goto bad;
        switch (*end) {
        case 'K':
        case 'k':
            x <<= 10, end++;
            break;
        case 'M':
        case 'm':
            x <<= 20, end++;
            break;
        case 'G':
        case 'g':
            x <<= 30, end++;
            break;
        }
        if ((*end && *end != ',') || x == 0)
            goto bad;
        size_t *nv = realloc(v, (size_t)(cnt + 1) * sizeof *v);
        if (!nv)
            goto bad;
        v = nv;
        v[cnt++] = (size_t)x;
        s = *end ? end + 1 : end;
    }
    if (cnt == 0)
        goto bad;
    *out = v;
    *n = cnt;
    return 0;
bad:
    free(v);
    return -1;
}

int bench_in_list(const char *list, const char *name)
{
    size_t len = strlen(name);
    if (!list)
        return 1;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, n) == 0)
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

int bench_common_opt(struct bench_opts *o, int c, const char *arg)
{
    switch (c) {
    case BENCH_OPT_PROVIDER:
        o->providers = arg;
        break;
    case BENCH_OPT_DETECT:
        for (const char *p = arg; *p;) {
            size_t n = strcspn(p, ",");
            if (detect_from_word(p, n) < 0)
                usage_error(o, "unknown detection mode in '%s' (auto, sentinel, flag, event)",
                            arg);
            p += n + (p[n] == ',');
        }
        o->detects = arg;
        break;
    case BENCH_OPT_ALL:
        o->all = 1;
        break;
    case BENCH_OPT_EXCLUDE:
        o->exclude = arg;
        break;
    case BENCH_OPT_IMPLS:
        o->impls = arg;
        break;
    case BENCH_OPT_SIZES:
        free(o->sizes);
        if (bench_parse_sizes(arg, &o->sizes, &o->nsizes))
            usage_error(o, "malformed size list '%s'", arg);
        for (int i = 0; i < o->nsizes; i++)
            if (o->sizes[i] < 8)
                usage_error(o, "sizes must be at least 8 bytes (a stamped word): '%s'", arg);
        break;
    case BENCH_OPT_ITERS:
        o->iters = parse_long(o, arg, 1, "--iters wants a count >= 1, not '%s'");
        break;
    case BENCH_OPT_WARMUP:
        o->warmup = parse_long(o, arg, 0, "--warmup wants a count >= 0, not '%s'");
        break;
    case BENCH_OPT_REPS:
        o->reps = (int)parse_long(o, arg, 1, "--reps wants a count >= 1, not '%s'");
        break;
    case BENCH_OPT_CHECK:
        if (strcmp(arg, "ends") == 0)
            o->check_full = 0;
        else if (strcmp(arg, "full") == 0)
            o->check_full = 1;
        else
            usage_error(o, "--check wants ends or full, not '%s'", arg);
        break;
    case BENCH_OPT_YIELD:
        o->yield = 1;
        break;
    case BENCH_OPT_TIMEOUT:
        o->timeout_s = (double)parse_long(o, arg, 1, "--timeout wants seconds >= 1, not '%s'");
        break;
    default:
        return 1;
    }
    return 0;
}

void bench_list_providers(FILE *f)
{
    for (size_t i = 0; i < NPROVIDER_NAMES; i++)
        fprintf(f, "%s\n", provider_names[i]);
}

/* ---- MPI and messages ---------------------------------------------------------- */

void bench_mpi_init(int *argc, char ***argv, const struct bench_opts *o)
{
    opts = o;
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &bench_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &bench_nranks);
    /* The MPI peers run on their own communicator, apart from dchan's. */
    MPI_Comm_dup(MPI_COMM_WORLD, &bench_comm);
}

void bench_mpi_finalize(void)
{
    MPI_Comm_free(&bench_comm);
    MPI_Finalize();
}

void bench_fatal(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: rank %d: ", opts ? opts->prog : "bench", bench_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached */
}

void bench_note(const char *fmt, ...)
{
    va_list ap;
    if (bench_rank != 0)
        return;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fflush(stderr);
}

/* ---- combinations ------------------------------------------------------------- */

static void on_async_error(dchan_handle_t *h, int rc, void *arg)
{
    /* Nothing a benchmark measures survives a broken channel. */
    bench_fatal("asynchronous error on a %s handle: %s (%s)",
                dchan_handle_provider(h) ? dchan_handle_provider(h) : "?", dchan_strerror(rc),
                bench_rc_name(rc));
}

static void set_provider_label(struct bench_combo *c)
{
    static int ofi_noted;
    const char *p = dchan_provider_name(c->ctx), *fab = getenv("FI_PROVIDER");
    snprintf(c->provider, sizeof c->provider, "%s", p ? p : "?");
    /* libfabric's own choice is per process: name it, so that runs over
     * shm and over tcp stay apart in the logs. */
    if (p && strcmp(p, "ofi") == 0 && fab && *fab) {
        size_t n = strlen(c->provider);
        snprintf(c->provider + n, sizeof c->provider - n, ":%s", fab);
        for (char *q = c->provider + n; *q; q++)
            if (*q == ';' || *q == ',' || *q == ' ')
                *q = '+';
    } else if (p && strcmp(p, "ofi") == 0 && !ofi_noted++) {
        /* Named explicitly, ofi takes the first fabric libfabric lists
         * (tcp;ofi_rxm here, tens of microseconds), which the label
         * cannot name. */
        bench_note("note: ofi runs on the fabric libfabric lists first (DCHAN_LOG=info names "
                   "it); FI_PROVIDER=shm selects its shared-memory fabric\n");
    }
}

/* dchan_init agreed on by every rank; it is collective, so they must. */
static int agreed_init(dchan_attr_t *attr, dchan_ctx_t **ctx)
{
    int rc = dchan_init(attr, ctx), lo, hi;
    MPI_Allreduce(&rc, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&rc, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (lo != hi)
        bench_fatal("dchan_init returned %s here but not on every rank (%s .. %s)",
                    bench_rc_name(rc), bench_rc_name(lo), bench_rc_name(hi));
    return rc;
}

int bench_combos_open(const struct bench_opts *o, const char *bench, int flags,
                      struct bench_combo **out, int *n, int *failed)
{
    const char *provs[64];
    int dets[8], nprov = 0, ndet = 0, cnt = 0;
    char provbuf[256];

    if (o->providers) {
        snprintf(provbuf, sizeof provbuf, "%s", o->providers);
        for (char *save = NULL, *w = strtok_r(provbuf, ",", &save); w && nprov < 64;
             w = strtok_r(NULL, ",", &save))
            provs[nprov++] = w;
    } else if (o->all) {
        for (size_t i = 0; i < NPROVIDER_NAMES; i++)
            provs[nprov++] = provider_names[i];
    } else {
        provs[nprov++] = NULL;
    }
    if (o->detects) {
        for (const char *p = o->detects; *p && ndet < 8;) {
            size_t len = strcspn(p, ",");
            dets[ndet++] = detect_from_word(p, len);
            p += len + (p[len] == ',');
        }
    } else if (o->all) {
        for (size_t i = 0; i < sizeof all_detects / sizeof all_detects[0]; i++)
            dets[ndet++] = all_detects[i];
    } else {
        dets[ndet++] = -1;
    }

    struct bench_combo *c = calloc((size_t)(nprov * ndet), sizeof *c);
    if (!c)
        bench_fatal("out of memory");
    *failed = 0;
    for (int i = 0; i < nprov; i++) {
        for (int j = 0; j < ndet; j++) {
            struct bench_combo *k = &c[cnt];
            /* A skipped combination leaves its slot to the next one: clean. */
            *k = (struct bench_combo){0};
            dchan_attr_t attr;
            char both[64];
            int rc;
            const char *pw = provs[i] ? provs[i] : "auto";
            const char *dw = dets[j] >= 0 ? bench_detect_word(dets[j]) : "auto";

            /* Excluded by the user (a known hang, say): said, not hidden. */
            snprintf(both, sizeof both, "%s/%s", pw, dw);
            if (o->exclude && (bench_in_list(o->exclude, pw) || bench_in_list(o->exclude, both))) {
                bench_note("%s: provider %s with detection %s: excluded (--exclude)\n", o->prog,
                           pw, dw);
                if (bench_rank == 0)
                    printf("SKIP bench=%s provider=%s detect=%s reason=excluded\n", bench, pw, dw);
                continue;
            }

            dchan_attr_init(&attr);
            if (attr.config_error)
                bench_fatal("a DCHAN_* environment variable is malformed (see dchan_info -e)");
            char real[48];
            if (provs[i]) {
                size_t len = strlen(provs[i]), sl = strlen(HEAP_SUFFIX);
                if (len > sl && len - sl < sizeof real &&
                    strcmp(provs[i] + len - sl, HEAP_SUFFIX) == 0) {
                    snprintf(real, sizeof real, "%.*s", (int)(len - sl), provs[i]);
                    attr.provider = real;
                    k->heap_buffers = 1;
                } else {
                    attr.provider = provs[i];
                }
            }
            if (dets[j] >= 0)
                attr.detect = dets[j];
            /* Trying everything: say here what was skipped, once, instead of
             * the library's error line per rank (DCHAN_LOG still wins). */
            if (o->all && !getenv("DCHAN_LOG"))
                attr.log_level = DCHAN_LOG_NONE;
            attr.error_fn = on_async_error;
            k->want_provider = provs[i];
            k->want_detect = dets[j];
            k->singleton = (flags & BENCH_SELF_SINGLETON) && provs[i] &&
                           strcmp(provs[i], "self") == 0;
            if (k->singleton) {
                /* self serves a rank's own channels only: measured in a
                 * one-process context on rank 0 while the others wait. */
                attr.bootstrap = DCHAN_BOOT_SINGLETON;
                rc = bench_rank == 0 ? dchan_init(&attr, &k->ctx) : DCHAN_SUCCESS;
                MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
            } else {
                rc = agreed_init(&attr, &k->ctx);
            }
            if (rc == DCHAN_ERR_UNSUPPORTED) {
                bench_note("%s: provider %s with detection %s: not usable here (dchan_init: %s); "
                           "skipped\n",
                           o->prog, pw, dw, dchan_strerror(rc));
                if (bench_rank == 0)
                    printf("SKIP bench=%s provider=%s detect=%s reason=%s\n", bench, pw, dw,
                           bench_rc_name(rc));
                continue;
            }
            if (rc != DCHAN_SUCCESS) {
                bench_note("%s: provider %s with detection %s: dchan_init failed: %s (%s)\n",
                           o->prog, pw, dw, dchan_strerror(rc), bench_rc_name(rc));
                if (bench_rank == 0)
                    printf("FAIL bench=%s provider=%s detect=%s reason=%s\n", bench, pw, dw,
                           bench_rc_name(rc));
                ++*failed;
                continue;
            }
            if (k->ctx)
                set_provider_label(k);
            /* The label names the placement too, so that the logs keep the
             * pseudo provider's results apart from the real one's. */
            if (k->ctx && k->heap_buffers) {
                size_t used = strlen(k->provider);
                snprintf(k->provider + used, sizeof k->provider - used, "%s", HEAP_SUFFIX);
            }
            MPI_Bcast(k->provider, sizeof k->provider, MPI_CHAR, 0, MPI_COMM_WORLD);
            snprintf(k->detect, sizeof k->detect, "%s", dw);
            cnt++;
        }
    }
    fflush(stdout);
    *out = c;
    *n = cnt;
    return cnt;
}

void bench_combos_close(struct bench_combo *c, int n)
{
    for (int i = 0; i < n; i++) {
        int rc = DCHAN_SUCCESS;
        if (c[i].ctx)
            rc = dchan_finalize(c[i].ctx);
        if (rc != DCHAN_SUCCESS)
            bench_fatal("dchan_finalize (%s): %s", c[i].provider, dchan_strerror(rc));
    }
    free(c);
}

void bench_combo_label(struct bench_combo *c, const dchan_handle_t *h)
{
    int d = dchan_handle_detect(h);
    snprintf(c->detect, sizeof c->detect, "%s", bench_detect_word(d));
}

void *bench_combo_alloc(const struct bench_combo *c, size_t size)
{
    void *p = NULL;
    if (c->heap_buffers || !c->ctx)
        return bench_alloc(size);
    int rc = dchan_alloc(c->ctx, size, &p);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_alloc of %zu bytes (%s): %s (%s)%s", size, c->provider,
                    dchan_strerror(rc), bench_rc_name(rc),
                    rc == DCHAN_ERR_NO_MEMORY ? "; see DCHAN_SHM_SEGMENT_SIZE" : "");
    memset(p, 0, size); /* touch every page now, not while timing */
    return p;
}

void bench_combo_free(const struct bench_combo *c, void *p)
{
    if (c->heap_buffers || !c->ctx) {
        bench_free(p);
        return;
    }
    int rc = dchan_free(c->ctx, p);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_free (%s): %s (%s)", c->provider, dchan_strerror(rc),
                    bench_rc_name(rc));
}

/* ---- waiting, statistics, memory ------------------------------------------------ */

void bench_spin_init(struct bench_spin *s, const char *what)
{
    s->start = 0;
    s->n = 0;
    s->what = what;
}

/* The waiting thread's CPU time, not the wall clock: where other processes
 * share the cores, the waiter and the peer it waits for each get a share,
 * and a wait stretches with the load; a peer that hangs leaves the waiter
 * spinning (or yielding to nobody), and its CPU time runs up with the wall
 * clock. */
static uint64_t wait_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void bench_spin_slow(struct bench_spin *s)
{
    if (opts->yield)
        sched_yield();
    if ((s->n & 0xfff) != 0)
        return;
    uint64_t now = wait_cpu_ns();
    if (s->start == 0) {
        s->start = now;
        s->wall = bench_now_ns();
    } else if ((double)(now - s->start) > opts->timeout_s * 1e9) {
        bench_fatal("nothing arrived while this process spent %.0f s of CPU time (%.0f s wall) "
                    "waiting for %s",
                    opts->timeout_s, (double)(bench_now_ns() - s->wall) / 1e9, s->what);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_stats(double *v, int n, double *med, double *min, double *max)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *min = v[0];
    *max = v[n - 1];
    *med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

const char *bench_fmt(char *buf, size_t len, double v, int decimals)
{
    snprintf(buf, len, "%.*f", decimals, v);
    if (v != 0 && strtod(buf, NULL) == 0)
        snprintf(buf, len, "%.3g", v);
    return buf;
}

long bench_scale(long base, size_t size, double budget, long min)
{
    long n = base;
    if ((double)size * (double)n > budget)
        n = (long)(budget / (double)size);
    return n < min ? min : n;
}

void *bench_alloc(size_t size)
{
    void *p = NULL;
    size_t len = (size + 4095) & ~(size_t)4095;
    if (posix_memalign(&p, 4096, len ? len : 4096))
        bench_fatal("cannot allocate %zu bytes", size);
    memset(p, 0, len); /* touch every page now, not while timing */
    return p;
}

void bench_free(void *p)
{
    free(p);
}

/* ---- stamps ---------------------------------------------------------------------- */

/* The stamped ends: a head word when there is room for both, and the
 * tail word (inverted stamp) always. */
static size_t head_len(size_t size)
{
    return size >= 16 ? 8 : 0;
}

static unsigned char body_byte(size_t i, unsigned stream, uint64_t seed)
{
    return (unsigned char)(i * 131u + stream * 17u + seed * 37u + 1u);
}

static void fill_body(unsigned char *b, size_t size, unsigned stream, uint64_t seed)
{
    for (size_t i = head_len(size); i < size - 8; i++)
        b[i] = body_byte(i, stream, seed);
}

void bench_fill_body(void *buf, size_t size, unsigned stream)
{
    fill_body(buf, size, stream, 0);
}

void bench_fill(void *buf, size_t size, unsigned stream, uint64_t seq, int full)
{
    unsigned char *b = buf;
    uint64_t s = bench_stamp(stream, seq), t = ~s;
    if (full)
        fill_body(b, size, stream, seq);
    if (head_len(size))
        memcpy(b, &s, 8);
    memcpy(b + size - 8, &t, 8);
}

static void mismatch(const char *impl, size_t size, unsigned stream, uint64_t seq,
                     const char *part, size_t off, uint64_t got, uint64_t want)
{
    fprintf(stderr,
            "%s: rank %d: VERIFICATION FAILED: impl %s, size %zu, message %llu of stream %u: "
            "%s at offset %zu is 0x%llx, expected 0x%llx\n",
            opts ? opts->prog : "bench", bench_rank, impl, size, (unsigned long long)seq,
            stream, part, off, (unsigned long long)got, (unsigned long long)want);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    exit(3);
}

void bench_check(const void *buf, size_t size, unsigned stream, uint64_t seq, int body,
                 const char *impl)
{
    const unsigned char *b = buf;
    uint64_t s = bench_stamp(stream, seq), got;

    /* The tail first: with one-sided writes it is the part most likely to
     * be late or stale. */
    memcpy(&got, b + size - 8, 8);
    if (got != ~s)
        mismatch(impl, size, stream, seq, "tail stamp", size - 8, got, ~s);
    if (head_len(size)) {
        memcpy(&got, b, 8);
        if (got != s)
            mismatch(impl, size, stream, seq, "head stamp", 0, got, s);
    }
    if (body == BENCH_BODY_NONE)
        return;
    uint64_t seed = body == BENCH_BODY_SEQ ? seq : 0;
    for (size_t i = head_len(size); i < size - 8; i++)
        if (b[i] != body_byte(i, stream, seed))
            mismatch(impl, size, stream, seq, "body byte", i, b[i], body_byte(i, stream, seed));
}
