/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_pingpong: one-way latency (half the round trip) of dchan against
 * what a user would pick instead, measured in the same run on 2 ranks:
 *
 *   dchan         put -> arrival callback -> dchan_ready, channels created once
 *                 per size, one dchan context per provider x detection mode
 *   mpi-sendrecv  MPI_Isend / MPI_Irecv of the same buffers, receives pre-posted
 *   mpi-put-pscw  MPI_Put into a window, post/start/complete/wait
 *   mpi-put-lock  passive target: MPI_Put, MPI_Win_flush, then a flag put that
 *                 the target polls
 *   ucx-put       raw UCX (UCP, when configure found it): ucp_put_nbx of the
 *                 body, ucp_worker_fence, then a put of the last word that
 *                 the target polls; nothing of dchan or MPI in between
 *   cacheline     two processes bouncing one shared cache line: the physical
 *                 floor of this machine's core-to-core latency; with it, the
 *                 floors of a channel pingpong, a word per direction:
 *                 cacheline-pair (each side polls for the next value, as
 *                 ucx-put's receiver does) and cacheline-rearm (the receiver
 *                 writes the idle value back before answering, as SENTINEL's
 *                 re-arm does), and ring (an 8-byte record through an MPSC
 *                 ring laid out as the shm provider's EVENT ring: the floor
 *                 of EVENT); size=8 results, no library involved
 *
 * Fairness: every implementation has its own buffers, warms up, and is then
 * timed in repetitions that take turns (A B C D A B C D ...), so that a
 * change of machine state (this VM's core-to-core latency flips between two
 * modes, see bench/README.md) hits them all alike. Each repetition's time is
 * the mean over its round trips; a result is the median over repetitions,
 * with their min and max. Every arrival is checked (bench.h: stamps).
 */
#include "config.h"

#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_UCX
#include <ucp/api/ucp.h>
#endif

#include "bench.h"
#include "shm_ring.h" /* the EVENT record layout, for the ring floor */

#define TAG_PP 11

enum kind {
    K_DCHAN,
    K_SENDRECV,
    K_PSCW,
    K_LOCK,
#ifdef HAVE_UCX
    K_UCX,
#endif
};

struct impl {
    enum kind kind;
    const char *name;
    struct bench_combo *combo; /* K_DCHAN */
    unsigned tx_stream, rx_stream;
    /* state at the current size */
    int on;
    unsigned char *sbuf, *rbuf;
    uint64_t tx_seq, rx_seq;
    dchan_handle_t *rh, *sh;
    int arrived; /* set by the arrival callback, inside dchan_progress */
    MPI_Request rreq, sreq;
    MPI_Win win, fwin;
    uint64_t *flag, *flag_src;
    /* results, per size */
    double *med, *min, *max;
    int *valid;
};

static struct bench_opts o = {
    .prog = "dchan_pingpong",
    .iters = 10000,
    .warmup = 1000,
    .reps = 25,
    .timeout_s = 60,
};
static double budget = 512.0 * 1024 * 1024; /* bytes per direction, per impl and size */
static int peer;
static size_t size;                          /* the size being measured */
static MPI_Group peer_group;

/* The shared cache line. */
static volatile uint64_t *cl_line;
/* An EVENT ring for the floor: tail and head on lines of their own, as
 * in the shm segment's header. */
#define FLOOR_RING_SLOTS 64u
struct floor_ring {
    _Alignas(128) uint64_t tail;
    _Alignas(128) uint64_t head;
    _Alignas(128) struct shm_slot slot[FLOOR_RING_SLOTS];
};
static struct floor_ring *cl_rings;
static uint64_t cl_val;
static MPI_Win cl_win = MPI_WIN_NULL;
static MPI_Comm cl_comm = MPI_COMM_NULL;

static const size_t default_sizes[] = {
    /* the ends of the small-message range the shm provider is judged on
     * (bench/mkreport.py, 8 B .. 1 KiB) */
    8, 1024,
    /* CkDirect paper, Tables 1-2 */
    100, 1000, 5000, 10000, 20000, 30000, 40000, 70000, 100000, 500000,
    /* thesis tables: 2 KiB .. 64 MiB */
    2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152,
    4194304, 8388608, 16777216, 33554432, 67108864};

/* What each arrival's check covers besides the ends: the body too with
 * --check full, and in the one verified round trip that ends every size. */
static int body_check = BENCH_BODY_NONE;

static int body_mode(void)
{
    return body_check;
}

/* First failure on any rank, so that every rank takes the same branch. */
static int agree(int rc)
{
    int lo;
    MPI_Allreduce(&rc, &lo, 1, MPI_INT, MPI_MIN, bench_comm);
    return lo;
}

/* ---- dchan ------------------------------------------------------------------------ */

static void on_arrival(dchan_handle_t *h, void *arg)
{
    struct impl *m = arg;
    if (h != m->rh)
        bench_fatal("arrival callback for a handle that is not the channel's");
    m->arrived++;
}

static void dchan_wait_arrival(struct impl *m)
{
    struct bench_spin sp;
    bench_spin_init(&sp, "a dchan arrival");
    while (!m->arrived) {
        int rc = dchan_progress(m->combo->ctx);
        if (rc < 0)
            bench_fatal("dchan_progress: %s", dchan_strerror(rc));
        bench_spin(&sp);
    }
    if (m->arrived != 1)
        bench_fatal("%d arrival callbacks for one put", m->arrived);
    m->arrived = 0;
}

/* The send buffer may be rewritten only once the last put completed locally. */
static void dchan_wait_sent(struct impl *m)
{
    struct bench_spin sp;
    int rc;
    bench_spin_init(&sp, "a dchan put to complete locally");
    while ((rc = dchan_put_test(m->sh)) == 0)
        bench_spin(&sp);
    if (rc < 0)
        bench_fatal("dchan_put_test: %s", dchan_strerror(rc));
}

