/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The 128-byte wire form of a receive handle. All integers little-endian:
 *
 *   off len field
 *     0   4 magic "DCHW"          48  64 provider remote-access fields
 *     4   2 format version        112  8 credit and depth (below)
 *     6   1 provider id           120  8 checksum: FNV-1a 64 of bytes 0..119
 *     7   1 detection mode
 *     8   8 job key
 *    16   4 receiver rank
 *    20   4 sender rank
 *    24   4 receive handle id (slot, low byte of the generation)
 *    28   4 receive handle generation (whole)
 *    32   8 size
 *    40   8 oob pattern (SENTINEL; zero otherwise)
 *
 *   112   1 depth - 1 (slots of size bytes; 0 for depth 1)
 *   113   1 flags: 0x01 credit, 0x02 source (a get channel; EVENT, depth 1, no credit)
 *   114   2 credit word index (in the sender's credit area for this receiver)
 *   116   4 credit tag (high half of every credit word; 0 without credit)
 *
 * FNV-1a changes its result for any change of a single byte, so every one
 * byte corruption is refused, as is anything not written by dchan.
 */
#ifndef DCHAN_WIRE_H
#define DCHAN_WIRE_H

#include <stdbool.h>
#include <stdint.h>

#include "dchan.h"
#include "provider.h"

#define DCHAN_WIRE_MAGIC 0x57484344u /* "DCHW" read little-endian */
#define DCHAN_WIRE_VERSION 1u

struct dchan_wire_fields {
    uint8_t provider_id;
    uint8_t detect;
    uint64_t job_key;
    uint32_t recv_rank;
    uint32_t send_rank;
    uint32_t handle_id;
    uint32_t handle_gen;
    uint64_t size;
    uint64_t oob;
    uint32_t depth; /* 1 ... DCHAN_MAX_DEPTH */
    bool credit;
    bool source; /* the wire of a source (dchan_create_source): for dchan_assoc_remote */
    uint16_t credit_index;
    uint32_t credit_tag;
    unsigned char prov[DCHAN_WIRE_PROV_BYTES];
};

void dchan_wire_encode(const struct dchan_wire_fields *f, dchan_wire_t *w);
/* Structural check of every field; DCHAN_ERR_HANDLE for anything off. */
int dchan_wire_decode(const dchan_wire_t *w, struct dchan_wire_fields *f);
uint64_t dchan_fnv1a64(const void *p, size_t n);

/* Little-endian helpers, also for providers' remote-access fields. */
void dchan_put_le16(unsigned char *p, uint16_t v);
void dchan_put_le32(unsigned char *p, uint32_t v);
void dchan_put_le64(unsigned char *p, uint64_t v);
uint16_t dchan_get_le16(const unsigned char *p);
uint32_t dchan_get_le32(const unsigned char *p);
uint64_t dchan_get_le64(const unsigned char *p);

#endif
