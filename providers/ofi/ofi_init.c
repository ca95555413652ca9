/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * ofi: libfabric RDM endpoints (DESIGN §4). This file chooses the libfabric
 * provider, opens the fabric, domain, completion queue, address vector and
 * endpoint, exchanges addresses, and converts libfabric errors. Channels,
 * puts and progress are in ofi_rma.c, registrations in ofi_mr.c.
 *
 * One completion queue serves both directions: local completions of our
 * writes carry an ofi_op context, arrivals carry remote CQ data.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "ofi.h"
#include "params.h"
#include "wire.h"

/* Largest single write over libfabric's tcp unless DCHAN_OFI_MAX_MSG says. */
#define OFI_TCP_MAX_WRITE ((size_t)1 << 20)

/* ---- parameters ------------------------------------------------------------------ */

/* DCHAN_PROVIDER names ofi (for dchan_info; a context knows from p->forced). */
static bool ofi_named(void)
{
    const char *s = dchan_param_env("PROVIDER");
    while (s && *s) {
        size_t n = strcspn(s, ",");
        if (n == 3 && strncmp(s, OFI_NAME, 3) == 0)
            return true;
        s += n + (s[n] == ',');
    }
    return false;
}

/* FI_PROVIDER names a libfabric provider (an exclusion list, "^shm",
 * chooses nothing). */
static bool fi_provider_set(void)
{
    const char *s = getenv("FI_PROVIDER");
    return s && *s && *s != '^';
}

/* ---- errors ---------------------------------------------------------------------- */

/* The peer cannot be reached at all: every channel to it fails. */
bool dchan_ofi_unreachable(int fi_err)
{
    switch (fi_err < 0 ? -fi_err : fi_err) {
    case FI_EHOSTUNREACH:
    case FI_ECONNREFUSED:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_EADDRNOTAVAIL:
    case FI_EHOSTDOWN:
        return true;
    default:
        return false;
    }
}

/* The write found its connection gone and was not sent: posting it again
 * cannot deliver anything twice. (A write canceled or reset while in
 * flight may have been delivered: that one is an error on its handle.) */
bool dchan_ofi_unsent(int fi_err)
{
    switch (fi_err < 0 ? -fi_err : fi_err) {
    case FI_ENOTCONN:
    case EPIPE: /* fi_errno.h leaves FI_EPIPE out; the values are errno's */
    case FI_ESHUTDOWN:
        return true;
    default:
        return false;
    }
}

/* The write's connection broke under it (tcp resets a connection that
 * carried a write to a closed region, say). Whether it was delivered is
 * unknown, unless the connection was already known lost when it was
 * posted: see write_done. */
bool dchan_ofi_reset(int fi_err)
{
    switch (fi_err < 0 ? -fi_err : fi_err) {
    case FI_ECANCELED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
        return true;
    default:
        return false;
    }
}

/* The one conversion of libfabric status to ours; the native detail goes
 * to the log, except for FI_EAGAIN which only means "progress and retry". */
int dchan_ofi_rc(struct dchan_prov *p, int fi_err, const char *what)
{
    int e = fi_err < 0 ? -fi_err : fi_err;
    int rc;

    switch (e) {
    case 0:
        return DCHAN_SUCCESS;
    case FI_EAGAIN:
        return DCHAN_ERR_AGAIN;
    case FI_ENOMEM:
    case FI_ENOSPC:
        rc = DCHAN_ERR_NO_MEMORY;
        break;
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
    case FI_ENODATA:
    case FI_EBADFLAGS:
        rc = DCHAN_ERR_UNSUPPORTED;
        break;
    case FI_ETRUNC:
    case FI_EMSGSIZE:
    case FI_ETOOSMALL:
        rc = DCHAN_ERR_SIZE;
        break;
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
    case FI_EREMOTEIO:
    case FI_ETIMEDOUT:
    case FI_ECANCELED: /* tcp: the peer dropped the connection (a closed region) */
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
        rc = DCHAN_ERR_PEER; /* the remote region is gone or the peer stopped answering */
        break;
    default:
        rc = dchan_ofi_unreachable(e) || dchan_ofi_unsent(e) ? DCHAN_ERR_PEER
                                                              : DCHAN_ERR_PROVIDER;
        break;
    }
    dchan_warn(p ? p->ctx : NULL, OFI_NAME, "%s: %s (-%d)", what, dchan_ofi_strerror(e), e);
    return rc;
}

/* ---- choosing a libfabric provider ----------------------------------------------- */

#define OFI_MR_MODES                                                                       \
    (FI_MR_LOCAL | FI_MR_RAW | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |        \
     FI_MR_ENDPOINT)
#define OFI_MODES (FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA)

static struct fi_info *hints_new(void)
{
    struct fi_info *h = dchan_ofi_fn.dupinfo(NULL);
    if (!h)
        return NULL;
    h->ep_attr->type = FI_EP_RDM;
    /* FI_MSG and FI_RECV: FI_RX_CQ_DATA providers need posted receives. */
    h->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_MSG | FI_RECV;
    h->mode = OFI_MODES;
    h->domain_attr->mr_mode = OFI_MR_MODES;
    /* The core serialises every call on a context, which owns its domain. */
    h->domain_attr->threading = FI_THREAD_DOMAIN;
    h->addr_format = FI_FORMAT_UNSPEC;
    return h;
}

/* The transports DESIGN §4 keeps out of automatic selection. */
static bool is_fallback(const struct fi_info *i)
{
    static const char *const names[] = {"tcp", "sockets", "udp", "net"};
    const char *n = i->fabric_attr && i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
    size_t len = strcspn(n, ";"); /* the core provider under any utility provider */
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (len == strlen(names[k]) && strncmp(n, names[k], len) == 0)
            return true;
    return false;
}

/* Can this provider do what we need, in a way we can follow? */
static bool usable(const struct fi_info *i)
{
    uint64_t modes = i->mode | (i->tx_attr ? i->tx_attr->mode : 0) |
                     (i->rx_attr ? i->rx_attr->mode : 0);
    return i->ep_attr && i->ep_attr->type == FI_EP_RDM && (i->caps & FI_RMA) &&
           i->domain_attr && !(i->domain_attr->mr_mode & ~(uint64_t)OFI_MR_MODES) &&
           i->domain_attr->mr_mode != FI_MR_BASIC && i->domain_attr->mr_mode != FI_MR_SCALABLE &&
           !(modes & ~(uint64_t)OFI_MODES) && i->fabric_attr && i->fabric_attr->prov_name;
}