static int dchan_setup(struct impl *m)
{
    dchan_wire_t mine, theirs;
    int rc = dchan_create_handle(m->combo->ctx, peer, m->rbuf, size, BENCH_OOB, on_arrival, m,
                                 &m->rh);
    int all = agree(rc);
    if (all != DCHAN_SUCCESS) {
        if (rc == DCHAN_SUCCESS)
            dchan_handle_destroy(m->rh);
        return all;
    }
    rc = dchan_handle_export(m->rh, &mine);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_export: %s", dchan_strerror(rc));
    MPI_Sendrecv(&mine, sizeof mine, MPI_BYTE, peer, TAG_PP, &theirs, sizeof theirs, MPI_BYTE,
                 peer, TAG_PP, bench_comm, MPI_STATUS_IGNORE);
    rc = dchan_assoc_local(m->combo->ctx, &theirs, m->sbuf, size, &m->sh);
    if ((all = agree(rc)) != DCHAN_SUCCESS)
        bench_fatal("dchan_assoc_local (%s, %zu bytes): %s", m->combo->provider, size,
                    dchan_strerror(all));
    bench_combo_label(m->combo, m->rh);
    return DCHAN_SUCCESS;
}

static void dchan_run(struct impl *m, long n)
{
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            dchan_wait_sent(m);
            bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
            int rc = dchan_put(m->sh);
            if (rc != DCHAN_SUCCESS)
                bench_fatal("dchan_put: %s", dchan_strerror(rc));
            dchan_wait_arrival(m);
            bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
            if ((rc = dchan_ready(m->rh)) != DCHAN_SUCCESS)
                bench_fatal("dchan_ready: %s", dchan_strerror(rc));
        } else {
            dchan_wait_arrival(m);
            bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
            /* Re-armed before the reply: the reply is what lets the peer put again. */
            int rc = dchan_ready(m->rh);
            if (rc != DCHAN_SUCCESS)
                bench_fatal("dchan_ready: %s", dchan_strerror(rc));
            dchan_wait_sent(m);
            bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
            if ((rc = dchan_put(m->sh)) != DCHAN_SUCCESS)
                bench_fatal("dchan_put: %s", dchan_strerror(rc));
        }
    }
}

static void dchan_teardown(struct impl *m)
{
    int rc = dchan_handle_destroy(m->sh);
    if (rc != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_destroy (send): %s", dchan_strerror(rc));
    MPI_Barrier(bench_comm); /* no put is left in flight towards a receive handle */
    if ((rc = dchan_handle_destroy(m->rh)) != DCHAN_SUCCESS)
        bench_fatal("dchan_handle_destroy (receive): %s", dchan_strerror(rc));
}

/* ---- MPI two-sided -------------------------------------------------------------- */

/* Each rank keeps one receive posted at all times: it is re-posted as soon
 * as the last one was checked, before the reply goes out. */
static void sendrecv_setup(struct impl *m)
{
    MPI_Irecv(m->rbuf, (int)size, MPI_BYTE, peer, TAG_PP, bench_comm, &m->rreq);
}

static void sendrecv_run(struct impl *m, long n)
{
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
            MPI_Isend(m->sbuf, (int)size, MPI_BYTE, peer, TAG_PP, bench_comm, &m->sreq);
            MPI_Wait(&m->rreq, MPI_STATUS_IGNORE);
            bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
            MPI_Irecv(m->rbuf, (int)size, MPI_BYTE, peer, TAG_PP, bench_comm, &m->rreq);
            MPI_Wait(&m->sreq, MPI_STATUS_IGNORE);
        } else {
            MPI_Wait(&m->rreq, MPI_STATUS_IGNORE);
            bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
            MPI_Irecv(m->rbuf, (int)size, MPI_BYTE, peer, TAG_PP, bench_comm, &m->rreq);
            bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
            MPI_Isend(m->sbuf, (int)size, MPI_BYTE, peer, TAG_PP, bench_comm, &m->sreq);
            MPI_Wait(&m->sreq, MPI_STATUS_IGNORE);
        }
    }
}

static void sendrecv_teardown(struct impl *m)
{
    MPI_Cancel(&m->rreq);
    MPI_Wait(&m->rreq, MPI_STATUS_IGNORE);
}

/* ---- MPI one-sided, post/start/complete/wait ----------------------------------------- */

/* Rank 1 opens its exposure epoch for the next ping as soon as it checked
 * the last one, the one-sided counterpart of a pre-posted receive. */
static void pscw_setup(struct impl *m)
{
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "no_locks", "true");
    MPI_Win_create(m->rbuf, (MPI_Aint)size, 1, info, bench_comm, &m->win);
    MPI_Info_free(&info);
    if (bench_rank == 1)
        MPI_Win_post(peer_group, 0, m->win);
}

static void pscw_run(struct impl *m, long n)
{
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            MPI_Win_post(peer_group, 0, m->win); /* for the pong */
            bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
            MPI_Win_start(peer_group, 0, m->win);
            MPI_Put(m->sbuf, (int)size, MPI_BYTE, peer, 0, (int)size, MPI_BYTE, m->win);
            MPI_Win_complete(m->win);
            MPI_Win_wait(m->win);
            bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
        } else {
            MPI_Win_wait(m->win);
            bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
            MPI_Win_post(peer_group, 0, m->win); /* for the next ping */
            bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
            MPI_Win_start(peer_group, 0, m->win);
            MPI_Put(m->sbuf, (int)size, MPI_BYTE, peer, 0, (int)size, MPI_BYTE, m->win);
            MPI_Win_complete(m->win);
        }
    }
}

static void pscw_teardown(struct impl *m)
{
    /* Close rank 1's last exposure epoch with an empty access epoch. */
    if (bench_rank == 0) {
        MPI_Win_start(peer_group, 0, m->win);
        MPI_Win_complete(m->win);
    } else {
        MPI_Win_wait(m->win);
    }
    MPI_Win_free(&m->win);
}

/* ---- MPI one-sided, passive target with a polled flag ------------------------------ */

static void lock_setup(struct impl *m)
{
    m->flag = bench_alloc(64);
    m->flag_src = bench_alloc(64);
    MPI_Win_create(m->rbuf, (MPI_Aint)size, 1, MPI_INFO_NULL, bench_comm, &m->win);
    MPI_Win_create(m->flag, 8, 8, MPI_INFO_NULL, bench_comm, &m->fwin);
    MPI_Win_lock_all(MPI_MODE_NOCHECK, m->win);
    MPI_Win_lock_all(MPI_MODE_NOCHECK, m->fwin);
}

static void lock_send(struct impl *m)
{
    bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
    MPI_Put(m->sbuf, (int)size, MPI_BYTE, peer, 0, (int)size, MPI_BYTE, m->win);
    /* The data is complete at the target before the flag is even sent. */
    MPI_Win_flush(peer, m->win);
    *m->flag_src = bench_stamp(m->tx_stream, m->tx_seq);
    MPI_Put(m->flag_src, 1, MPI_UINT64_T, peer, 0, 1, MPI_UINT64_T, m->fwin);
    MPI_Win_flush(peer, m->fwin);
}

