/* SPDX-License-Identifier: BSD-3-Clause */
/* Wire form encoding and structural validation (layout in wire.h). */
#include "config.h"

#include <stdint.h>
#include <string.h>

#include "wire.h"

enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_PROVIDER = 6,
    OFF_DETECT = 7,
    OFF_JOBKEY = 8,
    OFF_RRANK = 16,
    OFF_SRANK = 20,
    OFF_HID = 24,
    OFF_HGEN = 28,
    OFF_SIZE = 32,
    OFF_OOB = 40,
    OFF_PROV = 48,
    OFF_DEPTH = OFF_PROV + DCHAN_WIRE_PROV_BYTES,
    OFF_FLAGS = OFF_DEPTH + 1,
    OFF_CIDX = OFF_DEPTH + 2,
    OFF_CTAG = OFF_DEPTH + 4,
    OFF_SUM = 120
};
_Static_assert(OFF_CTAG + 4 == OFF_SUM, "wire layout");
#define WIRE_F_CREDIT 0x01u
#define WIRE_F_SOURCE 0x02u
_Static_assert(OFF_SUM + 8 == DCHAN_WIRE_SIZE, "wire layout");

void dchan_put_le16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

void dchan_put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

void dchan_put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

uint16_t dchan_get_le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

uint32_t dchan_get_le32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t dchan_get_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

uint64_t dchan_fnv1a64(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void dchan_wire_encode(const struct dchan_wire_fields *f, dchan_wire_t *w)
{
    unsigned char *b = w->bytes;
    memset(b, 0, DCHAN_WIRE_SIZE);
    dchan_put_le32(b + OFF_MAGIC, DCHAN_WIRE_MAGIC);
    dchan_put_le16(b + OFF_VERSION, DCHAN_WIRE_VERSION);
    b[OFF_PROVIDER] = f->provider_id;
    b[OFF_DETECT] = f->detect;
    dchan_put_le64(b + OFF_JOBKEY, f->job_key);
    dchan_put_le32(b + OFF_RRANK, f->recv_rank);
    dchan_put_le32(b + OFF_SRANK, f->send_rank);
    dchan_put_le32(b + OFF_HID, f->handle_id);
    dchan_put_le32(b + OFF_HGEN, f->handle_gen);
    dchan_put_le64(b + OFF_SIZE, f->size);
    dchan_put_le64(b + OFF_OOB, f->detect == DCHAN_DETECT_SENTINEL ? f->oob : 0);
    memcpy(b + OFF_PROV, f->prov, DCHAN_WIRE_PROV_BYTES);
    /* depth - 1, so that a default handle's bytes stay zero as before. */
    b[OFF_DEPTH] = (unsigned char)(f->depth > 1 ? f->depth - 1 : 0);
    b[OFF_FLAGS] = (unsigned char)((f->credit ? WIRE_F_CREDIT : 0) | (f->source ? WIRE_F_SOURCE : 0));
    dchan_put_le16(b + OFF_CIDX, f->credit_index);
    dchan_put_le32(b + OFF_CTAG, f->credit_tag);
    dchan_put_le64(b + OFF_SUM, dchan_fnv1a64(b, OFF_SUM));
}

int dchan_wire_decode(const dchan_wire_t *w, struct dchan_wire_fields *f)
{
    const unsigned char *b = w->bytes;

    if (dchan_get_le32(b + OFF_MAGIC) != DCHAN_WIRE_MAGIC ||
        dchan_get_le16(b + OFF_VERSION) != DCHAN_WIRE_VERSION ||
        dchan_get_le64(b + OFF_SUM) != dchan_fnv1a64(b, OFF_SUM))
        return DCHAN_ERR_HANDLE;
    if (b[OFF_FLAGS] & ~(WIRE_F_CREDIT | WIRE_F_SOURCE))
        return DCHAN_ERR_HANDLE;

    f->provider_id = b[OFF_PROVIDER];
    f->detect = b[OFF_DETECT];
    f->job_key = dchan_get_le64(b + OFF_JOBKEY);
    f->recv_rank = dchan_get_le32(b + OFF_RRANK);
    f->send_rank = dchan_get_le32(b + OFF_SRANK);
    f->handle_id = dchan_get_le32(b + OFF_HID);
    f->handle_gen = dchan_get_le32(b + OFF_HGEN);
    f->size = dchan_get_le64(b + OFF_SIZE);
    f->oob = dchan_get_le64(b + OFF_OOB);
    memcpy(f->prov, b + OFF_PROV, DCHAN_WIRE_PROV_BYTES);
    f->depth = b[OFF_DEPTH] + 1u;
    f->credit = (b[OFF_FLAGS] & WIRE_F_CREDIT) != 0;
    f->source = (b[OFF_FLAGS] & WIRE_F_SOURCE) != 0;
    /* A source is read whole, once per version: no slots, credit or mode. */
    if (f->source && (f->credit || b[OFF_DEPTH] != 0 || f->detect != DCHAN_DETECT_EVENT))
        return DCHAN_ERR_HANDLE;
    f->credit_index = dchan_get_le16(b + OFF_CIDX);
    f->credit_tag = dchan_get_le32(b + OFF_CTAG);

    /* Depth needs credit; credit needs a tag (never 0) and nothing else
     * does; the slots must fit in memory. */
    if (f->depth > DCHAN_MAX_DEPTH || (f->depth > 1 && !f->credit) ||
        (f->credit ? f->credit_tag == 0 : (f->credit_index | f->credit_tag) != 0) ||
        f->size > SIZE_MAX / f->depth)
        return DCHAN_ERR_HANDLE;
    if (f->provider_id == 0 || f->job_key == 0 || f->handle_id == 0 || f->size == 0)
        return DCHAN_ERR_HANDLE;
    /* The id carries the generation's low byte, which is never 0. */
    if ((f->handle_gen & 0xffu) == 0 || (f->handle_gen & 0xffu) != f->handle_id >> 24)
        return DCHAN_ERR_HANDLE;
    if (f->recv_rank > INT32_MAX || f->send_rank > INT32_MAX)
        return DCHAN_ERR_HANDLE;
    switch (f->detect) {
    case DCHAN_DETECT_SENTINEL:
        if (f->size < 8 || f->size % 8 != 0)
            return DCHAN_ERR_HANDLE;
        break;
    case DCHAN_DETECT_FLAG:
    case DCHAN_DETECT_EVENT:
        if (f->oob != 0)
            return DCHAN_ERR_HANDLE;
        break;
    default:
        return DCHAN_ERR_HANDLE;
    }
    return DCHAN_SUCCESS;
}
