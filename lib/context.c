/* SPDX-License-Identifier: BSD-3-Clause */
/* Contexts: init and provider selection, progress and callback dispatch. */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_SYS_RANDOM_H
#include <sys/random.h>
#endif

#include "core.h"
#include "handle.h"
#include "regcache.h"

/* The context whose callback this thread is running, if any. initial-exec:
 * one instruction to reach it on the progress path, instead of a call to
 * __tls_get_addr (libdchan is not meant to be dlopen'ed by a program that
 * has exhausted its static TLS reserve). */
static __thread dchan_ctx_t *tls_cb_ctx __attribute__((tls_model("initial-exec")));

uint64_t dchan_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool dchan_in_callback(const dchan_ctx_t *ctx)
{
    return tls_cb_ctx == ctx;
}

static uint64_t random_key(void)
{
    uint64_t k = 0;
#ifdef HAVE_GETRANDOM
    if (getrandom(&k, sizeof k, 0) != (ssize_t)sizeof k)
        k = 0;
#endif
    if (k == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        k = dchan_fnv1a64(&ts, sizeof ts) ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&k;
    }
    return k ? k : 0x646368616e6b6579ull;
}

static void attr_defaults(dchan_attr_t *a)
{
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    a->mpi_fcomm = -1;
    a->ext_rank = -1;
    a->log_level = DCHAN_LOG_WARN;
}

/* ---- provider selection ---------------------------------------------------- */

static void prov_free(struct dchan_prov *p)
{
    if (!p)
        return;
    /* Registrations first: they belong to the provider's domain. */
    dchan_regcache_destroy(p);
    if (p->opened)
        p->ops->close(p);
    free(p);
}

/* A provider cannot be used: says why (DCHAN_LOG=info) and adds "name:
 * why" to what the error says when no provider can be used. */
static void note_refusal(dchan_ctx_t *ctx, const char *name, const char *why)
{
    dchan_info(ctx, name, "not usable: %s", why);
    size_t used = strlen(ctx->refusal);
    snprintf(ctx->refusal + used, sizeof ctx->refusal - used, "%s%s: %s", used ? "; " : "", name,
             why);
}

/* Open one provider on every rank: local open, agreement, address exchange,
 * connect, agreement. Either every rank gets it or none does. */
static int prov_start(dchan_ctx_t *ctx, const struct dchan_provider_ops *ops, int forced,
                      struct dchan_prov **out)
{
    int n = ctx->nranks, rc, all_ok = 1;
    int64_t mine[2], *theirs = NULL;
    unsigned char *addrs = NULL, *pad;
    size_t maxlen = 0, noted = strlen(ctx->refusal);

    struct dchan_prov *p = calloc(1, sizeof *p);
    theirs = calloc((size_t)n, sizeof mine);
    if (!p || !theirs) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail; /* collective: still take part in the agreement below */
    }
    p->ops = ops;
    p->ctx = ctx;
    p->modes = ops->modes;
    p->forced = forced;
    rc = dchan_regcache_create(p);
    if (rc == DCHAN_SUCCESS)
        rc = ops->open(p);
    p->opened = rc == DCHAN_SUCCESS;
    if (!p->opened && p->desc[0])
        note_refusal(ctx, ops->name, p->desc);
    if (p->opened && ctx->detect != DCHAN_DETECT_AUTO &&
        !(p->modes & DCHAN_MODE_BIT(ctx->detect))) {
        char why[64];
        snprintf(why, sizeof why, "does not offer detection '%s' here",
                 dchan_enum_word(DCHAN_PT_DETECT, ctx->detect));
        note_refusal(ctx, ops->name, why);
        rc = DCHAN_ERR_UNSUPPORTED;
    }
