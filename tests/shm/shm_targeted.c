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
 *   --test hostile  rank 1 plays a faulty peer: through its mapping of
 *                 rank 0's segment it appends ring records with wrong
 *                 lengths (staged ones too), a second arrival, stale and garbage ids, a flood
 *                 of them, and scribbles over the header's geometry. Rank 0
 *                 must not crash; each channel named gets its error
 *                 (error_fn once, later calls return it, its buffer
 *                 untouched), records naming none are dropped, and the good
 *                 channels, and one created after the scribbling, keep
 *                 delivering every byte. Then rank 1 scribbles over its own
 *                 ring tail: rank 0's put to it times out, bounded, and
 *                 works again once the tail is back. Last, rank 1 forges
 *                 credit hints (copies of a credit word's value that ring
 *                 records carry, shm_ring.h) for a credited channel of rank
 *                 0 whose slot it still holds: a value beyond the depth,
 *                 another user's tag, an older user's, another index, one
 *                 past the area. None may grant a put; one that a faulty
 *                 peer could as well have stored in the word is taken like
 *                 the word; and the channel then carries every byte.
 *   --test word   SENTINEL into heap buffers (DCHAN_DETECT=sentinel). The
 *                 body travels by Cross Memory Attach, whose kernel copy can
 *                 be seen half done; the tail must not, so it travels in a
 *                 ring record and the receiver stores it itself. Rank 1
 *                 puts (depth 1, a credited depth 4, a gathered put), then
 *                 both meet in an MPI barrier, which runs no dchan progress:
 *                 rank 0 finds every body in place and every tail still the
 *                 sentinel, then at its progress the arrivals, whole and in
 *                 order; a body of up to 32 bytes rides in the record too,
 *                 and one of up to SHM_STAGE_MAX in the records after it
 *                 (staged: still the last round's before progress, the
 *                 ones at the ring's end too).
 *                 Forged word records (a slot past the depth, a destroyed
 *                 handle, id 0, unknown flags) are dropped without a byte
 *                 written, and the channels go on; ones with an inline or
 *                 staged length that is not the body's, or a staged
 *                 length of 0, fail that channel alone (DCHAN_ERR_SIZE,
 *                 its data as it was).
 */
#define _GNU_SOURCE
#include "config.h"

#include <dirent.h>
#include <getopt.h>
#include <mpi.h>
#include <sched.h>
#include <stdbool.h>

#define OOB 0x6f6f62736d68735full
#include "mptest.h"
#include "shm_ring.h"

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

/* ---- --test hostile ---------------------------------------------------------------- */

/* Rank 0's channels from rank 1: the first few are victims of bad records,
 * the last three stay good. */
enum { V_INLINE, V_BIG, V_LEN49, V_OVERRUN, V_HUGELEN, V_STAGED0, V_STAGEDMAX, G_SMALL, G_BIG,
       G_HEAP, NCH };
static const size_t ch_size[NCH] = {32, 4096, 49, 64, 48, 64, 4096, 8, 65536, 1000};
static const int ch_heap[NCH] = {0, 0, 1, 0, 0, 1, 1, 0, 0, 1};
static dchan_handle_t *ch[NCH + 1]; /* + the channel made after the scribbling */
static long ch_arrivals[NCH + 1], ch_errors[NCH + 1];
static int ch_rc[NCH + 1];

static int channel_of(const dchan_handle_t *h)
{
    for (int c = 0; c <= NCH; c++)
        if (ch[c] == h)
            return c;
    die("a callback for a handle that is not a channel of the test");
}

static void on_ch_arrival(dchan_handle_t *h, void *arg)
{
    ch_arrivals[channel_of(h)]++;
}

static void on_ch_error(dchan_handle_t *h, int rc, void *arg)
{
    int c = channel_of(h);
    ch_errors[c]++;
    ch_rc[c] = rc;
}

static uint32_t wire_id(const dchan_wire_t *w)
{
    return (uint32_t)w->bytes[24] | (uint32_t)w->bytes[25] << 8 |
           (uint32_t)w->bytes[26] << 16 | (uint32_t)w->bytes[27] << 24;
}

/* This process's mapping of rank r's segment (named after the job key). */
static struct shm_hdr *segment_of(const dchan_wire_t *w, int r)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512], want[64];
    unsigned long lo = 0;
    uint64_t key = 0;
    for (int i = 0; i < 8; i++)
        key |= (uint64_t)w->bytes[8 + i] << (8 * i);
    if (!f)
        die("cannot read /proc/self/maps");
    snprintf(want, sizeof want, "memfd:dchan-%016llx-%d ", (unsigned long long)key, r);
    while (fgets(line, sizeof line, f))
        if (strstr(line, want) && sscanf(line, "%lx-", &lo) == 1)
            break;
    fclose(f);
    if (!lo)
        die("rank %d's segment is not mapped here", r);
    return (struct shm_hdr *)lo;
}

