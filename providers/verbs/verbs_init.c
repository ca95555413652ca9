/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * verbs provider: device, port and GID choice, the resources of a context
 * (PD, CQs, SRQ, two RC QPs per peer), the address exchange and the ops
 * table. Everything is discovered from the device and port; the DCHAN_VERBS_*
 * parameters (lib/params.def) only narrow it.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "params.h"
#include "verbs.h"
#include "wire.h"

extern const struct dchan_provider_ops dchan_verbs_ops;

/* The address blob every rank publishes (little-endian): a header, then for
 * each rank r the QPNs of this rank's data and control QPs dedicated to r.
 * Header: magic, version, RoCE, port, MTU (bytes 0..7), LID (8), nranks
 * (12), GID (16), then the credit area: address (32), rkey (40) and words
 * per rank (44), the get area: address (48), rkey (56), and the RDMA READs
 * the rank's QPs serve at once (60, 16 bits). */
#define VRB_ADDR_MAGIC 0x41425256u /* "VRBA" */
#define VRB_ADDR_VERSION 3
#define VRB_ADDR_HDR 64
#define VRB_ADDR_PER_RANK 8

/* ---- parameters ------------------------------------------------------------------ */

uint64_t dchan_verbs_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- errors ---------------------------------------------------------------------- */

int dchan_verbs_rc(struct vrb_state *s, int kind, int value, const char *what)
{
    const dchan_ctx_t *ctx = s ? s->p->ctx : NULL;
    int rc;

    if (value == 0)
        return DCHAN_SUCCESS;
    if (kind == VRB_WC) {
        switch (value) {
        case IBV_WC_WR_FLUSH_ERR:
            return DCHAN_ERR_AGAIN; /* not a failure of its own: re-issued */
        case IBV_WC_REM_ACCESS_ERR:
            /* The receiver's memory key refused the write: a destroyed
             * receive handle, or a wire that was not the receiver's. */
            rc = DCHAN_ERR_HANDLE;
            break;
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR:
        case IBV_WC_RESP_TIMEOUT_ERR:
        case IBV_WC_REM_ABORT_ERR:
            rc = DCHAN_ERR_PEER;
            break;
        default:
            rc = DCHAN_ERR_PROVIDER;
            break;
        }
        if (what)
            dchan_warn(ctx, VRB_NAME, "%s: %s (wc status %d)", what,
                       ibv_wc_status_str((enum ibv_wc_status)value), value);
        return rc;
    }
    switch (value) {
    case ENOMEM:
    case ENOSPC:
        rc = DCHAN_ERR_NO_MEMORY;
        break;
    case EFAULT:
        rc = DCHAN_ERR_INVALID_ARG;
        break;
    case ENODEV:
    case ENOSYS:
    case EOPNOTSUPP:
    case EPROTONOSUPPORT:
        rc = DCHAN_ERR_UNSUPPORTED;
        break;
    case ETIMEDOUT:
        rc = DCHAN_ERR_PEER;
        break;
    default:
        rc = DCHAN_ERR_PROVIDER;
        break;
    }
    if (what)
        dchan_warn(ctx, VRB_NAME, "%s: %s", what, strerror(value));
    return rc;
}

/* ---- QPN lookup (receive completions name the local QP) ----------------------------- */

static uint32_t qpn_hash(uint32_t qpn)
{
    return qpn * 0x9e3779b1u;
}

static void qpn_add(struct vrb_state *s, uint32_t qpn, uint32_t val)
{
    uint32_t i = qpn_hash(qpn) & s->qpn_mask;
    while (s->qpn_key[i])
        i = (i + 1) & s->qpn_mask;
    s->qpn_key[i] = qpn;
    s->qpn_val[i] = val;
}

bool dchan_verbs_qpn_lookup(const struct vrb_state *s, uint32_t qpn, struct vrb_conn **c,
                            bool *ctl)
{
    for (uint32_t i = qpn_hash(qpn) & s->qpn_mask; s->qpn_key[i]; i = (i + 1) & s->qpn_mask) {
        if (s->qpn_key[i] == qpn) {
            *c = &s->conns[s->qpn_val[i] >> 1];
            *ctl = s->qpn_val[i] & 1;
            return true;
        }
    }
    return false;
}

/* ---- device, port and GID ------------------------------------------------------------ */

static const char *link_name(const struct ibv_port_attr *pa)
{
    return pa->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand";
}

/* Opens the device and port to use: DCHAN_VERBS_DEVICE / _PORT, or the first
 * active InfiniBand or Ethernet port. iWARP cannot carry immediates. */
