/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Every rank runs a libuv loop that serves dchan arrivals beside its own
 * timer and descriptor (integrations/libuv/README.md):
 *   - a token goes round the ranks on dchan channels (rank r puts to
 *     r + 1); rank 0 starts a lap from a uv timer every --period-ms, the
 *     others forward it from the arrival callback;
 *   - each rank's timer also writes a byte into a pipe of its own, which a
 *     uv_poll on the other end reads: the loop's own descriptors work as
 *     before.
 * Every message is checked (its lap, the ranks it passed, every byte). At
 * the end rank 0 prints a RESULT line; with --check the program fails if
 * a message was wrong or missing, if the pipe lost a byte, or if the loop
 * did not sleep: the process's CPU time over the loop must stay under a
 * quarter of its wall time (the loop is idle between laps).
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifdef USE_MPI
#include <mpi.h>
#endif
#include <uv.h>

#include <dchan.h>

#include "dchan_uv.h"

#define OOB 0x7e7e7e7e7e7e7e7eull

static dchan_ctx_t *ctx;
static int me, np;
static long laps = 100, got, sent;
static size_t size = 256;
static int period_ms = 5;
static unsigned char *rbuf, *sbuf;
static dchan_handle_t *rh, *sh;
static uv_loop_t *loop;
static uv_timer_t timer;
static uv_poll_t pipe_poll;
static int pipefd[2];
static long ticks, pipe_bytes;
static dchan_uv_t *du;
static int failed;

static void fail(const char *what, long lap)
{
    fprintf(stderr, "uv_example[%d]: FAIL: %s (lap %ld)\n", me, what, lap);
    failed = 1;
}

/* Byte k of lap 'lap' as it leaves rank 'from'. */
static unsigned char byte_of(long lap, int from, size_t k)
{
    uint64_t x = (uint64_t)lap * 0x9e3779b97f4a7c15ull ^ (uint64_t)from << 40 ^ k * 0x2545f491ull;
    x ^= x >> 29;
    return (unsigned char)(x * 0xbf58476d1ce4e5b9ull >> 56);
}

static void stamp(long lap)
{
    for (size_t k = 0; k < size; k++)
        sbuf[k] = byte_of(lap, me, k);
    uint64_t tail = (uint64_t)lap + 1; /* never OOB: a SENTINEL put must not end in it */
    memcpy(sbuf + size - 8, &tail, 8);
}

static int check(long lap, int from)
{
    uint64_t tail;
    memcpy(&tail, rbuf + size - 8, 8);
    if (tail != (uint64_t)lap + 1)
        return 0;
    for (size_t k = 0; k < size - 8; k++)
        if (rbuf[k] != byte_of(lap, from, k))
            return 0;
    return 1;
}

static void put_lap(long lap)
{
    stamp(lap);
    int rc = dchan_put(sh);
    if (rc != DCHAN_SUCCESS)
        fail(dchan_strerror(rc), lap);
    sent++;
}

static void finish(void);

/* From the loop, through dchan_uv's progress. */
static void on_arrival(dchan_handle_t *h, void *arg)
{
    int from = (me + np - 1) % np;
    if (!check(got, from))
        fail("message content", got);
    got++;
    int rc = dchan_ready(h);
    if (rc != DCHAN_SUCCESS)
        fail(dchan_strerror(rc), got);
    if (me != 0)
        put_lap(got - 1); /* forward the token */
    if ((me == 0 && got == laps) || (me != 0 && sent == laps))
        finish();
}

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    fail(dchan_strerror(rc), got);
}

static void on_timer(uv_timer_t *t)
{
    char c = 'x';
    ticks++;
    if (write(pipefd[1], &c, 1) != 1)
        fail("pipe write", ticks);
    /* Rank 0 starts the next lap once the token is home. */
    if (me == 0 && sent == got && sent < laps)
        put_lap(sent);
}

static void on_pipe(uv_poll_t *p, int status, int events)
{
    char b[64];
    ssize_t n = read(pipefd[0], b, sizeof b);
    if (n > 0)
        pipe_bytes += n;
}

