/* SPDX-License-Identifier: BSD-3-Clause */
/* Registration cache management (lookup calls are in provider.h). */
#ifndef DCHAN_REGCACHE_H
#define DCHAN_REGCACHE_H

#include <stddef.h>

struct dchan_prov;

int dchan_regcache_create(struct dchan_prov *p);
/* Deregister whatever is left and free the cache. */
void dchan_regcache_destroy(struct dchan_prov *p);
/* Registrations currently held, for tests. */
size_t dchan_regcache_count(const struct dchan_prov *p);

#endif
