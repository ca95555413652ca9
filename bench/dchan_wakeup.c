/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Wake-up latency (DESIGN §7): rank 0 sends a message stamped with the
 * time (CLOCK_MONOTONIC, one clock for both ranks of a host) every --gap-us
 * (300 us by default, long enough for rank 1 to be asleep again), and
 * waits for an acknowledgement; rank 1 waits for each message as the
 * implementation waits, and takes now - stamp when it holds the message
 * (in the arrival callback for dchan). Reported: the median of that
 * one-way latency, the 10th and 90th percentiles, and rank 1's CPU time
 * over the wall time of the loop (a real sleeper stays near 0). Measured
 * in the same run:
 *   dchan        each provider and mode asked for: put -> poll() on
 *                dchan_wakeup_fd after dchan_wakeup_arm -> progress ->
 *                callback, which answers;
 *   eventfd      two processes that write each other's eventfd (taken with
 *                pidfd_getfd) and sleep in poll() on their own: the
 *                physical floor of a wake-up;
 *   fi_cq_sread  libfabric's own blocking wait: fi_send / fi_recv of the
 *                same size and fi_cq_sread on a CQ with a wait object, on
 *                the fabrics asked for (--fabrics);
 *   mpi_recv     MPI_Send / MPI_Recv (Open MPI spins inside MPI_Recv: see
 *                its CPU column).
 * Usage: mpirun -np 2 --bind-to core bench/dchan_wakeup [--provider shm,ofi,mpi]
 *          [--detect event,flag,sentinel] [--fabrics "tcp;ofi_rxm,shm"] [--iters N]
 *          [--size B] [--gap-us US]
 * Output: human-readable lines on stderr, RESULT lines on stdout.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>
#ifdef HAVE_OFI
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#endif

#include <dchan.h>

#define OOB 0x6b6b6b6b6b6b6b6bull

static int me, np;
static long iters = 2000, warmup = 100, gap_us = 300;
static size_t size = 64;
static double *samples; /* rank 1: one-way latencies, seconds */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Rank 0, between messages: the receiver goes back to sleep meanwhile. */
static void gap(void)
{
    struct timespec ts = {0, gap_us * 1000L};
    nanosleep(&ts, NULL);
}

