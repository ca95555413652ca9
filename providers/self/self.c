/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * self: channels whose sender is the receiver's own rank. A put is a copy
 * into the receive buffer followed by a release store of the tail or the
 * sequence word (or a direct arrival report for EVENT), so a thread polling
 * with acquire loads never sees the signal before the data.
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "provider.h"

extern const struct dchan_provider_ops dchan_self_ops;

struct self_h {
    uint32_t recv_id; /* looked up at each put: a destroyed receiver is noticed */
};

static int self_probe(struct dchan_probe *out)
{
    snprintf(out->desc, sizeof out->desc, "in-process copies for a rank's own channels");
    out->modes = dchan_self_ops.modes;
    out->default_detect = DCHAN_DETECT_EVENT;
    return DCHAN_SUCCESS;
}

/* The credit area: the only peer is this rank, and its words are plain
 * memory, so it grows with the channels (credit_words_max, up to every
 * 16-bit index), in chunks that never move: a send handle keeps its word's
 * address. */
#define SELF_CHUNK_WORDS 256
#define SELF_CREDIT_WORDS 65536
struct self_state {
    uint64_t *chunk[SELF_CREDIT_WORDS / SELF_CHUNK_WORDS];
};

static uint64_t *credit_word(struct dchan_prov *p, uint32_t index)
{
    struct self_state *s = p->state;
    uint64_t **c = &s->chunk[index / SELF_CHUNK_WORDS];
    if (!*c && !(*c = calloc(SELF_CHUNK_WORDS, sizeof **c)))
        return NULL;
    return *c + index % SELF_CHUNK_WORDS;
}

static int self_open(struct dchan_prov *p)
{
    p->default_detect = DCHAN_DETECT_EVENT;
    p->addr_len = 0;
    p->state = calloc(1, sizeof(struct self_state));
    return p->state ? DCHAN_SUCCESS : DCHAN_ERR_NO_MEMORY;
}

static int self_connect(struct dchan_prov *p, const void *addrs, size_t len)
{
    return DCHAN_SUCCESS;
}

static void self_close(struct dchan_prov *p)
{
    struct self_state *s = p->state;
    for (size_t i = 0; s && i < sizeof s->chunk / sizeof s->chunk[0]; i++)
        free(s->chunk[i]);
    free(p->state);
    p->state = NULL;
}

static int self_recv_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    return DCHAN_SUCCESS; /* the sender finds the receiver by id, in-process */
}

static void self_recv_close(dchan_handle_t *h)
{
}

/* The receive handle a sender handle writes to, if it still exists: the
 * id names a table entry, and the generation says it is still the handle
 * the wire described (a destroyed handle's entry changes generation). */
static dchan_handle_t *target(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    dchan_handle_t *r = dchan_ctx_recv_handle(p->ctx, DCHAN_PROV_PRIV(h, struct self_h)->recv_id);
    return r && dchan_h_gen(r) == dchan_h_gen(h) ? r : NULL;
}

/* At association: the wire must describe that handle exactly. */
static dchan_handle_t *target_checked(dchan_handle_t *h)
{
    struct dchan_prov *p = dchan_h_prov(h);
    dchan_handle_t *r = target(h);
    if (!r || dchan_h_prov(r) != p || dchan_h_size(r) != dchan_h_size(h) ||
        dchan_h_depth(r) != dchan_h_depth(h) || dchan_h_detect(r) != dchan_h_detect(h) ||
        dchan_h_peer(r) != dchan_ctx_rank(p->ctx))
        return NULL;
    return r;
}

static int self_send_open(dchan_handle_t *h, const unsigned char *wire_fields)
{
    for (int i = 0; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wire_fields[i])
            return DCHAN_ERR_HANDLE;
    DCHAN_PROV_PRIV(h, struct self_h)->recv_id = dchan_h_remote_id(h);
    return target_checked(h) ? DCHAN_SUCCESS : DCHAN_ERR_HANDLE;
}

static int self_put(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    dchan_handle_t *r = target(h);
    if (!r)
        return DCHAN_ERR_PEER; /* the receive handle was destroyed */
    /* Never overwrite data the application still holds. */
    int rc = dchan_core_recv_writable(r, d->slot);
    if (rc != DCHAN_SUCCESS) {
        dchan_core_wake(dchan_h_prov(h)->ctx); /* the overrun is an error to report */
        return rc;
    }
    char *dst = (char *)dchan_h_buf(r) + d->offset;
    switch (d->detect) {
    case DCHAN_DETECT_SENTINEL: {
        uint64_t tail;
        if (d->iov) {
            /* Gathered: the body, then the tail, which may straddle segments. */
            dchan_gather_copy(d, 0, d->size - 8, dst);
            dchan_gather_copy(d, d->size - 8, d->size, &tail);
        } else {
            memmove(dst, d->src, d->size - 8);
            memcpy(&tail, (const char *)d->src + d->size - 8, 8);
        }
        __atomic_store_n((uint64_t *)(dst + d->size - 8), tail, __ATOMIC_RELEASE);
        break;
    }
    case DCHAN_DETECT_FLAG:
        if (d->iov)
            dchan_gather_copy(d, 0, d->size, dst);
        else if (d->src)
            memmove(dst, d->src, d->size);
        __atomic_store_n(dchan_h_seq_word(r), d->seq, __ATOMIC_RELEASE);
        break;
    default:
        if (d->iov)
            dchan_gather_copy(d, 0, d->size, dst);
        else if (d->src)
            memmove(dst, d->src, d->size);
        dchan_core_arrival(r);
        break;
    }
    /* Another thread of this process may sleep on the wake-up descriptor. */
    dchan_core_wake(dchan_h_prov(h)->ctx);
    return DCHAN_PROV_PUT_DONE;
}