static const char *core_name(const struct fi_info *i)
{
    return i->fabric_attr->prov_name;
}

/* Adds a provider name to a list of skipped ones, once. */
static void note_skipped(char *list, size_t len, const char *name)
{
    size_t n = strlen(list);
    for (const char *at = strstr(list, name); at; at = strstr(at + 1, name))
        if ((at == list || at[-2] == ',') && (at[strlen(name)] == ',' || !at[strlen(name)]))
            return;
    if (n + strlen(name) + 3 < len)
        snprintf(list + n, len - n, "%s%s", n ? ", " : "", name);
}

static void mr_mode_str(uint64_t m, char *out, size_t len)
{
    static const struct {
        uint64_t bit;
        const char *name;
    } bits[] = {{FI_MR_LOCAL, "LOCAL"},         {FI_MR_RAW, "RAW"},
                {FI_MR_VIRT_ADDR, "VIRT_ADDR"}, {FI_MR_ALLOCATED, "ALLOCATED"},
                {FI_MR_PROV_KEY, "PROV_KEY"},   {FI_MR_ENDPOINT, "ENDPOINT"}};
    size_t n = 0;
    out[0] = '\0';
    for (size_t k = 0; k < sizeof bits / sizeof bits[0]; k++)
        if ((m & bits[k].bit) && n < len)
            n += (size_t)snprintf(out + n, len - n, "%s%s", n ? "|" : "", bits[k].name);
    if (!n)
        snprintf(out, len, "none");
}

static bool rma_waw(const struct fi_info *i)
{
    uint64_t tx = i->tx_attr->msg_order, rx = i->rx_attr->msg_order;
    return ((tx & FI_ORDER_WAW) && (rx & FI_ORDER_WAW)) ||
           ((tx & FI_ORDER_RMA_WAW) && (rx & FI_ORDER_RMA_WAW));
}

/*
 * fi_cq(3) "target completion semantics": a write carrying remote CQ data
 * shows the data of earlier writes once message order holds between them
 * (write after write). A write without target completion (the FLAG word,
 * the SENTINEL tail) needs the data itself placed in order: FI_ORDER_DATA.
 * Otherwise FI_FENCE with FI_DELIVERY_COMPLETE, or waiting for the
 * FI_DELIVERY_COMPLETE completion of the earlier writes, does it.
 */
static int choose_order(const struct fi_info *i, const char *want, bool event,
                        enum ofi_order *out)
{
    bool stream = rma_waw(i) && (event || (i->rx_attr->comp_order & FI_ORDER_DATA));
    bool fence = (i->caps & FI_FENCE) != 0;
    /* FI_FENCE only on request: the one provider here offering it
     * (sockets) lost fenced writes in our tests. */
    if (strcasecmp(want, "auto") == 0)
        *out = stream ? OFI_ORD_STREAM : OFI_ORD_COMPLETION;
    else if (strcasecmp(want, "ordered") == 0 && stream)
        *out = OFI_ORD_STREAM;
    else if (strcasecmp(want, "fence") == 0 && fence)
        *out = OFI_ORD_FENCE;
    else if (strcasecmp(want, "completion") == 0)
        *out = OFI_ORD_COMPLETION;
    else
        return DCHAN_ERR_UNSUPPORTED;
    return DCHAN_SUCCESS;
}

static const char *order_name(enum ofi_order o)
{
    return o == OFI_ORD_STREAM ? "provider ordering" : o == OFI_ORD_FENCE ? "fence" : "completion";
}

/* Settings that follow from one fi_info and the parameters. */
struct ofi_plan {
    size_t cq_data, max_msg;
    enum ofi_order ord_event, ord_tail;
    unsigned modes;
    int default_detect;
};

static int plan_for(const struct fi_info *i, const struct dchan_params *pv,
                    struct ofi_plan *pl, char *why, size_t whylen)
{
    unsigned long cqd = pv->OFI_CQ_DATA_SIZE, maxmsg = pv->OFI_MAX_MSG;
    const char *order = pv->OFI_ORDER; /* one of its words: dchan_init checked */
    size_t have = i->domain_attr->cq_data_size;

    if (cqd != 0 && cqd != 4 && cqd != 8) {
        snprintf(why, whylen, "DCHAN_OFI_CQ_DATA_SIZE=%lu: expected 0, 4 or 8", cqd);
        return DCHAN_ERR_INVALID_ARG;
    }
    if (cqd > have) {
        snprintf(why, whylen, "DCHAN_OFI_CQ_DATA_SIZE=%lu but %s carries %zu bytes", cqd,
                 core_name(i), have);
        return DCHAN_ERR_UNSUPPORTED;
    }
    pl->cq_data = cqd ? cqd : have >= 8 ? 8 : have >= 4 ? 4 : 0;
    pl->max_msg = i->ep_attr->max_msg_size ? i->ep_attr->max_msg_size : SIZE_MAX;
    /* libfabric 1.17's tcp stalled now and then on a single write much
     * larger than the socket buffers (4 MiB here) when the connection had
     * carried smaller ones before: a 64 KiB then 32 MiB EVENT pingpong hung
     * every time. In writes of 1 MiB it never did, and 64 MiB pingpongs got
     * faster (13.4 ms one way against 17.4 ms). */
    const char *name = core_name(i);
    bool tcp = strncmp(name, "tcp", 3) == 0 && (name[3] == '\0' || name[3] == ';');
    if (!maxmsg && tcp && pl->max_msg > OFI_TCP_MAX_WRITE)
        pl->max_msg = OFI_TCP_MAX_WRITE;
    if (maxmsg && maxmsg < pl->max_msg)
        pl->max_msg = maxmsg;
    if (choose_order(i, order, true, &pl->ord_event) != DCHAN_SUCCESS ||
        choose_order(i, order, false, &pl->ord_tail) != DCHAN_SUCCESS) {
        snprintf(why, whylen, "DCHAN_OFI_ORDER=%s is not guaranteed by %s", order,
                 core_name(i));
        return DCHAN_ERR_UNSUPPORTED;
    }
    if (strcmp(pv->OFI_CREDIT, "write") == 0 && !rma_waw(i)) {
        snprintf(why, whylen, "DCHAN_OFI_CREDIT=write is not guaranteed by %s (no "
                 "write-after-write order)", core_name(i));
        return DCHAN_ERR_UNSUPPORTED;
    }
    /* FLAG and SENTINEL: body, then an 8-byte write ordered after it. */
    pl->modes = DCHAN_MODE_BIT(DCHAN_DETECT_FLAG) | DCHAN_MODE_BIT(DCHAN_DETECT_SENTINEL);
    if (pl->cq_data >= 4)
        pl->modes |= DCHAN_MODE_BIT(DCHAN_DETECT_EVENT);
    /* EVENT is one write and one completion at the receiver; FLAG and
     * SENTINEL add an 8-byte write ordered after the body, a round trip
     * where the provider does not order data (shm, tcp). Measured one-way
     * (tests/ofi/ofi_targeted --test latency), EVENT/FLAG/SENTINEL: shm
     * 1.0/4.2/2.5 us at 8 bytes, 8.1/10.3/10.3 at 64 KiB; tcp 17/30/16
     * at 8 bytes, 15/27/26 at 1 KiB. EVENT wherever it exists. */
    pl->default_detect = pl->cq_data >= 4 ? DCHAN_DETECT_EVENT : DCHAN_DETECT_FLAG;
    return DCHAN_SUCCESS;
}