/* Rank 1 sends its statistics to rank 0, which prints them. */
static void report(const char *impl, const char *prov, const char *detect, double cpu,
                   double wall, double asleep)
{
    double r[5] = {0};
    if (me == 1) {
        qsort(samples, (size_t)iters, sizeof *samples, cmp_d);
        r[0] = samples[iters / 2] * 1e6;
        r[1] = samples[iters / 10] * 1e6;
        r[2] = samples[iters * 9 / 10] * 1e6;
        r[3] = 100 * cpu / wall;
        r[4] = asleep;
        MPI_Send(r, 5, MPI_DOUBLE, 0, 99, MPI_COMM_WORLD);
        return;
    }
    MPI_Recv(r, 5, MPI_DOUBLE, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    fprintf(stderr, "  %-12s %-14s %-9s %9.2f us (p10 %7.2f, p90 %7.2f)  receiver cpu %5.1f %%",
            impl, prov, detect, r[0], r[1], r[2], r[3]);
    if (r[4] >= 0)
        fprintf(stderr, "  sleeps/msg %4.2f", r[4]);
    fprintf(stderr, "\n");
    printf("RESULT bench=wakeup impl=%s provider=%s detect=%s size=%zu gap_us=%ld oneway_us=%.3f "
           "p10_us=%.3f p90_us=%.3f receiver_cpu_pct=%.2f",
           impl, prov, detect, size, gap_us, r[0], r[1], r[2], r[3]);
    if (r[4] >= 0)
        printf(" sleeps_per_msg=%.2f", r[4]);
    printf("\n");
    fflush(stdout);
}

/* ---- dchan --------------------------------------------------------------------------- */

static volatile long got;
static dchan_ctx_t *ctx;
static int wfd;
static long armed_ok, waits, sample_at;
static void *rbuf, *sbuf;

static void on_arrival(dchan_handle_t *h, void *arg)
{
    uint64_t t = now_ns(), stamp;
    memcpy(&stamp, (char *)rbuf + size - 8, 8);
    if (me == 1 && sample_at >= 0)
        samples[sample_at] = (double)(t - stamp) / 1e9;
    got++;
}

/* Until the n-th arrival, sleeping whenever arming allows. */
static int wait_got(long n)
{
    waits++;
    for (;;) {
        int rc;
        while ((rc = dchan_progress(ctx)) > 0)
            ;
        if (rc < 0)
            return rc;
        if (got >= n)
            return 0;
        rc = dchan_wakeup_arm(ctx);
        if (rc == DCHAN_ERR_AGAIN)
            continue;
        if (rc < 0)
            return rc;
        armed_ok++;
        struct pollfd p = {wfd, POLLIN, 0};
        if (poll(&p, 1, 10000) == 0)
            return DCHAN_ERR_TIMEOUT;
    }
}

static int bench_dchan(const char *prov, const char *detect)
{
    dchan_attr_t a;
    dchan_handle_t *rh = NULL, *sh = NULL;
    dchan_wire_t w, all[2];
    int rc;

    dchan_attr_init(&a);
    a.provider = prov;
    a.detect = !strcmp(detect, "sentinel") ? DCHAN_DETECT_SENTINEL
               : !strcmp(detect, "flag")   ? DCHAN_DETECT_FLAG
               : !strcmp(detect, "event")  ? DCHAN_DETECT_EVENT
                                           : DCHAN_DETECT_AUTO;
    a.log_level = DCHAN_LOG_NONE;
    rc = dchan_init(&a, &ctx);
    if (rc != DCHAN_SUCCESS) {
        if (me == 0) {
            fprintf(stderr, "  dchan        %-14s %-9s skipped: %s\n", prov, detect,
                    dchan_strerror(rc));
            printf("SKIP bench=wakeup impl=dchan provider=%s detect=%s reason=\"%s\"\n", prov,
                   detect, dchan_strerror(rc));
        }
        return 0;
    }
    got = 0;
    rbuf = sbuf = NULL;
    if ((rc = dchan_alloc(ctx, size, &rbuf)) || (rc = dchan_alloc(ctx, size, &sbuf)) ||
        (rc = dchan_create_handle(ctx, 1 - me, rbuf, size, OOB, on_arrival, NULL, &rh)) ||
        (rc = dchan_handle_export(rh, &w)) || (rc = dchan_allgather(ctx, &w, all, sizeof w)) ||
        (rc = dchan_assoc_local(ctx, &all[1 - me], sbuf, size, &sh)) ||
        (rc = dchan_wakeup_fd(ctx, &wfd)))
        goto out;
    memset(sbuf, 0x11, size);
    double c0 = 0, t0 = 0;
    for (long i = -warmup; i < iters; i++) {
        long k = i + warmup;
        if (i == 0) {
            dchan_barrier(ctx);
            c0 = cpu_s();
            t0 = (double)now_ns() / 1e9;
            armed_ok = waits = 0;
        }
        sample_at = i;
        if (me == 0) {
            gap();
            uint64_t stamp = now_ns();
            memcpy((char *)sbuf + size - 8, &stamp, 8);
            if ((rc = dchan_put(sh)) || (rc = wait_got(k + 1)) || (rc = dchan_ready(rh)))
                goto out;
        } else {
            if ((rc = wait_got(k + 1)) || (rc = dchan_ready(rh)))
                goto out;
            uint64_t stamp = (uint64_t)k + 1; /* an acknowledgement */
            memcpy((char *)sbuf + size - 8, &stamp, 8);
            if ((rc = dchan_put(sh)))
                goto out;
        }
    }
    double wall = (double)now_ns() / 1e9 - t0, cpu = cpu_s() - c0;
    char name[64];
    snprintf(name, sizeof name, "%s", dchan_provider_name(ctx));
    /* Sleeps per message: 1 when each waits asleep once; more where a
     * timer wakes the sleeper to look (mpi, ofi without a wait fd). */
    report("dchan", name, detect, cpu, wall, waits ? (double)armed_ok / (double)waits : 0);
out:
    if (rc)
        fprintf(stderr, "dchan_wakeup[%d]: %s/%s: %s\n", me, prov, detect, dchan_strerror(rc));
    if (rh)
        dchan_handle_destroy(rh);
    if (sh)
        dchan_handle_destroy(sh);
    dchan_free(ctx, rbuf);
    dchan_free(ctx, sbuf);
    dchan_finalize(ctx);
    return rc;
}

/* ---- eventfd: the floor ---------------------------------------------------------------- */

/* The message is the stamp itself, as the eventfd's count. */
static int bench_eventfd(void)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC), mine[2] = {getpid(), efd}, peer[4];
    MPI_Allgather(mine, 2, MPI_INT, peer, 2, MPI_INT, MPI_COMM_WORLD);
    int pfd = (int)syscall(SYS_pidfd_open, peer[2 * (1 - me)], 0);
    int other = pfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pfd, peer[2 * (1 - me) + 1], 0);
    int ok = other >= 0, all_ok;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!all_ok) {
        if (me == 0)
            printf("SKIP bench=wakeup impl=eventfd reason=pidfd_getfd\n");
        return 0;
    }
    struct pollfd p = {efd, POLLIN, 0};
    uint64_t v;
    double c0 = 0, t0 = 0;
    for (long i = -warmup; i < iters; i++) {
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            c0 = cpu_s();
            t0 = (double)now_ns() / 1e9;
        }
        if (me == 0) {
            gap();
            v = now_ns();
            if (write(other, &v, 8) != 8)
                return 1;
        }
        while (poll(&p, 1, -1) < 0 && errno == EINTR)
            ;
        if (read(efd, &v, 8) != 8)
            return 1;
        if (me == 1) {
            if (i >= 0)
                samples[i] = (double)(now_ns() - v) / 1e9;
            v = 1;
            if (write(other, &v, 8) != 8)
                return 1;
        }
    }
    report("eventfd", "-", "-", cpu_s() - c0, (double)now_ns() / 1e9 - t0, -1);
    close(other);
    close(pfd);
    close(efd);
    return 0;
}

