/* SPDX-License-Identifier: BSD-3-Clause */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "dchan.h"
#include "seqslots.h"

static int grow(void **arr, uint32_t *cap, size_t elem, uint32_t need)
{
    if (need <= *cap)
        return 0;
    uint32_t ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(*arr, (size_t)ncap * elem);
    if (!n)
        return -1;
    *arr = n;
    *cap = ncap;
    return 0;
}

int dchan_seqpool_get(struct dchan_seqpool *p, struct dchan_seqslot *s, uint64_t **word)
{
    if (p->nfree == 0) {
        void *chunk;
        uint32_t c = p->nchunks;
        if (grow((void **)&p->chunks, &p->chunks_cap, sizeof *p->chunks, c + 1) ||
            grow((void **)&p->free, &p->free_cap, sizeof *p->free,
                 (c + 1) * (uint32_t)DCHAN_SEQ_PER_CHUNK))
            return DCHAN_ERR_NO_MEMORY;
        if (p->chunk_alloc) {
            int rc = p->chunk_alloc(p->arg, &chunk);
            if (rc != DCHAN_SUCCESS)
                return rc;
        } else if (posix_memalign(&chunk, DCHAN_SEQ_CHUNK_BYTES, DCHAN_SEQ_CHUNK_BYTES)) {
            return DCHAN_ERR_NO_MEMORY;
        }
        memset(chunk, 0, DCHAN_SEQ_CHUNK_BYTES);
        p->chunks[c] = chunk;
        p->nchunks++;
        /* Pushed in reverse so that slots are handed out in address order. */
        for (uint32_t i = DCHAN_SEQ_PER_CHUNK; i-- > 0;)
            p->free[p->nfree++] = c * (uint32_t)DCHAN_SEQ_PER_CHUNK + i;
    }
    uint32_t n = p->free[--p->nfree];
    s->chunk = n / (uint32_t)DCHAN_SEQ_PER_CHUNK;
    s->index = n % (uint32_t)DCHAN_SEQ_PER_CHUNK;
    *word = &p->chunks[s->chunk][s->index];
    **word = 0;
    return DCHAN_SUCCESS;
}

void dchan_seqpool_put(struct dchan_seqpool *p, struct dchan_seqslot s)
{
    /* The stack holds every slot of every chunk, so this never allocates. */
    p->free[p->nfree++] = s.chunk * (uint32_t)DCHAN_SEQ_PER_CHUNK + s.index;
}

void dchan_seqpool_chunk(const struct dchan_seqpool *p, uint32_t chunk, void **base,
                         size_t *len)
{
    *base = p->chunks[chunk];
    *len = DCHAN_SEQ_CHUNK_BYTES;
}

void dchan_seqpool_fini(struct dchan_seqpool *p)
{
    for (uint32_t c = 0; c < p->nchunks; c++) {
        if (p->chunk_free)
            p->chunk_free(p->arg, p->chunks[c]);
        else
            free(p->chunks[c]);
    }
    free(p->chunks);
    free(p->free);
    memset(p, 0, sizeof *p);
}