/* Rank 1: append one record to rank 0's ring as a producer would, with
 * whatever id and length. The ring's size is read before the header is
 * scribbled over. */
static uint64_t peer_slots;

/* Append one record as a producer would: claim a position (waiting while
 * the ring is full: rank 0 consumes while it waits for the good
 * channels), write id, len and the data area (0xee, then data[0, n)), and
 * publish it. */
static void put_record(struct shm_hdr *hdr, uint32_t id, uint32_t len, const void *data, size_t n)
{
    struct shm_slot *ring = (struct shm_slot *)((char *)hdr + SHM_HDR_BYTES);
    uint64_t pos = __atomic_fetch_add(&hdr->ring_tail, 1, __ATOMIC_ACQ_REL);
    while (pos - __atomic_load_n(&hdr->ring_head, __ATOMIC_ACQUIRE) >= peer_slots)
        sched_yield();
    struct shm_slot *sl = &ring[pos & (peer_slots - 1)];
    sl->id = id;
    sl->len = len;
    memset(sl->data, 0xee, sizeof sl->data);
    if (n)
        memcpy(sl->data, data, n);
    __atomic_store_n(&sl->seq, pos + 1, __ATOMIC_RELEASE);
}

static void bad_record(struct shm_hdr *hdr, uint32_t id, uint32_t len)
{
    put_record(hdr, id, len, NULL, 0);
}

/* Rank 1: as bad_record, a record of id with 8 bytes of payload inline
 * and a credit hint (index, value). */
static void hint_record(struct shm_hdr *hdr, uint32_t id, uint64_t payload, uint32_t index,
                        uint64_t value)
{
    unsigned char data[SHM_INLINE_BYTES];
    struct shm_hint hint = {.value = value, .index = index};
    memset(data, 0xee, sizeof data);
    memcpy(data, &payload, 8);
    memcpy(data + SHM_HINT_AT, &hint, sizeof hint);
    put_record(hdr, id, 8 | SHM_LEN_HINT, data, sizeof data);
}

static long hint_arrivals;

static void on_hint_arrival(dchan_handle_t *h, void *arg)
{
    hint_arrivals++;
}

/* Rank 0 waits for hint_arrivals to reach n. */
static void wait_hint_arrivals(dchan_ctx_t *ctx, long n)
{
    unsigned long long t0 = now_ns();
    while (hint_arrivals < n) {
        if (now_ns() - t0 > 30000000000ull)
            die("no arrival %ld on the channel of the hints", n);
        int rc = dchan_wait(ctx, 1000);
        if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
            die("dchan_wait: %s", dchan_strerror(rc));
    }
}