/* ---- MPI_Recv ----------------------------------------------------------------------------- */

static int bench_mpi(void)
{
    uint64_t *buf = calloc(1, size);
    double c0 = 0, t0 = 0;
    for (long i = -warmup; i < iters; i++) {
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            c0 = cpu_s();
            t0 = (double)now_ns() / 1e9;
        }
        if (me == 0) {
            gap();
            buf[0] = now_ns();
            MPI_Send(buf, (int)size, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(buf, (int)size, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            if (i >= 0)
                samples[i] = (double)(now_ns() - buf[0]) / 1e9;
            MPI_Send(buf, (int)size, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
        }
    }
    report("mpi_recv", "ob1", "-", cpu_s() - c0, (double)now_ns() / 1e9 - t0, -1);
    free(buf);
    return 0;
}

/* ---- fi_cq_sread ------------------------------------------------------------------------------ */

#ifdef HAVE_OFI
struct sread {
    struct fid_ep *ep;
    struct fid_cq *cq;
    fi_addr_t peer;
    void *desc;
    char *buf;
};

/* One message of ours out, and (rank 0) the acknowledgement in, each
 * completion taken with fi_cq_sread, which blocks on the wait object. */
static int sread_wait(struct sread *f, void *want)
{
    struct fi_cq_entry ent;
    for (;;) {
        ssize_t n = fi_cq_sread(f->cq, &ent, 1, NULL, -1);
        if (n == 1 && ent.op_context == want)
            return 0;
        if (n < 0 && n != -FI_EAGAIN) {
            fprintf(stderr, "fi_cq_sread: %s\n", fi_strerror((int)-n));
            return -1;
        }
    }
}

static int sread_loop(struct sread *f, const char *prov)
{
    struct fi_context sctx, rctx;
    double c0 = 0, t0 = 0;
    uint64_t stamp;
    for (long i = -warmup; i < iters; i++) {
        if (i == 0) {
            MPI_Barrier(MPI_COMM_WORLD);
            c0 = cpu_s();
            t0 = (double)now_ns() / 1e9;
        }
        while (fi_recv(f->ep, f->buf + size, size, f->desc, f->peer, &rctx) == -FI_EAGAIN)
            fi_cq_read(f->cq, NULL, 0);
        if (me == 0) {
            gap();
            stamp = now_ns();
            memcpy(f->buf, &stamp, 8);
        } else {
            if (sread_wait(f, &rctx))
                return -1;
            memcpy(&stamp, f->buf + size, 8);
            if (i >= 0)
                samples[i] = (double)(now_ns() - stamp) / 1e9;
        }
        while (fi_send(f->ep, f->buf, size, f->desc, f->peer, &sctx) == -FI_EAGAIN)
            fi_cq_read(f->cq, NULL, 0);
        /* Completions come in either order: the send's, then (rank 0) the reply. */
        struct fi_cq_entry ent;
        int need_send = 1, need_recv = me == 0;
        while (need_send || need_recv) {
            ssize_t n = fi_cq_sread(f->cq, &ent, 1, NULL, -1);
            if (n == 1 && ent.op_context == &sctx)
                need_send = 0;
            else if (n == 1 && ent.op_context == &rctx)
                need_recv = 0;
            else if (n < 0 && n != -FI_EAGAIN) {
                fprintf(stderr, "fi_cq_sread: %s\n", fi_strerror((int)-n));
                return -1;
            }
        }
    }
    report("fi_cq_sread", prov, "-", cpu_s() - c0, (double)now_ns() / 1e9 - t0, -1);
    return 0;
}

static int bench_sread(const char *prov)
{
    struct fi_info *hints = fi_allocinfo(), *info = NULL;
    struct fid_fabric *fab = NULL;
    struct fid_domain *dom = NULL;
    struct fid_av *av = NULL;
    struct fid_mr *mr = NULL;
    struct sread f = {.peer = FI_ADDR_UNSPEC, .buf = calloc(2, size)};
    char name[256], *names = NULL;
    size_t nlen = sizeof name;
    const char *what = "fi_getinfo";
    int ret, ok, all_ok;

    hints->caps = FI_MSG;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->fabric_attr->prov_name = strdup(prov);
    ret = fi_getinfo(FI_VERSION(1, 9), NULL, NULL, 0, hints, &info);
    if (!ret && (what = "fi_fabric", ret = fi_fabric(info->fabric_attr, &fab, NULL)) == 0 &&
        (what = "fi_domain", ret = fi_domain(fab, info, &dom, NULL)) == 0) {
        struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_UNSPEC,
                                .size = 64};
        struct fi_av_attr aa = {.type = FI_AV_TABLE, .count = 2};
        what = "fi_cq_open with a wait object";
        if ((ret = fi_cq_open(dom, &ca, &f.cq, NULL)) == 0 &&
            (what = "fi_av_open", ret = fi_av_open(dom, &aa, &av, NULL)) == 0 &&
            (what = "fi_endpoint", ret = fi_endpoint(dom, info, &f.ep, NULL)) == 0 &&
            (what = "fi_ep_bind", ret = fi_ep_bind(f.ep, &av->fid, 0)) == 0 &&
            (ret = fi_ep_bind(f.ep, &f.cq->fid, FI_TRANSMIT | FI_RECV)) == 0 &&
            (what = "fi_enable", ret = fi_enable(f.ep)) == 0 &&
            (what = "fi_getname", ret = fi_getname(&f.ep->fid, name, &nlen)) == 0 &&
            (info->domain_attr->mr_mode & FI_MR_LOCAL))
            ret = fi_mr_reg(dom, f.buf, 2 * size, FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL);
        if (!ret && mr)
            f.desc = fi_mr_desc(mr);
    }
    ok = ret == 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_ok) {
        unsigned long l = nlen, maxl;
        MPI_Allreduce(&l, &maxl, 1, MPI_UNSIGNED_LONG, MPI_MAX, MPI_COMM_WORLD);
        names = calloc(2, maxl);
        MPI_Allgather(name, (int)maxl, MPI_BYTE, names, (int)maxl, MPI_BYTE, MPI_COMM_WORLD);
        ok = fi_av_insert(av, names + (size_t)(1 - me) * maxl, 1, &f.peer, 0, NULL) == 1;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        what = "fi_av_insert";
    }
    if (!all_ok) {
        if (me == 0) {
            fprintf(stderr, "  fi_cq_sread  %-14s %-9s skipped: %s: %s\n", prov, "-", what,
                    fi_strerror(ret < 0 ? -ret : ret));
            printf("SKIP bench=wakeup impl=fi_cq_sread provider=%s reason=\"%s\"\n", prov, what);
        }
    } else {
        sread_loop(&f, prov);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (f.ep)
        fi_close(&f.ep->fid);
    if (mr)
        fi_close(&mr->fid);
    if (av)
        fi_close(&av->fid);
    if (f.cq)
        fi_close(&f.cq->fid);
    if (dom)
        fi_close(&dom->fid);
    if (fab)
        fi_close(&fab->fid);
    if (info)
        fi_freeinfo(info);
    fi_freeinfo(hints);
    free(names);
    free(f.buf);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"provider", required_argument, NULL, 'p'},
                                         {"detect", required_argument, NULL, 'd'},
                                         {"fabrics", required_argument, NULL, 'f'},
                                         {"iters", required_argument, NULL, 'n'},
                                         {"size", required_argument, NULL, 's'},
                                         {"gap-us", required_argument, NULL, 'g'},
                                         {NULL, 0, NULL, 0}};
    char provs[256] = "shm,ofi,mpi", detects[64] = "event", fabrics[128] = "tcp;ofi_rxm,shm";
    int c;
    while ((c = getopt_long(argc, argv, "p:d:f:n:s:g:", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            snprintf(provs, sizeof provs, "%s", optarg);
            break;
        case 'd':
            snprintf(detects, sizeof detects, "%s", optarg);
            break;
        case 'f':
            snprintf(fabrics, sizeof fabrics, "%s", optarg);
            break;
        case 'n':
            iters = atol(optarg);
            warmup = iters / 20;
            break;
        case 's':
            size = (size_t)atol(optarg);
            break;
        case 'g':
            gap_us = atol(optarg);
            break;
        default:
            fprintf(stderr, "usage: mpirun -np 2 dchan_wakeup [--provider LIST] [--detect LIST] "
                            "[--fabrics LIST] [--iters N] [--size B] [--gap-us US]\n");
            return 2;
        }
    }
    size = size < 8 ? 8 : (size + 7) / 8 * 8;
    if (iters < 10)
        iters = 10;
    if (gap_us < 0 || gap_us > 999999)
        gap_us = 300;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (np != 2) {
        if (me == 0)
            fprintf(stderr, "dchan_wakeup: runs on 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    samples = calloc((size_t)iters, sizeof *samples);
    if (me == 0)
        fprintf(stderr, "wake-up latency, %zu B, a message every %ld us to a sleeping receiver "
                        "(median one-way, put -> receiver holds it)\n",
                size, gap_us);
    bench_eventfd();
    for (char *sp, *p = strtok_r(provs, ",", &sp); p; p = strtok_r(NULL, ",", &sp)) {
        char dl[64];
        snprintf(dl, sizeof dl, "%s", detects);
        for (char *sd, *d = strtok_r(dl, ",", &sd); d; d = strtok_r(NULL, ",", &sd))
            bench_dchan(p, d);
    }
#ifdef HAVE_OFI
    for (char *sf, *f = strtok_r(fabrics, ",", &sf); f; f = strtok_r(NULL, ",", &sf))
        bench_sread(f);
#endif
    bench_mpi();
    bench_eventfd(); /* again: the floor did not move during the run */
    MPI_Finalize();
    return 0;
}