/*
 * Get (DESIGN §7) reads a source's buffer and published word and writes
 * its taken word: FI_READ here, FI_REMOTE_READ there. Credit can go as an
 * atomic maximum (FI_ATOMIC), which no reordering can undo. Asking for
 * them in the hints that choose the provider could make a provider that
 * writes but cannot read drop out of the list, or move the choice, so the
 * choice is made as before and this asks the chosen provider (same
 * provider and domain) again with the capabilities 'extra' added. NULL
 * where it refuses: with none of them the ofi provider offers no get
 * (dchan_create_source returns DCHAN_ERR_UNSUPPORTED), credit goes as
 * ordered or completed writes, and puts run unchanged.
 */
static struct fi_info *with_caps(const struct fi_info *i, uint64_t extra)
{
    struct fi_info *h = hints_new(), *list = NULL, *found = NULL;
    if (!h)
        return NULL;
    h->caps |= extra;
    h->fabric_attr->prov_name = strdup(i->fabric_attr->prov_name);
    if (i->fabric_attr->name)
        h->fabric_attr->name = strdup(i->fabric_attr->name);
    if (i->domain_attr->name)
        h->domain_attr->name = strdup(i->domain_attr->name);
    if (dchan_ofi_fn.getinfo(OFI_API_VERSION, NULL, NULL, 0, h, &list) == 0) {
        for (struct fi_info *r = list; r; r = r->next) {
            if (usable(r) && (r->caps & extra) == extra &&
                strcmp(core_name(r), core_name(i)) == 0 &&
                (!i->domain_attr->name ||
                 (r->domain_attr->name && strcmp(r->domain_attr->name, i->domain_attr->name) == 0))) {
                found = dchan_ofi_fn.dupinfo(r);
                break;
            }
        }
        dchan_ofi_fn.freeinfo(list);
    }
    dchan_ofi_fn.freeinfo(h);
    return found;
}

/* fi_getinfo with our hints; the first usable entry, honouring the
 * fallback rule unless the user named ofi or a libfabric provider. */
static int candidates(struct fi_info **list, bool named, bool *explicit_choice)
{
    struct fi_info *h = hints_new();
    int ret;
    if (!h)
        return -FI_ENOMEM;
    *explicit_choice = named || fi_provider_set();
    ret = dchan_ofi_fn.getinfo(OFI_API_VERSION, NULL, NULL, 0, h, list);
    dchan_ofi_fn.freeinfo(h);
    return ret;
}

static int probe(struct dchan_probe *out)
{
    struct fi_info *list = NULL, *i;
    bool explicit_choice;
    char skipped[96] = "", why[128] = "";
    const char *unloaded;
    if (dchan_ofi_load(NULL, &unloaded) != 0) {
        snprintf(out->desc, sizeof out->desc, "%s", unloaded);
        return DCHAN_ERR_UNSUPPORTED;
    }
    uint32_t v = dchan_ofi_fn.version();
    const struct dchan_params *pv = dchan_probe_params();
    if (!pv) {
        snprintf(out->desc, sizeof out->desc, "a DCHAN_* variable is malformed (see dchan_info -e)");
        return DCHAN_ERR_INVALID_ARG;
    }
    int ret = candidates(&list, ofi_named(), &explicit_choice);

    if (ret) {
        snprintf(out->desc, sizeof out->desc, "libfabric %u.%u: no RDM provider with RMA (%s)",
                 FI_MAJOR(v), FI_MINOR(v), dchan_ofi_strerror(-ret));
        return DCHAN_ERR_UNSUPPORTED;
    }
    for (i = list; i; i = i->next) {
        if (!usable(i))
            continue;
        if (!explicit_choice && is_fallback(i)) {
            note_skipped(skipped, sizeof skipped, core_name(i));
            continue;
        }
        break;
    }
    if (!i) {
        snprintf(out->desc, sizeof out->desc,
                 "libfabric %u.%u: only the fallbacks %s (set DCHAN_PROVIDER=ofi or "
                 "FI_PROVIDER to use them)",
                 FI_MAJOR(v), FI_MINOR(v), skipped[0] ? skipped : "(none)");
        dchan_ofi_fn.freeinfo(list);
        return DCHAN_ERR_UNSUPPORTED;
    }
    struct ofi_plan pl;
    char mm[64];
    ret = plan_for(i, pv, &pl, why, sizeof why);
    mr_mode_str(i->domain_attr->mr_mode, mm, sizeof mm);
    snprintf(out->desc, sizeof out->desc,
             "libfabric %u.%u, %s on %s: mr_mode %s, %zu-byte CQ data%s%s%s%s", FI_MAJOR(v),
             FI_MINOR(v), core_name(i), i->domain_attr->name ? i->domain_attr->name : "?", mm,
             i->domain_attr->cq_data_size, skipped[0] ? "; auto skips " : "", skipped,
             ret ? "; " : "", ret ? why : "");
    if (ret == DCHAN_SUCCESS) {
        out->modes = pl.modes;
        out->default_detect = pl.default_detect;
    }
    dchan_ofi_fn.freeinfo(list);
    return ret;
}

