/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the exchange scenarios cannot show about shm:
 *
 *   --test jobs   two jobs on one host (MPI_COMM_WORLD split in halves, a
 *                 context each). After dchan_init no process holds a
 *                 descriptor of any segment, so nothing can open one; each
 *                 process maps only its own job's segments (their names carry
 *                 the job key); a wire of the other job is refused; and both
 *                 jobs still exchange correctly afterwards.
 *   --test alloc  dchan_alloc / dchan_free: alignment, placement in the
 *                 shared segment (the wire names it as the place peers
 *                 store into), every misuse refused with its code and
 *                 nothing lost, exhaustion and reuse of the whole segment.
 */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <getopt.h>
#include <mpi.h>

#define OOB 0x6f6f62736d68735full
#include "mptest.h"

static long arrived;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    arrived++;
}

static void wait_one(dchan_ctx_t *ctx)
{
    int rc = dchan_wait(ctx, 10000);
    if (rc < 0)
        die("dchan_wait: %s", dchan_strerror(rc));
}

/* Does this process hold a descriptor of any dchan segment? */
static int holds_segment_fd(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], target[300];
    int found = 0;
    if (!d)
        die("cannot list /proc/self/fd");
    while ((e = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n > 0) {
            target[n] = '\0';
            if (strstr(target, "memfd:dchan-"))
                found = 1;
        }
    }
    closedir(d);
    return found;
}

/* Count this process's mappings of dchan segments with and without key. */
static void count_mappings(uint64_t key, int *mine, int *other)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512], want[64];
    if (!f)
        die("cannot read /proc/self/maps");
    snprintf(want, sizeof want, "memfd:dchan-%016llx-", (unsigned long long)key);
    *mine = *other = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "memfd:dchan-"))
            continue;
        if (strstr(line, want))
            ++*mine;
        else
            ++*other;
    }
    fclose(f);
}

/* One put each way between the two ranks of a job, verified. */
static void exchange(dchan_ctx_t *ctx, int jme, int peer, long iter)
{
    const size_t size = 4096;
    unsigned char *rbuf, *sbuf;
    dchan_handle_t *rh, *sh;
    dchan_wire_t w, theirs[2];

    CHECK(dchan_alloc(ctx, size, (void **)&rbuf));
    CHECK(dchan_alloc(ctx, size, (void **)&sbuf));
    memset(rbuf, 0, size);
    CHECK(dchan_create_handle(ctx, peer, rbuf, size, OOB, on_arrival, NULL, &rh));
    CHECK(dchan_handle_export(rh, &w));
    CHECK(dchan_allgather(ctx, &w, theirs, sizeof w));
    CHECK(dchan_assoc_local(ctx, &theirs[peer], sbuf, size, &sh));
    if (strcmp(dchan_handle_provider(sh), "shm") != 0)
        die("job channel served by %s, not shm", dchan_handle_provider(sh));
    fill(sbuf, size, jme, 0, iter);
    long before = arrived;
    CHECK(dchan_put(sh));
    while (arrived == before)
        wait_one(ctx);
    verify(rbuf, size, peer, 0, iter);
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_handle_destroy(sh));
    CHECK(dchan_handle_destroy(rh));
    CHECK(dchan_free(ctx, rbuf));
    CHECK(dchan_free(ctx, sbuf));
}

