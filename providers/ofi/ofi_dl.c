/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libfabric is loaded when the ofi provider is first probed or opened, not
 * when a program linked with dchan starts.
 *
 * Why: Debian's libfabric links PSM's libinfinipath, whose constructor
 * takes SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT in every
 * process that loads it (unless IPATH_NO_BACKTRACE is set, as mpirun sets
 * it for its ranks): its handler prints a backtrace and calls exit(). As a
 * dependency of libdchan it ran before main, and nothing could tell what it
 * had replaced: an inherited ignore of SIGINT was lost, a crash gave an exit
 * status instead of a core. Here every disposition is read before the load
 * and put back after it where the load changed it, so a program keeps its
 * ignores and the handlers it installed. Programs that never use ofi no
 * longer load libfabric and its dozen dependencies at all.
 *
 * dchan calls six libfabric functions directly. They are versioned symbols
 * (fi_getinfo@FABRIC_1.3): dlvsym asks for the versions that a program
 * linked against this build's headers gets (configure reads them,
 * DCHAN_OFI_V_*), so a newer libfabric at run time gives the ABI of those
 * headers, as the dynamic linker would.
 *
 * A thread that changes a disposition while another loads libfabric here
 * may see its change undone; dchan loads it once per process.
 */
#define _GNU_SOURCE /* dlvsym */
#include "config.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "ofi.h"

struct dchan_ofi_fns dchan_ofi_fn;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc = -1;
static char load_why[192];
static char restored[128]; /* the signals put back, for the first context's log */
static int restored_told;

/* Flags and mask matter only to a handler (the C library adds a flag of
 * its own to whatever it installs). */
static int same_disposition(const struct sigaction *a, const struct sigaction *b)
{
    if (a->sa_handler != b->sa_handler)
        return 0;
    return a->sa_handler == SIG_DFL || a->sa_handler == SIG_IGN ||
           (a->sa_flags == b->sa_flags && memcmp(&a->sa_mask, &b->sa_mask, sizeof a->sa_mask) == 0);
}

static void *fn(void *lib, const char *name, const char *version)
{
    void *f = version[0] ? dlvsym(lib, name, version) : dlsym(lib, name);
    if (!f && !load_why[0])
        snprintf(load_why, sizeof load_why, "%s has no %s%s%s", DCHAN_OFI_SONAME, name,
                 version[0] ? "@" : "", version);
    return f;
}

static void load(void)
{
    static struct sigaction before[NSIG];
    static unsigned char known[NSIG];
    void *lib;

    for (int s = 1; s < NSIG; s++)
        known[s] = sigaction(s, NULL, &before[s]) == 0;
    lib = dlopen(DCHAN_OFI_SONAME, RTLD_NOW | RTLD_LOCAL);
    for (int s = 1; s < NSIG; s++) {
        struct sigaction now;
        if (!known[s] || sigaction(s, NULL, &now) != 0 || same_disposition(&before[s], &now))
            continue;
        sigaction(s, &before[s], NULL);
        size_t n = strlen(restored);
        const char *abbrev = sigabbrev_np(s);
        if (abbrev)
            snprintf(restored + n, sizeof restored - n, "%sSIG%s", n ? ", " : "", abbrev);
        else
            snprintf(restored + n, sizeof restored - n, "%ssignal %d", n ? ", " : "", s);
    }
    if (!lib) {
        const char *e = dlerror();
        snprintf(load_why, sizeof load_why, "cannot load %s: %s", DCHAN_OFI_SONAME,
                 e ? e : "unknown error");
        return;
    }
    /* libfabric stays loaded: it is not written to be unloaded. */
    dchan_ofi_fn.getinfo = fn(lib, "fi_getinfo", DCHAN_OFI_V_FI_GETINFO);
    dchan_ofi_fn.freeinfo = fn(lib, "fi_freeinfo", DCHAN_OFI_V_FI_FREEINFO);
    dchan_ofi_fn.dupinfo = fn(lib, "fi_dupinfo", DCHAN_OFI_V_FI_DUPINFO);
    dchan_ofi_fn.fabric = fn(lib, "fi_fabric", DCHAN_OFI_V_FI_FABRIC);
    dchan_ofi_fn.strerror = fn(lib, "fi_strerror", DCHAN_OFI_V_FI_STRERROR);
    dchan_ofi_fn.version = fn(lib, "fi_version", DCHAN_OFI_V_FI_VERSION);
    if (!load_why[0])
        load_rc = 0;
}

int dchan_ofi_load(const dchan_ctx_t *ctx, const char **why)
{
    pthread_once(&load_once, load);
    if (ctx && restored[0] && !__atomic_exchange_n(&restored_told, 1, __ATOMIC_RELAXED))
        dchan_info(ctx, OFI_NAME, "loading %s changed the handling of %s: put back",
                   DCHAN_OFI_SONAME, restored);
    if (load_rc != 0 && why)
        *why = load_why;
    return load_rc;
}

const char *dchan_ofi_strerror(int fi_err)
{
    /* A libfabric error comes from a loaded libfabric: the else is for
     * safety only. */
    return load_rc == 0 ? dchan_ofi_fn.strerror(fi_err) : "(libfabric is not loaded)";
}