/* What was chosen and why, for DCHAN_LOG=info; cut to fit. */
static void set_desc(struct dchan_prov *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_desc(struct dchan_prov *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->desc, sizeof p->desc, fmt, ap);
    va_end(ap);
}

/* ---- the endpoint ---------------------------------------------------------------- */

/* Peers' addresses as shipped through the bootstrap:
 *   0  4  magic "DOFB"
 *   4  8  FNV-1a of the libfabric provider name (every rank must agree)
 *  12  8  host identity (shm reaches only its own host)
 *  20  2  length n of the libfabric address
 *  22  2  length m of the credit area's raw key (FI_MR_RAW), else 0
 *  24  4  words per peer in the credit area (this rank's CREDIT_WORDS)
 *  28  8  credit area: target address of word 0 (virtual address, or 0)
 *  36  8  credit area: key, or with raw keys the region's base address
 *  44  n  the address, then a NUL (FI_ADDR_STR formats are strings)
 *  45+n m the raw key */
#define ADDR_MAGIC 0x42464f44u
#define ADDR_HDR 44

static uint64_t host_id(void)
{
    char buf[512];
    size_t n;
    if (gethostname(buf, 256) != 0)
        buf[0] = '\0';
    buf[255] = '\0';
    n = strlen(buf);
    /* Containers share host names; the boot id tells machines apart. */
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        n += fread(buf + n, 1, sizeof buf - n - 1, f);
        fclose(f);
    }
    return dchan_fnv1a64(buf, n);
}

static void state_free(struct ofi_state *st)
{
    if (!st)
        return;
    if (st->ep)
        fi_close(&st->ep->fid);
    dchan_ofi_orphans_release(st);
    dchan_ofi_mr_close_all(st);
    dchan_ofi_cslabs_free(st);
    /* Ours, not the registration cache's: closed above, freed here. */
    free(st->credit_mr);
    free(st->csrc_mr);
    if (st->cpeer)
        for (int r = 0; r < st->nranks; r++)
            if (st->cpeer[r].raw_mapped)
                fi_mr_unmap_key(st->domain, st->cpeer[r].key);
    if (st->av)
        fi_close(&st->av->fid);
    if (st->cq)
        fi_close(&st->cq->fid);
    dchan_waketimer_close(&st->wt);
    if (st->domain)
        fi_close(&st->domain->fid);
    if (st->fabric)
        fi_close(&st->fabric->fid);
    if (st->info)
        dchan_ofi_fn.freeinfo(st->info);
    free(st->peers);
    free(st->conn_lost);
    free(st->cpeer);
    free(st->credit_area);
    free(st->csrc);
    free(st->ops);
    free(st->rx);
    free(st->addr);
    free(st);
}

int dchan_ofi_post_rx(struct ofi_state *st, struct ofi_rx *rx)
{
    /* Zero bytes: with FI_RX_CQ_DATA the remote CQ data consumes the
     * receive, the data itself goes to the RMA target. */
    return (int)fi_recv(st->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, rx);
}

/*
 * The credit area: nranks x CREDIT_WORDS zeroed words registered for remote
 * write (a peer writes only its own row), like a receive buffer, so every
 * mr_mode bit is followed by dchan_ofi_mr_reg; its target address and key
 * travel in the endpoint address. Credit writes are 8-byte fi_inject_write
 * where the provider orders write after write, so that a later count can
 * never be overtaken by an earlier one. Elsewhere (shm: its fast path
 * writes from the initiator while its queued writes wait for the target)
 * they are fi_inject_atomic FI_MAX where the provider has it: a word's
 * values only grow (lib/handle.c, cid_free), so the largest count wins
 * whatever the order. The ofi:shm credited pingpong went from 2.5-3.0x
 * the uncredited one to 1.5-1.7x (SENTINEL, EVENT) and 1.66 to 1.23
 * (FLAG). Without either, each goes with FI_DELIVERY_COMPLETE from a
 * source of its own, and the core starts the next only once it completed.
 */
static int credit_area_open(struct dchan_prov *p, struct ofi_state *st)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len;
    void *mem = NULL;
    int rc;

    st->credit_words = dchan_ctx_params(p->ctx)->CREDIT_WORDS;
    if (st->credit_words == 0 ||
        st->credit_words > SIZE_MAX / sizeof(uint64_t) / (size_t)st->nranks)
        return -FI_EINVAL;
    len = (size_t)st->nranks * st->credit_words * sizeof(uint64_t);
    if (posix_memalign(&mem, page, (len + page - 1) / page * page) != 0)
        return -FI_ENOMEM;
    memset(mem, 0, len);
    st->credit_area = mem;
    p->state = st; /* what dchan_ofi_mr_reg works on */
    rc = dchan_ofi_mr_reg(p, st->credit_area, len, DCHAN_ACCESS_REMOTE_WRITE,
                          (void **)&st->credit_mr);
    if (rc != DCHAN_SUCCESS)
        return rc == DCHAN_ERR_NO_MEMORY ? -FI_ENOMEM : -FI_EOTHER;
    if ((st->mr_mode & FI_MR_RAW) && st->credit_mr->raw_len == 0)
        return -FI_EOTHER;
    const char *want = dchan_ctx_params(p->ctx)->OFI_CREDIT; /* one of its words */
    bool any = strcmp(want, "auto") == 0;
    bool can_write = rma_waw(st->info) && st->info->tx_attr->inject_size >= sizeof(uint64_t);
    /* A maximum is the same whatever order the counts land in. */
    struct fi_atomic_attr aa;
    bool can_atomic = (st->info->caps & FI_ATOMIC) &&
                      fi_query_atomic(st->domain, FI_UINT64, FI_MAX, &aa, 0) == 0 &&
                      aa.count >= 1 && aa.size == sizeof(uint64_t) &&
                      st->info->tx_attr->inject_size >= sizeof(uint64_t);
    /* plan_for and ofi_open saw to the order and the capability; this is
     * a provider with atomics but no maximum of 64-bit words. */
    if ((strcmp(want, "write") == 0 && !can_write) || (strcmp(want, "atomic") == 0 && !can_atomic))
        return -FI_EOPNOTSUPP;
    st->credit_inject = can_write && (any || strcmp(want, "write") == 0);
    st->credit_atomic = !st->credit_inject && can_atomic && (any || strcmp(want, "atomic") == 0);
    if (st->credit_inject || st->credit_atomic)
        return 0;
    st->csrc = calloc(st->nops, sizeof *st->csrc);
    if (!st->csrc)
        return -FI_ENOMEM;
    if (st->mr_local) {
        rc = dchan_ofi_mr_reg(p, st->csrc, st->nops * sizeof *st->csrc, DCHAN_ACCESS_SEND,
                              (void **)&st->csrc_mr);
        if (rc != DCHAN_SUCCESS)
            return rc == DCHAN_ERR_NO_MEMORY ? -FI_ENOMEM : -FI_EOTHER;
        st->csrc_desc = st->csrc_mr->desc;
    }
    return 0;
}