static void test_jobs(void)
{
    int wrank, wsize;
    MPI_Comm job;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    if (wsize != 4)
        die("--test jobs needs 4 ranks");
    MPI_Comm_split(MPI_COMM_WORLD, wrank / 2, wrank, &job);

    dchan_attr_t a;
    dchan_ctx_t *ctx;
    dchan_attr_init(&a);
    a.bootstrap = DCHAN_BOOT_MPI;
    a.mpi_comm = &job;
    CHECK(dchan_init(&a, &ctx));
    int jme = dchan_rank(ctx), peer = 1 - jme;
    me = wrank;
    nranks = wsize;
    if (strcmp(dchan_provider_name(ctx), "shm") != 0)
        die("provider %s, not shm", dchan_provider_name(ctx));

    /* The job key, as the segments' names carry it: from a wire. */
    unsigned char probe[64];
    dchan_handle_t *h;
    dchan_wire_t w;
    CHECK(dchan_create_handle(ctx, peer, probe, sizeof probe, OOB, on_arrival, NULL, &h));
    CHECK(dchan_handle_export(h, &w));
    uint64_t key = 0;
    for (int i = 0; i < 8; i++)
        key |= (uint64_t)(unsigned char)w.bytes[8 + i] << (8 * i);

    if (holds_segment_fd())
        die("a segment descriptor is still open after dchan_init");
    int mine, other;
    count_mappings(key, &mine, &other);
    if (mine != 2 || other != 0)
        die("maps %d segments of its job (want 2) and %d of another (want 0)", mine, other);

    /* A wire of the other job is refused, and nothing breaks. */
    dchan_wire_t all[4];
    MPI_Allgather(&w, sizeof w, MPI_BYTE, all, sizeof w, MPI_BYTE, MPI_COMM_WORLD);
    int foreign = wrank < 2 ? 2 + jme : jme; /* the other job's rank with our job rank */
    dchan_handle_t *x;
    static unsigned char sbuf[64];
    EXPECT(dchan_assoc_local(ctx, &all[foreign], sbuf, sizeof sbuf, &x), DCHAN_ERR_HANDLE);
    CHECK(dchan_handle_destroy(h));

    for (long it = 1; it <= 3; it++)
        exchange(ctx, jme, peer, it);
    CHECK(dchan_finalize(ctx));
    MPI_Comm_free(&job);
}