static void lock_recv(struct impl *m)
{
    uint64_t want = bench_stamp(m->rx_stream, m->rx_seq + 1);
    struct bench_spin sp;
    bench_spin_init(&sp, "the mpi-put-lock flag");
    while (__atomic_load_n(m->flag, __ATOMIC_ACQUIRE) != want) {
        MPI_Win_sync(m->fwin);
        /* An MPI whose RMA needs the target's progress gets it here. */
        if ((sp.n & 0x3f) == 0x3f) {
            int f;
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, bench_comm, &f, MPI_STATUS_IGNORE);
        }
        bench_spin(&sp);
    }
    MPI_Win_sync(m->win);
    bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
}

static void lock_run(struct impl *m, long n)
{
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            lock_send(m);
            lock_recv(m);
        } else {
            lock_recv(m);
            lock_send(m);
        }
    }
}

static void lock_teardown(struct impl *m)
{
    MPI_Win_unlock_all(m->fwin);
    MPI_Win_unlock_all(m->win);
    MPI_Win_free(&m->fwin);
    MPI_Win_free(&m->win);
    bench_free(m->flag);
    bench_free(m->flag_src);
}

/* ---- raw UCX: body put, fence, flag put ------------------------------------------- */

#ifdef HAVE_UCX
/*
 * One UCP context, worker and endpoint for the whole run, opened before the
 * first size like the cache line. Each rank receives into one buffer of the
 * largest size that UCX allocated itself (UCP_MEM_MAP_ALLOCATE): memory
 * from a shared-memory memory domain is what lets UCX's posix or sysv
 * transport write into it with a plain copy; a malloc'd buffer would be
 * reachable only through cma's system call. Send buffers are the ordinary
 * per-size ones: an RMA source needs no registration on shared memory, and
 * a transport that wants one registers (and caches) it during warm-up.
 */
static struct {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_mem_h memh;
    ucp_rkey_h rkey;      /* the peer's receive buffer */
    unsigned char *rbuf;  /* this rank's receive buffer */
    uint64_t raddr;       /* the peer's, as an address in its process */
} ux;

/* A message of the current size starts this far into a receive buffer, so
 * that its last word, the one the target polls, is 8-byte aligned (an
 * atomic load wants that) at any size. Both ranks compute it from the
 * receiver's address. */
static size_t ucx_offset(uint64_t base)
{
    return (size_t)((8 - (base + size) % 8) % 8);
}

/* Waits until a request is complete, making progress; NULL: done inline. */
static ucs_status_t ucx_wait(ucs_status_ptr_t req, const char *what)
{
    ucs_status_t st;
    struct bench_spin sp;
    if (req == NULL)
        return UCS_OK;
    if (UCS_PTR_IS_ERR(req))
        return UCS_PTR_STATUS(req);
    bench_spin_init(&sp, what);
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(ux.worker);
        bench_spin(&sp);
    }
    ucp_request_free(req);
    return st;
}

/* An MPI barrier that keeps this worker progressing: the peer's endpoint
 * may need it (wire-up, a flush) while this rank waits. */
static void ucx_barrier(void)
{
    MPI_Request r;
    int done = 0;
    struct bench_spin sp;
    bench_spin_init(&sp, "the peer at a ucx-put barrier");
    MPI_Ibarrier(bench_comm, &r);
    for (;;) {
        if (ux.worker)
            ucp_worker_progress(ux.worker);
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (done)
            break;
        bench_spin(&sp);
    }
}

/* Sends len bytes to the peer and returns what it sent (malloc'd). */
static void *ucx_swap(const void *mine, size_t len, size_t *theirs_len)
{
    uint64_t n = len, m = 0;
    MPI_Sendrecv(&n, 1, MPI_UINT64_T, peer, TAG_PP, &m, 1, MPI_UINT64_T, peer, TAG_PP,
                 bench_comm, MPI_STATUS_IGNORE);
    if (n > INT_MAX || m > INT_MAX)
        bench_fatal("a UCX address or key of %llu bytes", (unsigned long long)(n > m ? n : m));
    void *theirs = malloc(m ? (size_t)m : 1);
    if (!theirs)
        bench_fatal("out of memory");
    MPI_Sendrecv(mine, (int)n, MPI_BYTE, peer, TAG_PP, theirs, (int)m, MPI_BYTE, peer, TAG_PP,
                 bench_comm, MPI_STATUS_IGNORE);
    *theirs_len = (size_t)m;
    return theirs;
}

/* Takes down whatever ucx_open set up; collective. force: the endpoint may
 * be half set up (an open that failed), so do not wait for a flush. */
static void ucx_close(int force)
{
    if (ux.rkey)
        ucp_rkey_destroy(ux.rkey);
    if (ux.ep) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0};
        ucs_status_t st = ucx_wait(ucp_ep_close_nbx(ux.ep, &prm), "a ucx-put endpoint to close");
        if (st != UCS_OK && !force)
            bench_fatal("ucp_ep_close_nbx: %s", ucs_status_string(st));
    }
    /* Neither rank unmaps memory the other may still write, nor destroys a
     * worker whose endpoint the other is closing. */
    ucx_barrier();
    if (ux.memh)
        ucp_mem_unmap(ux.ctx, ux.memh);
    if (ux.worker)
        ucp_worker_destroy(ux.worker);
    if (ux.ctx)
        ucp_cleanup(ux.ctx);
    memset(&ux, 0, sizeof ux);
}

/* Opens UCX for receive buffers of up to len bytes; collective. -1 (with a
 * note, the run goes on without ucx-put) when any rank cannot. */