/* Open everything on one fi_info; *what names the step that failed. */
static int endpoint_open(struct dchan_prov *p, const struct fi_info *cand, struct ofi_state **out,
                         const char **what)
{
    struct ofi_state *st = calloc(1, sizeof *st);
    struct fi_cq_attr cq_attr;
    struct fi_av_attr av_attr;
    char name[256];
    size_t name_len = sizeof name;
    int ret = -FI_ENOMEM;

    *what = "allocation";
    if (!st)
        return ret;
    st->nranks = dchan_ctx_nranks(p->ctx);
    st->wait_fd = -1;
    dchan_waketimer_init(p->ctx, &st->wt);
    st->info = dchan_ofi_fn.dupinfo(cand);
    st->peers = calloc((size_t)st->nranks, sizeof *st->peers);
    st->conn_lost = calloc((size_t)st->nranks, sizeof *st->conn_lost);
    st->cpeer = calloc((size_t)st->nranks, sizeof *st->cpeer);
    if (!st->info || !st->peers || !st->conn_lost || !st->cpeer)
        goto fail;
    if (st->info->next) {
        dchan_ofi_fn.freeinfo(st->info->next); /* fi_dupinfo copies one entry; be sure */
        st->info->next = NULL;
    }
    *what = "fi_fabric";
    ret = dchan_ofi_fn.fabric(st->info->fabric_attr, &st->fabric, NULL);
    if (ret)
        goto fail;
    *what = "fi_domain";
    ret = fi_domain(st->fabric, st->info, &st->domain, NULL);
    if (ret)
        goto fail;

    /* Room for every write we post and one arrival per posted receive or
     * armed handle; providers with FI_RM_ENABLED absorb the rest. */
    memset(&cq_attr, 0, sizeof cq_attr);
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.size = st->info->tx_attr->size + st->info->rx_attr->size;
    *what = "fi_cq_open";
    /* A wait fd for dchan_wakeup_fd where the fabric has one; it costs the
     * data path nothing until fi_trywait resets it (libfabric signals it
     * once per reset). */
    cq_attr.wait_obj = FI_WAIT_FD;
    ret = fi_cq_open(st->domain, &cq_attr, &st->cq, NULL);
    if (ret == 0 && fi_control(&st->cq->fid, FI_GETWAIT, &st->wait_fd) != 0) {
        fi_close(&st->cq->fid);
        st->cq = NULL;
        st->wait_fd = -1;
        ret = -FI_ENOSYS;
    }
    if (ret) {
        cq_attr.wait_obj = FI_WAIT_NONE;
        ret = fi_cq_open(st->domain, &cq_attr, &st->cq, NULL);
    }
    if (ret)
        goto fail;
    memset(&av_attr, 0, sizeof av_attr);
    av_attr.type = st->info->domain_attr->av_type;
    av_attr.count = (size_t)st->nranks;
    *what = "fi_av_open";
    ret = fi_av_open(st->domain, &av_attr, &st->av, NULL);
    if (ret)
        goto fail;
    *what = "fi_endpoint";
    ret = fi_endpoint(st->domain, st->info, &st->ep, NULL);
    if (ret)
        goto fail;
    *what = "fi_ep_bind";
    ret = fi_ep_bind(st->ep, &st->av->fid, 0);
    if (ret == 0)
        ret = fi_ep_bind(st->ep, &st->cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret)
        goto fail;
    *what = "fi_enable";
    ret = fi_enable(st->ep);
    if (ret)
        goto fail;
    *what = "fi_getname";
    ret = fi_getname(&st->ep->fid, name, &name_len);
    if (ret)
        goto fail;
    if (name_len > sizeof name - 1 || name_len > UINT16_MAX) {
        ret = -FI_ETOOSMALL;
        goto fail;
    }
    ret = -FI_ENOMEM;

    /* Contexts for our writes: never more in flight than the queue holds. */
    st->nops = st->info->tx_attr->size ? st->info->tx_attr->size : 256;
    if (st->nops > 4096)
        st->nops = 4096;
    st->ops = calloc(st->nops, sizeof *st->ops);
    if (!st->ops)
        goto fail;
    for (size_t k = st->nops; k-- > 0;) {
        st->ops[k].next_free = st->free_ops;
        st->free_ops = &st->ops[k];
    }
    if ((st->info->mode | st->info->rx_attr->mode) & FI_RX_CQ_DATA) {
        st->nrx = st->info->rx_attr->size ? st->info->rx_attr->size : 256;
        if (st->nrx > 1024)
            st->nrx = 1024;
        st->rx = calloc(st->nrx, sizeof *st->rx);
        if (!st->rx)
            goto fail;
        *what = "fi_recv (FI_RX_CQ_DATA)";
        for (size_t k = 0; k < st->nrx; k++) {
            ret = dchan_ofi_post_rx(st, &st->rx[k]);
            if (ret)
                goto fail;
        }
    }
    st->mr_mode = st->info->domain_attr->mr_mode;
    st->mr_local = (st->mr_mode & FI_MR_LOCAL) || dchan_ctx_params(p->ctx)->OFI_MR_LOCAL != 0;
    st->key_size = st->info->domain_attr->mr_key_size;
    st->next_key = 1;
    st->same_host_only = strcmp(core_name(st->info), "shm") == 0 ||
                         ((st->info->caps & FI_LOCAL_COMM) && !(st->info->caps & FI_REMOTE_COMM));

    *what = "credit area";
    ret = credit_area_open(p, st);
    if (ret)
        goto fail;
    const struct ofi_mr *cm = st->credit_mr;
    size_t raw_len = (st->mr_mode & FI_MR_RAW) ? cm->raw_len : 0;
    ret = -FI_ENOMEM;
    st->addr_len = ADDR_HDR + name_len + 1 + raw_len;
    st->addr = calloc(1, st->addr_len);
    if (!st->addr || raw_len > UINT16_MAX)
        goto fail;
    dchan_put_le32(st->addr, ADDR_MAGIC);
    dchan_put_le64(st->addr + 4, dchan_fnv1a64(core_name(st->info), strlen(core_name(st->info))));
    dchan_put_le64(st->addr + 12, host_id());
    dchan_put_le16(st->addr + 20, (uint16_t)name_len);
    dchan_put_le16(st->addr + 22, (uint16_t)raw_len);
    dchan_put_le32(st->addr + 24, (uint32_t)st->credit_words);
    dchan_put_le64(st->addr + 28, (st->mr_mode & FI_MR_VIRT_ADDR)
                                      ? (uint64_t)(uintptr_t)st->credit_area : 0);
    dchan_put_le64(st->addr + 36, raw_len ? cm->raw_base : cm->key);
    memcpy(st->addr + ADDR_HDR, name, name_len);
    memcpy(st->addr + ADDR_HDR + name_len + 1, cm->raw, raw_len);
    p->state = NULL; /* ofi_open sets it once chosen */
    *out = st;
    return 0;

fail:
    p->state = NULL;
    state_free(st);
    return ret;
}

