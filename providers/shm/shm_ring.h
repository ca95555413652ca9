/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shm segment as peers share it (header and EVENT ring records), and
 * the ring's consumer. Internal to the shm provider; declared here so that
 * the fuzz target can drive the consumer with arbitrary records, without
 * processes, and the targeted tests can play a faulty peer.
 */
#ifndef DCHAN_SHM_RING_H
#define DCHAN_SHM_RING_H

#include <stdint.h>

struct dchan_prov;

#define SHM_MAGIC 0x4d485344u /* "DSHM" */
#define SHM_VERSION 4u
#define SHM_HDR_BYTES 4096u
/* Ring sizes a segment may have (DCHAN_SHM_RING_SLOTS, a power of two). */
#define SHM_RING_MIN 16u
#define SHM_RING_MAX (1u << 24)

/* One arrival record per cache line, so that the producer filling one
 * never takes the line the consumer is reading. Puts of up to
 * SHM_INLINE_BYTES ride in the record and the consumer copies them into
 * the buffer: the receiver then takes one line from the sender instead of
 * two (record, then buffer), and never writes a buffer it does not own. */
#define SHM_INLINE_BYTES 48u
struct shm_slot {
    uint64_t seq; /* pos + 1 once the record at ring position pos is complete */
    uint32_t id;  /* receive handle id; 0: a claimed position with nothing */
    uint32_t len; /* bytes inline in data, 0: the body is in the buffer; | SHM_LEN_HINT;
                   * or SHM_LEN_WORD */
    unsigned char data[SHM_INLINE_BYTES];
};
_Static_assert(sizeof(struct shm_slot) == 64, "one record per cache line");

/* A record with SHM_LEN_HINT in len and a length of at most SHM_HINT_AT
 * (the body in the buffer, or a short one inline) carries at data +
 * SHM_HINT_AT a copy of the producer's latest credit write to the
 * consumer, made since its last record there. The consumer's next put on
 * that channel then knows its credit without loading the credit word,
 * whose line would otherwise cross from the producer and back for every
 * message of a credited exchange. */
#define SHM_LEN_HINT 0x80000000u
#define SHM_HINT_AT 32u
struct shm_hint {
    uint64_t value; /* the word's value */
    uint32_t index; /* the word's index */
    uint32_t unused;
};
_Static_assert(SHM_HINT_AT + sizeof(struct shm_hint) <= SHM_INLINE_BYTES, "hint in the record");

/* A record whose len is SHM_LEN_WORD | n carries the word that signals an
 * arrival on a SENTINEL or FLAG handle whose buffer (or sequence word)
 * lies outside the segment. The producer would write it with Cross Memory
 * Attach, whose copy the kernel makes byte by byte and may be preempted
 * in: its write of the signalling word could be seen half done, a word
 * that is neither the sentinel nor the tail. The consumer stores the word
 * instead, in one aligned store. The n (at most SHM_WORD_INLINE) bytes at
 * data + SHM_WORD_BODY_AT are the body of a small message (all of it but
 * the tail for SENTINEL, all of it for FLAG), which the consumer copies in
 * first, as it does EVENT's; 0: the body is in the buffer already. */
#define SHM_LEN_WORD 0x40000000u
#define SHM_WORD_BODY_AT 16u
#define SHM_WORD_INLINE (SHM_INLINE_BYTES - SHM_WORD_BODY_AT)
#define SHM_WORD_LEN_MASK 63u /* the bits of n in len */
struct shm_word {
    uint64_t value; /* the tail, or the sequence value */
    uint32_t slot;  /* the slot it signals */
    uint32_t unused;
};
_Static_assert(sizeof(struct shm_word) <= SHM_WORD_BODY_AT, "word before the body");
_Static_assert(SHM_WORD_INLINE <= SHM_WORD_LEN_MASK, "n fits its bits");

/* A record whose len has SHM_LEN_STAGED carries a body of n bytes (the
 * low SHM_STAGED_LEN_MASK bits, 1 ... SHM_STAGE_MAX) for a receive
 * buffer outside the segment, which the consumer copies in as it does an
 * inline one: no system call for the producer, where Cross Memory Attach
 * costs one per message (about 1.5 us here, ten times a small put). The
 * body starts at data (EVENT) or at data + SHM_WORD_BODY_AT (with
 * SHM_LEN_WORD: a signalling word record) and runs on over the whole
 * lines of the records that follow, which the producer claimed with it
 * and publishes with its seq: shm_staged_records() records in all, never
 * more than a quarter of the ring (larger bodies go by Cross Memory
 * Attach) and never across its end: where they would run across it, the
 * producer claims the positions up to the end as well and publishes a
 * staged record of id 0 over them, a filler the consumer passes over.
 * The consumer zeroes the seq of each line it passes so, so that a body
 * word left there can never look like a complete record of a later lap. */
#define SHM_LEN_STAGED 0x20000000u
#define SHM_STAGED_LEN_MASK 0xffffu
#define SHM_STAGE_MAX 4096u
_Static_assert(SHM_STAGE_MAX <= SHM_STAGED_LEN_MASK, "n fits its bits");
#define SHM_SLOT_DATA_AT 16u
_Static_assert(__builtin_offsetof(struct shm_slot, data) == SHM_SLOT_DATA_AT, "data's offset");

/* Records a staged body of n bytes at offset at of data takes, its own
 * included. */
static inline uint64_t shm_staged_records(uint64_t at, uint64_t n)
{
    return (SHM_SLOT_DATA_AT + at + n + 63) / 64;
}

/* At offset 0 of every segment; written by its owner before peers map it.
 * Every peer of the host can write it too: nobody trusts what it reads
 * here beyond what it validated (see shm.c). */
struct shm_hdr {
    uint32_t magic, version;
    uint64_t job_key;
    int32_t rank, pid;
    uint64_t size;
    uint64_t ring_off, ring_slots;
    uint64_t data_off;
    /* Lines apart by 128 bytes: the adjacent-line prefetcher fetches pairs,
     * and the tail (producers') and head (the owner's) must not travel
     * together. */
    _Alignas(128) uint64_t attached; /* peers that mapped it */
    uint64_t cma_probe; /* written by peers with process_vm_writev at connect */
    _Alignas(128) uint64_t ring_tail; /* next position producers claim */
    _Alignas(128) uint64_t ring_head; /* next position the owner consumes */
    /* Wake-up (DESIGN §7): nonzero while the owner sleeps on its eventfd;
     * a sender that finds it set after its signalling store takes it (one
     * signal per sleep) and writes the eventfd. Read-mostly, on a line of
     * its own. nowake: peers that could not get the eventfd. */
    _Alignas(128) uint32_t asleep;
    uint32_t nowake;
};

/* The consumer's side of a ring, in private memory: the position it
 * consumes next and the geometry are its own, never read back from the
 * segment. */
struct shm_ring {
    struct shm_slot *slots; /* written only to zero the seq of staged lines */
    uint64_t mask;       /* slots - 1 */
    uint64_t head;       /* next position to consume */
    uint64_t *head_pub;  /* where producers read head (the header's ring_head) */
    uint64_t dropped;    /* records that named no live handle taking them */
};

/* Consume the complete records at the head of r, at most one ring's worth,
 * reporting each to p's context; returns the records consumed. */
int dchan_shm_ring_consume(struct dchan_prov *p, struct shm_ring *r);

#endif /* DCHAN_SHM_RING_H */
