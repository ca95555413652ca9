/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * ofi memory registration, through the core's registration cache, and the
 * remote-access fields of the wire. Every mr_mode bit the libfabric
 * provider may ask for is followed here:
 *   FI_MR_LOCAL      send buffers (and the sender's sequence words, the
 *                    segments of a gathered send side) are registered for
 *                    FI_WRITE, a getter's buffer for FI_READ, and their
 *                    desc passed;
 *   FI_MR_VIRT_ADDR  targets are virtual addresses, else offsets from the
 *                    registered region's base;
 *   FI_MR_PROV_KEY   the provider's key (fi_mr_key), else one we choose;
 *   FI_MR_ALLOCATED  buffers handed to dchan are allocated memory;
 *   FI_MR_ENDPOINT   fi_mr_bind to the endpoint, then fi_mr_enable;
 *   FI_MR_RAW        fi_mr_raw_attr here, fi_mr_map_raw at the sender.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "ofi.h"
#include "seqslots.h"
#include "wire.h"

static void mr_unlink(struct ofi_state *st, struct ofi_mr *m)
{
    if (m->prev)
        m->prev->next = m->next;
    else if (st->mrs == m)
        st->mrs = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->prev = m->next = NULL;
}

int dchan_ofi_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access, void **out)
{
    struct ofi_state *st = p->state;
    bool remote = (access & (DCHAN_ACCESS_REMOTE_WRITE | OFI_ACCESS_REMOTE_READ |
                             OFI_ACCESS_REMOTE_RW)) != 0;
    bool raw = remote && (st->mr_mode & FI_MR_RAW);
    size_t raw_cap = raw ? (st->key_size ? st->key_size : sizeof(uint64_t)) : 0;
    struct iovec iov = {.iov_base = addr, .iov_len = len};
    struct fi_mr_attr attr;
    struct ofi_mr *m;
    const char *what = "fi_mr_regattr";
    int ret;

    m = calloc(1, sizeof *m + raw_cap);
    if (!m)
        return DCHAN_ERR_NO_MEMORY;
    memset(&attr, 0, sizeof attr); /* iface 0 is FI_HMEM_SYSTEM */
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    /* Receive buffers take remote writes only; send buffers are read by
     * our own writes only; a source's buffer is read by its getter only,
     * its control words read and written; a getter reads into its buffer
     * and writes the taken word from its own words. */
    switch (access) {
    case DCHAN_ACCESS_REMOTE_WRITE: attr.access = FI_REMOTE_WRITE; break;
    case OFI_ACCESS_REMOTE_READ: attr.access = FI_REMOTE_READ; break;
    case OFI_ACCESS_REMOTE_RW: attr.access = FI_REMOTE_READ | FI_REMOTE_WRITE; break;
    case OFI_ACCESS_READ_INTO: attr.access = FI_READ | FI_WRITE; break;
    default: attr.access = FI_WRITE; break;
    }
    if (!(st->mr_mode & FI_MR_PROV_KEY)) {
        /* Keys we choose must be unique in the domain and fit mr_key_size. */
        if (st->key_size < sizeof(uint64_t) && st->next_key >> (8 * st->key_size)) {
            dchan_err(p->ctx, OFI_NAME, "out of %zu-byte memory keys", st->key_size);
            free(m);
            return DCHAN_ERR_NO_MEMORY;
        }
        attr.requested_key = st->next_key++;
    }
    ret = fi_mr_regattr(st->domain, &attr, 0, &m->mr);
    if (ret)
        goto free_mr;
    if (st->mr_mode & FI_MR_ENDPOINT) {
        what = "fi_mr_bind";
        ret = fi_mr_bind(m->mr, &st->ep->fid, 0);
        if (ret)
            goto close_mr;
        what = "fi_mr_enable";
        ret = fi_mr_enable(m->mr);
        if (ret)
            goto close_mr;
    }
    m->desc = fi_mr_desc(m->mr);
    if (raw) {
        size_t ks = raw_cap;
        what = "fi_mr_raw_attr";
        ret = fi_mr_raw_attr(m->mr, &m->raw_base, m->raw, &ks, 0);
        if (ret == -FI_ETOOSMALL) {
            /* Larger than mr_key_size said: grow and ask again. */
            struct ofi_mr *g = realloc(m, sizeof *m + ks);
            if (!g) {
                ret = -FI_ENOMEM;
                goto close_mr;
            }
            m = g;
            raw_cap = ks;
            ret = fi_mr_raw_attr(m->mr, &m->raw_base, m->raw, &ks, 0);
        }
        if (ret)
            goto close_mr;
        m->raw_len = ks;
    } else if (remote) {
        m->key = fi_mr_key(m->mr);
        if (m->key == FI_KEY_NOTAVAIL) {
            what = "fi_mr_key";
            ret = -FI_ENOKEY;
            goto close_mr;
        }
    }
    m->next = st->mrs;
    if (st->mrs)
        st->mrs->prev = m;
    st->mrs = m;
    *out = m;
    return DCHAN_SUCCESS;

close_mr:
    fi_close(&m->mr->fid);
free_mr:
    free(m);
    return dchan_ofi_rc(p, ret, what);
}