static int pick_port(const struct dchan_params *pv, struct ibv_context **out_ctx,
                     uint8_t *out_port, struct ibv_port_attr *out_pa,
                     struct ibv_device_attr *out_dev, char *why, size_t wl)
{
    const char *want = pv->VERBS_DEVICE;
    unsigned long want_port = pv->VERBS_PORT;
    struct ibv_device **list;
    int n = 0;

    list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        snprintf(why, wl, "no RDMA device (%s)", list ? "empty device list" : strerror(errno));
        if (list)
            ibv_free_device_list(list);
        return DCHAN_ERR_UNSUPPORTED;
    }
    if (want[0])
        snprintf(why, wl, "device %s not found, or without an active port%s", want,
                 want_port ? " of the number DCHAN_VERBS_PORT gives" : "");
    else
        snprintf(why, wl, "no active InfiniBand or RoCE port%s on %d device(s)",
                 want_port ? " of the number DCHAN_VERBS_PORT gives" : "", n);
    for (int d = 0; d < n; d++) {
        struct ibv_device *dev = list[d];
        struct ibv_device_attr da;
        struct ibv_context *ctx;

        if (want[0] && strcmp(ibv_get_device_name(dev), want) != 0)
            continue;
        if (dev->transport_type != IBV_TRANSPORT_IB)
            continue; /* iWARP, usNIC, ...: no RC write-with-immediate semantics */
        ctx = ibv_open_device(dev);
        if (!ctx)
            continue;
        if (ibv_query_device(ctx, &da) != 0) {
            ibv_close_device(ctx);
            continue;
        }
        for (unsigned port = 1; port <= da.phys_port_cnt; port++) {
            struct ibv_port_attr pa;
            if (want_port && port != want_port)
                continue;
            if (ibv_query_port(ctx, (uint8_t)port, &pa) != 0 || pa.state != IBV_PORT_ACTIVE)
                continue;
            if (pa.link_layer != IBV_LINK_LAYER_ETHERNET && pa.lid == 0)
                continue; /* InfiniBand without a LID: no subnet manager yet */
            *out_ctx = ctx;
            *out_port = (uint8_t)port;
            *out_pa = pa;
            *out_dev = da;
            ibv_free_device_list(list);
            return DCHAN_SUCCESS;
        }
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    return DCHAN_ERR_UNSUPPORTED;
}

static bool gid_zero(const union ibv_gid *g)
{
    static const union ibv_gid zero;
    return memcmp(g, &zero, sizeof zero) == 0;
}

static bool gid_ipv4(const union ibv_gid *g)
{
    static const unsigned char pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, pfx, sizeof pfx) == 0;
}

/* How good a GID table entry is for RoCE: v2 (routable UDP) before v1, and
 * an IPv4-mapped address first, as most RoCE fabrics are routed over IPv4. */
static int gid_score(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
#if HAVE_DECL_IBV_QUERY_GID_EX && HAVE_DECL_IBV_GID_TYPE_ROCE_V2
    struct ibv_gid_entry e;
    if (ibv_query_gid_ex(ctx, port, (uint32_t)index, &e, 0) != 0 || gid_zero(&e.gid))
        return -1;
    *gid = e.gid;
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2)
        return gid_ipv4(gid) ? 4 : 3;
    return gid_ipv4(gid) ? 2 : 1;
#else
    if (ibv_query_gid(ctx, port, index, gid) != 0 || gid_zero(gid))
        return -1;
    return gid_ipv4(gid) ? 2 : 1;
#endif
}

static int pick_gid(struct vrb_state *s, char *why, size_t wl)
{
    const char *want = s->pv->VERBS_GID_INDEX;
    int best = -1, best_score = -1;

    if (want[0] && strcmp(want, "auto") != 0) {
        char *end;
        unsigned long v = strtoul(want, &end, 10);
        if (*end || end == want || v >= (unsigned long)s->port.gid_tbl_len) {
            snprintf(why, wl, "DCHAN_VERBS_GID_INDEX=%s: expected auto or an index below %d",
                     want, s->port.gid_tbl_len);
            return DCHAN_ERR_INVALID_ARG;
        }
        if (gid_score(s->ctx, s->port_num, (int)v, &s->gid) < 0) {
            snprintf(why, wl, "GID index %lu of %s port %u is empty", v, s->devname,
                     s->port_num);
            return DCHAN_ERR_INVALID_ARG;
        }
        s->gid_index = (int)v;
        return DCHAN_SUCCESS;
    }
    if (!s->roce) {
        /* The port GID; used only when the peer is on another subnet. */
        s->gid_index = 0;
        if (ibv_query_gid(s->ctx, s->port_num, 0, &s->gid) != 0)
            memset(&s->gid, 0, sizeof s->gid);
        return DCHAN_SUCCESS;
    }
    for (int i = 0; i < s->port.gid_tbl_len; i++) {
        union ibv_gid g;
        int sc = gid_score(s->ctx, s->port_num, i, &g);
        if (sc > best_score) {
            best = i;
            best_score = sc;
            s->gid = g;
        }
    }
    if (best < 0) {
        snprintf(why, wl, "no valid GID on RoCE port %s:%u", s->devname, s->port_num);
        return DCHAN_ERR_UNSUPPORTED;
    }
    s->gid_index = best;
    return DCHAN_SUCCESS;
}