/*
 * endpoint_open, once more where fi_enable found the endpoint's name taken.
 * libfabric's shm names its region after the process id and an endpoint
 * count; a region left in /dev/shm by a process that died with this
 * process's id (an aborted job, a killed rank) holds a live pid, ours, so
 * shm 1.17 calls it in use, removes it and fails with -FI_EBUSY. The next
 * try creates the region afresh. Without it the endpoint with FI_READ
 * failed on that rank alone, which left that rank without get.
 */
static int endpoint_open_retry(struct dchan_prov *p, const struct fi_info *cand,
                               struct ofi_state **out, const char **what)
{
    int ret = endpoint_open(p, cand, out, what);
    for (int tries = 1; ret == -FI_EBUSY && tries < 3; tries++) {
        dchan_info(p->ctx, OFI_NAME, "%s: %s found the endpoint's name in use (%s); once more",
                   core_name(cand), *what, dchan_ofi_strerror(-ret));
        ret = endpoint_open(p, cand, out, what);
    }
    return ret;
}

static int ofi_open(struct dchan_prov *p)
{
    struct fi_info *list = NULL, *i;
    struct ofi_state *st = NULL;
    struct ofi_plan pl;
    bool explicit_choice, rank0 = dchan_ctx_rank(p->ctx) == 0;
    char why[160] = "", mm[64], skipped[96] = "";
    const char *what = "";
    int ret, rc = DCHAN_ERR_UNSUPPORTED;

    if (dchan_ofi_load(p->ctx, &what) != 0) {
        set_desc(p, "%s", what);
        return DCHAN_ERR_UNSUPPORTED;
    }
    ret = candidates(&list, p->forced, &explicit_choice);
    if (ret) {
        set_desc(p, "no libfabric RDM provider with RMA here (%s)", dchan_ofi_strerror(-ret));
        return DCHAN_ERR_UNSUPPORTED;
    }
    for (i = list; i; i = i->next) {
        if (!usable(i))
            continue;
        if (!explicit_choice && is_fallback(i)) {
            note_skipped(skipped, sizeof skipped, core_name(i));
            continue;
        }
        rc = plan_for(i, dchan_ctx_params(p->ctx), &pl, why, sizeof why);
        if (rc == DCHAN_ERR_INVALID_ARG) {
            /* A malformed parameter is the user's error: say so loudly. */
            dchan_err(p->ctx, OFI_NAME, "%s", why);
            break;
        }
        if (rc != DCHAN_SUCCESS) {
            if (rank0)
                dchan_info(p->ctx, OFI_NAME, "skipping %s: %s", core_name(i), why);
            continue;
        }
        /* Manual data progress, even where automatic is offered: with
         * libfabric 1.17's tcp;ofi_rxm, automatic progress lost large RMA
         * writes with remote CQ data now and then (16 MiB pingpongs hung in
         * about one run of four; none of eight with manual progress). dchan
         * drives progress in put, progress and its barriers instead. */
        /* With get and credit by atomic maximum if it can, else with get,
         * else as chosen; DCHAN_OFI_CREDIT=atomic takes only the first,
         * or atomics alone. */
        static const struct {
            uint64_t caps;
            const char *name;
        } extras[] = {{FI_READ | FI_REMOTE_READ | FI_ATOMIC, "FI_READ and FI_ATOMIC"},
                      {FI_READ | FI_REMOTE_READ, "FI_READ"},
                      {FI_ATOMIC, "FI_ATOMIC"}};
        bool atomic = strcmp(dchan_ctx_params(p->ctx)->OFI_CREDIT, "atomic") == 0;
        ret = -FI_ENODATA;
        for (size_t e = 0; ret && e < sizeof extras / sizeof *extras; e++) {
            if (atomic ? !(extras[e].caps & FI_ATOMIC) : e == 2)
                continue;
            struct fi_info *rd = with_caps(i, extras[e].caps);
            struct ofi_plan rpl;
            char rwhy[160];
            if (!rd)
                continue;
            if (plan_for(rd, dchan_ctx_params(p->ctx), &rpl, rwhy, sizeof rwhy) == DCHAN_SUCCESS) {
                ret = endpoint_open_retry(p, rd, &st, &what);
                if (ret == 0)
                    pl = rpl;
                else if (e == 1) /* every rank: one without get makes sources to it fail */
                    dchan_warn(p->ctx, OFI_NAME, "%s with %s: %s failed (%s); no get",
                               core_name(i), extras[e].name, what, dchan_ofi_strerror(-ret));
                else if (rank0) /* another try follows, or the skip says why */
                    dchan_info(p->ctx, OFI_NAME, "%s with %s: %s failed (%s)", core_name(i),
                               extras[e].name, what, dchan_ofi_strerror(-ret));
            }
            dchan_ofi_fn.freeinfo(rd);
        }
        if (atomic && ret == -FI_ENODATA) {
            snprintf(why, sizeof why, "DCHAN_OFI_CREDIT=atomic: %s offers no FI_ATOMIC",
                     core_name(i));
            rc = DCHAN_ERR_UNSUPPORTED;
            if (rank0)
                dchan_info(p->ctx, OFI_NAME, "skipping %s: %s", core_name(i), why);
            continue;
        }
        if (ret && !atomic)
            ret = endpoint_open_retry(p, i, &st, &what);
        if (ret == 0)
            break;
        rc = dchan_ofi_rc(p, ret, what);
        snprintf(why, sizeof why, "%s on %s: %s", what, core_name(i), dchan_ofi_strerror(-ret));
        if (rank0)
            dchan_info(p->ctx, OFI_NAME, "skipping %s: %s", core_name(i), why);
    }
    if (skipped[0] && rank0)
        dchan_info(p->ctx, OFI_NAME,
                   "skipped the fallbacks %s (DCHAN_PROVIDER=ofi or FI_PROVIDER allow them)",
                   skipped);
    if (!st) {
        dchan_ofi_fn.freeinfo(list);
        if (!why[0] && skipped[0])
            snprintf(why, sizeof why, "only the tcp/sockets/udp fallbacks %s", skipped);
        set_desc(p, "%s", why[0] ? why : "no usable libfabric provider"); /* quoted by the core */
        return rc == DCHAN_SUCCESS ? DCHAN_ERR_UNSUPPORTED : rc;
    }
    st->cq_data = pl.cq_data;
    st->max_msg = pl.max_msg;
    st->iov_limit = st->info->tx_attr->iov_limit ? st->info->tx_attr->iov_limit : 1;
    if (st->iov_limit > 64)
        st->iov_limit = 64; /* an iovec array on the stack per write */
    st->can_read = (st->info->caps & FI_READ) && (st->info->caps & FI_REMOTE_READ);
    st->ord_event = pl.ord_event;
    st->ord_tail = pl.ord_tail;
    /* A network provider's default completion only says the data left:
     * a connection that breaks later loses it without a word (tcp drops
     * the connection on a write to a closed region, and the writes behind
     * it). Delivery completion of each put's last write makes every loss
     * an error on its handle. shm places the data or drops it silently
     * either way (1.17 tells the initiator nothing of a write to a closed
     * region), and pays for delivery completion with a slower protocol. */
    st->dc_last = strcmp(core_name(st->info), "shm") != 0;
    /*
     * The word the receiver polls (the SENTINEL tail, the FLAG sequence
     * word) must not be torn. shm's fast path for a write without remote CQ
     * data or delivery completion is the initiator's process_vm_writev
     * straight into the receiver's memory, whose kernel copy stores the 8
     * bytes in no set order (a poll saw the tail's last byte new and the
     * seven others still the sentinel, about once in ten credit-small
     * runs). A write with remote CQ data goes through shm's command queue
     * and is applied by the receiver's own progress, which none of its
     * polls runs into: the last write carries OFI_CQ_QUIET, which costs the
     * receiver a completion to skip and the sender nothing (delivery
     * completion, the other way off the fast path, costs it a round trip).
     */
    st->word_at_target = !st->dc_last;
    p->state = st;
    p->modes = pl.modes;
    p->default_detect = pl.default_detect;
    p->addr = st->addr;
    p->addr_len = st->addr_len;
    mr_mode_str(st->mr_mode, mm, sizeof mm);
    set_desc(p,
             "%s (%s) on %s: mr_mode %s, %zu-byte CQ data; last write ordered by %s (event), "
             "%s (flag/sentinel)",
             core_name(st->info),
             fi_provider_set() ? "FI_PROVIDER" : explicit_choice ? "DCHAN_PROVIDER=ofi"
                                                                 : "first RMA provider",
             st->info->domain_attr->name ? st->info->domain_attr->name : "?", mm, st->cq_data,
             order_name(st->ord_event), order_name(st->ord_tail));
    if (rank0) {
        char mx[24];
        if (st->max_msg == SIZE_MAX)
            snprintf(mx, sizeof mx, "unlimited");
        else
            snprintf(mx, sizeof mx, "%zu", st->max_msg);
        dchan_info(p->ctx, OFI_NAME,
                   "%s: writes of %s bytes at most, tx depth %zu, msg_order tx %#llx rx %#llx, "
                   "rx comp_order %#llx%s%s, %s data progress; delivery completion of the last "
                   "write: %s; %zu segments per write; get %s",
                   core_name(st->info), mx, st->info->tx_attr->size,
                   (unsigned long long)st->info->tx_attr->msg_order,
                   (unsigned long long)st->info->rx_attr->msg_order,
                   (unsigned long long)st->info->rx_attr->comp_order,
                   (st->info->caps & FI_FENCE) ? ", FI_FENCE" : "",
                   st->nrx ? ", FI_RX_CQ_DATA" : "",
                   st->info->domain_attr->data_progress == FI_PROGRESS_AUTO ? "automatic"
                                                                            : "manual",
                   st->dc_last ? "yes" : "no", st->iov_limit,
                   st->can_read ? "by fi_read" : "not offered (no FI_READ)");
        dchan_info(p->ctx, OFI_NAME, "credit area of %zu words per rank; credit writes %s",
                   st->credit_words,
                   st->credit_inject   ? "by fi_inject_write (write-after-write ordered)"
                   : st->credit_atomic ? "by fi_inject_atomic (FI_MAX: any order)"
                                       : "with delivery completion, one at a time per channel");
    }
    dchan_ofi_fn.freeinfo(list);
    return DCHAN_SUCCESS;
}