void dchan_ofi_mr_dereg(struct dchan_prov *p, void *mr)
{
    struct ofi_state *st = p->state;
    struct ofi_mr *m = mr;

    if (!m)
        return;
    if (!st || !m->mr) { /* already closed with the endpoint */
        free(m);
        return;
    }
    int ret = fi_close(&m->mr->fid);
    if (ret == -FI_EBUSY) {
        /* fi_mr(3): some providers refuse while the endpoint is open; the
         * region is closed after the endpoint, at provider close. */
        m->busy = true;
        return;
    }
    if (ret)
        dchan_ofi_rc(p, ret, "fi_close (memory region)");
    mr_unlink(st, m);
    free(m);
}

void dchan_ofi_mr_close_all(struct ofi_state *st)
{
    while (st->mrs) {
        struct ofi_mr *m = st->mrs;
        mr_unlink(st, m);
        if (m->mr)
            fi_close(&m->mr->fid);
        m->mr = NULL;
        /* Still owned by the registration cache, which frees it through
         * mr_dereg; a busy one was released by the cache already. */
        if (m->busy)
            free(m);
    }
}

/* ---- the wire's provider fields -------------------------------------------------------
 *   off len
 *    0   1  layout version (OFI_WIRE_VERSION)
 *    1   1  flags: OFI_WIRE_RAW (raw keys), OFI_WIRE_SEQ (a FLAG sequence word)
 *    2   1  raw key length of the buffer's region
 *    3   1  raw key length of the sequence word's region
 *    4   8  buffer: target address of byte 0 (virtual address, or offset 0)
 *   12   8  buffer: key, or with raw keys the region's base address
 *   20   8  sequence word: target address (virtual, or offset in its chunk)
 *   28   8  sequence word: key, or the raw base address
 *   36  28  raw keys: the buffer's, then the sequence word's
 * Unused bytes are zero; a raw key that does not fit is refused at
 * registration, never truncated. */

void dchan_ofi_wire_pack(const struct ofi_wire *w, unsigned char *out)
{
    out[0] = OFI_WIRE_VERSION;
    out[1] = w->flags;
    out[2] = w->buf_raw_len;
    out[3] = w->seq_raw_len;
    dchan_put_le64(out + 4, w->buf_addr);
    dchan_put_le64(out + 12, w->buf_key);
    dchan_put_le64(out + 20, w->seq_addr);
    dchan_put_le64(out + 28, w->seq_key);
    memcpy(out + 36, w->raw, (size_t)w->buf_raw_len + w->seq_raw_len);
}

int dchan_ofi_wire_unpack(const unsigned char *in, bool raw, bool flag, bool virt,
                          struct ofi_wire *w)
{
    size_t used;

    memset(w, 0, sizeof *w);
    w->flags = in[1];
    w->buf_raw_len = in[2];
    w->seq_raw_len = in[3];
    w->buf_addr = dchan_get_le64(in + 4);
    w->buf_key = dchan_get_le64(in + 12);
    w->seq_addr = dchan_get_le64(in + 20);
    w->seq_key = dchan_get_le64(in + 28);
    if (in[0] != OFI_WIRE_VERSION || (w->flags & ~(OFI_WIRE_RAW | OFI_WIRE_SEQ)) ||
        !(w->flags & OFI_WIRE_RAW) != !raw || !(w->flags & OFI_WIRE_SEQ) != !flag)
        return DCHAN_ERR_HANDLE;
    used = (size_t)w->buf_raw_len + w->seq_raw_len;
    if (raw ? w->buf_raw_len == 0 || !w->seq_raw_len != !flag || used > OFI_WIRE_RAW_BYTES
            : used != 0)
        return DCHAN_ERR_HANDLE;
    if (!flag && (w->seq_addr || w->seq_key))
        return DCHAN_ERR_HANDLE;
    /* Receive buffers are registered exactly: their offset is 0. Sequence
     * words are 8-byte slots of one registered chunk. */
    if (virt ? w->buf_addr == 0 : w->buf_addr != 0)
        return DCHAN_ERR_HANDLE;
    if (flag && (w->seq_addr % sizeof(uint64_t) ||
                 (virt ? w->seq_addr == 0 : w->seq_addr >= DCHAN_SEQ_CHUNK_BYTES)))
        return DCHAN_ERR_HANDLE;
    for (size_t k = 36 + used; k < DCHAN_WIRE_PROV_BYTES; k++)
        if (in[k])
            return DCHAN_ERR_HANDLE;
    memcpy(w->raw, in + 36, used);
    return DCHAN_SUCCESS;
}