/* The ACK timeout must cover the responder's ACK delay (local_ca_ack_delay,
 * taken as the peer's too) and the round trip; 2^14 * 4.096 us = 67 ms is
 * the floor most fabrics use. */
static uint8_t derive_timeout(const struct ibv_device_attr *da)
{
    unsigned t = (unsigned)da->local_ca_ack_delay + 1;
    if (t < 14)
        t = 14;
    return (uint8_t)(t > 31 ? 31 : t);
}

static int read_params(struct vrb_state *s, char *why, size_t wl)
{
    unsigned long timeout = s->pv->VERBS_TIMEOUT, retry = s->pv->VERBS_RETRY_CNT;
    unsigned long sl = s->pv->VERBS_SL, tc = s->pv->VERBS_TRAFFIC_CLASS;

    unsigned long sq = s->pv->VERBS_SQ_DEPTH, srq = s->pv->VERBS_SRQ_DEPTH;

    if (timeout > 31 || retry > 7 || sl > 15 || tc > 255) {
        snprintf(why, wl,
                 "DCHAN_VERBS_TIMEOUT (0..31), _RETRY_CNT (0..7), _SL (0..15) or "
                 "_TRAFFIC_CLASS (0..255) out of range");
        return DCHAN_ERR_INVALID_ARG;
    }
    /* Below these the provider cannot work (a device's limits may lower the
     * defaults further, and say so). */
    if ((sq && sq < 4) || (srq && srq < 2 * VRB_SRQ_BATCH)) {
        snprintf(why, wl, "DCHAN_VERBS_%s=%lu: at least %d", sq && sq < 4 ? "SQ_DEPTH" : "SRQ_DEPTH",
                 sq && sq < 4 ? sq : srq, sq && sq < 4 ? 4 : 2 * VRB_SRQ_BATCH);
        return DCHAN_ERR_INVALID_ARG;
    }
    s->timeout = (uint8_t)timeout;
    s->retry_cnt = (uint8_t)retry;
    s->sl = (uint8_t)sl;
    s->tclass = (uint8_t)tc;
    /* 0.64 ms: the SRQ is refilled by progress, which a busy peer may call
     * late; with rnr_retry 7 (forever) an empty SRQ only delays a put. */
    s->min_rnr = 12;
    s->trust_in_order = s->pv->VERBS_IN_ORDER != 0;
    s->keepalive_ns = s->pv->VERBS_KEEPALIVE_MS * 1000000ull;
    s->event_split = s->pv->VERBS_EVENT_SPLIT;
    return DCHAN_SUCCESS;
}

/* ---- probe ---------------------------------------------------------------------------- */

static void describe(char *out, size_t len, const char *dev, uint8_t port,
                     const struct ibv_port_attr *pa, int gid_index)
{
    if (pa->link_layer == IBV_LINK_LAYER_ETHERNET)
        snprintf(out, len, "rdma-core libibverbs: %s port %u, RoCE GID index %d, MTU %d", dev,
                 port, gid_index, 128 << pa->active_mtu);
    else
        snprintf(out, len, "rdma-core libibverbs: %s port %u, InfiniBand LID %u, MTU %d", dev,
                 port, pa->lid, 128 << pa->active_mtu);
}

static int vrb_probe(struct dchan_probe *out)
{
    struct vrb_state s; /* only what the device and GID choice need */
    char why[128];

    memset(&s, 0, sizeof s);
    out->modes = dchan_verbs_ops.modes;
    out->default_detect = DCHAN_DETECT_EVENT;
    s.pv = dchan_probe_params();
    if (!s.pv) {
        snprintf(out->desc, sizeof out->desc, "a DCHAN_* variable is malformed (see dchan_info -e)");
        return DCHAN_ERR_INVALID_ARG;
    }
    int rc = pick_port(s.pv, &s.ctx, &s.port_num, &s.port, &s.dev, why, sizeof why);
    if (rc == DCHAN_SUCCESS) {
        snprintf(s.devname, sizeof s.devname, "%s", ibv_get_device_name(s.ctx->device));
        s.roce = s.port.link_layer == IBV_LINK_LAYER_ETHERNET;
        rc = pick_gid(&s, why, sizeof why);
    }
    if (rc == DCHAN_SUCCESS)
        describe(out->desc, sizeof out->desc, s.devname, s.port_num, &s.port, s.gid_index);
    else
        snprintf(out->desc, sizeof out->desc, "rdma-core libibverbs: %s", why);
    if (s.ctx)
        ibv_close_device(s.ctx);
    return rc;
}