static int ofi_connect(struct dchan_prov *p, const void *addrs, size_t len)
{
    struct ofi_state *st = p->state;
    const unsigned char *all = addrs;
    uint64_t prov = dchan_get_le64(st->addr + 4), host = dchan_get_le64(st->addr + 12);

    for (int r = 0; r < st->nranks; r++) {
        const unsigned char *a = all + (size_t)r * len;
        size_t n, m;
        if (len < ADDR_HDR + 1 || dchan_get_le32(a) != ADDR_MAGIC ||
            (n = dchan_get_le16(a + 20)) + (m = dchan_get_le16(a + 22)) + ADDR_HDR + 1 > len ||
            dchan_get_le32(a + 24) == 0 || !m != !(st->mr_mode & FI_MR_RAW)) {
            set_desc(p, "malformed endpoint address from rank %d", r);
            return DCHAN_ERR_PROVIDER;
        }
        if (dchan_get_le64(a + 4) != prov) {
            set_desc(p, "rank %d chose another libfabric provider than %s (set FI_PROVIDER)", r,
                     core_name(st->info));
            return DCHAN_ERR_UNSUPPORTED;
        }
        if (st->same_host_only && dchan_get_le64(a + 12) != host) {
            set_desc(p, "%s reaches only this host; rank %d is elsewhere",
                     core_name(st->info), r);
            return DCHAN_ERR_UNSUPPORTED;
        }
        int ret = fi_av_insert(st->av, a + ADDR_HDR, 1, &st->peers[r], 0, NULL);
        if (ret != 1) {
            set_desc(p, "fi_av_insert of rank %d failed", r);
            return dchan_ofi_rc(p, ret < 0 ? ret : -FI_EINVAL, "fi_av_insert");
        }
        /* Where this rank's credit writes to r go. */
        struct ofi_cpeer *c = &st->cpeer[r];
        c->words = dchan_get_le32(a + 24);
        c->raddr = dchan_get_le64(a + 28);
        c->key = dchan_get_le64(a + 36);
        if (m) {
            uint64_t key;
            ret = fi_mr_map_raw(st->domain, c->key, (uint8_t *)(uintptr_t)(a + ADDR_HDR + n + 1),
                                m, &key, 0);
            if (ret) {
                set_desc(p, "fi_mr_map_raw of rank %d's credit area failed", r);
                return dchan_ofi_rc(p, ret, "fi_mr_map_raw (credit area)");
            }
            c->key = key;
            c->raw_mapped = true;
        }
    }
    return DCHAN_SUCCESS;
}