static int ucx_open(size_t len)
{
    ucp_params_t cp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                             UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                               .address = NULL,
                               .length = len + 8, /* room for ucx_offset */
                               .flags = UCP_MEM_MAP_ALLOCATE};
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    const char *what = "ucp_init";
    ucs_status_t st;

    /* A handle stays NULL unless its creation succeeded: ucx_close
     * takes down what is not. */
    memset(&ux, 0, sizeof ux);
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    if ((st = ucp_init(&cp, NULL, &ctx)) == UCS_OK)
        ux.ctx = ctx;
    if (st == UCS_OK) {
        what = "ucp_worker_create";
        if ((st = ucp_worker_create(ux.ctx, &wp, &worker)) == UCS_OK)
            ux.worker = worker;
    }
    if (st == UCS_OK) {
        what = "ucp_mem_map";
        if ((st = ucp_mem_map(ux.ctx, &mp, &memh)) == UCS_OK)
            ux.memh = memh;
    }
    if (st == UCS_OK) {
        what = "ucp_mem_query";
        st = ucp_mem_query(ux.memh, &ma);
    }
    if (st == UCS_OK && ((uintptr_t)ma.address % 8 || ma.length < len + 8)) {
        what = "ucp_mem_map (an unaligned or short buffer)";
        st = UCS_ERR_NO_MEMORY;
    }
    if (agree(st == UCS_OK ? 0 : -1) != 0)
        goto fail;
    ux.rbuf = ma.address;
    memset(ux.rbuf, 0, len + 8); /* and every page touched before timing */

    /* Worker addresses, then endpoints: nothing else about UCX goes
     * through MPI. */
    ucp_address_t *addr;
    size_t alen, plen;
    if ((st = ucp_worker_get_address(ux.worker, &addr, &alen)) != UCS_OK)
        bench_fatal("ucp_worker_get_address: %s", ucs_status_string(st));
    void *paddr = ucx_swap(addr, alen, &plen);
    ucp_worker_release_address(ux.worker, addr);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS, .address = paddr};
    ucp_ep_h eph;
    what = "ucp_ep_create";
    if ((st = ucp_ep_create(ux.worker, &ep, &eph)) == UCS_OK)
        ux.ep = eph;
    free(paddr);

    /* The receive buffer's key and address. */
    void *rk = NULL, *prk;
    size_t rklen = 0, prklen;
    uint64_t mine = (uint64_t)(uintptr_t)ux.rbuf;
    if (st == UCS_OK) {
        what = "ucp_rkey_pack";
        st = ucp_rkey_pack(ux.ctx, ux.memh, &rk, &rklen);
    }
    prk = ucx_swap(rk ? rk : "", rk ? rklen : 0, &prklen); /* always: the peer waits */
    if (rk)
        ucp_rkey_buffer_release(rk);
    MPI_Sendrecv(&mine, 1, MPI_UINT64_T, peer, TAG_PP, &ux.raddr, 1, MPI_UINT64_T, peer, TAG_PP,
                 bench_comm, MPI_STATUS_IGNORE);
    if (st == UCS_OK && prklen == 0) {
        what = "the peer's ucp_rkey_pack";
        st = UCS_ERR_NO_ELEM;
    }
    if (st == UCS_OK) {
        /* UCS_ERR_UNREACHABLE here: no transport reaches the peer's memory. */
        ucp_rkey_h rkey;
        what = "ucp_ep_rkey_unpack";
        if ((st = ucp_ep_rkey_unpack(ux.ep, prk, &rkey)) == UCS_OK)
            ux.rkey = rkey;
    }
    free(prk);
    if (agree(st == UCS_OK ? 0 : -1) != 0)
        goto fail;
    return 0;

fail:
    /* Said by the rank that failed, then by rank 0 for the run's record. */
    if (st != UCS_OK)
        fprintf(stderr, "%s: rank %d: ucx-put: %s: %s\n", o.prog, bench_rank, what,
                ucs_status_string(st));
    ucx_close(1);
    bench_note("%s: ucx-put: UCX cannot be used here; skipped\n", o.prog);
    return -1;
}

/* The per-size receive buffer: the mapped one, cleared, so that nothing
 * of the last size can pass for this size's first arrival. */
static unsigned char *ucx_recv_buffer(void)
{
    unsigned char *b = ux.rbuf + ucx_offset((uint64_t)(uintptr_t)ux.rbuf);
    memset(ux.rbuf, 0, size + 8);
    /* The peer's first put of this size must not land before the clearing. */
    ucx_barrier();
    return b;
}

static void ucx_send(struct impl *m)
{
    ucp_request_param_t prm = {.op_attr_mask = 0};
    uint64_t dst = ux.raddr + ucx_offset(ux.raddr);
    ucs_status_ptr_t body = NULL, flag;
    ucs_status_t st;

    bench_fill(m->sbuf, size, m->tx_stream, ++m->tx_seq, o.check_full);
    if (size > 8) {
        body = ucp_put_nbx(ux.ep, m->sbuf, size - 8, dst, ux.rkey, &prm);
        if (UCS_PTR_IS_ERR(body))
            bench_fatal("ucp_put_nbx (body): %s", ucs_status_string(UCS_PTR_STATUS(body)));
        /* The last word must not land before the body: the target takes
         * its arrival for the arrival of the whole. Whether the fence also
         * orders puts that UCX sends over two different transports depends
         * on its version; on shared memory each put is a copy finished
         * before ucp_put_nbx returns (no request comes back), so the order
         * holds either way, and the head word the target checks would
         * catch a late body. */
        if ((st = ucp_worker_fence(ux.worker)) != UCS_OK)
            bench_fatal("ucp_worker_fence: %s", ucs_status_string(st));
    }
    flag = ucp_put_nbx(ux.ep, m->sbuf + size - 8, 8, dst + size - 8, ux.rkey, &prm);
    /* Both complete locally before the send buffer may be rewritten; on
     * shared memory they already are. */
    if ((st = ucx_wait(body, "the ucx-put body to complete locally")) != UCS_OK)
        bench_fatal("ucp_put_nbx (body): %s", ucs_status_string(st));
    if ((st = ucx_wait(flag, "the ucx-put flag to complete locally")) != UCS_OK)
        bench_fatal("ucp_put_nbx (flag): %s", ucs_status_string(st));
}

static void ucx_recv(struct impl *m)
{
    const uint64_t *tail = (const uint64_t *)(m->rbuf + size - 8);
    uint64_t want = ~bench_stamp(m->rx_stream, m->rx_seq + 1);
    struct bench_spin sp;
    bench_spin_init(&sp, "the ucx-put flag word");
    while (__atomic_load_n(tail, __ATOMIC_ACQUIRE) != want) {
        /* Shared-memory RMA needs nothing of the target; a transport that
         * does (wire-up, RMA emulated over messages) gets it here, as
         * seldom as mpi-put-lock's probe. */
        if ((sp.n & 0x3f) == 0x3f)
            ucp_worker_progress(ux.worker);
        bench_spin(&sp);
    }
    bench_check(m->rbuf, size, m->rx_stream, ++m->rx_seq, body_mode(), m->name);
}

