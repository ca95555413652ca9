/* SPDX-License-Identifier: BSD-3-Clause */
/* Gathered send sides and completion callbacks (lib/strided.c). */
#ifndef DCHAN_STRIDED_H
#define DCHAN_STRIDED_H

#include <stddef.h>

#include "dchan.h"
#include "provider.h"

/* A caller's segment list: checked (DCHAN_ERR_INVALID_ARG for a NULL base
 * with a length, n < 1, overlaps), copied without its empty segments,
 * neighbours merged. *out is NULL when every segment is empty. */
int dchan_iov_import(const dchan_iov_t *iov, int n, dchan_iov_t **out, size_t *nout,
                     size_t *total);
/* A C-order subarray of 1 ... 3 dimensions as runs (merged where they
 * touch), in the order of its elements. DCHAN_ERR_INVALID_ARG for any
 * rule broken, DCHAN_ERR_NO_MEMORY. */
int dchan_subarray_runs(const void *base, int ndims, const size_t sizes[],
                        const size_t subsizes[], const size_t starts[], size_t elem_size,
                        dchan_iov_t **out, size_t *nout, size_t *total);
/* Bytes [from, to) of the concatenation of segs into dst. */
void dchan_segs_copy(const dchan_iov_t *segs, size_t nseg, size_t from, size_t to, void *dst);
/* The segments as vectors (runs of equal length at a constant stride: a
 * face of a 3-D block across its last axis is one); NULL when out of
 * memory (callers then use the segments). */
struct dchan_gvec *dchan_segs_vectorize(const dchan_iov_t *segs, size_t nseg, size_t *nvec);
/* Bytes [from, to) of the message the vectors describe into dst. */
void dchan_gvec_copy(const struct dchan_gvec *v, size_t nv, size_t from, size_t to, void *dst);

#endif