/* ---- wake-up ---------------------------------------------------------------------------- */

static int ofi_wake_fd(struct dchan_prov *p, int *fd)
{
    struct ofi_state *st = p->state;
    if (st->wait_fd >= 0) {
        *fd = st->wait_fd;
        return DCHAN_SUCCESS;
    }
    dchan_info(p->ctx, OFI_NAME, "%s has no wait fd: a sleeping process wakes on a timer to look",
               core_name(st->info));
    return dchan_waketimer_fd(p->ctx, &st->wt, fd);
}

/* Completions first (progress also serves incoming transfers under manual
 * progress), then fi_trywait: it resets the wait fd and refuses when
 * something came in between. A peer's silent write (SENTINEL or FLAG
 * tail, a credit word) ends in the target's progress on the fabrics here
 * (tcp applies RMA there), whose socket is in the wait set. */
static int ofi_wake_arm(struct dchan_prov *p)
{
    struct ofi_state *st = p->state;
    int n = dchan_ofi_progress(p);
    if (n != 0) {
        dchan_waketimer_activity(&st->wt);
        return n < 0 ? n : DCHAN_ERR_AGAIN;
    }
    if (st->wait_fd < 0)
        return dchan_waketimer_arm(&st->wt, false);
    struct fid *f = &st->cq->fid;
    int ret = fi_trywait(st->fabric, &f, 1);
    if (ret == -FI_EAGAIN)
        return DCHAN_ERR_AGAIN;
    return ret ? dchan_ofi_rc(p, ret, "fi_trywait") : DCHAN_SUCCESS;
}

static void ofi_close(struct dchan_prov *p)
{
    state_free(p->state);
    p->state = NULL;
}

const struct dchan_provider_ops dchan_ofi_ops = {
    .name = OFI_NAME,
    .wire_id = DCHAN_PROV_ID_OFI,
    .scope = DCHAN_SCOPE_NET,
    .modes = DCHAN_MODE_BIT(DCHAN_DETECT_SENTINEL) | DCHAN_MODE_BIT(DCHAN_DETECT_FLAG) |
             DCHAN_MODE_BIT(DCHAN_DETECT_EVENT),
    .probe = probe,
    .open = ofi_open,
    .connect = ofi_connect,
    .close = ofi_close,
    .mr_reg = dchan_ofi_mr_reg,
    .mr_dereg = dchan_ofi_mr_dereg,
    .mem_alloc = dchan_prov_nosys_mem_alloc,
    .mem_free = dchan_prov_nosys_mem_free,
    .recv_open = dchan_ofi_recv_open,
    .recv_arm = dchan_prov_noop_recv_arm,
    .recv_close = dchan_ofi_recv_close,
    .send_open = dchan_ofi_send_open,
    .put = dchan_ofi_put,
    .put_abandon = dchan_ofi_put_abandon,
    .send_close = dchan_ofi_send_close,
    .map_slot = dchan_prov_nosys_map_slot, /* peers' memory is never mapped here */
    .credit_open = dchan_ofi_credit_open,
    .credit_close = dchan_prov_noop_credit_close,
    .credit_write = dchan_ofi_credit_write,
    .progress = dchan_ofi_progress,
    .wake_fd = ofi_wake_fd,
    .wake_arm = ofi_wake_arm,
    .wake_disarm = dchan_prov_noop_wake_disarm,
    .sleeps = DCHAN_SLEEPS_FABRIC,
    .gather = true, /* fi_writemsg iovecs (ofi_rma.c) */
    .get = &dchan_ofi_get_ops, /* fi_read, where the fabric grants it (ofi_get.c) */
};