static void ucx_run(struct impl *m, long n)
{
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            ucx_send(m);
            ucx_recv(m);
        } else {
            ucx_recv(m);
            ucx_send(m);
        }
    }
}
#endif /* HAVE_UCX */

/* ---- the shared cache line ------------------------------------------------------- */

static int cacheline_open(void)
{
    int nsize = 0, du;
    MPI_Aint sz;
    void *base;
    MPI_Comm_split_type(bench_comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &cl_comm);
    MPI_Comm_size(cl_comm, &nsize);
    if (agree(nsize == 2 ? 0 : -1) != 0) {
        bench_note("%s: the ranks share no memory: no cacheline measurement\n", o.prog);
        MPI_Comm_free(&cl_comm);
        return -1;
    }
    /* Three lines 128 bytes apart (the adjacent-line prefetcher pairs
     * lines): the shared one, then one per direction for the floors; then
     * a ring per rank for the EVENT floor. */
    MPI_Win_allocate_shared(bench_rank == 0 ? 4 * 128 + 2 * sizeof(struct floor_ring) : 0, 1,
                            MPI_INFO_NULL, cl_comm, &base, &cl_win);
    MPI_Win_shared_query(cl_win, 0, &sz, &du, &base);
    cl_line = base;
    /* The window need not start on a 128-byte boundary; the same offset
     * from it is one in every process (the mappings are page-aligned). */
    uintptr_t rings = (uintptr_t)base + 3 * 128;
    cl_rings = (struct floor_ring *)(rings + (-rings & 127));
    if (bench_rank == 0) {
        for (int k = 0; k < 3; k++)
            cl_line[k * 16] = 0;
        memset(cl_rings, 0, 2 * sizeof *cl_rings);
    }
    MPI_Barrier(cl_comm);
    cl_val = 0;
    return 0;
}

static void cacheline_run(long n)
{
    struct bench_spin sp;
    bench_spin_init(&sp, "the cache line");
    for (long i = 0; i < n; i++) {
        if (bench_rank == 0) {
            __atomic_store_n(cl_line, cl_val + 1, __ATOMIC_RELEASE);
            while (__atomic_load_n(cl_line, __ATOMIC_ACQUIRE) != cl_val + 2)
                bench_spin(&sp);
        } else {
            while (__atomic_load_n(cl_line, __ATOMIC_ACQUIRE) != cl_val + 1)
                bench_spin(&sp);
            __atomic_store_n(cl_line, cl_val + 2, __ATOMIC_RELEASE);
        }
        cl_val += 2;
    }
}

/*
 * The floors of a channel pingpong, which has a word per direction: rank 0
 * stores into line 1 and polls line 2, rank 1 the other way round. Plain:
 * each side polls for the next value (what ucx-put's receiver does).
 * Re-armed: the receiver writes the idle value back once it saw the word
 * change, as SENTINEL's re-arm does, before it answers. Nothing else: no
 * library, no callback.
 */
static void pair_run(long n, int rearm)
{
    volatile uint64_t *out = cl_line + (bench_rank == 0 ? 16 : 32),
                      *in = cl_line + (bench_rank == 0 ? 32 : 16);
    struct bench_spin sp;
    bench_spin_init(&sp, "the line pair");
    for (long i = 0; i < n; i++) {
        uint64_t v = ++cl_val; /* both ranks count alike */
        if (bench_rank == 0)
            __atomic_store_n(out, v, __ATOMIC_RELEASE);
        if (rearm) {
            while (__atomic_load_n(in, __ATOMIC_ACQUIRE) == 0)
                bench_spin(&sp);
            __atomic_store_n(in, 0, __ATOMIC_RELEASE);
        } else {
            while (__atomic_load_n(in, __ATOMIC_ACQUIRE) != v)
                bench_spin(&sp);
        }
        if (bench_rank == 1)
            __atomic_store_n(out, v, __ATOMIC_RELEASE);
    }
}

/*
 * The floor of EVENT's mechanism: each rank owns an MPSC ring of records
 * laid out as the shm provider's (struct shm_slot), and the peer puts an
 * 8-byte record into it: claim a position on the tail with a CAS, write
 * id, length and the inline body, publish the sequence; the owner waits
 * for the sequence at its head, copies the body out and publishes the new
 * head. What the provider adds around this (handle lookup, callback,
 * re-arm) is what the dchan EVENT rows cost above it.
 */
static uint64_t ring_head_seen; /* the peer ring's head as the producer last read it */

