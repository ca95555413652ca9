/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * fi_rma_pingpong: the raw-libfabric baseline of the dchan benchmarks.
 *
 * Two ranks write a buffer into each other with fi_writedata; the remote
 * CQ data tells the receiver that the data is there, as dchan's EVENT
 * detection does, but with nothing of dchan in between. MPI is used only
 * to exchange endpoint addresses and memory keys. Each iteration checks a
 * word at both ends of the received buffer.
 *
 *   mpirun -np 2 bench/fi_rma_pingpong [--sizes 8,4096,1048576]
 *          [--iters 1000] [--warmup 100]
 *
 * The libfabric provider is the first RDM provider offering RMA and remote
 * CQ data, or the one FI_PROVIDER names. Statistics as in dchan_pingpong,
 * so that the two compare: the iterations of a size (cut down so that at
 * most 512 MiB go each way, never below 25) form 25 repetitions; the
 * median, min and max are over the repetitions' mean one-way times.
 * Prints one line per size:
 *   RESULT bench=pingpong impl=fi-rma provider=<p> size=<bytes>
 *          oneway_us=<median> min_us=<min> max_us=<max>
 */
#include "config.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define MAXSIZES 64
#define NRX 64

static int me = -1;

static void fail(const char *what, int ret)
{
    fprintf(stderr, "fi_rma_pingpong[%d]: %s: %s\n", me, what, fi_strerror(ret < 0 ? -ret : ret));
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

struct fab {
    struct fi_info *info;
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_ep *ep;
    struct fid_mr *mr;
    fi_addr_t peer;
    uint64_t raddr, rkey; /* the peer's buffer */
    void *desc;
    struct fi_context2 tx_ctx, rx_ctx[NRX];
    int rx_cq_data; /* FI_RX_CQ_DATA: remote CQ data consumes a posted receive */
    long tx_pending;
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* buf holds the send half [0, half) and the receive half [half, 2 half). */
static void setup(struct fab *f, unsigned char *buf, size_t half, int peer)
{
    struct fi_info *hints = fi_allocinfo();
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
    struct fi_av_attr av_attr = {.type = FI_AV_UNSPEC, .count = 2};
    char name[256];
    size_t name_len = sizeof name;
    int ret;

    if (!hints)
        fail("fi_allocinfo", -FI_ENOMEM);
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG | FI_RECV;
    hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), NULL, NULL, 0, hints,
                     &f->info);
    fi_freeinfo(hints);
    if (ret)
        fail("fi_getinfo", ret);
    /* The first entry with remote CQ data. */
    while (f->info && f->info->domain_attr->cq_data_size < 4) {
        struct fi_info *next = f->info->next;
        f->info->next = NULL;
        fi_freeinfo(f->info);
        f->info = next;
    }
    if (!f->info)
        fail("no provider with remote CQ data", -FI_ENODATA);
    if (f->info->next) {
        fi_freeinfo(f->info->next);
        f->info->next = NULL;
    }
    f->rx_cq_data = ((f->info->mode | f->info->rx_attr->mode) & FI_RX_CQ_DATA) != 0;
    if ((ret = fi_fabric(f->info->fabric_attr, &f->fabric, NULL)) ||
        (ret = fi_domain(f->fabric, f->info, &f->domain, NULL)))
        fail("fi_fabric/fi_domain", ret);
    cq_attr.size = f->info->tx_attr->size + f->info->rx_attr->size;
    if ((ret = fi_cq_open(f->domain, &cq_attr, &f->cq, NULL)) ||
        (ret = fi_av_open(f->domain, &av_attr, &f->av, NULL)) ||
        (ret = fi_endpoint(f->domain, f->info, &f->ep, NULL)) ||
        (ret = fi_ep_bind(f->ep, &f->av->fid, 0)) ||
        (ret = fi_ep_bind(f->ep, &f->cq->fid, FI_TRANSMIT | FI_RECV)) ||
        (ret = fi_enable(f->ep)) || (ret = fi_getname(&f->ep->fid, name, &name_len)))
        fail("endpoint setup", ret);
    for (int k = 0; f->rx_cq_data && k < NRX; k++)
        if ((ret = (int)fi_recv(f->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, &f->rx_ctx[k])))
            fail("fi_recv", ret);

    /* One registration: the send half is read by our writes, the peer
     * writes the receive half. */
    uint64_t mode = f->info->domain_attr->mr_mode;
    ret = fi_mr_reg(f->domain, buf, 2 * half, FI_REMOTE_WRITE | FI_WRITE, 0,
                    (mode & FI_MR_PROV_KEY) ? 0 : 1, 0, &f->mr, NULL);
    if (ret)
        fail("fi_mr_reg", ret);
    if ((mode & FI_MR_ENDPOINT) &&
        ((ret = fi_mr_bind(f->mr, &f->ep->fid, 0)) || (ret = fi_mr_enable(f->mr))))
        fail("fi_mr_bind/enable", ret);
    f->desc = fi_mr_desc(f->mr);

    /* Exchange addresses, keys and buffer addresses over MPI. */
    struct {
        char name[256];
        uint64_t name_len, addr, key;
    } mine, theirs;
    memset(&mine, 0, sizeof mine);
    memcpy(mine.name, name, name_len);
    mine.name_len = name_len;
    mine.addr = ((mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)buf : 0) + half;
    mine.key = fi_mr_key(f->mr);
    MPI_Sendrecv(&mine, sizeof mine, MPI_BYTE, peer, 0, &theirs, sizeof theirs, MPI_BYTE, peer, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (fi_av_insert(f->av, theirs.name, 1, &f->peer, 0, NULL) != 1)
        fail("fi_av_insert", -FI_EINVAL);
    f->raddr = theirs.addr;
    f->rkey = theirs.key;
}

static void teardown(struct fab *f)
{
    fi_close(&f->ep->fid);
    fi_close(&f->mr->fid);
    fi_close(&f->av->fid);
    fi_close(&f->cq->fid);
    fi_close(&f->domain->fid);
    fi_close(&f->fabric->fid);
    fi_freeinfo(f->info);
}

/* Poll until the peer's write arrived; local completions are counted. */
static void wait_arrival(struct fab *f)
{
    struct fi_cq_data_entry e[8];
    for (;;) {
        ssize_t n = fi_cq_read(f->cq, e, 8);
        if (n == -FI_EAGAIN)
            continue;
        if (n < 0) {
            struct fi_cq_err_entry err = {0};
            fi_cq_readerr(f->cq, &err, 0);
            fail("completion", err.err ? -err.err : (int)n);
        }
        int got = 0;
        for (ssize_t k = 0; k < n; k++) {
            if (e[k].op_context == &f->tx_ctx) {
                f->tx_pending--;
                continue;
            }
            if (f->rx_cq_data && e[k].op_context) {
                int ret = (int)fi_recv(f->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, e[k].op_context);
                if (ret)
                    fail("fi_recv (repost)", ret);
            }
            if (e[k].flags & FI_REMOTE_CQ_DATA)
                got++;
        }
        if (got)
            return;
    }
}

static void write_to_peer(struct fab *f, const void *buf, size_t len)
{
    ssize_t ret;
    while ((ret = fi_writedata(f->ep, buf, len, f->desc, 1, f->peer, f->raddr, f->rkey,
                               &f->tx_ctx)) == -FI_EAGAIN) {
        struct fi_cq_data_entry e;
        /* Progress, keeping any arrival for wait_arrival: none can come
         * before our write, the peer waits for it. */
        if (fi_cq_read(f->cq, &e, 1) == 1 && e.op_context == &f->tx_ctx)
            f->tx_pending--;
    }
    if (ret)
        fail("fi_writedata", (int)ret);
    f->tx_pending++;
}

static void stamp(unsigned char *b, size_t len, uint64_t v)
{
    size_t n = len < 8 ? len : 8;
    memcpy(b, &v, n);
    memcpy(b + len - n, &v, n);
}

static void check(const unsigned char *b, size_t len, uint64_t v)
{
    size_t n = len < 8 ? len : 8;
    if (memcmp(b, &v, n) != 0 || memcmp(b + len - n, &v, n) != 0) {
        fprintf(stderr, "fi_rma_pingpong[%d]: size %zu: wrong data at an end of the buffer\n",
                me, len);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    long sizes[MAXSIZES] = {8, 64, 512, 4096, 32768, 262144, 1048576};
    int nsizes = 7, nranks, opt;
    long iters = 1000, warmup = 100;
    static const struct option opts[] = {{"sizes", required_argument, 0, 's'},
                                          {"iters", required_argument, 0, 'i'},
                                          {"warmup", required_argument, 0, 'w'},
                                          {0, 0, 0, 0}};

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (opt == 's') {
            char *s = optarg, *end;
            for (nsizes = 0; *s && nsizes < MAXSIZES; s = *end ? end + 1 : end) {
                static const char units[] = "KMG"; /* x1024, as the other benchmarks read sizes */
                long v = strtol(s, &end, 0);
                const char *m = end != s && *end ? strchr(units, *end) : NULL;
                if (m) {
                    v <<= 10 * (m - units + 1);
                    end++;
                }
                if (end == s || v < 1 || (*end && *end != ','))
                    goto usage;
                sizes[nsizes++] = v;
            }
        } else if (opt == 'i') {
            iters = atol(optarg);
        } else if (opt == 'w') {
            warmup = atol(optarg);
        } else {
            goto usage;
        }
    }
    if (nranks != 2 || iters < 1 || warmup < 0)
        goto usage;

    size_t maxlen = 0;
    for (int k = 0; k < nsizes; k++)
        maxlen = (size_t)sizes[k] > maxlen ? (size_t)sizes[k] : maxlen;
    size_t half = (maxlen + 4095) & ~(size_t)4095;
    unsigned char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, 2 * half))
        fail("posix_memalign", -FI_ENOMEM);
    memset(buf, 0, 2 * half);
    unsigned char *sbuf = buf, *rbuf = buf + half;
    double *t = calloc((size_t)(iters > 25 ? iters : 25), sizeof *t);
    struct fab f;
    memset(&f, 0, sizeof f);
    setup(&f, buf, half, 1 - me);
    if (me == 0)
        fprintf(stderr, "fi_rma_pingpong: %s on %s, %ld iterations after %ld warm-up\n",
                f.info->fabric_attr->prov_name, f.info->domain_attr->name, iters, warmup);

    for (int k = 0; k < nsizes; k++) {
        size_t len = (size_t)sizes[k];
        const long reps = 25, budget = 512l << 20;
        long n = iters, w = warmup;
        if (n * (long)len > budget) {
            n = budget / (long)len;
            w = w * n / iters;
        }
        if (n < reps)
            n = reps;
        MPI_Barrier(MPI_COMM_WORLD);
        for (long i = -w; i < n; i++) {
            uint64_t v = ((uint64_t)k << 40) ^ ((uint64_t)(i + w) * 2 + 1);
            double t0 = now_us();
            if (me == 0) {
                stamp(sbuf, len, v);
                write_to_peer(&f, sbuf, len);
                wait_arrival(&f);
                check(rbuf, len, v + 1);
            } else {
                wait_arrival(&f);
                check(rbuf, len, v);
                stamp(sbuf, len, v + 1);
                write_to_peer(&f, sbuf, len);
            }
            if (i >= 0)
                t[i] = (now_us() - t0) / 2;
        }
        /* Our last write completes before the buffer is reused. */
        while (f.tx_pending > 0) {
            struct fi_cq_data_entry e;
            ssize_t got = fi_cq_read(f.cq, &e, 1);
            if (got == 1 && e.op_context == &f.tx_ctx)
                f.tx_pending--;
            else if (got < 0 && got != -FI_EAGAIN)
                fail("fi_cq_read", (int)got);
        }
        if (me == 0) {
            /* Mean of each repetition (a block of iterations), in place. */
            long per = n / reps;
            for (long r = 0; r < reps; r++) {
                double sum = 0;
                for (long i = r * per; i < (r + 1) * per; i++)
                    sum += t[i];
                t[r] = sum / per;
            }
            qsort(t, (size_t)reps, sizeof *t, cmp_double);
            printf("RESULT bench=pingpong impl=fi-rma provider=%s size=%zu oneway_us=%.3f "
                   "min_us=%.3f max_us=%.3f\n",
                   f.info->fabric_attr->prov_name, len, t[reps / 2], t[0], t[reps - 1]);
            fflush(stdout);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    teardown(&f);
    free(t);
    free(buf);
    MPI_Finalize();
    return 0;

usage:
    if (me == 0)
        fprintf(stderr, "usage: mpirun -np 2 fi_rma_pingpong [--sizes a,b,... (K, M, G: x1024)] "
                        "[--iters N] [--warmup N]\n");
    MPI_Finalize();
    return 2;
}
