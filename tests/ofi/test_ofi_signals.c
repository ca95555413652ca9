/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Linking dchan leaves a program's signals as they were: Debian's libfabric
 * loads PSM's libinfinipath, whose constructor takes SIGINT, SIGTERM,
 * SIGSEGV, SIGBUS, SIGILL and SIGABRT (a backtrace, then exit()), and the
 * ofi provider hands the defaults back (providers/ofi/ofi_init.c).
 *
 * The test first execs itself with the six at their defaults and
 * IPATH_NO_BACKTRACE unset (as a program started outside mpirun has them),
 * so that what it inherited from make cannot decide the outcome. The
 * child then checks that none of the six is libinfinipath's handler (or
 * ignored: the defaults went in), and that SIGTERM and SIGABRT raised in a
 * forked process end it by that signal, not by an exit status. A handler
 * from elsewhere is a sanitizer's (the sanitizer builds run this test too)
 * and is let be. Where libinfinipath is not loaded the checks hold
 * trivially; the output says which case ran.
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

static int seen_infinipath(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libinfinipath.so"))
        *(int *)arg = 1;
    return 0;
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
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            sigaction(sigs[i], &dfl, NULL);
        unsetenv("IPATH_NO_BACKTRACE");
        char *args[] = {argv[0], "--child", NULL};
        execv("/proc/self/exe", args);
        perror("test_ofi_signals: execv /proc/self/exe");
        return 99;
    }

    int loaded = 0, bad = 0;
    dl_iterate_phdr(seen_infinipath, &loaded);
    /* Something of the library, so that it is surely linked and loaded. */
    if (strcmp(dchan_strerror(DCHAN_SUCCESS), "") == 0) {
        fprintf(stderr, "test_ofi_signals: dchan_strerror gave an empty string\n");
        bad++;
    }
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        Dl_info where;
        if (sigaction(sigs[i], NULL, &sa) != 0) {
            perror("test_ofi_signals: sigaction");
            bad++;
            continue;
        }
        if (sa.sa_handler == SIG_DFL)
            continue;
        void *fn = sa.sa_flags & SA_SIGINFO ? (void *)sa.sa_sigaction : (void *)sa.sa_handler;
        const char *owner = sa.sa_handler == SIG_IGN ? "ignored"
                            : dladdr(fn, &where) && where.dli_fname ? where.dli_fname
                                                                    : "an unknown handler";
        if (sa.sa_handler == SIG_IGN || strstr(owner, "libinfinipath.so")) {
            fprintf(stderr, "test_ofi_signals: %s is not at its default: %s\n",
                    strsignal(sigs[i]), owner);
            bad++;
        } else {
            fprintf(stderr, "test_ofi_signals: %s is taken by %s (a sanitizer's), let be\n",
                    strsignal(sigs[i]), owner);
        }
    }
    if (!ends_by(SIGTERM))
        bad++;
    if (!ends_by(SIGABRT))
        bad++;
    printf("%s test_ofi_signals: libinfinipath %s; none of SIGINT, SIGTERM, SIGSEGV, SIGBUS, "
           "SIGILL and SIGABRT is its, SIGTERM and SIGABRT end a process by the signal\n",
           bad ? "FAIL" : "ok  ", loaded ? "loaded" : "not loaded (nothing to undo)");
    return bad ? 1 : 0;
}
