/* SPDX-License-Identifier: BSD-3-Clause */
/* Handle internals shared by context.c and handle.c. */
#ifndef DCHAN_HANDLE_H
#define DCHAN_HANDLE_H

#include "core.h"

bool dchan_in_callback(const dchan_ctx_t *ctx);
/* Destroy a live handle (lock held): cancel, release, quarantine. */
int dchan_handle_release(dchan_handle_t *h);
/* Free quarantined handles beyond keep. */
void dchan_quarantine_flush(dchan_ctx_t *ctx, uint64_t keep);
void dchan_pq_remove(dchan_ctx_t *ctx, dchan_handle_t *h);
void dchan_fire_remove(dchan_ctx_t *ctx, dchan_handle_t *h);
/* The scan saw *probe change to v on a queued SENTINEL or FLAG handle. */
void dchan_recv_detected(dchan_handle_t *h, uint64_t v);

#endif