fail:
    mine[0] = rc;
    mine[1] = rc == DCHAN_SUCCESS ? (int64_t)p->addr_len : 0;
    if (!theirs) {
        /* Cannot even take part: the others will see a failed bootstrap. */
        prov_free(p);
        return DCHAN_ERR_NO_MEMORY;
    }
    int brc = dchan_boot_allgather(&ctx->boot, mine, theirs, sizeof mine);
    if (brc != DCHAN_SUCCESS) {
        rc = brc;
        goto out;
    }
    for (int r = 0; r < n; r++) {
        if (theirs[2 * r] != DCHAN_SUCCESS) {
            if (all_ok && r != ctx->rank && rc == DCHAN_SUCCESS) {
                char why[64];
                snprintf(why, sizeof why, "refused on rank %d (%s)", r,
                         dchan_strerror((int)theirs[2 * r]));
                note_refusal(ctx, ops->name, why);
            }
            all_ok = 0;
            if (rc == DCHAN_SUCCESS)
                rc = (int)theirs[2 * r];
        }
        if ((size_t)theirs[2 * r + 1] > maxlen)
            maxlen = (size_t)theirs[2 * r + 1];
    }
    if (!all_ok)
        goto out;

    /* Addresses, padded to the longest. */
    addrs = calloc((size_t)n + 1, maxlen ? maxlen : 1);
    if (!addrs) {
        rc = DCHAN_ERR_NO_MEMORY; /* the others fail in connect's agreement */
        goto out;
    }
    pad = addrs + (size_t)n * maxlen;
    if (p->addr_len)
        memcpy(pad, p->addr, p->addr_len);
    rc = dchan_boot_allgather(&ctx->boot, pad, addrs, maxlen);
    if (rc == DCHAN_SUCCESS) {
        /* A connect that fails may say why in p->desc, as open does. */
        char desc[sizeof p->desc];
        memcpy(desc, p->desc, sizeof desc);
        rc = ops->connect(p, addrs, maxlen);
        if (rc != DCHAN_SUCCESS)
            note_refusal(ctx, ops->name,
                         strcmp(desc, p->desc) ? p->desc : dchan_strerror(rc));
    }
    p->connected = rc == DCHAN_SUCCESS;
    mine[0] = rc;
    mine[1] = 0;
    brc = dchan_boot_allgather(&ctx->boot, mine, theirs, sizeof mine);
    if (brc != DCHAN_SUCCESS)
        rc = brc;
    for (int r = 0; r < n && rc == DCHAN_SUCCESS; r++)
        if (theirs[2 * r] != DCHAN_SUCCESS) {
            rc = (int)theirs[2 * r];
            char why[64];
            snprintf(why, sizeof why, "could not connect on rank %d (%s)", r, dchan_strerror(rc));
            note_refusal(ctx, ops->name, why);
        }
out:
    free(addrs);
    free(theirs);
    if (rc != DCHAN_SUCCESS) {
        if (strlen(ctx->refusal) == noted)
            note_refusal(ctx, ops->name, dchan_strerror(rc)); /* no reason given */
        ctx->declined = p && p->declined;
        prov_free(p);
        return rc;
    }
    *out = p;
    return DCHAN_SUCCESS;
}

static int add_prov(dchan_ctx_t *ctx, struct dchan_prov *p)
{
    if (ctx->nprovs == DCHAN_MAX_PROVS)
        return DCHAN_ERR_NO_MEMORY;
    ctx->provs[ctx->nprovs++] = p;
    /* Every poll visits only providers that have something to poll. */
    if (p->ops->progress != dchan_prov_noop_progress)
        ctx->polled[ctx->npolled++] = p;
    return DCHAN_SUCCESS;
}

/* The kernel (boot id) and the namespaces in nsfiles, appended to buf. */
static size_t kernel_identity(char *buf, size_t n, size_t cap, const char *const *nsfiles,
                              size_t nns)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (cap - n > 64 && fgets(buf + n, 64, f))
            n += strlen(buf + n);
        fclose(f);
    }
    for (size_t i = 0; i < nns; i++) {
        struct stat st;
        if (stat(nsfiles[i], &st) == 0 && n + 2 * sizeof(uint64_t) <= cap) {
            uint64_t v[2] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino};
            memcpy(buf + n, v, sizeof v);
            n += sizeof v;
        }
    }
    return n;
}

/* This host's identity: ranks with the same value can map each other's
 * memory. The kernel (boot id) and the IPC and PID namespaces decide that,
 * not the name alone: two containers may share a hostname. */
static uint64_t host_identity(const dchan_ctx_t *ctx)
{
    static const char *const ns[] = {"/proc/self/ns/ipc", "/proc/self/ns/pid"};
    char buf[512];
    size_t n = 0;
    const char *forced = ctx->params.HOST;

    if (forced && *forced)
        return dchan_fnv1a64(forced, strlen(forced)) | 1;
    memset(buf, 0, sizeof buf);
    if (gethostname(buf, 255) == 0)
        n = strlen(buf);
    n = kernel_identity(buf, n, sizeof buf, ns, 2);
    return dchan_fnv1a64(buf, n) | 1;
}

/* Where a pid means the same process: one kernel, one PID namespace.
 * Unlike host_identity, DCHAN_HOST cannot force it (it may join ranks of
 * several kernels, whose pids must not be watched here). */
static uint64_t pid_space(void)
{
    static const char *const ns[] = {"/proc/self/ns/pid"};
    char buf[128] = {0};
    return dchan_fnv1a64(buf, kernel_identity(buf, 0, sizeof buf, ns, 1)) | 1;
}