static void test_hints(dchan_ctx_t *ctx)
{
    /* cred: 0 -> 1, credited, depth 1 (its word in rank 0's area). carrier:
     * 1 -> 0, plain EVENT, whose records carry the hints. */
    static uint64_t cred_r, cred_s, car_r, car_s;
    dchan_handle_t *cred = NULL, *car = NULL, *car_s_h = NULL;
    dchan_wire_t cw, aw;
    if (me == 1) {
        dchan_handle_attr_t ha;
        dchan_handle_attr_init(&ha);
        ha.credit = 1;
        CHECK(dchan_create_handle_attr(ctx, 0, &cred_r, 8, OOB, on_hint_arrival, NULL, &ha,
                                       &cred));
        CHECK(dchan_handle_export(cred, &cw));
    } else {
        CHECK(dchan_create_handle(ctx, 1, &car_r, 8, OOB, on_hint_arrival, NULL, &car));
        CHECK(dchan_handle_export(car, &aw));
    }
    MPI_Bcast(&cw, (int)sizeof cw, MPI_BYTE, 1, MPI_COMM_WORLD);
    MPI_Bcast(&aw, (int)sizeof aw, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (me == 0) {
        CHECK(dchan_assoc_local(ctx, &cw, &cred_s, 8, &cred));
        fill((unsigned char *)&cred_s, 8, 0, 70, 1);
        CHECK(dchan_put(cred));
        EXPECT(dchan_credits(cred), 0);
    } else {
        CHECK(dchan_assoc_local(ctx, &aw, &car_s, 8, &car_s_h));
        while (hint_arrivals < 1)
            wait_one(ctx);
        verify((unsigned char *)&cred_r, 8, 0, 70, 1); /* and held: no release */
    }
    CHECK(dchan_barrier(ctx));

    /* The credit word's index and tag, as the wire carries them. */
    uint32_t index = (uint32_t)cw.bytes[114] | (uint32_t)cw.bytes[115] << 8;
    uint64_t base = ((uint64_t)cw.bytes[116] | (uint64_t)cw.bytes[117] << 8 |
                     (uint64_t)cw.bytes[118] << 16 | (uint64_t)cw.bytes[119] << 24)
                    << 32;
    const struct {
        uint32_t index;
        uint64_t value;
    } forged[] = {
        {index, base + 2},                   /* two releases: beyond depth 1 */
        {index, base + (1ull << 32) + 1},    /* the next user's tag */
        {index, base - (1ull << 32) + 1},    /* an older user's */
        {index, base + 0xffffffffull},       /* far beyond */
        {index ^ 1, base + 1},               /* another index: no channel there */
        {65535, base + 1},                   /* past the credit area */
        {0xffffffffu, base + 1},             /* far past it */
    };
    int nforged = (int)(sizeof forged / sizeof forged[0]);
    for (int k = 0; k <= nforged; k++) {
        if (me == 1) {
            struct shm_hdr *hdr = segment_of(&aw, 0);
            /* Last, the value of one release: what the word would hold. */
            uint32_t i = k < nforged ? forged[k].index : index;
            uint64_t v = k < nforged ? forged[k].value : base + 1;
            hint_record(hdr, wire_id(&aw), 0x1234567800000000ull + (uint64_t)k, i, v);
        } else {
            wait_hint_arrivals(ctx, k + 1);
            if (car_r != 0x1234567800000000ull + (uint64_t)k)
                die("the record of hint %d delivered %#llx", k, (unsigned long long)car_r);
            if (k < nforged) {
                EXPECT(dchan_credits(cred), 0);
                EXPECT(dchan_put(cred), DCHAN_ERR_AGAIN);
                EXPECT(dchan_put_ptr(cred, &(void *){NULL}), DCHAN_ERR_AGAIN);
            } else {
                EXPECT(dchan_credits(cred), 1); /* taken as the word would be */
            }
            CHECK(dchan_ready(car));
        }
        CHECK(dchan_barrier(ctx));
    }

    /* Rank 1 releases for real and answers on the carrier, whose record
     * now carries a true hint; rank 0 puts again, and the channel carries
     * every byte. */
    if (me == 1) {
        CHECK(dchan_ready(cred));
        fill((unsigned char *)&car_s, 8, 1, 71, 1);
        CHECK(dchan_put(car_s_h));
        while (hint_arrivals < 2)
            wait_one(ctx);
        verify((unsigned char *)&cred_r, 8, 0, 70, 2);
        CHECK(dchan_ready(cred));
    } else {
        wait_hint_arrivals(ctx, nforged + 2);
        verify((unsigned char *)&car_r, 8, 1, 71, 1);
        CHECK(dchan_ready(car));
        EXPECT(dchan_credits(cred), 1);
        fill((unsigned char *)&cred_s, 8, 0, 70, 2);
        CHECK(dchan_put(cred));
    }
    CHECK(dchan_barrier(ctx));
    if (cred)
        CHECK(dchan_handle_destroy(cred));
    if (car_s_h)
        CHECK(dchan_handle_destroy(car_s_h));
    if (car)
        CHECK(dchan_handle_destroy(car));
    CHECK(dchan_barrier(ctx));
}

/* Rank 0 waits for one more arrival on every good channel; rank 1 puts on
 * them. Both verify and re-arm before the next round. */
static void good_round(dchan_ctx_t *ctx, dchan_handle_t **sh, unsigned char **sbuf,
                       unsigned char **rbuf, int with_new, long iter)
{
    int first = G_SMALL, last = with_new ? NCH : G_HEAP;
    if (me == 1) {
        for (int c = first; c <= last; c++) {
            fill(sbuf[c], c == NCH ? 256 : ch_size[c], 1, c, iter);
            CHECK(dchan_put(sh[c]));
        }
    } else {
        for (int c = first; c <= last; c++) {
            unsigned long long t0 = now_ns();
            while (ch_arrivals[c] < iter) {
                if (now_ns() - t0 > 30000000000ull)
                    die("channel %d: no arrival %ld", c, iter);
                int rc = dchan_wait(ctx, 1000);
                if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
                    die("dchan_wait: %s", dchan_strerror(rc));
            }
            if (ch_errors[c] || ch_arrivals[c] != iter)
                die("good channel %d: %ld arrivals, %ld errors (%s) at iteration %ld", c,
                    ch_arrivals[c], ch_errors[c], dchan_strerror(ch_rc[c]), iter);
            verify(rbuf[c], c == NCH ? 256 : ch_size[c], 1, c, iter);
            CHECK(dchan_ready(ch[c]));
        }
    }
    CHECK(dchan_barrier(ctx));
}

/* A context of two ranks on shm, errors to on_error. */
static dchan_ctx_t *pair_init(const char *test, dchan_error_fn on_error)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx;
    dchan_attr_init(&a);
    a.error_fn = on_error;
    CHECK(dchan_init(&a, &ctx));
    me = dchan_rank(ctx);
    nranks = dchan_nranks(ctx);
    if (nranks != 2)
        die("--test %s needs 2 ranks", test);
    if (strcmp(dchan_provider_name(ctx), "shm") != 0)
        die("provider %s, not shm", dchan_provider_name(ctx));
    return ctx;
}

