/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Gathered send sides (dchan_assoc_local_iov, dchan_assoc_local_subarray)
 * and the sender's completion callback (dchan_set_completion), DESIGN §7.
 *
 * A send side is turned into a list of non-empty segments once, at
 * association; a subarray becomes the runs of its last dimension, merged
 * where they touch (a block of full rows is one segment). Each put then
 * hands the list to the provider (ops.gather), or gathers it into a
 * staging buffer for providers without a gather of their own.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "handle.h"
#include "strided.h"

/* ---- segment lists ------------------------------------------------------------ */

static int seg_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const dchan_iov_t *)a)->base,
              y = (uintptr_t)((const dchan_iov_t *)b)->base;
    return x < y ? -1 : x > y;
}

int dchan_iov_import(const dchan_iov_t *iov, int n, dchan_iov_t **out, size_t *nout,
                     size_t *total)
{
    size_t sum = 0, k = 0;

    if (!iov || n < 1)
        return DCHAN_ERR_INVALID_ARG;
    for (int i = 0; i < n; i++) {
        if (iov[i].len == 0)
            continue; /* allowed, as in writev: nothing to send */
        uintptr_t b = (uintptr_t)iov[i].base;
        if (!iov[i].base || iov[i].len > UINTPTR_MAX - b || iov[i].len > SIZE_MAX - sum)
            return DCHAN_ERR_INVALID_ARG;
        sum += iov[i].len;
        k++;
    }
    if (k == 0) {
        /* Nothing at all: no receive buffer is empty. */
        *out = NULL;
        *nout = 0;
        *total = 0;
        return DCHAN_SUCCESS;
    }
    dchan_iov_t *segs = malloc(k * sizeof *segs), *sorted = malloc(k * sizeof *sorted);
    if (!segs || !sorted) {
        free(segs);
        free(sorted);
        return DCHAN_ERR_NO_MEMORY;
    }
    k = 0;
    for (int i = 0; i < n; i++)
        if (iov[i].len)
            segs[k++] = iov[i];
    /* Overlapping segments would send some bytes twice: almost surely a
     * mistake in the caller's arithmetic, refused like an out-of-bounds
     * subarray. */
    memcpy(sorted, segs, k * sizeof *segs);
    qsort(sorted, k, sizeof *sorted, seg_cmp);
    for (size_t i = 1; i < k; i++)
        if ((uintptr_t)sorted[i - 1].base + sorted[i - 1].len > (uintptr_t)sorted[i].base) {
            free(segs);
            free(sorted);
            return DCHAN_ERR_INVALID_ARG;
        }
    free(sorted);
    /* Segments that follow each other in memory and in order: one. */
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m && (const char *)segs[m - 1].base + segs[m - 1].len == segs[i].base)
            segs[m - 1].len += segs[i].len;
        else
            segs[m++] = segs[i];
    }
    *out = segs;
    *nout = m;
    *total = sum;
    return DCHAN_SUCCESS;
}

/* Append a run, merged with the last when it starts where that one ends. */
static int run_add(dchan_iov_t **segs, size_t *n, size_t *cap, const char *p, size_t len)
{
    if (*n && (const char *)(*segs)[*n - 1].base + (*segs)[*n - 1].len == p) {
        (*segs)[*n - 1].len += len;
        return DCHAN_SUCCESS;
    }
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        dchan_iov_t *g = realloc(*segs, c * sizeof *g);
        if (!g)
            return DCHAN_ERR_NO_MEMORY;
        *segs = g;
        *cap = c;
    }
    (*segs)[(*n)++] = (dchan_iov_t){p, len};
    return DCHAN_SUCCESS;
}