static void finish(void)
{
    uv_timer_stop(&timer);
    uv_stop(loop);
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"laps", required_argument, NULL, 'n'},
                                         {"size", required_argument, NULL, 's'},
                                         {"period-ms", required_argument, NULL, 'p'},
                                         {"check", no_argument, NULL, 'c'},
                                         {NULL, 0, NULL, 0}};
    int c, do_check = 0, rc;
    while ((c = getopt_long(argc, argv, "n:s:p:c", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            laps = atol(optarg);
            break;
        case 's':
            size = (size_t)atol(optarg);
            break;
        case 'p':
            period_ms = atoi(optarg);
            break;
        case 'c':
            do_check = 1;
            break;
        default:
            fprintf(stderr, "usage: uv_example [--laps N] [--size B] [--period-ms MS] [--check]\n");
            return 2;
        }
    }
    size = size < 16 ? 16 : (size + 7) / 8 * 8;
#ifdef USE_MPI
    MPI_Init(&argc, &argv);
#endif
    dchan_attr_t attr;
    dchan_attr_init(&attr);
    attr.error_fn = on_error;
    if ((rc = dchan_init(&attr, &ctx)) != DCHAN_SUCCESS) {
        fprintf(stderr, "uv_example: dchan_init: %s\n", dchan_strerror(rc));
        return 1;
    }
    me = dchan_rank(ctx);
    np = dchan_nranks(ctx);

    /* The ring: a receive handle from the left, a send handle to the right,
     * wires shipped by dchan's own allgather. */
    dchan_wire_t w, *all = calloc((size_t)np, sizeof *all);
    if (dchan_alloc(ctx, size, (void **)&rbuf) || dchan_alloc(ctx, size, (void **)&sbuf) || !all) {
        fprintf(stderr, "uv_example: out of memory\n");
        return 1;
    }
    memset(rbuf, 0, size);
    if ((rc = dchan_create_handle(ctx, (me + np - 1) % np, rbuf, size, OOB, on_arrival, NULL,
                                  &rh)) ||
        (rc = dchan_handle_export(rh, &w)) || (rc = dchan_allgather(ctx, &w, all, sizeof w)) ||
        (rc = dchan_assoc_local(ctx, &all[(me + 1) % np], sbuf, size, &sh))) {
        fprintf(stderr, "uv_example: channel set-up: %s\n", dchan_strerror(rc));
        return 1;
    }
    free(all);

    loop = uv_default_loop();
    if (pipe(pipefd) != 0)
        return 1;
    uv_poll_init(loop, &pipe_poll, pipefd[0]);
    uv_poll_start(&pipe_poll, UV_READABLE, on_pipe);
    uv_timer_init(loop, &timer);
    uv_timer_start(&timer, on_timer, (uint64_t)period_ms, (uint64_t)period_ms);
    if ((rc = dchan_uv_start(loop, ctx, 16, &du)) != 0) {
        fprintf(stderr, "uv_example: dchan_uv_start: %s\n",
                rc < 0 && rc >= DCHAN_ERR_OVERRUN ? dchan_strerror(rc) : uv_strerror(rc));
        return 1;
    }
    dchan_barrier(ctx); /* every loop is about to serve its channel */

    double c0 = cpu_s(), t0 = wall_s();
    uv_run(loop, UV_RUN_DEFAULT);
    double cpu = cpu_s() - c0, wall = wall_s() - t0;

    /* Closing: the glue's handles and ours, then the loop ends. */
    unsigned long wakeups = dchan_uv_wakeups(du);
    if (dchan_uv_error(du))
        fail(dchan_strerror(dchan_uv_error(du)), got);
    dchan_uv_stop(du, NULL, NULL);
    uv_close((uv_handle_t *)&timer, NULL);
    uv_close((uv_handle_t *)&pipe_poll, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    on_pipe(NULL, 0, 0); /* what the last tick wrote */
    close(pipefd[0]);
    close(pipefd[1]);

    if (got != laps || sent != laps)
        fail("messages missing", got);
    if (pipe_bytes != ticks)
        fail("the pipe lost bytes", pipe_bytes);
    int slept = cpu < 0.25 * wall;
    if (do_check && !slept)
        fail("the loop did not sleep (CPU time not under a quarter of wall time)", laps);
    fprintf(stderr, "uv_example[%d]: %ld laps, %ld timer ticks, %lu wake-ups by dchan, cpu %.3f s "
            "of %.3f s\n", me, laps, ticks, wakeups, cpu, wall);
    dchan_barrier(ctx);
    if (me == 0)
        printf("RESULT app=uv_example provider=%s ranks=%d laps=%ld size=%zu wall_s=%.3f "
               "cpu_s=%.3f dchan_wakeups=%lu verified=%s\n",
               dchan_provider_name(ctx), np, laps, size, wall, cpu, wakeups,
               failed ? "no" : "yes");
    dchan_handle_destroy(rh);
    dchan_handle_destroy(sh);
    dchan_free(ctx, rbuf);
    dchan_free(ctx, sbuf);
    dchan_finalize(ctx);
#ifdef USE_MPI
    MPI_Finalize();
#endif
    return failed;
}
