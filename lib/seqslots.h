/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * FLAG mode sequence words: 8-byte slots packed into page-aligned chunks
 * that never move, so a provider registers a chunk once (through the
 * registration cache) and the polling scan reads densely packed words.
 */
#ifndef DCHAN_SEQSLOTS_H
#define DCHAN_SEQSLOTS_H

#include <stddef.h>
#include <stdint.h>

#define DCHAN_SEQ_CHUNK_BYTES 4096u
#define DCHAN_SEQ_PER_CHUNK (DCHAN_SEQ_CHUNK_BYTES / sizeof(uint64_t))

struct dchan_seqslot {
    uint32_t chunk;
    uint32_t index;
};

struct dchan_seqpool {
    /* Where chunks come from; NULL: the heap. The receive pool takes them
     * from the context's allocator, so that peers on the host store into
     * the words directly. */
    int (*chunk_alloc)(void *arg, void **chunk);
    void (*chunk_free)(void *arg, void *chunk);
    void *arg;
    uint64_t **chunks;
    uint32_t nchunks, chunks_cap;
    uint32_t *free; /* stack of free slot numbers (chunk * PER_CHUNK + index) */
    uint32_t nfree, free_cap;
};

/* A zeroed slot; DCHAN_ERR_NO_MEMORY when no chunk can be added. */
int dchan_seqpool_get(struct dchan_seqpool *p, struct dchan_seqslot *s, uint64_t **word);
void dchan_seqpool_put(struct dchan_seqpool *p, struct dchan_seqslot s);
void dchan_seqpool_chunk(const struct dchan_seqpool *p, uint32_t chunk, void **base,
                         size_t *len);
void dchan_seqpool_fini(struct dchan_seqpool *p);

#endif