int dchan_subarray_runs(const void *base, int ndims, const size_t sizes[],
                        const size_t subsizes[], const size_t starts[], size_t elem_size,
                        dchan_iov_t **out, size_t *nout, size_t *total)
{
    size_t sz[3] = {1, 1, 1}, sub[3] = {1, 1, 1}, st[3] = {0, 0, 0};
    size_t span = elem_size, sum = elem_size;

    if (!base || ndims < 1 || ndims > 3 || !sizes || !subsizes || !starts || elem_size == 0)
        return DCHAN_ERR_INVALID_ARG;
    /* Right-aligned into three dimensions: missing outer ones are 1 wide. */
    for (int i = 0; i < ndims; i++) {
        int j = 3 - ndims + i;
        sz[j] = sizes[i];
        sub[j] = subsizes[i];
        st[j] = starts[i];
        if (sub[j] < 1 || st[j] > sz[j] || sub[j] > sz[j] - st[j])
            return DCHAN_ERR_INVALID_ARG;
        /* The whole array and the subarray must be addressable. */
        if (sz[j] > SIZE_MAX / span || sub[j] > SIZE_MAX / sum)
            return DCHAN_ERR_INVALID_ARG;
        span *= sz[j];
        sum *= sub[j];
    }
    if (span > UINTPTR_MAX - (uintptr_t)base)
        return DCHAN_ERR_INVALID_ARG;
    dchan_iov_t *segs = NULL;
    size_t n = 0, cap = 0, row = sub[2] * elem_size;
    for (size_t i = 0; i < sub[0]; i++)
        for (size_t j = 0; j < sub[1]; j++) {
            size_t off = (((st[0] + i) * sz[1] + st[1] + j) * sz[2] + st[2]) * elem_size;
            if (run_add(&segs, &n, &cap, (const char *)base + off, row) != DCHAN_SUCCESS) {
                free(segs);
                return DCHAN_ERR_NO_MEMORY;
            }
        }
    /* A list that grew by doubling: give back the slack. */
    if (n < cap) {
        dchan_iov_t *t = realloc(segs, n * sizeof *t);
        if (t)
            segs = t;
    }
    *out = segs;
    *nout = n;
    *total = sum;
    return DCHAN_SUCCESS;
}

/* ---- gathering ------------------------------------------------------------------- */

void dchan_segs_copy(const dchan_iov_t *segs, size_t nseg, size_t from, size_t to, void *dst)
{
    char *d = dst;
    size_t pos = 0;
    for (size_t i = 0; i < nseg && pos < to; pos += segs[i].len, i++) {
        size_t end = pos + segs[i].len;
        if (end <= from)
            continue;
        size_t a = from > pos ? from - pos : 0, b = (to < end ? to : end) - pos;
        const char *s = (const char *)segs[i].base + a;
        /* Single elements (a face across the last axis): a call to memcpy
         * per 8 bytes would cost more than the copy. */
        if (b - a == 8) {
            uint64_t w;
            memcpy(&w, s, 8);
            memcpy(d, &w, 8);
        } else {
            memcpy(d, s, b - a);
        }
        d += b - a;
    }
}

size_t dchan_h_segs(const dchan_handle_t *h, const dchan_iov_t **segs)
{
    *segs = h->segs;
    return h->segs ? h->nseg : 0;
}

struct dchan_gvec *dchan_segs_vectorize(const dchan_iov_t *segs, size_t nseg, size_t *nvec)
{
    struct dchan_gvec *v = malloc(nseg * sizeof *v);
    size_t n = 0;
    if (!v)
        return NULL;
    for (size_t i = 0; i < nseg;) {
        struct dchan_gvec g = {segs[i].base, segs[i].len, 1, 0};
        size_t j = i + 1;
        if (j < nseg && segs[j].len == g.len) {
            g.stride = (const char *)segs[j].base - g.base;
            while (j < nseg && segs[j].len == g.len &&
                   (const char *)segs[j].base - (const char *)segs[j - 1].base == g.stride)
                j++;
            g.count = j - i;
        }
        v[n++] = g;
        i = j;
    }
    struct dchan_gvec *t = realloc(v, n * sizeof *v);
    *nvec = n;
    return t ? t : v;
}

void dchan_gvec_copy(const struct dchan_gvec *v, size_t nv, size_t from, size_t to, void *dst)
{
    char *d = dst;
    size_t pos = 0;
    for (size_t i = 0; i < nv && pos < to; i++) {
        size_t len = v[i].len, end = pos + len * v[i].count;
        if (end <= from) {
            pos = end;
            continue;
        }
        size_t a = from > pos ? from - pos : 0, left = (to < end ? to : end) - pos - a;
        size_t k = a / len, off = a % len;
        const char *p = v[i].base + (ptrdiff_t)k * v[i].stride;
        if (len == 8 && off == 0) {
            /* Single elements at a stride: no call per element. */
            for (; left >= 8; left -= 8, d += 8, p += v[i].stride) {
                uint64_t w;
                memcpy(&w, p, 8);
                memcpy(d, &w, 8);
            }
        }
        while (left) {
            size_t n = len - off < left ? len - off : left;
            memcpy(d, p + off, n);
            d += n;
            left -= n;
            off = 0;
            p += v[i].stride;
        }
        pos = end;
    }
}