static int self_map_slot(dchan_handle_t *h, size_t offset, void **ptr)
{
    dchan_handle_t *r = target(h);
    if (!r)
        return DCHAN_ERR_UNSUPPORTED; /* the put will report the receiver gone */
    *ptr = (char *)dchan_h_buf(r) + offset;
    return DCHAN_SUCCESS;
}

static int self_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word)
{
    /* The receiver is in this process: its word, or a forged wire. */
    dchan_handle_t *r = target(h);
    if (!r || dchan_h_credit_index(r) != index)
        return DCHAN_ERR_HANDLE;
    if (!(*word = credit_word(dchan_h_prov(h), index)))
        return DCHAN_ERR_NO_MEMORY;
    return DCHAN_SUCCESS;
}

static int self_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src)
{
    uint64_t *w = credit_word(dchan_h_prov(h), index); /* taken by the sender's open */
    if (!w)
        return DCHAN_ERR_NO_MEMORY;
    __atomic_store_n(w, *src, __ATOMIC_RELEASE);
    dchan_core_wake(dchan_h_prov(h)->ctx);
    return DCHAN_PROV_PUT_DONE;
}

static void self_send_close(dchan_handle_t *h)
{
}

/* ---- get: the getter finds the source by id, in-process ---------------------------- */

static dchan_handle_t *source_of(dchan_handle_t *g)
{
    dchan_handle_t *s =
        dchan_ctx_recv_handle(dchan_h_prov(g)->ctx, DCHAN_PROV_PRIV(g, struct self_h)->recv_id);
    return dchan_h_is_source(s) && dchan_h_gen(s) == dchan_h_gen(g) ? s : NULL;
}

static int self_src_open(dchan_handle_t *h, unsigned char *wire_fields)
{
    return DCHAN_SUCCESS;
}

static void self_src_close(dchan_handle_t *h)
{
}

static int self_src_publish(dchan_handle_t *h)
{
    dchan_core_wake(dchan_h_prov(h)->ctx); /* the getter may be another thread */
    return DCHAN_SUCCESS;
}

static int self_get_open(dchan_handle_t *g, const unsigned char *wire_fields)
{
    for (int i = 0; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wire_fields[i])
            return DCHAN_ERR_HANDLE;
    DCHAN_PROV_PRIV(g, struct self_h)->recv_id = dchan_h_remote_id(g);
    dchan_handle_t *s = source_of(g);
    return s && dchan_h_size(s) == dchan_h_size(g) ? DCHAN_SUCCESS : DCHAN_ERR_HANDLE;
}

static void self_get_close(dchan_handle_t *g)
{
}

static int self_get_peek(dchan_handle_t *g, uint64_t *v)
{
    dchan_handle_t *s = source_of(g);
    *v = s ? __atomic_load_n(&dchan_h_ctl(s)[0], __ATOMIC_ACQUIRE) : 0;
    return DCHAN_SUCCESS;
}

static int self_get(dchan_handle_t *g)
{
    dchan_handle_t *s = source_of(g);
    if (!s)
        return DCHAN_ERR_PEER;
    memmove(dchan_h_buf(g), dchan_h_buf(s), dchan_h_size(g));
    return DCHAN_PROV_PUT_DONE;
}

static int self_get_ack(dchan_handle_t *g, uint64_t v)
{
    dchan_handle_t *s = source_of(g);
    if (s)
        __atomic_store_n(&dchan_h_ctl(s)[1], v, __ATOMIC_RELEASE);
    dchan_core_wake(dchan_h_prov(g)->ctx);
    return DCHAN_SUCCESS;
}

static const struct dchan_get_ops self_get_ops = {
    .src_open = self_src_open,
    .src_close = self_src_close,
    .src_publish = self_src_publish,
    .get_open = self_get_open,
    .get_close = self_get_close,
    .get_peek = self_get_peek,
    .get = self_get,
    .get_ack = self_get_ack,
};

const struct dchan_provider_ops dchan_self_ops = {
    .name = "self",
    .wire_id = DCHAN_PROV_ID_SELF,
    .scope = DCHAN_SCOPE_SELF,
    .credit_words_max = SELF_CREDIT_WORDS,
    .modes = DCHAN_MODE_BIT(DCHAN_DETECT_SENTINEL) | DCHAN_MODE_BIT(DCHAN_DETECT_FLAG) |
             DCHAN_MODE_BIT(DCHAN_DETECT_EVENT),
    .probe = self_probe,
    .open = self_open,
    .connect = self_connect,
    .close = self_close,
    .mr_reg = dchan_prov_nosys_mr_reg,
    .mr_dereg = dchan_prov_nosys_mr_dereg,
    .mem_alloc = dchan_prov_nosys_mem_alloc,
    .mem_free = dchan_prov_nosys_mem_free,
    .recv_open = self_recv_open,
    .recv_arm = dchan_prov_noop_recv_arm,
    .recv_close = self_recv_close,
    .send_open = self_send_open,
    .put = self_put,
    .put_abandon = dchan_prov_noop_put_abandon,
    .send_close = self_send_close,
    .map_slot = self_map_slot,
    .credit_open = self_credit_open,
    .credit_close = dchan_prov_noop_credit_close,
    .credit_write = self_credit_write,
    .progress = dchan_prov_noop_progress,
    /* In-process: the core's own eventfd, signalled by dchan_core_wake. */
    .wake_fd = dchan_prov_nowake_fd,
    .wake_arm = dchan_prov_noop_wake_arm,
    .wake_disarm = dchan_prov_noop_wake_disarm,
    .sleeps = DCHAN_SLEEPS_EVENT,
    .gather = true, /* a gathering copy into the slot */
    .get = &self_get_ops,
};