/* ---- teardown ------------------------------------------------------------------------- */

/* Releases whatever exists, in reverse order of creation; used by a failed
 * open and by close. */
static void vrb_free(struct vrb_state *s)
{
    if (s->conns) {
        for (int r = 0; r < s->nranks; r++) {
            struct vrb_conn *c = &s->conns[r];
            if (c->ctl)
                ibv_destroy_qp(c->ctl);
            if (c->qp)
                ibv_destroy_qp(c->qp);
            free(c->ring);
        }
    }
    if (s->gstage_mr)
        ibv_dereg_mr(s->gstage_mr);
    if (s->garea_mr)
        ibv_dereg_mr(s->garea_mr);
    if (s->cstage_mr)
        ibv_dereg_mr(s->cstage_mr);
    if (s->carea_mr)
        ibv_dereg_mr(s->carea_mr);
    if (s->srq)
        ibv_destroy_srq(s->srq);
    if (s->rcq)
        ibv_destroy_cq(s->rcq);
    if (s->scq)
        ibv_destroy_cq(s->scq);
    if (s->wch)
        ibv_destroy_comp_channel(s->wch);
    if (s->pd)
        ibv_dealloc_pd(s->pd);
    if (s->ctx)
        ibv_close_device(s->ctx);
    free(s->conns);
    free(s->qpn_key);
    free(s->qpn_val);
    free(s->wr);
    free(s->sge);
    free(s->addr);
    free(s->carea);
    free(s->cstage);
    free(s->garea);
    free(s->gstage);
    free(s);
}

/* Page-aligned, zeroed words for the credit area or its staging copy,
 * registered with the access given (never relaxed ordering: the sender
 * reads its words from memory). */
static int credit_mem(struct vrb_state *s, size_t len, int access, uint64_t **mem,
                      struct ibv_mr **mr)
{
    void *p = NULL;
    int rc = posix_memalign(&p, 4096, len);
    if (rc)
        return dchan_verbs_rc(s, VRB_ERRNO, rc, "allocating the credit area");
    memset(p, 0, len);
    *mem = p;
    *mr = ibv_reg_mr(s->pd, p, len, access);
    if (!*mr)
        return dchan_verbs_rc(s, VRB_ERRNO, errno ? errno : ENOMEM, "ibv_reg_mr (credit area)");
    return DCHAN_SUCCESS;
}

/* ---- open ------------------------------------------------------------------------------- */

static struct ibv_qp *make_qp(struct vrb_state *s, uint32_t depth, uint32_t sge,
                              uint32_t *inline_io, struct ibv_qp_cap *granted)
{
    struct ibv_qp_init_attr a;
    struct ibv_qp *qp = NULL;

    /* Devices cap max_inline_data (and the SGEs next to it) differently,
     * and some reject what they cannot give: halve the inline request
     * until the device accepts it, then the SGEs. */
    for (;; sge /= 2) {
        for (uint32_t inl = *inline_io;; inl /= 2) {
            memset(&a, 0, sizeof a);
            a.send_cq = s->scq;
            a.recv_cq = s->rcq;
            a.srq = s->srq;
            a.qp_type = IBV_QPT_RC;
            a.sq_sig_all = 0;
            a.cap.max_send_wr = depth;
            a.cap.max_send_sge = sge;
            a.cap.max_inline_data = inl;
            qp = ibv_create_qp(s->pd, &a);
            if (qp || errno != EINVAL || inl == 0)
                break;
        }
        if (qp || errno != EINVAL || sge <= 1)
            break;
    }
    if (qp) {
        *inline_io = a.cap.max_inline_data;
        *granted = a.cap;
    }
    return qp;
}

