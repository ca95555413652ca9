/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A libfabric that cannot serve dchan: the ofi provider loads libfabric at
 * first use (providers/ofi/ofi_dl.c), so a program linked with dchan starts
 * where libfabric is missing or is not the one dchan was built for; the
 * ofi provider is then not usable, says why, and the others work.
 *
 * The test execs itself with a stub libfabric.so.1 that has none of
 * libfabric's functions (tests/ofi/nofabric.c) first in LD_LIBRARY_PATH,
 * and checks that:
 *  - the stub is what the load found (it is loaded after dchan_init tried
 *    ofi, not before);
 *  - dchan_init asked for ofi alone fails with DCHAN_ERR_UNSUPPORTED, and
 *    again the same way (nothing is left half loaded), and its error line
 *    (at the default log level) says why: a symbol the stub lacks;
 *  - dchan_init with the automatic choice works, and a channel of the
 *    process to itself delivers a message, checked byte by byte.
 * NOFABRIC_DIR, set by the build, is where the stub is.
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dchan.h"

#define SIZE 1000

static int arrivals;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    (void)h;
    (void)arg;
    arrivals++;
}

static int stub_seen(struct dl_phdr_info *info, size_t size, void *arg)
{
    const char *dir = *(const char **)arg;
    (void)size;
    if (info->dlpi_name && strncmp(info->dlpi_name, dir, strlen(dir)) == 0 &&
        strstr(info->dlpi_name, "libfabric.so"))
        *(const char **)arg = NULL;
    return 0;
}

static int stub_loaded(const char *dir)
{
    const char *d = dir;
    dl_iterate_phdr(stub_seen, &d);
    return d == NULL;
}

static int fails(const char *fmt, const char *what)
{
    fprintf(stderr, "test_ofi_unloadable: FAIL: ");
    fprintf(stderr, fmt, what);
    fputc('\n', stderr);
    return 1;
}

static int init(const char *provider, dchan_ctx_t **ctx)
{
    dchan_attr_t a;
    dchan_attr_init(&a);
    a.provider = provider;
    a.bootstrap = DCHAN_BOOT_SINGLETON;
    return dchan_init(&a, ctx);
}

int main(int argc, char **argv)
{
    const char *dir = NOFABRIC_DIR;
    if (argc < 2 || strcmp(argv[1], "--child") != 0) {
        const char *old = getenv("LD_LIBRARY_PATH");
        char *path = malloc(strlen(dir) + (old ? strlen(old) : 0) + 2);
        if (!path)
            return 99;
        sprintf(path, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
        setenv("LD_LIBRARY_PATH", path, 1);
        char *args[] = {argv[0], "--child", NULL};
        execv("/proc/self/exe", args);
        perror("test_ofi_unloadable: execv /proc/self/exe");
        return 99;
    }

    if (stub_loaded(dir))
        return fails("%s: the stub libfabric is loaded before dchan_init", dir);
    dchan_ctx_t *ctx = NULL;
    for (int round = 0; round < 2; round++) {
        /* What dchan_init logs goes to a file, then to our stderr. */
        FILE *log = tmpfile();
        int saved = dup(2);
        char text[2048] = "";
        if (!log || saved < 0 || dup2(fileno(log), 2) < 0)
            return fails("%s", "cannot capture stderr");
        int rc = init("ofi", &ctx);
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        rewind(log);
        size_t n = fread(text, 1, sizeof text - 1, log);
        text[n] = '\0';
        fclose(log);
        fputs(text, stderr);
        if (rc != DCHAN_ERR_UNSUPPORTED)
            return fails("dchan_init on ofi with the stub libfabric: %s, not DCHAN_ERR_UNSUPPORTED",
                         dchan_strerror(rc));
        if (!strstr(text, "error: none of the providers 'ofi' could be used") ||
            !strstr(text, "ofi: libfabric.so.1 has no fi_"))
            return fails("%s", "dchan_init's error does not say why ofi could not open");
    }
    if (!stub_loaded(dir))
        return fails("%s: dchan_init on ofi did not load the stub libfabric.so.1", dir);

    int rc = init(NULL, &ctx);
    if (rc != DCHAN_SUCCESS)
        return fails("dchan_init, automatic choice: %s", dchan_strerror(rc));
    static unsigned char src[SIZE], dst[SIZE];
    for (int i = 0; i < SIZE; i++)
        src[i] = (unsigned char)(i * 13 + 5);
    dchan_handle_t *rh = NULL, *sh = NULL;
    dchan_wire_t w;
    if ((rc = dchan_create_handle(ctx, 0, dst, SIZE, 0, on_arrival, NULL, &rh)) != DCHAN_SUCCESS ||
        (rc = dchan_handle_export(rh, &w)) != DCHAN_SUCCESS ||
        (rc = dchan_assoc_local(ctx, &w, src, SIZE, &sh)) != DCHAN_SUCCESS ||
        (rc = dchan_put(sh)) != DCHAN_SUCCESS)
        return fails("a channel to ourselves: %s", dchan_strerror(rc));
    for (long spins = 0; arrivals == 0; spins++) {
        if ((rc = dchan_progress(ctx)) < 0)
            return fails("dchan_progress: %s", dchan_strerror(rc));
        if (spins > 100000000L)
            return fails("%s", "the message to ourselves never arrived");
    }
    if (arrivals != 1 || memcmp(src, dst, SIZE) != 0)
        return fails("%s", "the message to ourselves arrived wrong");
    printf("ok   test_ofi_unloadable: ofi refused with the stub libfabric (twice), the "
           "automatic choice (%s) delivered %d bytes\n", dchan_handle_provider(sh), SIZE);
    dchan_handle_destroy(sh);
    dchan_handle_destroy(rh);
    rc = dchan_finalize(ctx);
    if (rc != DCHAN_SUCCESS)
        return fails("dchan_finalize: %s", dchan_strerror(rc));
    return 0;
}
