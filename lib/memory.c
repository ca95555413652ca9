/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_alloc / dchan_free: memory from the provider that peers write most
 * cheaply (shm's shared segment), or from the heap when no provider offers
 * any, so that a program using dchan_alloc runs on every provider. Every
 * block is recorded in a sorted table, so that dchan_free of anything else
 * is refused instead of corrupting an allocator.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Index of the first block whose address is >= addr. */
static size_t mem_find(const dchan_ctx_t *ctx, uintptr_t addr)
{
    size_t lo = 0, hi = ctx->nmem;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ctx->mem[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

bool dchan_core_mem_overflows(const dchan_ctx_t *ctx, const void *ptr, size_t len)
{
    uintptr_t addr = (uintptr_t)ptr;
    size_t i = mem_find(ctx, addr + 1);
    if (i == 0)
        return false;
    const struct dchan_mem *m = &ctx->mem[i - 1]; /* the last block starting at or below addr */
    return addr < m->addr + m->size && len > m->addr + m->size - addr;
}

int dchan_core_mem_alloc(dchan_ctx_t *ctx, size_t size, size_t align, bool internal, void **out)
{
    struct dchan_prov *p = ctx->mem_prov;
    void *ptr = NULL;
    int rc;

    if (ctx->nmem == ctx->mem_cap) {
        size_t cap = ctx->mem_cap ? ctx->mem_cap * 2 : 64;
        struct dchan_mem *n = realloc(ctx->mem, cap * sizeof *n);
        if (!n)
            return DCHAN_ERR_NO_MEMORY;
        ctx->mem = n;
        ctx->mem_cap = cap;
    }
    if (p) {
        rc = p->ops->mem_alloc(p, size, align, &ptr);
        if (rc != DCHAN_SUCCESS)
            return rc;
    } else if (posix_memalign(&ptr, align, size)) {
        return DCHAN_ERR_NO_MEMORY;
    }
    size_t i = mem_find(ctx, (uintptr_t)ptr);
    memmove(&ctx->mem[i + 1], &ctx->mem[i], (ctx->nmem - i) * sizeof *ctx->mem);
    ctx->mem[i] = (struct dchan_mem){(uintptr_t)ptr, size, p, internal};
    ctx->nmem++;
    *out = ptr;
    return DCHAN_SUCCESS;
}

static void mem_release_at(dchan_ctx_t *ctx, size_t i)
{
    struct dchan_mem m = ctx->mem[i];
    memmove(&ctx->mem[i], &ctx->mem[i + 1], (ctx->nmem - i - 1) * sizeof *ctx->mem);
    ctx->nmem--;
    if (m.prov)
        m.prov->ops->mem_free(m.prov, (void *)m.addr);
    else
        free((void *)m.addr);
}

int dchan_core_mem_free(dchan_ctx_t *ctx, void *ptr, bool internal)
{
    size_t i = mem_find(ctx, (uintptr_t)ptr);
    if (i == ctx->nmem || ctx->mem[i].addr != (uintptr_t)ptr || ctx->mem[i].internal != internal)
        return DCHAN_ERR_INVALID_ARG;
    mem_release_at(ctx, i);
    return DCHAN_SUCCESS;
}

void dchan_core_mem_fini(dchan_ctx_t *ctx)
{
    while (ctx->nmem)
        mem_release_at(ctx, ctx->nmem - 1);
    free(ctx->mem);
    ctx->mem = NULL;
    ctx->mem_cap = 0;
}

/* The receive sequence pool's chunks (lib/seqslots.c). */
static int seq_chunk_alloc(void *arg, void **chunk)
{
    int rc = dchan_core_mem_alloc(arg, DCHAN_SEQ_CHUNK_BYTES, DCHAN_SEQ_CHUNK_BYTES, true, chunk);
    if (rc == DCHAN_SUCCESS)
        memset(*chunk, 0, DCHAN_SEQ_CHUNK_BYTES);
    return rc;
}

static void seq_chunk_free(void *arg, void *chunk)
{
    dchan_core_mem_free(arg, chunk, true);
}

void dchan_core_mem_init(dchan_ctx_t *ctx)
{
    for (int i = 0; i < ctx->nprovs && !ctx->mem_prov; i++)
        if (ctx->provs[i]->ops->mem_alloc != dchan_prov_nosys_mem_alloc)
            ctx->mem_prov = ctx->provs[i];
    ctx->recv_seq.chunk_alloc = seq_chunk_alloc;
    ctx->recv_seq.chunk_free = seq_chunk_free;
    ctx->recv_seq.arg = ctx;
}

/* Does [addr, addr + size) overlap the buffer of a live handle? */
static bool in_use(const dchan_ctx_t *ctx, uintptr_t addr, size_t size)
{
    for (const dchan_handle_t *h = ctx->all_head; h; h = h->all_next) {
        /* A receiver's depth slots; every other end has one buffer of size
         * bytes (a credited sender's depth is the receiver's). */
        uintptr_t b = (uintptr_t)h->buf;
        size_t len = h->role == DCHAN_ROLE_RECV ? h->size * h->depth : h->size;
        if (b < addr + size && addr < b + len)
            return true;
    }
    return false;
}

DCHAN_API int dchan_alloc(dchan_ctx_t *ctx, size_t size, void **ptr)
{
    if (!dchan_ctx_ok(ctx) || !ptr || size == 0 || size > ((size_t)1 << 48))
        return DCHAN_ERR_INVALID_ARG;
    dchan_ctx_lock(ctx);
    int rc = dchan_core_mem_alloc(ctx, size, DCHAN_ALLOC_ALIGN, false, ptr);
    if (rc == DCHAN_ERR_NO_MEMORY && ctx->mem_prov)
        dchan_warn(ctx, ctx->mem_prov->ops->name,
                   "dchan_alloc of %zu bytes: the shared segment is full (see dchan_info -e "
                   "for its size)",
                   size);
    dchan_ctx_unlock(ctx);
    return rc;
}

DCHAN_API int dchan_free(dchan_ctx_t *ctx, void *ptr)
{
    if (!dchan_ctx_ok(ctx))
        return DCHAN_ERR_INVALID_ARG;
    if (!ptr)
        return DCHAN_SUCCESS;
    dchan_ctx_lock(ctx);
    int rc = DCHAN_ERR_INVALID_ARG;
    size_t i = mem_find(ctx, (uintptr_t)ptr);
    if (i < ctx->nmem && ctx->mem[i].addr == (uintptr_t)ptr && !ctx->mem[i].internal) {
        /* A handle still reading or writing it would touch freed memory. */
        if (in_use(ctx, ctx->mem[i].addr, ctx->mem[i].size))
            rc = DCHAN_ERR_STATE;
        else
            rc = dchan_core_mem_free(ctx, ptr, false);
    }
    dchan_ctx_unlock(ctx);
    return rc;
}