static void test_hostile(void)
{
    dchan_ctx_t *ctx = pair_init("hostile", on_ch_error);

    unsigned char *rbuf[NCH + 1] = {0}, *sbuf[NCH + 1] = {0};
    dchan_handle_t *sh[NCH + 1] = {0};
    dchan_wire_t w[NCH + 1];
    uint32_t stale = 0;
    if (me == 0) {
        for (int c = 0; c < NCH; c++) {
            if (ch_heap[c])
                rbuf[c] = xalloc(ch_size[c]);
            else
                CHECK(dchan_alloc(ctx, ch_size[c], (void **)&rbuf[c]));
            fill(rbuf[c], ch_size[c], 0, c, 0); /* what a victim must still hold */
            CHECK(dchan_create_handle(ctx, 1, rbuf[c], ch_size[c], OOB, on_ch_arrival, NULL,
                                      &ch[c]));
            CHECK(dchan_handle_export(ch[c], &w[c]));
        }
        /* A channel destroyed at once: its id is stale. */
        dchan_handle_t *x;
        CHECK(dchan_create_handle(ctx, 1, rbuf[G_SMALL], 8, OOB, on_ch_arrival, NULL, &x));
        CHECK(dchan_handle_export(x, &w[NCH]));
        CHECK(dchan_handle_destroy(x));
    }
    MPI_Bcast(w, (int)sizeof w, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (w[0].bytes[7] != DCHAN_DETECT_EVENT)
        die("the channels are not in EVENT mode (the ring serves EVENT only)");
    if (me == 1) {
        for (int c = G_SMALL; c < NCH; c++) {
            sbuf[c] = xalloc(ch_size[c]);
            CHECK(dchan_assoc_local(ctx, &w[c], sbuf[c], ch_size[c], &sh[c]));
        }
        stale = wire_id(&w[NCH]);
    }
    good_round(ctx, sh, sbuf, rbuf, 0, 1);

    /* Bad records, then the good channels' puts behind them in the ring:
     * when those arrived, every bad record was consumed. */
    if (me == 1) {
        struct shm_hdr *hdr = segment_of(&w[0], 0);
        peer_slots = __atomic_load_n(&hdr->ring_slots, __ATOMIC_RELAXED);
        bad_record(hdr, wire_id(&w[V_INLINE]), 16);     /* inline, not its size */
        bad_record(hdr, wire_id(&w[V_BIG]), 1000);      /* more than a record holds */
        bad_record(hdr, wire_id(&w[V_LEN49]), 49);      /* its size, but no record holds it */
        bad_record(hdr, wire_id(&w[V_OVERRUN]), 0);     /* an arrival ... */
        bad_record(hdr, wire_id(&w[V_OVERRUN]), 0);     /* ... and one before the re-arm */
        bad_record(hdr, wire_id(&w[V_HUGELEN]), UINT32_MAX);
        /* Staged bodies (shm_ring.h) that no producer makes: none, and one
         * byte past the limit (both taken alone: what follows is good). */
        bad_record(hdr, wire_id(&w[V_STAGED0]), SHM_LEN_STAGED);
        bad_record(hdr, wire_id(&w[V_STAGEDMAX]), SHM_LEN_STAGED | (SHM_STAGE_MAX + 1));
        bad_record(hdr, stale, 8);                      /* a destroyed handle */
        bad_record(hdr, 0xdeadbeefu, 8);                /* no handle at all */
        bad_record(hdr, 0, 7);                          /* nothing, with a length */
        bad_record(hdr, wire_id(&w[G_SMALL]) ^ 0x01000000u, 8); /* another generation */
    }
    good_round(ctx, sh, sbuf, rbuf, 0, 2);
    if (me == 0) {
        static const int want[] = {DCHAN_ERR_SIZE,    DCHAN_ERR_SIZE, DCHAN_ERR_SIZE,
                                   DCHAN_ERR_OVERRUN, DCHAN_ERR_SIZE, DCHAN_ERR_SIZE,
                                   DCHAN_ERR_SIZE};
        for (int c = V_INLINE; c <= V_STAGEDMAX; c++) {
            if (ch_errors[c] != 1 || ch_rc[c] != want[c])
                die("channel %d: error_fn called %ld times with %s, expected once with %s", c,
                    ch_errors[c], dchan_strerror(ch_rc[c]), dchan_strerror(want[c]));
            if (ch_arrivals[c] > (c == V_OVERRUN))
                die("channel %d: %ld arrivals from bad records", c, ch_arrivals[c]);
            /* The error sticks to the channel; its data was never touched. */
            EXPECT(dchan_ready(ch[c]), want[c]);
            EXPECT(dchan_ready_pollq(ch[c]), want[c]);
            verify(rbuf[c], ch_size[c], 0, c, 0);
        }
    }

    /* Garbage over the header's geometry: neither side reads it back, and a
     * channel made afterwards is still placed in the segment. */
    if (me == 1) {
        struct shm_hdr *hdr = segment_of(&w[0], 0);
        hdr->data_off = hdr->size;
        hdr->ring_off = 12345;
        hdr->ring_slots = 3;
        hdr->version = 99;
    }
    CHECK(dchan_barrier(ctx));
    if (me == 0) {
        CHECK(dchan_alloc(ctx, 256, (void **)&rbuf[NCH]));
        CHECK(dchan_create_handle(ctx, 1, rbuf[NCH], 256, OOB, on_ch_arrival, NULL, &ch[NCH]));
        CHECK(dchan_handle_export(ch[NCH], &w[NCH]));
        if (w[NCH].bytes[48] != 1)
            die("a dchan_alloc buffer is not placed in the segment after the scribbling");
        ch_arrivals[NCH] = 2; /* counts along with the other good channels */
    }
    MPI_Bcast(&w[NCH], (int)sizeof w[NCH], MPI_BYTE, 0, MPI_COMM_WORLD);
    if (me == 1) {
        sbuf[NCH] = xalloc(256);
        CHECK(dchan_assoc_local(ctx, &w[NCH], sbuf[NCH], 256, &sh[NCH]));
    }
    for (long it = 3; it <= 20; it++)
        good_round(ctx, sh, sbuf, rbuf, 1, it);

    /* A flood of records naming nothing, several rings' worth: dropped (and
     * logged at the 1st, 2nd, 4th ...), and consumption goes on. */
    if (me == 1) {
        struct shm_hdr *hdr = segment_of(&w[0], 0);
        for (uint32_t i = 0; i < 8 * peer_slots; i++)
            bad_record(hdr, 0xdead0000u + i, i % 64);
    }
    for (long it = 21; it <= 30; it++)
        good_round(ctx, sh, sbuf, rbuf, 1, it);

    /* The producer's side: rank 1 scribbles over its own ring tail, as a
     * faulty receiver (or another producer) could. Rank 0's put to it then
     * finds no room and ends in DCHAN_ERR_TIMEOUT after the drain time,
     * having written nothing; with the tail back, the same channel works. */
    static uint64_t back_buf, back_src;
    dchan_handle_t *back_h = NULL;
    dchan_wire_t back;
    struct shm_hdr *own = NULL;
    uint64_t tail = 0;
    if (me == 1) {
        CHECK(dchan_create_handle(ctx, 0, &back_buf, 8, OOB, on_arrival, NULL, &back_h));
        CHECK(dchan_handle_export(back_h, &back));
    }
    MPI_Bcast(&back, (int)sizeof back, MPI_BYTE, 1, MPI_COMM_WORLD);
    if (me == 0)
        CHECK(dchan_assoc_local(ctx, &back, &back_src, 8, &back_h));
    if (me == 1) {
        own = segment_of(&back, 1);
        tail = __atomic_load_n(&own->ring_tail, __ATOMIC_ACQUIRE);
        __atomic_store_n(&own->ring_tail, tail + 1000000, __ATOMIC_RELEASE);
    }
    CHECK(dchan_barrier(ctx));
    if (me == 0) {
        unsigned long long t0 = now_ns();
        fill((unsigned char *)&back_src, 8, 0, 99, 1);
        EXPECT(dchan_put(back_h), DCHAN_ERR_TIMEOUT);
        if (now_ns() - t0 > 30000000000ull)
            die("a put into a ring with a garbage tail took %.1f s", (now_ns() - t0) / 1e9);
    }
    CHECK(dchan_barrier(ctx));
    if (me == 1) {
        if (arrived)
            die("an arrival from a put that could not claim a record");
        __atomic_store_n(&own->ring_tail, tail, __ATOMIC_RELEASE);
    }
    CHECK(dchan_barrier(ctx));
    if (me == 0) {
        CHECK(dchan_put(back_h));
    } else {
        while (!arrived)
            wait_one(ctx);
        verify((unsigned char *)&back_buf, 8, 0, 99, 1);
    }
    CHECK(dchan_barrier(ctx));
    CHECK(dchan_handle_destroy(back_h));

    test_hints(ctx);

    CHECK(dchan_barrier(ctx));
    for (int c = 0; c <= NCH; c++) {
        if (sh[c])
            CHECK(dchan_handle_destroy(sh[c]));
        if (ch[c])
            CHECK(dchan_handle_destroy(ch[c]));
        if (me == 1)
            free(sbuf[c]);
        else if (c < NCH && ch_heap[c])
            free(rbuf[c]);
    }
    CHECK(dchan_finalize(ctx));
}

/* ---- --test word ------------------------------------------------------------------- */

/* Bodies of up to SHM_WORD_INLINE bytes ride in the record with the tail
 * (W_TINY, W_GTINY), and bodies of up to SHM_STAGE_MAX in the records
 * after it (W_BIG, W_DEPTH, W_GATHER): those are not in the buffer before
 * the receiver's progress either, also where they meet the ring's end (a
 * filler record takes the positions up to it). W_HUGE's body goes by
 * Cross Memory Attach. */
enum { W_SMALL, W_BIG, W_DEPTH, W_GATHER, W_TINY, W_GTINY, W_HUGE, NW };
static const size_t w_size[NW] = {8, 4104, 64, 1024, SHM_WORD_INLINE + 8, 24, SHM_STAGE_MAX + 16};
static const int w_depth[NW] = {1, 1, 4, 1, 2, 1, 1};
static dchan_handle_t *wch[NW];
static long w_arrivals[NW];
/* Staged bodies found still the last round's before the receiver's
 * progress, per channel, and found landed (gone by Cross Memory Attach). */
static long w_staged[NW], w_landed[NW];
/* Victims of forged lengths: 5 bytes inline for a body of 32, and 63, more
 * than a record holds, for a body of 40; staged, one byte past
 * SHM_STAGE_MAX, and no body at all, for bodies of 40: each fails its
 * channel alone, nothing read. */
#define NV 4
static const size_t v_size[NV] = {SHM_WORD_INLINE + 8, 48, 48, 48};
static const uint32_t v_len[NV] = {SHM_LEN_WORD | 5, SHM_LEN_WORD | SHM_WORD_LEN_MASK,
                                   SHM_LEN_WORD | SHM_LEN_STAGED | (SHM_STAGE_MAX + 1),
                                   SHM_LEN_WORD | SHM_LEN_STAGED};
static dchan_handle_t *vch[NV];
static long v_arrivals[NV], v_errors[NV];
static int v_rc[NV];

static void on_w_arrival(dchan_handle_t *h, void *arg)
{
    intptr_t c = (intptr_t)arg;
    if (c >= NW)
        v_arrivals[c - NW]++;
    else
        w_arrivals[c]++;
}

static void on_w_error(dchan_handle_t *h, int rc, void *arg)
{
    for (int i = 0; i < NV; i++)
        if (h == vch[i]) {
            v_errors[i]++;
            v_rc[i] = rc;
            return;
        }
    die("error on a channel that should work: %s", dchan_strerror(rc));
}

/* Rank 1: a record with a signalling word (shm_ring.h), forged. */
static void word_record(struct shm_hdr *hdr, uint32_t id, uint32_t len, uint32_t slot,
                        uint64_t value)
{
    struct shm_word w = {.value = value, .slot = slot};
    put_record(hdr, id, len, &w, sizeof w);
}

/* One round: rank 1 puts every slot of every channel; rank 0 checks, with
 * no dchan call since, that the bodies landed and no tail did; then takes
 * the arrivals, in order, and releases them. */
static void word_round(dchan_ctx_t *ctx, dchan_handle_t **sh, unsigned char **sbuf,
                       unsigned char **rbuf, long iter)
{
    if (me == 1) {
        for (int c = 0; c < NW; c++)
            for (int k = 0; k < w_depth[c]; k++) {
                fill(sbuf[c], w_size[c], 1, c, iter * 64 + k);
                CHECK(dchan_put(sh[c]));
            }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        for (int c = 0; c < NW; c++)
            for (int k = 0; k < w_depth[c]; k++) {
                unsigned char *slot = rbuf[c] + (size_t)k * w_size[c];
                uint64_t tail;
                memcpy(&tail, slot + w_size[c] - 8, 8);
                if (tail != OOB)
                    die("channel %d slot %d, round %ld: the tail holds %016llx before the "
                        "receiver's progress (a tail written by Cross Memory Attach)",
                        c, k, iter, (unsigned long long)tail);
                if (w_arrivals[c] != (iter - 1) * w_depth[c])
                    die("channel %d: %ld arrivals before round %ld", c, w_arrivals[c], iter);
                /* A body by Cross Memory Attach is this round's; an inline
                 * one is still the last round's (the initial fill in the
                 * first); a staged one either, as a whole. */
                size_t body = w_size[c] - 8;
                int from = 1;
                long it = iter * 64 + k;
                mpt_verify_when = " (the body, before the tail)";
                bool staged = body > SHM_WORD_INLINE && body <= SHM_STAGE_MAX;
                uint64_t first;
                memcpy(&first, slot, 8);
                if (body <= SHM_WORD_INLINE || (staged && first != word_of(1, c, it, 0))) {
                    from = iter == 1 ? 0 : 1;
                    it = iter == 1 ? 0 : (iter - 1) * 64 + k;
                    mpt_verify_when = " (an inline or staged body, before the receiver's progress)";
                    w_staged[c] += staged;
                } else {
                    w_landed[c] += staged;
                }
                verify(slot, body, from, c, it);
            }
        for (int c = 0; c < NW; c++) {
            unsigned long long t0 = now_ns();
            while (w_arrivals[c] < iter * w_depth[c]) {
                if (now_ns() - t0 > 30000000000ull)
                    die("channel %d: %ld arrivals in round %ld", c, w_arrivals[c], iter);
                int rc = dchan_wait(ctx, 1000);
                if (rc < 0 && rc != DCHAN_ERR_TIMEOUT)
                    die("dchan_wait: %s", dchan_strerror(rc));
            }
            if (w_arrivals[c] != iter * w_depth[c])
                die("channel %d: %ld arrivals in round %ld", c, w_arrivals[c], iter);
            mpt_verify_when = " (at arrival)";
            for (int k = 0; k < w_depth[c]; k++) {
                void *slot;
                CHECK(dchan_slot(wch[c], &slot));
                if (slot != rbuf[c] + (size_t)k * w_size[c])
                    die("channel %d: slot %d delivered out of order", c, k);
                verify(slot, w_size[c], 1, c, iter * 64 + k);
                CHECK(dchan_ready(wch[c]));
            }
            /* Past the buffer: never written (the forged slots aim there). */
            verify(rbuf[c] + (size_t)w_depth[c] * w_size[c], w_size[c], 0, c, 0);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_word(void)
{
    dchan_ctx_t *ctx = pair_init("word", on_w_error);

    unsigned char *rbuf[NW] = {0}, *sbuf[NW] = {0}, *vbuf[NV] = {0};
    dchan_handle_t *sh[NW] = {0};
    dchan_wire_t w[NW + 1 + NV]; /* the channels, a destroyed one, the victims */
    if (me == 0) {
        for (int c = 0; c < NW; c++) {
            dchan_handle_attr_t ha;
            dchan_handle_attr_init(&ha);
            ha.depth = w_depth[c];
            ha.credit = w_depth[c] > 1;
            /* On the heap, with a guard of one more slot behind it. */
            rbuf[c] = xalloc((size_t)(w_depth[c] + 1) * w_size[c]);
            for (int k = 0; k <= w_depth[c]; k++)
                fill(rbuf[c] + (size_t)k * w_size[c], w_size[c], 0, c, 0);
            CHECK(dchan_create_handle_attr(ctx, 1, rbuf[c], w_size[c], OOB, on_w_arrival,
                                           (void *)(intptr_t)c, &ha, &wch[c]));
            if (dchan_handle_detect(wch[c]) != DCHAN_DETECT_SENTINEL)
                die("channel %d is not in SENTINEL mode (run with DCHAN_DETECT=sentinel)", c);
            CHECK(dchan_handle_export(wch[c], &w[c]));
            if (w[c].bytes[48] != 2)
                die("channel %d: a heap buffer that the wire does not name as one", c);
        }
        dchan_handle_t *x;
        CHECK(dchan_create_handle(ctx, 1, rbuf[W_SMALL], 8, OOB, on_w_arrival, NULL, &x));
        CHECK(dchan_handle_export(x, &w[NW]));
        CHECK(dchan_handle_destroy(x));
        for (int i = 0; i < NV; i++) {
            vbuf[i] = xalloc(v_size[i]);
            fill(vbuf[i], v_size[i], 0, NW + i, 0);
            CHECK(dchan_create_handle(ctx, 1, vbuf[i], v_size[i], OOB, on_w_arrival,
                                      (void *)(intptr_t)(NW + i), &vch[i]));
            CHECK(dchan_handle_export(vch[i], &w[NW + 1 + i]));
        }
    }
    MPI_Bcast(w, (int)sizeof w, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (me == 1) {
        for (int c = 0; c < NW; c++) {
            sbuf[c] = xalloc(w_size[c]);
            if (c != W_GATHER && c != W_GTINY) {
                CHECK(dchan_assoc_local(ctx, &w[c], sbuf[c], w_size[c], &sh[c]));
                continue;
            }
            /* The tail straddles the last two pieces (1000, 20 and 4 bytes;
             * 10, 10 and 4), gathered from one buffer in order. */
            size_t n1 = c == W_GATHER ? 1000 : 10, n2 = c == W_GATHER ? 20 : 10;
            dchan_iov_t iov[3] = {{sbuf[c], n1}, {sbuf[c] + n1, n2}, {sbuf[c] + n1 + n2, 4}};
            CHECK(dchan_assoc_local_iov(ctx, &w[c], iov, 3, &sh[c]));
        }
        peer_slots = __atomic_load_n(&segment_of(&w[0], 0)->ring_slots, __ATOMIC_RELAXED);
    }
    for (long it = 1; it <= 50; it++)
        word_round(ctx, sh, sbuf, rbuf, it);

    /* Forged records, then a round whose records come behind them. */
    if (me == 1) {
        struct shm_hdr *hdr = segment_of(&w[0], 0);
        uint64_t v = word_of(1, W_SMALL, 999, 0);
        word_record(hdr, wire_id(&w[W_SMALL]), SHM_LEN_WORD, 1, v);  /* past its depth */
        word_record(hdr, wire_id(&w[W_DEPTH]), SHM_LEN_WORD, 4, v);  /* past its depth */
        word_record(hdr, wire_id(&w[W_SMALL]), SHM_LEN_WORD, UINT32_MAX, v);
        word_record(hdr, wire_id(&w[NW]), SHM_LEN_WORD, 0, v);       /* destroyed */
        word_record(hdr, 0, SHM_LEN_WORD, 0, v);                     /* no handle */
        word_record(hdr, wire_id(&w[W_SMALL]), SHM_LEN_WORD | SHM_LEN_HINT, 0, v);
        word_record(hdr, wire_id(&w[W_SMALL]), SHM_LEN_WORD | SHM_LEN_HINT | 8, 0, v);
        for (int i = 0; i < NV; i++)
            word_record(hdr, wire_id(&w[NW + 1 + i]), v_len[i], 0, v);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (long it = 51; it <= 60; it++)
        word_round(ctx, sh, sbuf, rbuf, it);
    if (me == 0) {
        /* Staging must have served every time: the ring always has room
         * here (rank 0 empties it each round), and at its end a filler
         * record comes first (the rounds wrap it about once). */
        for (int c = 0; c < NW; c++) {
            size_t body = w_size[c] - 8;
            bool staged = body > SHM_WORD_INLINE && body <= SHM_STAGE_MAX;
            if (staged && (w_staged[c] != 60L * w_depth[c] || w_landed[c] != 0))
                die("channel %d: %ld staged bodies and %ld by Cross Memory Attach in 60 rounds",
                    c, w_staged[c], w_landed[c]);
        }
        printf("word: staged bodies (not in place before progress) / by Cross Memory Attach:");
        for (int c = 0; c < NW; c++)
            printf(" %d:%ld/%ld", c, w_staged[c], w_landed[c]);
        printf("\n");
    }
    if (me == 0)
        for (int i = 0; i < NV; i++) {
            if (v_errors[i] != 1 || v_rc[i] != DCHAN_ERR_SIZE || v_arrivals[i])
                die("victim %d: %ld errors (%s), %ld arrivals; expected one DCHAN_ERR_SIZE", i,
                    v_errors[i], dchan_strerror(v_rc[i]), v_arrivals[i]);
            uint64_t tail;
            memcpy(&tail, vbuf[i] + v_size[i] - 8, 8);
            if (tail != OOB)
                die("victim %d: its tail changed", i);
            mpt_verify_when = " (a victim's body)";
            verify(vbuf[i], v_size[i] - 8, 0, NW + i, 0);
            EXPECT(dchan_ready(vch[i]), DCHAN_ERR_SIZE);
        }

    CHECK(dchan_barrier(ctx));
    for (int c = 0; c < NW; c++) {
        if (sh[c])
            CHECK(dchan_handle_destroy(sh[c]));
        if (wch[c])
            CHECK(dchan_handle_destroy(wch[c]));
        free(me == 1 ? sbuf[c] : rbuf[c]);
    }
    for (int i = 0; i < NV; i++) {
        if (vch[i])
            CHECK(dchan_handle_destroy(vch[i]));
        free(vbuf[i]);
    }
    CHECK(dchan_finalize(ctx));
}

int main(int argc, char **argv)
{
    const char *test = argc == 3 && strcmp(argv[1], "--test") == 0 ? argv[2] : "";
    mpt_prog = "shm_targeted";
    MPI_Init(&argc, &argv);
    if (strcmp(test, "jobs") == 0) {
        test_jobs();
    } else if (strcmp(test, "hostile") == 0) {
        /* A small ring, so that the flood wraps it many times; a short
         * drain time for the put that cannot claim a record. */
        setenv("DCHAN_SHM_RING_SLOTS", "64", 1);
        setenv("DCHAN_DRAIN_TIMEOUT_MS", "2000", 1);
        test_hostile();
    } else if (strcmp(test, "word") == 0) {
        test_word();
    } else if (strcmp(test, "alloc") == 0) {
        /* A small segment, so that exhausting it is quick. */
        setenv("DCHAN_SHM_SEGMENT_SIZE", "33554432", 1);
        test_alloc();
    } else {
        fprintf(stderr, "usage: shm_targeted --test jobs|alloc|hostile|word\n");
        MPI_Finalize();
        return 2;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0)
        printf("RESULT test=shm-%s verified=yes\n", test);
    MPI_Finalize();
    return 0;
}