void dchan_gather_copy(const struct dchan_put_desc *d, size_t from, size_t to, void *dst)
{
    if (d->vec)
        dchan_gvec_copy(d->vec, d->nvec, from, to, dst);
    else
        dchan_segs_copy(d->iov, d->iovcnt, from, to, dst);
}

size_t dchan_gather_slice(const struct dchan_put_desc *d, size_t *from, size_t to,
                          dchan_iov_t *out, size_t max)
{
    size_t pos = 0, k = 0;
    for (size_t i = 0; i < d->iovcnt && pos < to && k < max; pos += d->iov[i].len, i++) {
        size_t end = pos + d->iov[i].len;
        if (end <= *from)
            continue;
        size_t a = *from > pos ? *from - pos : 0, b = (to < end ? to : end) - pos;
        out[k++] = (dchan_iov_t){(const char *)d->iov[i].base + a, b - a};
        *from = pos + b;
    }
    return k;
}

/* ---- completion callback ----------------------------------------------------------- */

DCHAN_API int dchan_set_completion(dchan_handle_t *h, dchan_arrival_fn fn, void *arg)
{
    if (!h)
        return DCHAN_ERR_INVALID_ARG;
    if (h->magic == DCHAN_H_DEAD)
        return DCHAN_ERR_STATE;
    if (h->magic != DCHAN_H_MAGIC)
        return DCHAN_ERR_INVALID_ARG;
    if (h->role != DCHAN_ROLE_SEND)
        return DCHAN_ERR_STATE;
    dchan_ctx_t *ctx = h->ctx;
    int rc = DCHAN_SUCCESS;
    dchan_ctx_lock(ctx);
    if (!fn) {
        /* Removed: callbacks still due are dropped with it. */
        if (h->on_fire)
            dchan_fire_remove(ctx, h);
        h->cfn = NULL;
        h->carg = NULL;
        h->n_cdone = h->n_done;
    } else if (h->error) {
        rc = h->error;
    } else {
        /* Puts completed before now are not reported. */
        if (!h->cfn)
            h->n_cdone = h->n_done;
        h->cfn = fn;
        h->carg = arg;
    }
    dchan_ctx_unlock(ctx);
    return rc;
}

/* ---- association ----------------------------------------------------------------- */

/* After the caller's arguments were checked: the wire (DCHAN_ERR_HANDLE),
 * then the total against the receive size (DCHAN_ERR_SIZE). */
static int assoc_segs(dchan_ctx_t *ctx, const dchan_wire_t *wire, dchan_iov_t *segs,
                      size_t nseg, size_t total, dchan_handle_t **out)
{
    /* Every segment empty: total 0, which no receive size is. */
    int rc = dchan_assoc_send(ctx, wire, segs ? segs[0].base : NULL, total, segs, nseg, out);
    if (rc != DCHAN_SUCCESS) {
        free(segs);
        return rc;
    }
    /* Not yet visible to any other thread: no lock needed. */
    dchan_handle_t *h = *out;
    h->vecs = dchan_segs_vectorize(segs, nseg, &h->nvec);
    if (!h->stage) { /* the provider gathers: it may use the vectors */
        h->pd.vec = h->vecs;
        h->pd.nvec = h->nvec;
    }
    return rc;
}

DCHAN_API int dchan_assoc_local_iov(dchan_ctx_t *ctx, const dchan_wire_t *wire,
                                    const dchan_iov_t *iov, int n, dchan_handle_t **out)
{
    dchan_iov_t *segs;
    size_t nseg, total;

    if (!dchan_ctx_ok(ctx) || !wire || !out)
        return DCHAN_ERR_INVALID_ARG;
    int rc = dchan_iov_import(iov, n, &segs, &nseg, &total);
    if (rc != DCHAN_SUCCESS)
        return rc;
    return assoc_segs(ctx, wire, segs, nseg, total, out);
}

DCHAN_API int dchan_assoc_local_subarray(dchan_ctx_t *ctx, const dchan_wire_t *wire,
                                         const void *base, int ndims, const size_t sizes[],
                                         const size_t subsizes[], const size_t starts[],
                                         size_t elem_size, dchan_handle_t **out)
{
    dchan_iov_t *segs;
    size_t nseg, total;

    if (!dchan_ctx_ok(ctx) || !wire || !out)
        return DCHAN_ERR_INVALID_ARG;
    int rc = dchan_subarray_runs(base, ndims, sizes, subsizes, starts, elem_size, &segs, &nseg,
                                 &total);
    if (rc != DCHAN_SUCCESS)
        return rc;
    return assoc_segs(ctx, wire, segs, nseg, total, out);
}