static int vrb_open(struct dchan_prov *p)
{
    struct vrb_state *s = calloc(1, sizeof *s);
    struct ibv_srq_init_attr sa;
    char why[160] = "";
    int rc;

    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    s->p = p;
    s->rank = dchan_ctx_rank(p->ctx);
    s->nranks = dchan_ctx_nranks(p->ctx);
    s->pv = dchan_ctx_params(p->ctx);
    rc = read_params(s, why, sizeof why);
    if (rc != DCHAN_SUCCESS)
        goto fail;
    rc = pick_port(s->pv, &s->ctx, &s->port_num, &s->port, &s->dev, why, sizeof why);
    if (rc != DCHAN_SUCCESS)
        goto fail;
    snprintf(s->devname, sizeof s->devname, "%s", ibv_get_device_name(s->ctx->device));
    s->roce = s->port.link_layer == IBV_LINK_LAYER_ETHERNET;
    rc = pick_gid(s, why, sizeof why);
    if (rc != DCHAN_SUCCESS)
        goto fail;
    if (s->timeout == 0)
        s->timeout = derive_timeout(&s->dev);

    /* Affiliated errors and fatal events are read from progress, never
     * waited for. */
    int fl = fcntl(s->ctx->async_fd, F_GETFL);
    if (fl < 0 || fcntl(s->ctx->async_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "making the async event fd non-blocking");
        goto fail;
    }

    /* Limits: two QPs per peer, one send CQ for all of them (flushes
     * complete every outstanding WR, so it must hold them all), one SRQ. */
    uint32_t n = (uint32_t)s->nranks;
    if ((uint64_t)s->dev.max_qp < 2ull * n || s->dev.max_srq < 1) {
        snprintf(why, sizeof why, "%s offers %d QPs and %d SRQs; %u QPs and an SRQ are needed",
                 s->devname, s->dev.max_qp, s->dev.max_srq, 2 * n);
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }
    uint64_t sq = s->pv->VERBS_SQ_DEPTH;
    if (sq == 0)
        sq = 256;
    if (sq > (uint64_t)s->dev.max_qp_wr)
        sq = (uint64_t)s->dev.max_qp_wr;
    uint64_t per_conn = (uint64_t)s->dev.max_cqe / n;
    if (sq + VRB_CTL_DEPTH > per_conn)
        sq = per_conn > VRB_CTL_DEPTH ? per_conn - VRB_CTL_DEPTH : 0;
    if (sq < 4) {
        snprintf(why, sizeof why, "%u ranks need more than the %d entries of one CQ of %s", n,
                 s->dev.max_cqe, s->devname);
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }
    uint64_t srq = s->pv->VERBS_SRQ_DEPTH;
    if (srq == 0)
        srq = 1024;
    if (srq > (uint64_t)s->dev.max_srq_wr)
        srq = (uint64_t)s->dev.max_srq_wr;
    /* Half the CQ at most: a device rounding the SRQ up (to a power of
     * two) still leaves a receive CQ entry for every receive it holds. */
    if (2 * srq + 2 * VRB_SRQ_BATCH > (uint64_t)s->dev.max_cqe)
        srq = ((uint64_t)s->dev.max_cqe - 2 * VRB_SRQ_BATCH) / 2;
    if (srq < 2 * VRB_SRQ_BATCH) {
        snprintf(why, sizeof why, "%s: shared receive queue too small", s->devname);
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }

    s->pd = ibv_alloc_pd(s->ctx);
    if (!s->pd) {
        rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "ibv_alloc_pd");
        goto fail;
    }
    /* The credit area peers write into (DESIGN §7). */
    s->cw = (uint32_t)s->pv->CREDIT_WORDS;
    s->carea_len = (size_t)n * s->cw * sizeof(uint64_t);
    rc = credit_mem(s, s->carea_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &s->carea,
                    &s->carea_mr);
    if (rc != DCHAN_SUCCESS)
        goto fail;
    /* The get area sources push their published words into, and the copy
     * those words are sent from where they cannot go inline. */
    s->garea_len = (size_t)n * VRB_GET_SLOTS * sizeof(uint64_t);
    rc = credit_mem(s, s->garea_len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &s->garea,
                    &s->garea_mr);
    if (rc == DCHAN_SUCCESS)
        rc = credit_mem(s, s->garea_len, 0, &s->gstage, &s->gstage_mr);
    if (rc != DCHAN_SUCCESS)
        goto fail;
    /* RDMA READ (get): what this rank may have outstanding as initiator
     * and serve as responder per QP; the initiator side also keeps to
     * what the peer serves (connect). */
    s->rd_init = (uint8_t)(s->dev.max_qp_init_rd_atom > 16 ? 16 : s->dev.max_qp_init_rd_atom);
    s->rd_resp = (uint8_t)(s->dev.max_qp_rd_atom > 16 ? 16 : s->dev.max_qp_rd_atom);
    /* Costs nothing until a CQ is armed (dchan_wakeup_arm); without one,
     * dchan_wakeup_fd says DCHAN_ERR_UNSUPPORTED. */
    s->wch = ibv_create_comp_channel(s->ctx);
    if (s->wch && fcntl(s->wch->fd, F_SETFL, fcntl(s->wch->fd, F_GETFL) | O_NONBLOCK) != 0) {
        ibv_destroy_comp_channel(s->wch);
        s->wch = NULL;
    }
    s->scq = ibv_create_cq(s->ctx, (int)(n * (sq + VRB_CTL_DEPTH)), NULL, s->wch, 0);
    if (!s->scq) {
        rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "ibv_create_cq (send)");
        goto fail;
    }
    memset(&sa, 0, sizeof sa);
    sa.attr.max_wr = (uint32_t)srq;
    sa.attr.max_sge = 1; /* receives carry no buffer; some devices want one SGE */
    s->srq = ibv_create_srq(s->pd, &sa);
    if (!s->srq) {
        rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "ibv_create_srq");
        goto fail;
    }
    /* Never more receive completions than posted receives: the CQ holds
     * the SRQ as granted (devices round up). */
    s->srq_depth = (uint32_t)srq;
    uint64_t rcq = (uint64_t)sa.attr.max_wr + 2 * VRB_SRQ_BATCH;
    if (rcq > (uint64_t)s->dev.max_cqe) {
        snprintf(why, sizeof why, "%s granted an SRQ of %u, more than a CQ holds", s->devname,
                 sa.attr.max_wr);
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }
    s->rcq = ibv_create_cq(s->ctx, (int)rcq, NULL, s->wch, 0);
    if (!s->rcq) {
        rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "ibv_create_cq (receive)");
        goto fail;
    }

    s->conns = calloc(n, sizeof *s->conns);
    s->qpn_mask = 1;
    while (s->qpn_mask < 8 * n)
        s->qpn_mask <<= 1;
    s->qpn_key = calloc(s->qpn_mask, sizeof *s->qpn_key);
    s->qpn_val = calloc(s->qpn_mask, sizeof *s->qpn_val);
    s->qpn_mask--;
    if (!s->conns || !s->qpn_key || !s->qpn_val) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }
    s->max_inline = (uint32_t)s->pv->VERBS_MAX_INLINE;
    s->sq_depth = (uint32_t)sq;
    /* Gathered puts: an SGE list per WR, as long as the device allows. */
    uint32_t want_sge = s->dev.max_sge < 1 ? 1 : (uint32_t)s->dev.max_sge;
    if (want_sge > VRB_MAX_SGE)
        want_sge = VRB_MAX_SGE;
    s->max_sge = want_sge;
    for (uint32_t r = 0; r < n; r++) {
        struct vrb_conn *c = &s->conns[r];
        struct ibv_qp_cap cap;
        uint32_t no_inline = 0;

        c->s = s;
        c->peer = (int)r;
        c->idx = r;
        c->qp = make_qp(s, (uint32_t)sq, want_sge, &s->max_inline, &cap);
        if (!c->qp) {
            rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "ibv_create_qp (data)");
            goto fail;
        }
        /* Devices may grant more than asked (rounding up): keep to what
         * was asked, which the send CQ was sized for; never more than
         * granted. */
        if (cap.max_send_wr < s->sq_depth)
            s->sq_depth = cap.max_send_wr;
        /* Likewise the SGEs: never more than asked or granted. */
        if (cap.max_send_sge < s->max_sge)
            s->max_sge = cap.max_send_sge ? cap.max_send_sge : 1;
        c->gval = &s->gstage[(size_t)r * VRB_GET_SLOTS];
        c->ctl = make_qp(s, VRB_CTL_DEPTH, 1, &no_inline, &cap);
        if (!c->ctl) {
            rc = dchan_verbs_rc(s, VRB_ERRNO, errno, "ibv_create_qp (control)");
            goto fail;
        }
        qpn_add(s, c->qp->qp_num, 2 * r);
        qpn_add(s, c->ctl->qp_num, 2 * r + 1);
    }
    /* One slot stays free for the marker a failed post may need. */
    s->sq_usable = s->sq_depth - 1;
    s->sig_every = s->sq_depth / 2 ? s->sq_depth / 2 : 1;
    s->wr_cap = s->sq_usable;
    s->wr = calloc(s->wr_cap, sizeof *s->wr);
    s->sge = calloc((size_t)s->wr_cap * s->max_sge, sizeof *s->sge);
    if (!s->wr || !s->sge) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }
    for (uint32_t r = 0; r < n; r++) {
        s->conns[r].ring = calloc(s->sq_depth, sizeof *s->conns[r].ring);
        if (!s->conns[r].ring) {
            rc = DCHAN_ERR_NO_MEMORY;
            goto fail;
        }
    }
    if (s->max_inline < 8) {
        /* Credit words cannot go inline: they are sent from a registered copy. */
        rc = credit_mem(s, s->carea_len, 0, &s->cstage, &s->cstage_mr);
        if (rc != DCHAN_SUCCESS)
            goto fail;
    }
    uint64_t mm = s->pv->VERBS_MAX_MSG;
    s->max_msg = s->port.max_msg_sz;
    if (mm && mm < s->max_msg)
        s->max_msg = mm;
    if (s->max_msg < 8) {
        snprintf(why, sizeof why, "largest message %llu bytes: below the 8 a put needs",
                 (unsigned long long)s->max_msg);
        rc = DCHAN_ERR_INVALID_ARG;
        goto fail;
    }

    /* This rank's address for every peer. */
    size_t len = VRB_ADDR_HDR + (size_t)n * VRB_ADDR_PER_RANK;
    s->addr = calloc(1, len);
    if (!s->addr) {
        rc = DCHAN_ERR_NO_MEMORY;
        goto fail;
    }
    dchan_put_le32(s->addr, VRB_ADDR_MAGIC);
    s->addr[4] = VRB_ADDR_VERSION;
    s->addr[5] = s->roce ? 1 : 0;
    s->addr[6] = s->port_num;
    s->addr[7] = (unsigned char)s->port.active_mtu;
    dchan_put_le16(s->addr + 8, s->port.lid);
    dchan_put_le32(s->addr + 12, n);
    memcpy(s->addr + 16, s->gid.raw, 16);
    dchan_put_le64(s->addr + 32, (uintptr_t)s->carea);
    dchan_put_le32(s->addr + 40, s->carea_mr->rkey);
    dchan_put_le32(s->addr + 44, s->cw);
    dchan_put_le64(s->addr + 48, (uintptr_t)s->garea);
    dchan_put_le32(s->addr + 56, s->garea_mr->rkey);
    dchan_put_le16(s->addr + 60, s->rd_resp);
    for (uint32_t r = 0; r < n; r++) {
        dchan_put_le32(s->addr + VRB_ADDR_HDR + r * VRB_ADDR_PER_RANK, s->conns[r].qp->qp_num);
        dchan_put_le32(s->addr + VRB_ADDR_HDR + r * VRB_ADDR_PER_RANK + 4,
                       s->conns[r].ctl->qp_num);
    }

    describe(p->desc, sizeof p->desc, s->devname, s->port_num, &s->port, s->gid_index);
    size_t dl = strlen(p->desc);
    snprintf(p->desc + dl, sizeof p->desc - dl, ", SQ %u, SRQ %u, inline %u, SGE %u",
             s->sq_depth, s->srq_depth, s->max_inline, s->max_sge);
    p->state = s;
    p->default_detect = DCHAN_DETECT_EVENT;
    p->addr = s->addr;
    p->addr_len = len;
    return DCHAN_SUCCESS;

