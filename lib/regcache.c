/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Registration cache: one provider registration per (address, length,
 * access), reference counted, so that a send buffer associated with many
 * handles (multicast) or a sequence-word chunk shared by many handles is
 * registered once. Used only when handles are created or associated, never
 * on the put or progress paths.
 */
#include "config.h"

#include <stdlib.h>

#include "core.h"
#include "regcache.h"

struct dchan_reg {
    struct dchan_regcache *cache;
    uintptr_t addr;
    size_t len;
    unsigned access;
    unsigned refs;
    void *mr;
    struct dchan_reg *next;
};

struct dchan_regcache {
    struct dchan_prov *prov;
    struct dchan_reg **buckets;
    size_t nbuckets, count;
};

static size_t bucket_of(const struct dchan_regcache *c, uintptr_t addr, size_t len,
                        unsigned access)
{
    uint64_t k = (uint64_t)addr * 0x9e3779b97f4a7c15ull ^ (uint64_t)len * 0xc2b2ae3d27d4eb4full ^
                 access;
    return (size_t)(k ^ (k >> 29)) & (c->nbuckets - 1);
}

int dchan_regcache_create(struct dchan_prov *p)
{
    struct dchan_regcache *c = calloc(1, sizeof *c);
    if (!c)
        return DCHAN_ERR_NO_MEMORY;
    c->nbuckets = 64;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return DCHAN_ERR_NO_MEMORY;
    }
    c->prov = p;
    p->regs = c;
    return DCHAN_SUCCESS;
}

static void rehash(struct dchan_regcache *c)
{
    size_t nb = c->nbuckets * 2;
    struct dchan_reg **nbk = calloc(nb, sizeof *nbk);
    if (!nbk)
        return; /* keep the longer chains; still correct */
    struct dchan_reg **old = c->buckets;
    size_t oldn = c->nbuckets;
    c->buckets = nbk;
    c->nbuckets = nb;
    for (size_t i = 0; i < oldn; i++) {
        for (struct dchan_reg *r = old[i], *next; r; r = next) {
            next = r->next;
            size_t b = bucket_of(c, r->addr, r->len, r->access);
            r->next = nbk[b];
            nbk[b] = r;
        }
    }
    free(old);
}

int dchan_reg_get(struct dchan_prov *p, void *addr, size_t len, unsigned access,
                  struct dchan_reg **out)
{
    struct dchan_regcache *c = p->regs;
    uintptr_t a = (uintptr_t)addr;
    int rc;

    if (!c || !addr || !len)
        return DCHAN_ERR_INVALID_ARG;
    size_t b = bucket_of(c, a, len, access);
    for (struct dchan_reg *r = c->buckets[b]; r; r = r->next) {
        if (r->addr == a && r->len == len && r->access == access) {
            r->refs++;
            p->ctx->stats.reg_cache_hits++;
            *out = r;
            return DCHAN_SUCCESS;
        }
    }
    struct dchan_reg *r = calloc(1, sizeof *r);
    if (!r)
        return DCHAN_ERR_NO_MEMORY;
    rc = p->ops->mr_reg(p, addr, len, access, &r->mr);
    if (rc != DCHAN_SUCCESS) {
        free(r);
        return rc;
    }
    p->ctx->stats.registrations++;
    r->cache = c;
    r->addr = a;
    r->len = len;
    r->access = access;
    r->refs = 1;
    r->next = c->buckets[b];
    c->buckets[b] = r;
    if (++c->count > c->nbuckets * 2)
        rehash(c);
    *out = r;
    return DCHAN_SUCCESS;
}

void dchan_reg_put(struct dchan_reg *r)
{
    if (!r || --r->refs > 0)
        return;
    struct dchan_regcache *c = r->cache;
    struct dchan_reg **pp = &c->buckets[bucket_of(c, r->addr, r->len, r->access)];
    while (*pp != r)
        pp = &(*pp)->next;
    *pp = r->next;
    c->count--;
    c->prov->ops->mr_dereg(c->prov, r->mr);
    free(r);
}

void *dchan_reg_mr(const struct dchan_reg *r)
{
    return r ? r->mr : NULL;
}

size_t dchan_regcache_count(const struct dchan_prov *p)
{
    return p->regs ? p->regs->count : 0;
}

void dchan_regcache_destroy(struct dchan_prov *p)
{
    struct dchan_regcache *c = p->regs;
    if (!c)
        return;
    for (size_t i = 0; i < c->nbuckets; i++) {
        for (struct dchan_reg *r = c->buckets[i], *next; r; r = next) {
            next = r->next;
            p->ops->mr_dereg(p, r->mr);
            free(r);
        }
    }
    free(c->buckets);
    free(c);
    p->regs = NULL;
}