static void ring_put(struct floor_ring *r, uint64_t v)
{
    uint64_t p = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);
    for (;;) {
        if (p - ring_head_seen >= FLOOR_RING_SLOTS) {
            ring_head_seen = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
            if (p - ring_head_seen >= FLOOR_RING_SLOTS)
                continue; /* cannot happen in a pingpong: one record in flight */
        }
        if (__atomic_compare_exchange_n(&r->tail, &p, p + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
    }
    struct shm_slot *sl = &r->slot[p & (FLOOR_RING_SLOTS - 1)];
    memcpy(sl->data, &v, sizeof v);
    sl->id = 1;
    sl->len = sizeof v;
    __atomic_store_n(&sl->seq, p + 1, __ATOMIC_RELEASE);
}

static uint64_t ring_take(struct floor_ring *r, uint64_t *head, struct bench_spin *sp)
{
    struct shm_slot *sl = &r->slot[*head & (FLOOR_RING_SLOTS - 1)];
    while (__atomic_load_n(&sl->seq, __ATOMIC_ACQUIRE) != *head + 1)
        bench_spin(sp);
    uint64_t v;
    if (sl->id != 1 || sl->len != sizeof v)
        bench_fatal("ring floor: a record changed under the reader");
    memcpy(&v, sl->data, sizeof v);
    __atomic_store_n(&r->head, ++*head, __ATOMIC_RELEASE);
    return v;
}

static void ring_run(long n)
{
    static uint64_t head; /* this rank's ring: the next position it consumes */
    struct floor_ring *mine = &cl_rings[bench_rank], *theirs = &cl_rings[1 - bench_rank];
    struct bench_spin sp;
    bench_spin_init(&sp, "the ring");
    for (long i = 0; i < n; i++) {
        uint64_t v = ++cl_val;
        if (bench_rank == 0)
            ring_put(theirs, v);
        if (ring_take(mine, &head, &sp) != v)
            bench_fatal("ring floor: records out of order");
        if (bench_rank == 1)
            ring_put(theirs, v);
    }
}

static void cacheline_close(void)
{
    MPI_Win_free(&cl_win);
    MPI_Comm_free(&cl_comm);
}

/* ---- driver ------------------------------------------------------------------------ */

/* Buffers are the impl's own, allocated per size. dchan's come from its
 * context (dchan_alloc: the shared segment under shm, where a put is a
 * plain copy), as a user after speed would take them, except under a
 * "-heap" pseudo provider; a transport that must provide the receive
 * memory (UCX) does. */
static unsigned char *send_buffer(const struct impl *m)
{
    if (m->kind == K_DCHAN)
        return bench_combo_alloc(m->combo, size);
    return bench_alloc(size);
}

static void free_send_buffer(struct impl *m)
{
    if (m->kind == K_DCHAN)
        bench_combo_free(m->combo, m->sbuf);
    else
        bench_free(m->sbuf);
}

static unsigned char *recv_buffer(const struct impl *m)
{
#ifdef HAVE_UCX
    if (m->kind == K_UCX)
        return ucx_recv_buffer();
#endif
    if (m->kind == K_DCHAN)
        return bench_combo_alloc(m->combo, size);
    return bench_alloc(size);
}

static void free_recv_buffer(struct impl *m)
{
#ifdef HAVE_UCX
    if (m->kind == K_UCX)
        return; /* mapped once, for the whole run */
#endif
    if (m->kind == K_DCHAN)
        bench_combo_free(m->combo, m->rbuf);
    else
        bench_free(m->rbuf);
}

static int impl_setup(struct impl *m)
{
    m->sbuf = send_buffer(m);
    m->rbuf = recv_buffer(m);
    bench_fill_body(m->sbuf, size, m->tx_stream);
    m->tx_seq = m->rx_seq = 0;
    m->arrived = 0;
    switch (m->kind) {
    case K_DCHAN: {
        int rc = dchan_setup(m);
        if (rc != DCHAN_SUCCESS) {
            bench_note("%s: dchan over %s (%s) at %zu bytes: %s; skipped\n", o.prog,
                       m->combo->provider, m->combo->detect, size, dchan_strerror(rc));
            if (bench_rank == 0)
                printf("SKIP bench=pingpong impl=dchan provider=%s detect=%s size=%zu "
                       "reason=%s\n",
                       m->combo->provider, m->combo->detect, size, bench_rc_name(rc));
            free_send_buffer(m);
            free_recv_buffer(m);
            return 0;
        }
        break;
    }
    case K_SENDRECV:
        sendrecv_setup(m);
        break;
    case K_PSCW:
        pscw_setup(m);
        break;
    case K_LOCK:
        lock_setup(m);
        break;
#ifdef HAVE_UCX
    case K_UCX:
        break; /* UCX was set up once, by ucx_open */
#endif
    }
    return 1;
}

static void impl_run(struct impl *m, long n)
{
    switch (m->kind) {
    case K_DCHAN:
        dchan_run(m, n);
        break;
    case K_SENDRECV:
        sendrecv_run(m, n);
        break;
    case K_PSCW:
        pscw_run(m, n);
        break;
    case K_LOCK:
        lock_run(m, n);
        break;
#ifdef HAVE_UCX
    case K_UCX:
        ucx_run(m, n);
        break;
#endif
    }
}

static void impl_teardown(struct impl *m)
{
    /* One more round trip, untimed, whose messages are checked whole where
     * the timed ones were checked (before a re-arm rewrites a sentinel). */
    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_FIXED;
    impl_run(m, 1);
    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
    switch (m->kind) {
    case K_DCHAN:
        dchan_teardown(m);
        break;
    case K_SENDRECV:
        sendrecv_teardown(m);
        break;
    case K_PSCW:
        pscw_teardown(m);
        break;
    case K_LOCK:
        lock_teardown(m);
        break;
#ifdef HAVE_UCX
    case K_UCX:
        break; /* the last arrival was seen: no put is in flight */
#endif
    }
    MPI_Barrier(bench_comm);
    free_send_buffer(m);
    free_recv_buffer(m);
}

static const char *label(const struct impl *m, char *buf, size_t len)
{
    if (m->kind == K_DCHAN)
        snprintf(buf, len, "dchan:%s/%s", m->combo->provider, m->combo->detect);
    else
        snprintf(buf, len, "%s", m->name);
    return buf;
}

static void result_line(const struct impl *m, size_t sz, double med, double min, double max)
{
    printf("RESULT bench=pingpong impl=%s provider=%s detect=%s size=%zu oneway_us=%.4f "
           "min_us=%.4f max_us=%.4f\n",
           m->name, m->kind == K_DCHAN ? m->combo->provider : "-",
           m->kind == K_DCHAN ? m->combo->detect : "-", sz, med, min, max);
    fflush(stdout);
}

#ifdef HAVE_UCX
#define UCX_BUILT "In this build."
#else
#define UCX_BUILT "Not in this build (configured without UCX)."
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: mpirun -np 2 dchan_pingpong [options]\n"
            "One-way latency of dchan beside MPI two-sided and one-sided, on 2 ranks.\n"
            "Implementations (--impls): dchan, mpi-sendrecv, mpi-put-pscw, mpi-put-lock,\n"
            "ucx-put, cacheline. Default sizes: 8 1024 100 1000 5000 10000 20000 30000\n"
            "40000 70000 100000 500000 and 2 KiB .. 64 MiB in powers of two. --iters\n"
            "(default 10000) round trips per size, fewer at large sizes so that at most\n"
            "--budget bytes (default 512M) go each way; never fewer than --reps (default\n"
            "25). --warmup (default 1000) is cut down in proportion.\n"
            "ucx-put: raw UCX puts; UCX picks its transports itself, shared memory (sysv,\n"
            "posix) between ranks of one node; UCX_TLS overrides (e.g. UCX_TLS=posix, or\n"
            "tcp). Skipped if UCX cannot open. " UCX_BUILT "\n"
            "cacheline: one line bounced between the ranks, then the floors of a pingpong\n"
            "with a word per direction: cacheline-pair (polling for the next value) and\n"
            "cacheline-rearm (the receiver writes the idle value back, as SENTINEL does),\n"
            "and ring (an 8-byte record through an MPSC ring like shm's EVENT ring).\n\n%s"
            "  --budget BYTES    bytes per direction per implementation and size\n",
            bench_common_help);
}

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        BENCH_LONGOPTS, {"budget", required_argument, NULL, BENCH_OPT_FIRST_PRIVATE}, {0}};
    int c, list = 0;

    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (bench_common_opt(&o, c, optarg) == 0)
            continue;
        if (c == BENCH_OPT_HELP) {
            usage(stdout);
            return 0;
        } else if (c == BENCH_OPT_LIST) {
            list = 1;
        } else if (c == BENCH_OPT_FIRST_PRIVATE) {
            budget = bench_parse_bytes(&o, optarg, "--budget");
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    if (list) {
        bench_list_providers(stdout);
        return 0;
    }
    if (!o.sizes) {
        o.nsizes = (int)(sizeof default_sizes / sizeof default_sizes[0]);
        o.sizes = malloc(sizeof default_sizes);
        if (!o.sizes)
            return 1;
        memcpy(o.sizes, default_sizes, sizeof default_sizes);
    }
    qsort(o.sizes, (size_t)o.nsizes, sizeof *o.sizes, cmp_size);
    for (int i = 0; i < o.nsizes; i++) {
        if (o.sizes[i] > (size_t)1 << 30) {
            fprintf(stderr, "%s: sizes above 1 GiB are not supported\n", o.prog);
            return 2;
        }
    }

    body_check = o.check_full ? BENCH_BODY_SEQ : BENCH_BODY_NONE;
    bench_mpi_init(&argc, &argv, &o);
    if (bench_nranks != 2)
        bench_fatal("needs exactly 2 ranks (mpirun -np 2), not %d", bench_nranks);
    peer = 1 - bench_rank;
    {
        MPI_Group world;
        MPI_Comm_group(bench_comm, &world);
        MPI_Group_incl(world, 1, &peer, &peer_group);
        MPI_Group_free(&world);
    }

    struct bench_combo *combos = NULL;
    int ncombos = 0, failed = 0;
    if (bench_in_list(o.impls, "dchan"))
        bench_combos_open(&o, "pingpong", 0, &combos, &ncombos, &failed);

    static const struct {
        enum kind kind;
        const char *name;
    } peers[] = {{K_SENDRECV, "mpi-sendrecv"}, {K_PSCW, "mpi-put-pscw"}, {K_LOCK, "mpi-put-lock"}};
    int nimpl = 0, maximpl = ncombos + (int)(sizeof peers / sizeof peers[0]) + 1;
    struct impl *impls = calloc((size_t)maximpl, sizeof *impls);
    if (!impls)
        bench_fatal("out of memory");
    for (int i = 0; i < ncombos; i++) {
        impls[nimpl].kind = K_DCHAN;
        impls[nimpl].name = "dchan";
        impls[nimpl].combo = &combos[i];
        nimpl++;
    }
    for (size_t i = 0; i < sizeof peers / sizeof peers[0]; i++) {
        if (!bench_in_list(o.impls, peers[i].name))
            continue;
        impls[nimpl].kind = peers[i].kind;
        impls[nimpl].name = peers[i].name;
        nimpl++;
    }
    /* UCX is opened once for the whole run, at the largest size. */
#ifdef HAVE_UCX
    int have_ucx = 0;
    if (bench_in_list(o.impls, "ucx-put") && ucx_open(o.sizes[o.nsizes - 1]) == 0) {
        impls[nimpl].kind = K_UCX;
        impls[nimpl].name = "ucx-put";
        nimpl++;
        have_ucx = 1;
    }
#else
    if (o.impls && bench_in_list(o.impls, "ucx-put"))
        bench_note("%s: ucx-put: not in this build (configured without UCX); skipped\n",
                   o.prog);
#endif
    for (int i = 0; i < nimpl; i++) {
        struct impl *m = &impls[i];
        m->tx_stream = (unsigned)(2 * i + bench_rank);
        m->rx_stream = (unsigned)(2 * i + peer);
        m->med = calloc((size_t)o.nsizes, sizeof(double));
        m->min = calloc((size_t)o.nsizes, sizeof(double));
        m->max = calloc((size_t)o.nsizes, sizeof(double));
        m->valid = calloc((size_t)o.nsizes, sizeof(int));
        if (!m->med || !m->min || !m->max || !m->valid)
            bench_fatal("out of memory");
    }
    int have_cl = bench_in_list(o.impls, "cacheline") && cacheline_open() == 0;
    double *samples = calloc((size_t)o.reps * (size_t)(nimpl + 1), sizeof(double));
    double *cl_med = calloc((size_t)o.nsizes, sizeof(double));
    if (!samples || !cl_med)
        bench_fatal("out of memory");

    bench_note("%s: %d implementation(s), %d size(s), %d repetitions each%s\n", o.prog, nimpl,
               o.nsizes, o.reps, o.check_full ? ", every byte checked (timings not comparable)"
                                              : "");

    /* The physical floor first, measured on its own. */
    const long cl_iters = o.iters < 1000 ? o.iters : 1000;
    double cl_all = 0;
    if (have_cl) {
        double mn, mx;
        cacheline_run(o.warmup);
        MPI_Barrier(bench_comm);
        for (int r = 0; r < o.reps; r++) {
            uint64_t t0 = bench_now_ns();
            cacheline_run(o.iters);
            samples[r] = (double)(bench_now_ns() - t0) / (double)o.iters / 2 / 1000;
        }
        bench_stats(samples, o.reps, &cl_all, &mn, &mx);
        if (bench_rank == 0) {
            printf("RESULT bench=pingpong impl=cacheline provider=- detect=- size=8 "
                   "oneway_us=%.4f min_us=%.4f max_us=%.4f\n",
                   cl_all, mn, mx);
            fflush(stdout);
        }
        bench_note("cacheline: one-way %.1f ns [%.1f-%.1f]\n", cl_all * 1000, mn * 1000,
                   mx * 1000);
        static const char *const floor_name[3] = {"cacheline-pair", "cacheline-rearm",
                                                  "ring"};
        for (int k = 0; k < 3; k++) {
            double med;
            if (k == 1) { /* the plain run left its last values: each clears its own */
                cl_line[bench_rank == 0 ? 32 : 16] = 0;
                MPI_Barrier(bench_comm);
            }
            if (k < 2)
                pair_run(o.warmup, k);
            else
                ring_run(o.warmup);
            MPI_Barrier(bench_comm);
            for (int r = 0; r < o.reps; r++) {
                uint64_t t0 = bench_now_ns();
                if (k < 2)
                    pair_run(o.iters, k);
                else
                    ring_run(o.iters);
                samples[r] = (double)(bench_now_ns() - t0) / (double)o.iters / 2 / 1000;
            }
            bench_stats(samples, o.reps, &med, &mn, &mx);
            if (bench_rank == 0) {
                printf("RESULT bench=pingpong impl=%s provider=- detect=- size=8 "
                       "oneway_us=%.4f min_us=%.4f max_us=%.4f\n",
                       floor_name[k], med, mn, mx);
                fflush(stdout);
            }
            bench_note("%s: one-way %.1f ns [%.1f-%.1f]\n", floor_name[k], med * 1000,
                       mn * 1000, mx * 1000);
        }
    }

    for (int si = 0; si < o.nsizes; si++) {
        size = o.sizes[si];
        long n = bench_scale(o.iters, size, budget, o.reps);
        long per = n / o.reps > 0 ? n / o.reps : 1;
        long warm = o.warmup > 0 ? (o.warmup * per * o.reps + o.iters - 1) / o.iters : 0;

        for (int i = 0; i < nimpl; i++)
            impls[i].on = impl_setup(&impls[i]);
        for (int i = 0; i < nimpl; i++)
            if (impls[i].on)
                impl_run(&impls[i], warm);
        if (have_cl)
            cacheline_run(cl_iters / 10);
        MPI_Barrier(bench_comm);
        /* Taking turns: repetition r of every implementation, then r + 1. */
        for (int r = 0; r < o.reps; r++) {
            for (int i = 0; i < nimpl; i++) {
                if (!impls[i].on)
                    continue;
                uint64_t t0 = bench_now_ns();
                impl_run(&impls[i], per);
                samples[i * o.reps + r] =
                    (double)(bench_now_ns() - t0) / (double)per / 2 / 1000;
            }
            if (have_cl) {
                uint64_t t0 = bench_now_ns();
                cacheline_run(cl_iters);
                samples[nimpl * o.reps + r] =
                    (double)(bench_now_ns() - t0) / (double)cl_iters / 2 / 1000;
            }
        }
        for (int i = 0; i < nimpl; i++)
            if (impls[i].on)
                impl_teardown(&impls[i]);

        if (bench_rank == 0) {
            char lb[96];
            fprintf(stderr, "%9zu B:", size);
            for (int i = 0; i < nimpl; i++) {
                struct impl *m = &impls[i];
                if (!m->on)
                    continue;
                bench_stats(&samples[i * o.reps], o.reps, &m->med[si], &m->min[si],
                            &m->max[si]);
                m->valid[si] = 1;
                result_line(m, size, m->med[si], m->min[si], m->max[si]);
                fprintf(stderr, "  %s %.3f", label(m, lb, sizeof lb), m->med[si]);
            }
            if (have_cl) {
                double mn, mx;
                bench_stats(&samples[nimpl * o.reps], o.reps, &cl_med[si], &mn, &mx);
                fprintf(stderr, "  (cacheline %.0f ns)", cl_med[si] * 1000);
            }
            fprintf(stderr, "  [%ld round trips]\n", per * o.reps);
        }
    }

    /* The readable summary, with the ratios of each dchan row to each peer. */
    if (bench_rank == 0) {
        char lb[96];
        fprintf(stderr, "\none-way latency in us: median [min-max] over %d repetitions\n",
                o.reps);
        fprintf(stderr, "%10s", "size");
        for (int i = 0; i < nimpl; i++)
            fprintf(stderr, " %26s", label(&impls[i], lb, sizeof lb));
        fprintf(stderr, "%s\n", have_cl ? "  cacheline ns" : "");
        for (int si = 0; si < o.nsizes; si++) {
            fprintf(stderr, "%10zu", o.sizes[si]);
            for (int i = 0; i < nimpl; i++) {
                struct impl *m = &impls[i];
                char cell[64];
                if (m->valid[si])
                    snprintf(cell, sizeof cell, "%.3f [%.3f-%.3f]", m->med[si], m->min[si],
                             m->max[si]);
                else
                    snprintf(cell, sizeof cell, "-");
                fprintf(stderr, " %26s", cell);
            }
            if (have_cl)
                fprintf(stderr, "  %12.0f", cl_med[si] * 1000);
            fprintf(stderr, "\n");
        }
        for (int d = 0; d < nimpl; d++) {
            if (impls[d].kind != K_DCHAN)
                continue;
            fprintf(stderr, "\nratio %s / peer (median / median; < 1: dchan is faster)\n",
                    label(&impls[d], lb, sizeof lb));
            fprintf(stderr, "%10s", "size");
            for (int i = 0; i < nimpl; i++)
                if (impls[i].kind != K_DCHAN)
                    fprintf(stderr, " %14s", impls[i].name);
            fprintf(stderr, "\n");
            for (int si = 0; si < o.nsizes; si++) {
                fprintf(stderr, "%10zu", o.sizes[si]);
                for (int i = 0; i < nimpl; i++) {
                    if (impls[i].kind == K_DCHAN)
                        continue;
                    if (impls[d].valid[si] && impls[i].valid[si] && impls[i].med[si] > 0)
                        fprintf(stderr, " %14.2f", impls[d].med[si] / impls[i].med[si]);
                    else
                        fprintf(stderr, " %14s", "-");
                }
                fprintf(stderr, "\n");
            }
        }
        if (have_cl)
            fprintf(stderr, "\ncacheline one-way at the start: %.1f ns\n", cl_all * 1000);
    }

    if (have_cl)
        cacheline_close();
#ifdef HAVE_UCX
    if (have_ucx)
        ucx_close(0);
#endif
    for (int i = 0; i < nimpl; i++) {
        free(impls[i].med);
        free(impls[i].min);
        free(impls[i].max);
        free(impls[i].valid);
    }
    free(impls);
    free(samples);
    free(cl_med);
    bench_combos_close(combos, ncombos);
    MPI_Group_free(&peer_group);
    free(o.sizes);
    bench_mpi_finalize();
    return failed ? 1 : 0;
}