fail:
    if (why[0])
        snprintf(p->desc, sizeof p->desc, "%s", why); /* the core logs and quotes it */
    vrb_free(s);
    return rc;
}

/* ---- connect ------------------------------------------------------------------------------ */

static int vrb_connect(struct dchan_prov *p, const void *addrs, size_t addr_len)
{
    struct vrb_state *s = p->state;
    const unsigned char *all = addrs;
    uint32_t n = (uint32_t)s->nranks;
    int rc;

    if (addr_len < VRB_ADDR_HDR + (size_t)n * VRB_ADDR_PER_RANK)
        return DCHAN_ERR_PROVIDER;
    for (uint32_t r = 0; r < n; r++) {
        const unsigned char *a = all + (size_t)r * addr_len;
        const unsigned char *mine = a + VRB_ADDR_HDR + (size_t)s->rank * VRB_ADDR_PER_RANK;
        struct vrb_conn *c = &s->conns[r];
        union ibv_gid gid;

        if (dchan_get_le32(a) != VRB_ADDR_MAGIC || a[4] != VRB_ADDR_VERSION ||
            dchan_get_le32(a + 12) != n) {
            dchan_err(p->ctx, VRB_NAME, "rank %u published a malformed address", r);
            return DCHAN_ERR_PROVIDER;
        }
        if (a[5] != (s->roce ? 1 : 0)) {
            dchan_err(p->ctx, VRB_NAME, "rank %u is on %s, this rank on %s: no path", r,
                      a[5] ? "RoCE" : "InfiniBand", link_name(&s->port));
            return DCHAN_ERR_UNSUPPORTED;
        }
        memcpy(gid.raw, a + 16, 16);
        c->rqpn = dchan_get_le32(mine);
        c->rctl = dchan_get_le32(mine + 4);
        c->mtu = (enum ibv_mtu)(a[7] < s->port.active_mtu ? a[7] : s->port.active_mtu);
        memset(&c->ah, 0, sizeof c->ah);
        c->ah.port_num = s->port_num;
        c->ah.sl = s->sl;
        if (s->roce || gid.global.subnet_prefix != s->gid.global.subnet_prefix) {
            /* RoCE always, InfiniBand across subnets: a GRH. */
            c->ah.is_global = 1;
            c->ah.grh.dgid = gid;
            c->ah.grh.sgid_index = (uint8_t)s->gid_index;
            c->ah.grh.hop_limit = 64;
            c->ah.grh.traffic_class = s->tclass;
        }
        if (!s->roce)
            c->ah.dlid = dchan_get_le16(a + 8);
        /* This rank's words in the peer's credit area. */
        c->rcw = dchan_get_le32(a + 44);
        c->crkey = dchan_get_le32(a + 40);
        c->craddr = dchan_get_le64(a + 32) + (uint64_t)s->rank * c->rcw * sizeof(uint64_t);
        if (dchan_get_le64(a + 32) == 0 || c->rcw == 0) {
            dchan_err(p->ctx, VRB_NAME, "rank %u published no credit area", r);
            return DCHAN_ERR_PROVIDER;
        }
        /* This rank's slots in the peer's get area. */
        c->grkey = dchan_get_le32(a + 56);
        c->garaddr = dchan_get_le64(a + 48) + (uint64_t)s->rank * VRB_GET_SLOTS * sizeof(uint64_t);
        if (dchan_get_le64(a + 48) == 0) {
            dchan_err(p->ctx, VRB_NAME, "rank %u published no get area", r);
            return DCHAN_ERR_PROVIDER;
        }
        unsigned peer_resp = dchan_get_le16(a + 60);
        c->rd_atom = (uint8_t)(s->rd_init < peer_resp ? s->rd_init : peer_resp);
        rc = dchan_verbs_conn_start(s, c);
        if (rc != DCHAN_SUCCESS)
            return rc;
    }
    /* Receives for every arrival in flight; peers write only after the
     * agreement that follows connect, when every QP here is in RTR. */
    s->srq_owed = s->srq_depth;
    dchan_verbs_srq_fill(s, false);
    if (s->srq_owed) {
        dchan_err(p->ctx, VRB_NAME, "could post only %u of %u receives",
                  s->srq_depth - s->srq_owed, s->srq_depth);
        return DCHAN_ERR_NO_MEMORY;
    }
    uint64_t now = dchan_verbs_now();
    for (uint32_t r = 0; r < n; r++)
        s->conns[r].alive_ns = now;
    size_t dl = strlen(p->desc);
    snprintf(p->desc + dl, sizeof p->desc - dl, ", ACK timeout %u, SENTINEL %s", s->timeout,
             s->conns[s->rank].in_order ? "one write" : "body+tail");
    return DCHAN_SUCCESS;
}