static void test_alloc(void)
{
    dchan_ctx_t *ctx;
    CHECK(dchan_init(NULL, &ctx));
    me = dchan_rank(ctx);
    nranks = dchan_nranks(ctx);
    int peer = (me + 1) % nranks;
    void *p, *q, *blocks[4096];
    int nb = 0;

    /* Misuse: each refused with its code. */
    EXPECT(dchan_alloc(NULL, 64, &p), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_alloc(ctx, 0, &p), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_alloc(ctx, 64, NULL), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_alloc(ctx, (size_t)1 << 62, &p), DCHAN_ERR_INVALID_ARG);
    EXPECT(dchan_free(NULL, &p), DCHAN_ERR_INVALID_ARG);
    CHECK(dchan_free(ctx, NULL));
    static char not_ours[64];
    EXPECT(dchan_free(ctx, not_ours), DCHAN_ERR_INVALID_ARG);
    CHECK(dchan_alloc(ctx, 1000, &p));
    if ((uintptr_t)p % 64)
        die("dchan_alloc returned %p, not 64-byte aligned", p);
    EXPECT(dchan_free(ctx, (char *)p + 64), DCHAN_ERR_INVALID_ARG);
    memset(p, 0xa5, 1000);

    /* A receive buffer from dchan_alloc is placed in the segment (the wire
     * says so: provider fields, byte 0 is 1); one from the heap is not. */
    unsigned char *heap = xalloc(1024);
    dchan_handle_t *h1, *h2;
    dchan_wire_t w1, w2;
    CHECK(dchan_create_handle(ctx, peer, p, 960, OOB, on_arrival, NULL, &h1));
    CHECK(dchan_create_handle(ctx, peer, heap, 1024, OOB, on_arrival, NULL, &h2));
    CHECK(dchan_handle_export(h1, &w1));
    CHECK(dchan_handle_export(h2, &w2));
    if (w1.bytes[6] != 5 || w1.bytes[48] != 1 || w2.bytes[48] != 2)
        die("wire placement: provider %d, dchan_alloc buffer %d (want 1), heap %d (want 2)",
            w1.bytes[6], w1.bytes[48], w2.bytes[48]);
    /* Freeing memory a live handle uses is refused, and the handle works. */
    EXPECT(dchan_free(ctx, p), DCHAN_ERR_STATE);
    CHECK(dchan_handle_destroy(h1));
    CHECK(dchan_handle_destroy(h2));
    free(heap);
    CHECK(dchan_free(ctx, p));
    EXPECT(dchan_free(ctx, p), DCHAN_ERR_INVALID_ARG); /* twice */

    /* Exhaustion: more than the segment is refused; then fill it with
     * blocks, free them all, and one block of most of it fits again. */
    EXPECT(dchan_alloc(ctx, (size_t)64 << 20, &p), DCHAN_ERR_NO_MEMORY);
    size_t total = 0;
    while (nb < 4096 && dchan_alloc(ctx, (size_t)1 << 20, &blocks[nb]) == DCHAN_SUCCESS) {
        ((char *)blocks[nb])[0] = (char)nb;
        total += (size_t)1 << 20;
        nb++;
    }
    if (nb < 16 || nb == 4096)
        die("%d blocks of 1 MiB in a 32 MiB segment", nb);
    EXPECT(dchan_alloc(ctx, (size_t)1 << 20, &q), DCHAN_ERR_NO_MEMORY);
    for (int i = 0; i < nb; i++) {
        if (((char *)blocks[i])[0] != (char)i)
            die("block %d was overwritten", i);
        CHECK(dchan_free(ctx, blocks[i]));
    }
    CHECK(dchan_alloc(ctx, total - 4096, &q));
    CHECK(dchan_free(ctx, q));

    /* After all that, channels over the segment still work. */
    const size_t size = 65536;
    unsigned char *rbuf, *sbuf;
    dchan_handle_t *rh, *sh;
    dchan_wire_t w, *all = calloc((size_t)nranks, sizeof w);
    CHECK(dchan_alloc(ctx, size, (void **)&rbuf));
    CHECK(dchan_alloc(ctx, size, (void **)&sbuf));
    int from = (me + nranks - 1) % nranks;
    CHECK(dchan_create_handle(ctx, from, rbuf, size, OOB, on_arrival, NULL, &rh));
    CHECK(dchan_handle_export(rh, &w));
    CHECK(dchan_allgather(ctx, &w, all, sizeof w));
    CHECK(dchan_assoc_local(ctx, &all[peer], sbuf, size, &sh));
    for (long it = 1; it <= 100; it++) {
        fill(sbuf, size, me, 0, it);
        long before = arrived;
        CHECK(dchan_put(sh));
        while (arrived == before)
            wait_one(ctx);
        verify(rbuf, size, from, 0, it);
        CHECK(dchan_ready(rh));
        CHECK(dchan_barrier(ctx)); /* every receiver re-armed before the next put */
    }
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_handle_destroy(sh));
    CHECK(dchan_handle_destroy(rh));
    CHECK(dchan_free(ctx, rbuf));
    /* sbuf is left to dchan_finalize, which releases every block. */
    free(all);
    CHECK(dchan_finalize(ctx));
}

int main(int argc, char **argv)
{
    const char *test = argc == 3 && strcmp(argv[1], "--test") == 0 ? argv[2] : "";
    mpt_prog = "shm_targeted";
    MPI_Init(&argc, &argv);
    if (strcmp(test, "jobs") == 0) {
        test_jobs();
    } else if (strcmp(test, "alloc") == 0) {
        /* A small segment, so that exhausting it is quick. */
        setenv("DCHAN_SHM_SEGMENT_SIZE", "33554432", 1);
        test_alloc();
    } else {
        fprintf(stderr, "usage: shm_targeted --test jobs|alloc\n");
        MPI_Finalize();
        return 2;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        printf("RESULT test=shm-%s verified=yes\n", test);
    MPI_Finalize();
    return 0;
}