int dchan_ctx_same_host(const dchan_ctx_t *ctx, int rank)
{
    return rank >= 0 && rank < ctx->nranks && ctx->host[rank] == ctx->host[ctx->rank];
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Host identities and pids of every rank; whether some host runs several
 * ranks and whether the ranks span several hosts (the same answer on every
 * rank). The pids of this host's ranks are watched for death. */
static int exchange_hosts(dchan_ctx_t *ctx, bool *shared, bool *multi)
{
    struct {
        uint64_t host, pid_space;
        int64_t pid;
    } mine = {host_identity(ctx), pid_space(), (int64_t)getpid()}, *all;
    int64_t *pids = calloc((size_t)ctx->nranks, sizeof *pids);
    ctx->host = calloc((size_t)ctx->nranks, sizeof *ctx->host);
    all = calloc((size_t)ctx->nranks, sizeof *all);
    uint64_t *sorted = calloc((size_t)ctx->nranks, sizeof *sorted);
    int rc = DCHAN_ERR_NO_MEMORY;
    if (ctx->host && sorted && all && pids)
        rc = dchan_boot_allgather(&ctx->boot, &mine, all, sizeof mine);
    *shared = *multi = false;
    if (rc == DCHAN_SUCCESS) {
        for (int r = 0; r < ctx->nranks; r++) {
            ctx->host[r] = all[r].host;
            /* 0: not a pid this process can watch */
            pids[r] = all[r].pid_space == mine.pid_space ? all[r].pid : 0;
        }
        rc = dchan_peers_watch_init(ctx, pids);
    }
    if (rc == DCHAN_SUCCESS) {
        memcpy(sorted, ctx->host, (size_t)ctx->nranks * sizeof *sorted);
        qsort(sorted, (size_t)ctx->nranks, sizeof *sorted, cmp_u64);
        for (int r = 1; r < ctx->nranks; r++) {
            if (sorted[r] == sorted[r - 1])
                *shared = true;
            else
                *multi = true;
        }
    }
    free(sorted);
    free(all);
    free(pids);
    return rc;
}

/* DESIGN §4: a named list is tried in order and serves every peer.
 * Otherwise each peer goes to the narrowest provider that serves it: self
 * for this rank, a host-scoped one (shm) for the others on this host, the
 * first network provider that works for the rest. */
static int select_providers(dchan_ctx_t *ctx, const char *list)
{
    const struct dchan_provider_ops *self_ops = dchan_provider_lookup("self");
    int rc = DCHAN_ERR_UNSUPPORTED;
    char word[32];
    bool shared, multi;

    rc = exchange_hosts(ctx, &shared, &multi);
    if (rc == DCHAN_SUCCESS) {
        ctx->route = calloc((size_t)ctx->nranks, sizeof *ctx->route);
        if (!ctx->route)
            rc = DCHAN_ERR_NO_MEMORY;
    }
    if (rc != DCHAN_SUCCESS)
        return rc;
    rc = DCHAN_ERR_UNSUPPORTED;

    if (list && *list) {
        for (const char *s = list; *s && !ctx->net;) {
            size_t n = strcspn(s, ",");
            memcpy(word, s, n);
            word[n] = '\0';
            s += n + (s[n] == ',');
            const struct dchan_provider_ops *ops = dchan_provider_lookup(word);
            if (!ops) {
                dchan_info(ctx, word, "not built into this library: skipped");
                continue;
            }
            if (ops->scope == DCHAN_SCOPE_SELF && ctx->nranks > 1) {
                dchan_info(ctx, word, "serves only a rank's own channels; %d ranks here",
                           ctx->nranks);
                rc = DCHAN_ERR_UNSUPPORTED;
                continue;
            }
            if (ops->scope == DCHAN_SCOPE_HOST && multi) {
                dchan_info(ctx, word, "serves only ranks on one host; these span several");
                rc = DCHAN_ERR_UNSUPPORTED;
                continue;
            }
            rc = prov_start(ctx, ops, 1, &ctx->net);
        }
        if (!ctx->net) {
            dchan_err(ctx, NULL, "none of the providers '%s' could be used (%s%s%s); see dchan_info",
                      list, dchan_strerror(rc), ctx->refusal[0] ? "; " : "", ctx->refusal);
            return rc;
        }
        ctx->self = ctx->net;
        for (int r = 0; r < ctx->nranks; r++)
            ctx->route[r] = ctx->net;
        snprintf(ctx->prov_name, sizeof ctx->prov_name, "%s", ctx->net->ops->name);
        dchan_info(ctx, ctx->net->ops->name, "chosen for every peer by DCHAN_PROVIDER=%s%s%s",
                   list, ctx->net->desc[0] ? ": " : "", ctx->net->desc);
        rc = add_prov(ctx, ctx->net);
        if (rc == DCHAN_SUCCESS)
            dchan_core_mem_init(ctx);
        return rc;
    }

    /* Ranks that share a host but cannot use its provider talk at network
     * speed: rank 0 says so (unless its own settings turned the provider
     * off), with why. */
    char host_why[sizeof ctx->refusal] = "";
    for (size_t i = 0; shared && i < dchan_num_providers && !ctx->local; i++) {
        if (dchan_providers[i]->scope != DCHAN_SCOPE_HOST)
            continue;
        rc = prov_start(ctx, dchan_providers[i], 0, &ctx->local);
        if (rc == DCHAN_SUCCESS && (rc = add_prov(ctx, ctx->local)) != DCHAN_SUCCESS)
            return rc;
        if (!ctx->local && !ctx->declined)
            snprintf(host_why, sizeof host_why, "%s", ctx->refusal);
    }
    if (multi || (ctx->nranks > 1 && !ctx->local)) {
        for (size_t i = 0; i < dchan_num_providers && !ctx->net; i++) {
            if (dchan_providers[i]->scope != DCHAN_SCOPE_NET)
                continue;
            rc = prov_start(ctx, dchan_providers[i], 0, &ctx->net);
        }
        if (!ctx->net) {
            dchan_err(ctx, NULL,
                      "no provider can reach the other ranks%s%s%s%s%s (see dchan_info)",
                      ctx->detect ? " with detection " : "",
                      ctx->detect ? dchan_enum_word(DCHAN_PT_DETECT, ctx->detect) : "",
                      ctx->refusal[0] ? " (" : "", ctx->refusal, ctx->refusal[0] ? ")" : "");
            return rc;
        }
        rc = add_prov(ctx, ctx->net);
        if (rc != DCHAN_SUCCESS)
            return rc;
    }
    rc = prov_start(ctx, self_ops, 0, &ctx->self);
    if (rc != DCHAN_SUCCESS) {
        dchan_err(ctx, "self", "cannot open: %s", dchan_strerror(rc));
        return rc;
    }
    rc = add_prov(ctx, ctx->self);
    if (rc != DCHAN_SUCCESS)
        return rc;
    for (int r = 0; r < ctx->nranks; r++)
        ctx->route[r] = r == ctx->rank                                 ? ctx->self
                        : ctx->local && dchan_ctx_same_host(ctx, r) ? ctx->local
                                                                       : ctx->net;
    if (ctx->local && ctx->net)
        snprintf(ctx->prov_name, sizeof ctx->prov_name, "%s+%s", ctx->local->ops->name,
                 ctx->net->ops->name);
    else
        snprintf(ctx->prov_name, sizeof ctx->prov_name, "%s",
                 (ctx->local ? ctx->local : ctx->net ? ctx->net : ctx->self)->ops->name);
    if (ctx->rank == 0 && host_why[0] && ctx->net)
        dchan_warn(ctx, NULL,
                   "ranks that share a host cannot use its provider (%s): %s serves them, "
                   "at network speed",
                   host_why, ctx->net->ops->name);
    if (ctx->rank == 0) {
        if (ctx->local)
            dchan_info(ctx, ctx->local->ops->name, "chosen for ranks on the same host%s%s",
                       ctx->local->desc[0] ? ": " : "", ctx->local->desc);
        if (ctx->net)
            dchan_info(ctx, ctx->net->ops->name, "chosen for ranks on other hosts%s%s",
                       ctx->net->desc[0] ? ": " : "", ctx->net->desc);
        dchan_info(ctx, "self", "chosen for a rank's own channels");
    }
    dchan_core_mem_init(ctx);
    return DCHAN_SUCCESS;
}

/* Provider progress while a barrier waits (no callbacks: they run at the
 * application's next dchan_progress). Non-zero stops the wait: a rank of
 * this host died while we waited, and the barrier has not completed in
 * DCHAN_DRAIN_TIMEOUT_MS since. Not at once: a rank that passed the
 * barrier may leave (finalize, exit) before this rank saw the barrier
 * complete, and its exit is no failure. */
static int poll_cb(void *arg)
{
    dchan_ctx_t *ctx = arg;
    dchan_core_poll_providers(ctx);
    if (!ctx->ndead)
        return 0;
    uint64_t now = dchan_now_ns();
    if (!ctx->barrier_death_ns)
        ctx->barrier_death_ns = now;
    return now - ctx->barrier_death_ns > ctx->params.DRAIN_TIMEOUT_MS * 1000000ull;
}

/* A barrier over the bootstrap, unless a peer is known dead: then nothing
 * collective can finish, and DCHAN_ERR_PEER says so at once. */
static int ctx_barrier(dchan_ctx_t *ctx)
{
    if (ctx->nwatch)
        dchan_peers_check_now(ctx); /* a death not seen yet */
    if (ctx->ndead)
        return DCHAN_ERR_PEER;
    ctx->barrier_death_ns = 0;
    return dchan_boot_barrier(&ctx->boot, poll_cb, ctx);
}

/* ---- init / finalize ------------------------------------------------------- */

static void ctx_free(dchan_ctx_t *ctx)
{
    /* Registrations go first, then the memory they covered (some of it the
     * providers' own), then the providers. */
    for (int i = ctx->nprovs - 1; i >= 0; i--)
        dchan_regcache_destroy(ctx->provs[i]);
    dchan_quarantine_flush(ctx, 0);
    dchan_seqpool_fini(&ctx->recv_seq);
    dchan_seqpool_fini(&ctx->send_seq);
    dchan_credit_ids_fini(ctx);
    dchan_core_mem_fini(ctx);
    for (int i = ctx->nprovs - 1; i >= 0; i--)
        prov_free(ctx->provs[i]);
    dchan_boot_fini(&ctx->boot);
    dchan_peers_watch_fini(ctx);
    dchan_wake_fini(ctx);
    free(ctx->route);
    free(ctx->host);
    free(ctx->htab);
    free(ctx->hgen);
    free(ctx->hfree);
    free(ctx->pq);
    if (ctx->locking)
        pthread_mutex_destroy(&ctx->lock);
    ctx->magic = 0;
    free(ctx);
}

DCHAN_API int dchan_init(const dchan_attr_t *uattr, dchan_ctx_t **out)
{
    static unsigned instances;
    dchan_attr_t attr;
    char err[256];
    int rc;

    if (!out)
        return DCHAN_ERR_INVALID_ARG;
    attr_defaults(&attr);
    if (uattr) {
        if (uattr->struct_size == 0 || uattr->struct_size > sizeof attr) {
            dchan_log_emit(NULL, DCHAN_LOG_ERROR, NULL,
                           "dchan_attr_t not set up by dchan_attr_init (struct_size %zu)",
                           uattr->struct_size);
            return DCHAN_ERR_INVALID_ARG;
        }
        memcpy(&attr, uattr, uattr->struct_size);
    } else {
        dchan_attr_init(&attr);
    }

    dchan_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return DCHAN_ERR_NO_MEMORY;
    ctx->rank = -1;
    ctx->wake_epfd = ctx->wake_efd = -1;
    ctx->log_level = attr.log_level >= DCHAN_LOG_NONE && attr.log_level <= DCHAN_LOG_DEBUG
                         ? attr.log_level
                         : DCHAN_LOG_WARN;
    ctx->instance = __atomic_fetch_add(&instances, 1, __ATOMIC_RELAXED);

    /* What this rank alone finds wrong (step 1) fails it, and, through the
     * first exchange, every other rank, instead of leaving them waiting in
     * the bootstrap: as long as the bootstrap itself can start here. */
    int local_rc = DCHAN_SUCCESS;
    rc = dchan_params_load(&ctx->params, err, sizeof err);
    if (rc != DCHAN_SUCCESS || attr.config_error) {
        dchan_err(ctx, NULL, "%s", rc != DCHAN_SUCCESS ? err : "malformed DCHAN_* variable");
        local_rc = DCHAN_ERR_INVALID_ARG;
    } else if (attr.detect < DCHAN_DETECT_AUTO || attr.detect > DCHAN_DETECT_EVENT ||
        attr.thread_level < DCHAN_THREAD_SINGLE || attr.thread_level > DCHAN_THREAD_MULTIPLE ||
        attr.bootstrap < DCHAN_BOOT_AUTO || attr.bootstrap > DCHAN_BOOT_SINGLETON ||
        attr.log_level < DCHAN_LOG_NONE || attr.log_level > DCHAN_LOG_DEBUG ||
        ctx->params.MAX_HANDLES == 0 || ctx->params.MAX_HANDLES > DCHAN_ID_INDEX_MASK ||
        ctx->params.CREDIT_WORDS == 0 || ctx->params.CREDIT_WORDS > 65536) {
        dchan_err(ctx, NULL,
                  "invalid attribute: detect %d, thread_level %d, bootstrap %d, log_level %d, "
                  "DCHAN_MAX_HANDLES %lu, DCHAN_CREDIT_WORDS %lu",
                  attr.detect, attr.thread_level, attr.bootstrap, attr.log_level,
                  ctx->params.MAX_HANDLES, ctx->params.CREDIT_WORDS);
        local_rc = DCHAN_ERR_INVALID_ARG;
    } else if (attr.provider && *attr.provider &&
               (rc = dchan_params_check_providers(attr.provider, err, sizeof err)) !=
                   DCHAN_SUCCESS) {
        dchan_err(ctx, NULL, "DCHAN_PROVIDER: %s", err);
        local_rc = rc;
    }
    if (local_rc != DCHAN_SUCCESS &&
        (attr.bootstrap < DCHAN_BOOT_AUTO || attr.bootstrap > DCHAN_BOOT_SINGLETON ||
         attr.thread_level < DCHAN_THREAD_SINGLE || attr.thread_level > DCHAN_THREAD_MULTIPLE)) {
        free(ctx); /* the bootstrap cannot start: the others wait */
        return local_rc;
    }
    ctx->detect = attr.detect;
    ctx->thread_level = attr.thread_level;
    ctx->error_fn = attr.error_fn;
    ctx->error_arg = attr.error_arg;
    ctx->locking = attr.thread_level == DCHAN_THREAD_MULTIPLE && local_rc == DCHAN_SUCCESS;
    if (ctx->locking && pthread_mutex_init(&ctx->lock, NULL) != 0) {
        free(ctx);
        return DCHAN_ERR_NO_MEMORY;
    }
    ctx->magic = DCHAN_CTX_MAGIC;

    rc = dchan_boot_init(&ctx->boot, &attr, ctx);
    if (rc != DCHAN_SUCCESS) {
        if (local_rc != DCHAN_SUCCESS)
            rc = local_rc;
        goto fail;
    }
    ctx->rank = ctx->boot.rank;
    ctx->nranks = ctx->boot.size;

    /* Job key from rank 0, and a check that every rank asked for the same
     * providers and detection, and keeps as many credit words per peer (a
     * receiver gives its channels word indices below its own count, in the
     * sender's area, which holds the sender's count). */
    {
        struct {
            uint64_t key, cfg, words, failed;
        } mine, *all = calloc((size_t)ctx->nranks, sizeof mine);
        if (!all) {
            rc = DCHAN_ERR_NO_MEMORY;
            goto fail;
        }
        mine.key = random_key();
        mine.cfg = dchan_fnv1a64(attr.provider ? attr.provider : "", attr.provider ? strlen(attr.provider) : 0) ^
                   (uint64_t)attr.detect;
        mine.words = ctx->params.CREDIT_WORDS;
        mine.failed = local_rc != DCHAN_SUCCESS;
        rc = dchan_boot_allgather(&ctx->boot, &mine, all, sizeof mine);
        ctx->epoch_state = mine.key; /* this rank's own random value */
        for (int r = 0; rc == DCHAN_SUCCESS && r < ctx->nranks; r++)
            if (all[r].failed) {
                /* That rank said why on its own stderr. */
                if (r != ctx->rank)
                    dchan_err(ctx, NULL, "rank %d could not start: its attributes or DCHAN_* "
                              "variables are invalid (see its error)", r);
                rc = local_rc != DCHAN_SUCCESS ? local_rc : DCHAN_ERR_INVALID_ARG;
            }
        if (rc == DCHAN_SUCCESS) {
            ctx->job_key = all[0].key;
            for (int r = 1; r < ctx->nranks; r++) {
                if (all[r].cfg != all[0].cfg) {
                    dchan_err(ctx, NULL,
                              "rank %d asked for another provider or detection mode than "
                              "rank 0; every rank must use the same DCHAN_PROVIDER and "
                              "DCHAN_DETECT",
                              r);
                    rc = DCHAN_ERR_INVALID_ARG;
                    break;
                }
                if (all[r].words != all[0].words) {
                    dchan_err(ctx, NULL,
                              "rank %d keeps DCHAN_CREDIT_WORDS=%llu credit words per peer, "
                              "rank 0 %llu; every rank must use the same",
                              r, (unsigned long long)all[r].words,
                              (unsigned long long)all[0].words);
                    rc = DCHAN_ERR_INVALID_ARG;
                    break;
                }
            }
        }
        free(all);
        if (rc != DCHAN_SUCCESS)
            goto fail;
    }
    dchan_info(ctx, NULL, "bootstrap %s, rank %d of %d", ctx->boot.ops->name, ctx->rank,
               ctx->nranks);

    rc = select_providers(ctx, attr.provider);
    if (rc != DCHAN_SUCCESS)
        goto fail;
    dchan_ctx_register(ctx);
    *out = ctx;
    return DCHAN_SUCCESS;

fail:
    ctx_free(ctx);
    return rc;
}

DCHAN_API int dchan_finalize(dchan_ctx_t *ctx)
{
    int rc = DCHAN_SUCCESS;

    if (!dchan_ctx_ok(ctx))
        return DCHAN_ERR_INVALID_ARG;
    if (dchan_in_callback(ctx))
        return DCHAN_ERR_STATE;
    dchan_ctx_unregister(ctx);
    dchan_ctx_lock(ctx);
    ctx->finalizing = true;
    while (ctx->all_head) {
        int hrc = dchan_handle_release(ctx->all_head);
        if (hrc != DCHAN_SUCCESS && rc == DCHAN_SUCCESS)
            rc = hrc;
    }
    /* Peers may still be completing puts into our memory: wait for all,
     * driving our providers meanwhile (a peer may wait on our progress).
     * With a peer dead, nobody can: release everything at once and say so. */
    int brc = ctx_barrier(ctx);
    if (brc == DCHAN_ERR_PEER)
        dchan_info(ctx, NULL, "a rank is gone: finalize does not wait for the others");
    if (brc != DCHAN_SUCCESS)
        rc = brc;
    dchan_ctx_unlock(ctx);
    ctx_free(ctx);
    return rc;
}

/* ---- queries ---------------------------------------------------------------- */

DCHAN_API int dchan_rank(const dchan_ctx_t *ctx)
{
    return dchan_ctx_ok(ctx) ? ctx->rank : DCHAN_ERR_INVALID_ARG;
}

DCHAN_API int dchan_nranks(const dchan_ctx_t *ctx)
{
    return dchan_ctx_ok(ctx) ? ctx->nranks : DCHAN_ERR_INVALID_ARG;
}

DCHAN_API const char *dchan_provider_name(const dchan_ctx_t *ctx)
{
    return dchan_ctx_ok(ctx) && ctx->prov_name[0] ? ctx->prov_name : NULL;
}

DCHAN_API int dchan_get_stats(const dchan_ctx_t *cctx, dchan_stats_t *stats)
{
    dchan_ctx_t *ctx = (dchan_ctx_t *)cctx; /* the lock is not part of the value */
    if (!dchan_ctx_ok(ctx) || !stats)
        return DCHAN_ERR_INVALID_ARG;
    dchan_ctx_lock(ctx);
    *stats = ctx->stats;
    dchan_ctx_unlock(ctx);
    return DCHAN_SUCCESS;
}

int dchan_ctx_rank(const dchan_ctx_t *ctx)
{
    return ctx->rank;
}

int dchan_ctx_nranks(const dchan_ctx_t *ctx)
{
    return ctx->nranks;
}

uint64_t dchan_ctx_job_key(const dchan_ctx_t *ctx)
{
    return ctx->job_key;
}

int dchan_ctx_thread_level(const dchan_ctx_t *ctx)
{
    return ctx->thread_level;
}

const void *dchan_ctx_boot_mpi_comm(const dchan_ctx_t *ctx)
{
    return ctx->boot.mpi_comm;
}

const struct dchan_params *dchan_ctx_params(const dchan_ctx_t *ctx)
{
    return &ctx->params;
}

/* ---- collectives for programs without their own means ------------------------ */

DCHAN_API int dchan_allgather(dchan_ctx_t *ctx, const void *in, void *out, size_t len)
{
    if (!dchan_ctx_ok(ctx) || !in || !out || len == 0)
        return DCHAN_ERR_INVALID_ARG;
    if (dchan_in_callback(ctx))
        return DCHAN_ERR_STATE;
    dchan_ctx_lock(ctx);
    int rc = dchan_boot_allgather(&ctx->boot, in, out, len);
    dchan_ctx_unlock(ctx);
    return rc;
}

DCHAN_API int dchan_barrier(dchan_ctx_t *ctx)
{
    if (!dchan_ctx_ok(ctx))
        return DCHAN_ERR_INVALID_ARG;
    if (dchan_in_callback(ctx))
        return DCHAN_ERR_STATE;
    dchan_ctx_lock(ctx);
    int rc = ctx_barrier(ctx);
    dchan_ctx_unlock(ctx);
    return rc;
}

/* ---- progress ----------------------------------------------------------------- */

/* Inline in progress, out of line for the rest. */
static inline __attribute__((always_inline)) int poll_providers(dchan_ctx_t *ctx)
{
    int rc = 0;
    dchan_peers_poll(ctx);
    for (int i = 0; i < ctx->npolled; i++) {
        int r = ctx->polled[i]->ops->progress(ctx->polled[i]);
        if (r < 0 && rc == 0)
            rc = r;
    }
    if (ctx->credq_head)
        dchan_credq_run(ctx);
    return rc;
}

int dchan_core_poll_providers(dchan_ctx_t *ctx)
{
    return poll_providers(ctx);
}

int dchan_core_drain_put(dchan_handle_t *h, uint64_t timeout_ms)
{
    dchan_ctx_t *ctx = h->ctx;
    uint64_t deadline = 0;
    unsigned spins = 0;

    while (h->inflight) {
        dchan_core_poll_providers(ctx);
        if (!h->inflight)
            break;
        if (ctx->ndead && ctx->dead[h->peer])
            return DCHAN_ERR_PEER; /* the receiver died: it never completes */
        if (++spins == 64)
            deadline = dchan_now_ns() + timeout_ms * 1000000ull;
        if (spins > 64) {
            if (dchan_now_ns() > deadline)
                return DCHAN_ERR_TIMEOUT;
            if (spins > (unsigned)ctx->params.SPIN)
                sched_yield();
        }
    }
    return h->error ? h->error : DCHAN_SUCCESS;
}

/* Run at most max callbacks and error reports, in the order they became
 * due; what is left stays queued, in order, for the next call. */
static inline __attribute__((always_inline)) int dispatch(dchan_ctx_t *ctx, int max)
{
    if (!ctx->fire_head && !ctx->errq_head)
        return 0; /* the common case of an idle poll */
    dchan_ctx_t *outer = tls_cb_ctx;
    dchan_handle_t *h;
    int n = 0;

    while (n < max && (h = dchan_fire_pop(ctx))) {
        dchan_arrival_fn fn = h->fn;
        void *arg = h->arg;
        if (h->role != DCHAN_ROLE_RECV) {
            /* One callback per completed put (dchan_set_completion), taken
             * version (a source's done_fn) or finished get (arrival_fn). */
            if (h->role == DCHAN_ROLE_SEND) {
                fn = h->cfn;
                arg = h->carg;
            }
            if (++h->n_cdone != h->n_done)
                dchan_fire_push(ctx, h);
        } else {
            h->n_fired++;
            if (h->depth == 1)
                h->in_pollq = false;
            else if (DCHAN_R_DUE(h))
                dchan_fire_push(ctx, h); /* one callback per slot, in turn with the others */
        }
        ctx->stats.callbacks++;
        n++;
        /* The handle is off every queue: the callback may ready, put or
         * destroy it, or any other handle. Nothing here touches h again. */
        tls_cb_ctx = ctx;
        dchan_ctx_unlock(ctx);
        fn(h, arg);
        dchan_ctx_lock(ctx);
        tls_cb_ctx = outer;
    }
    while (n < max && (h = ctx->errq_head)) {
        ctx->errq_head = h->errq_next;
        if (!ctx->errq_head)
            ctx->errq_tail = NULL;
        h->on_errq = false;
        /* An error ends a dchan_wait like an arrival: nobody waits forever
         * for a channel that broke. */
        n++;
        if (ctx->error_fn) {
            dchan_error_fn fn = ctx->error_fn;
            int rc = h->error;
            tls_cb_ctx = ctx;
            dchan_ctx_unlock(ctx);
            fn(h, rc, ctx->error_arg);
            dchan_ctx_lock(ctx);
            tls_cb_ctx = outer;
        }
    }
    return n;
}

static inline __attribute__((always_inline)) int progress(dchan_ctx_t *ctx, int max)
{
    if (!dchan_ctx_ok(ctx))
        return DCHAN_ERR_INVALID_ARG;
    if (dchan_in_callback(ctx))
        return DCHAN_ERR_STATE;
    dchan_ctx_lock(ctx);
    /* Awake again: senders stop signalling. */
    if (__builtin_expect(ctx->wake_armed, 0) &&
        (ctx->thread_level < DCHAN_THREAD_SERIALIZED ||
         pthread_equal(ctx->wake_thread, pthread_self())))
        dchan_wake_disarm(ctx);
    ctx->stats.progress_calls++;
    int rc = poll_providers(ctx);
    dchan_scan_pollq(ctx);
    if (ctx->look_head)
        dchan_credit_look(ctx);
    if (ctx->srcq_head)
        dchan_get_scan(ctx);
    int n = dispatch(ctx, max);
    dchan_ctx_unlock(ctx);
    return rc < 0 ? rc : n;
}

DCHAN_API int dchan_progress(dchan_ctx_t *ctx)
{
    return progress(ctx, INT_MAX);
}

DCHAN_API int dchan_progress_n(dchan_ctx_t *ctx, int max)
{
    if (max < 1)
        return DCHAN_ERR_INVALID_ARG;
    return progress(ctx, max);
}

DCHAN_API int dchan_wait(dchan_ctx_t *ctx, int timeout_ms)
{
    uint64_t deadline = 0;
    unsigned long empty = 0;

    if (!dchan_ctx_ok(ctx) || timeout_ms < -1)
        return DCHAN_ERR_INVALID_ARG;
    if (dchan_in_callback(ctx))
        return DCHAN_ERR_STATE;
    if (timeout_ms >= 0)
        deadline = dchan_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int n = dchan_progress(ctx);
        if (n != 0)
            return n;
        if (timeout_ms >= 0 && dchan_now_ns() >= deadline)
            return DCHAN_ERR_TIMEOUT;
        /* Spin briefly for latency, then give the core away: with more
         * ranks than cores the peer we wait for needs it. */
        if (++empty > ctx->params.SPIN)
            sched_yield();
    }
}