static void vrb_close(struct dchan_prov *p)
{
    struct vrb_state *s = p->state;
    if (!s)
        return;
    /* The core released every registration before calling close. */
    vrb_free(s);
    p->state = NULL;
}

const struct dchan_provider_ops dchan_verbs_ops = {
    .name = VRB_NAME,
    .wire_id = DCHAN_PROV_ID_VERBS,
    .scope = DCHAN_SCOPE_NET,
    .modes = DCHAN_MODE_BIT(DCHAN_DETECT_SENTINEL) | DCHAN_MODE_BIT(DCHAN_DETECT_FLAG) |
             DCHAN_MODE_BIT(DCHAN_DETECT_EVENT),
    .probe = vrb_probe,
    .open = vrb_open,
    .connect = vrb_connect,
    .close = vrb_close,
    .mr_reg = dchan_verbs_mr_reg,
    .mr_dereg = dchan_verbs_mr_dereg,
    .mem_alloc = dchan_prov_nosys_mem_alloc,
    .mem_free = dchan_prov_nosys_mem_free,
    .recv_open = dchan_verbs_recv_open,
    .recv_arm = dchan_prov_noop_recv_arm,
    .recv_close = dchan_verbs_recv_close,
    .send_open = dchan_verbs_send_open,
    .put = dchan_verbs_put,
    .put_abandon = dchan_verbs_put_abandon,
    .send_close = dchan_verbs_send_close,
    /* The receiver's memory is never mapped here. */
    .map_slot = dchan_prov_nosys_map_slot,
    .credit_open = dchan_verbs_credit_open,
    .credit_close = dchan_verbs_credit_close,
    .credit_write = dchan_verbs_credit_write,
    .progress = dchan_verbs_progress,
    .wake_fd = dchan_verbs_wake_fd,
    .wake_arm = dchan_verbs_wake_arm,
    .wake_disarm = dchan_prov_noop_wake_disarm,
    .sleeps = DCHAN_SLEEPS_EVENT,
    /* SGE lists over the segments (verbs_rma.c), READ for get (verbs_get.c). */
    .gather = true,
    .get = &dchan_verbs_get_ops,
};
