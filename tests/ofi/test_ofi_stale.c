/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A process that inherits the id of one that died with a libfabric shm
 * endpoint open. shm (1.17) names an endpoint's region "<pid>:<uid>:<n>"
 * in /dev/shm, n counting the process's endpoints, and refuses a leftover
 * region whose recorded owner is alive: fi_enable fails with EBUSY, and
 * the leftover is removed. Under a process id that was reused, the owner
 * the leftover names is alive: it is us. The ofi provider then has to try
 * again; before it did, that rank silently opened its endpoint without
 * FI_READ and had no get (a distcheck failure of ofi-get-split, one run
 * in about twenty on a machine with many leftovers).
 *
 * The leftover is made real: a helper process opens dchan over ofi shm,
 * its region is copied under this process's first endpoint name while the
 * helper (the owner it records) is still alive, and this process then
 * opens dchan and gets a buffer from itself over ofi. Exit 0 when the get
 * returns the buffer intact, 1 on any failure, 77 where libfabric has no
 * shm provider or names its regions otherwise (libfabric 1.17, Debian 12's,
 * does as above).
 */
#include "config.h"

#include <dchan.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIZE 4096

static void __attribute__((noreturn, format(printf, 1, 2))) die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "test_ofi_stale: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int open_ctx(dchan_ctx_t **ctx)
{
    dchan_attr_t a;
    dchan_attr_init(&a);
    a.provider = "ofi";
    a.bootstrap = DCHAN_BOOT_SINGLETON;
    a.detect = DCHAN_DETECT_EVENT;
    return dchan_init(&a, ctx);
}

/* The helper: opens dchan, says so on 'up', waits for 'go' to close. */
static void helper(int up, int go)
{
    dchan_ctx_t *ctx;
    int rc = open_ctx(&ctx);
    char c = rc == DCHAN_SUCCESS ? 'y' : rc == DCHAN_ERR_UNSUPPORTED ? 'u' : 'n';
    if (write(up, &c, 1) != 1)
        _exit(1);
    while (read(go, &c, 1) > 0)
        ;
    _exit(rc == DCHAN_SUCCESS && dchan_finalize(ctx) == DCHAN_SUCCESS ? 0 : 1);
}

/* /dev/shm/<pid>:<rest> of the helper's endpoint; rest copied out. */
static int find_region(pid_t pid, char *rest, size_t len)
{
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "%d:", (int)pid), found = 0;
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    for (struct dirent *e; !found && (e = readdir(d));)
        if (strncmp(e->d_name, prefix, (size_t)n) == 0 && strlen(e->d_name + n) < len) {
            strcpy(rest, e->d_name + n);
            found = 1;
        }
    closedir(d);
    return found;
}

static void copy_file(const char *from, const char *to)
{
    static char buf[1 << 16];
    int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ssize_t n;
    if (in < 0 || out < 0)
        die("copying %s to %s: %s", from, to, strerror(errno));
    while ((n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            die("writing %s: %s", to, strerror(errno));
    if (n < 0)
        die("reading %s: %s", from, strerror(errno));
    close(in);
    close(out);
}

static int arrived;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    (void)h;
    (void)arg;
    arrived++;
}

static void on_taken(dchan_handle_t *h, void *arg)
{
    (void)h;
    (void)arg;
}

int main(void)
{
    int up[2], go[2];
    char c, rest[64], from[128], to[128];
    const char *fip = getenv("FI_PROVIDER");

    /* shm alone: the leftover is its region (set before libfabric starts). */
    if (fip && strcmp(fip, "shm") != 0) {
        fprintf(stderr, "test_ofi_stale: FI_PROVIDER=%s set; this test is about shm\n", fip);
        return 77;
    }
    setenv("FI_PROVIDER", "shm", 1);
    if (pipe(up) || pipe(go))
        die("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(up[0]);
        close(go[1]);
        helper(up[1], go[0]);
    }
    close(up[1]);
    close(go[0]);
    if (read(up[0], &c, 1) != 1 || c == 'n')
        die("the helper could not open dchan over ofi shm");
    if (c == 'u') {
        fprintf(stderr, "test_ofi_stale: libfabric offers no shm provider here\n");
        return 77;
    }
    if (!find_region(pid, rest, sizeof rest)) {
        /* Another libfabric names its regions otherwise: no such clash. */
        fprintf(stderr, "test_ofi_stale: this libfabric's shm keeps no /dev/shm/<pid>:... "
                        "region (helper pid %d): nothing to test\n", (int)pid);
        close(go[1]);
        waitpid(pid, NULL, 0);
        return 77;
    }
    /* Our first endpoint's name: the helper's with our pid and index 0. */
    char *idx = strrchr(rest, ':');
    if (!idx)
        die("unexpected shm region name %d:%s", (int)pid, rest);
    snprintf(from, sizeof from, "/dev/shm/%d:%s", (int)pid, rest);
    snprintf(to, sizeof to, "/dev/shm/%d:%.*s0", (int)getpid(), (int)(idx - rest + 1), rest);
    unlink(to); /* a leftover of our own pid already: ours to replace */
    copy_file(from, to);

    dchan_ctx_t *ctx;
    int rc = open_ctx(&ctx);
    if (rc != DCHAN_SUCCESS)
        die("dchan_init over ofi shm beside a leftover region: %s", dchan_strerror(rc));

    /* A get from ourselves over ofi: fi_read, which the endpoint has only
     * if its first open (with FI_READ) was not given up. */
    static unsigned char src[SIZE], dst[SIZE];
    for (int i = 0; i < SIZE; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    dchan_handle_t *s = NULL, *g = NULL;
    dchan_wire_t w;
    rc = dchan_create_source(ctx, 0, src, SIZE, on_taken, NULL, &s);
    if (rc != DCHAN_SUCCESS)
        die("dchan_create_source: %s (the endpoint lost FI_READ to the leftover)",
            dchan_strerror(rc));
    if ((rc = dchan_handle_export(s, &w)) != DCHAN_SUCCESS ||
        (rc = dchan_assoc_remote(ctx, &w, dst, SIZE, on_arrival, NULL, &g)) != DCHAN_SUCCESS)
        die("export or assoc_remote of the source: %s", dchan_strerror(rc));
    time_t start = time(NULL);
    while ((rc = dchan_get(g)) == DCHAN_ERR_AGAIN) {
        dchan_progress(ctx);
        if (time(NULL) - start > 120)
            die("dchan_get: refused for 120 s");
    }
    if (rc != DCHAN_SUCCESS)
        die("dchan_get: %s", dchan_strerror(rc));
    while (!arrived) {
        if ((rc = dchan_progress(ctx)) < 0)
            die("dchan_progress: %s", dchan_strerror(rc));
        if (time(NULL) - start > 120)
            die("the get did not arrive in 120 s");
    }
    if (memcmp(src, dst, SIZE) != 0)
        die("the get returned other bytes than the source's");
    if ((rc = dchan_handle_destroy(g)) != DCHAN_SUCCESS ||
        (rc = dchan_handle_destroy(s)) != DCHAN_SUCCESS || (rc = dchan_finalize(ctx)) != DCHAN_SUCCESS)
        die("teardown: %s", dchan_strerror(rc));
    close(go[1]);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        die("the helper did not close cleanly");
    /* Nothing of ours is left in /dev/shm. */
    if (find_region(getpid(), rest, sizeof rest))
        die("/dev/shm/%d:%s left behind", (int)getpid(), rest);
    printf("test_ofi_stale: a leftover region under our name; get over ofi shm intact\n");
    return 0;
}
