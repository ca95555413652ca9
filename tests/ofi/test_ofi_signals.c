/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Loading dchan, and opening its ofi provider, leave a program's signals as
 * they were. Debian's libfabric loads PSM's libinfinipath, whose
 * constructor takes SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT (a
 * backtrace, then exit()). libdchan does not link libfabric: the provider
 * loads it at first use and puts back every disposition the load changed
 * (providers/ofi/ofi_dl.c).
 *
 * The test first execs itself with the six at their defaults except SIGINT,
 * ignored (as a background job of a non-interactive shell starts), and
 * IPATH_NO_BACKTRACE unset (as outside mpirun), so that what it inherited
 * from make cannot decide the outcome. The child then checks:
 *  - libfabric is not loaded before dchan_init: linking dchan loads nothing
 *    of it;
 *  - with its own SIGTERM handler installed, dchan_init on ofi (singleton)
 *    works and has loaded libfabric, and each of the six is exactly as
 *    before: SIGINT still ignored, SIGTERM still its handler, the others
 *    as inherited (the default, or a sanitizer's in the sanitizer builds);
 *  - raising SIGINT does nothing, raising SIGTERM runs its handler, and
 *    SIGABRT raised in a forked process ends it by that signal.
 * Whether libinfinipath came with libfabric is printed: where it does (as
 * on Debian), its constructor ran at the load and took the six.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dchan.h"

static const int sigs[] = {SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL, SIGABRT};
#define NSIGS (sizeof sigs / sizeof sigs[0])

static volatile sig_atomic_t terms;

static void on_term(int sig)
{
    (void)sig;
    terms++;
}

struct seen {
    const char *what;
    int found;
};

static int seen_lib(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct seen *s = arg;
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, s->what))
        s->found = 1;
    return 0;
}

static int loaded(const char *lib)
{
    struct seen s = {lib, 0};
    dl_iterate_phdr(seen_lib, &s);
    return s.found;
}

static const char *owner(const struct sigaction *sa)
{
    Dl_info where;
    void *fn = sa->sa_flags & SA_SIGINFO ? (void *)sa->sa_sigaction : (void *)sa->sa_handler;
    if (sa->sa_handler == SIG_DFL)
        return "the default";
    if (sa->sa_handler == SIG_IGN)
        return "ignored";
    if (sa->sa_handler == on_term)
        return "the program's handler";
    return dladdr(fn, &where) && where.dli_fname ? where.dli_fname : "an unknown handler";
}

/* A forked process raises sig: it must end by it. */
static int ends_by(int sig)
{
    pid_t pid = fork();
    if (pid < 0) {
        perror("test_ofi_signals: fork");
        return 0;
    }
    if (pid == 0) {
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none); /* SIGABRT's default dumps core */
        raise(sig);
        _exit(0); /* not reached when sig ends the process */
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) {
        perror("test_ofi_signals: waitpid");
        return 0;
    }
    if (WIFSIGNALED(st) && WTERMSIG(st) == sig)
        return 1;
    if (WIFEXITED(st))
        fprintf(stderr, "test_ofi_signals: raise(%s) ended the process with exit status %d\n",
                strsignal(sig), WEXITSTATUS(st));
    else
        fprintf(stderr, "test_ofi_signals: raise(%s) ended the process by signal %d\n",
                strsignal(sig), WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--child") != 0) {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        for (size_t i = 0; i < NSIGS; i++) {
            dfl.sa_handler = sigs[i] == SIGINT ? SIG_IGN : SIG_DFL;
            sigaction(sigs[i], &dfl, NULL);
        }
        unsetenv("IPATH_NO_BACKTRACE");
        char *args[] = {argv[0], "--child", NULL};
        execv("/proc/self/exe", args);
        perror("test_ofi_signals: execv /proc/self/exe");
        return 99;
    }

    int bad = 0;
    struct sigaction before[NSIGS], sa;
    if (loaded("libfabric.so")) {
        fprintf(stderr, "test_ofi_signals: libfabric is loaded before dchan_init\n");
        bad++;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0) {
        perror("test_ofi_signals: sigaction");
        return 99;
    }
    for (size_t i = 0; i < NSIGS; i++)
        if (sigaction(sigs[i], NULL, &before[i]) != 0) {
            perror("test_ofi_signals: sigaction");
            return 99;
        }
    if (before[0].sa_handler != SIG_IGN) {
        fprintf(stderr, "test_ofi_signals: SIGINT is not ignored after the exec: %s\n",
                owner(&before[0]));
        return 99;
    }

    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    dchan_attr_init(&a);
    a.provider = "ofi";
    a.bootstrap = DCHAN_BOOT_SINGLETON;
    int rc = dchan_init(&a, &ctx);
    if (rc != DCHAN_SUCCESS) {
        fprintf(stderr, "test_ofi_signals: dchan_init on ofi: %s\n", dchan_strerror(rc));
        return 1;
    }
    int fabric = loaded("libfabric.so"), ipath = loaded("libinfinipath.so");
    if (!fabric) {
        fprintf(stderr, "test_ofi_signals: dchan_init on ofi did not load libfabric\n");
        bad++;
    }
    for (size_t i = 0; i < NSIGS; i++) {
        if (sigaction(sigs[i], NULL, &sa) != 0) {
            perror("test_ofi_signals: sigaction");
            bad++;
            continue;
        }
        /* Flags matter to a handler only. */
        if (sa.sa_handler != before[i].sa_handler ||
            (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN &&
             sa.sa_flags != before[i].sa_flags)) {
            fprintf(stderr, "test_ofi_signals: %s was %s and is now %s\n", strsignal(sigs[i]),
                    owner(&before[i]), owner(&sa));
            bad++;
        }
    }
    raise(SIGINT); /* ignored: nothing happens */
    raise(SIGTERM);
    if (terms != 1) {
        fprintf(stderr, "test_ofi_signals: SIGTERM ran the program's handler %d times\n",
                (int)terms);
        bad++;
    }
    if (before[NSIGS - 1].sa_handler == SIG_DFL && !ends_by(SIGABRT))
        bad++;
    rc = dchan_finalize(ctx);
    if (rc != DCHAN_SUCCESS) {
        fprintf(stderr, "test_ofi_signals: dchan_finalize: %s\n", dchan_strerror(rc));
        bad++;
    }
    printf("%s test_ofi_signals: libfabric loaded at dchan_init, not before; libinfinipath %s; "
           "SIGINT still ignored, SIGTERM still the program's, the other four as they were\n",
           bad ? "FAIL" : "ok  ", ipath ? "came with it" : "did not come with it");
    return bad ? 1 : 0;
}
