/* SPDX-License-Identifier: BSD-3-Clause */
/* The providers built into this library, in automatic selection order. */
#include "config.h"

#include <string.h>

#include "provider.h"

#ifdef HAVE_VERBS
extern const struct dchan_provider_ops dchan_verbs_ops;
#endif
#ifdef HAVE_OFI
extern const struct dchan_provider_ops dchan_ofi_ops;
#endif
#ifdef HAVE_MPI
extern const struct dchan_provider_ops dchan_mpi_ops;
#endif
#ifdef HAVE_SHM
extern const struct dchan_provider_ops dchan_shm_ops;
#endif
extern const struct dchan_provider_ops dchan_self_ops;

/* Host-scoped first (shm), then network providers (verbs, ofi, mpi: DESIGN
 * §4), then self; the scope of each decides which peers it may serve. */
const struct dchan_provider_ops *const dchan_providers[] = {
#ifdef HAVE_SHM
    &dchan_shm_ops,
#endif
#ifdef HAVE_VERBS
    &dchan_verbs_ops,
#endif
#ifdef HAVE_OFI
    &dchan_ofi_ops,
#endif
#ifdef HAVE_MPI
    &dchan_mpi_ops,
#endif
    &dchan_self_ops,
};
const size_t dchan_num_providers = sizeof dchan_providers / sizeof dchan_providers[0];

const struct dchan_provider_ops *dchan_provider_lookup(const char *name)
{
    for (size_t i = 0; name && i < dchan_num_providers; i++)
        if (strcmp(dchan_providers[i]->name, name) == 0)
            return dchan_providers[i];
    return NULL;
}

int dchan_prov_nosys_mr_reg(struct dchan_prov *p, void *addr, size_t len, unsigned access,
                            void **mr)
{
    return DCHAN_ERR_UNSUPPORTED;
}

void dchan_prov_nosys_mr_dereg(struct dchan_prov *p, void *mr)
{
}

int dchan_prov_nosys_mem_alloc(struct dchan_prov *p, size_t size, size_t align, void **ptr)
{
    return DCHAN_ERR_UNSUPPORTED;
}

void dchan_prov_nosys_mem_free(struct dchan_prov *p, void *ptr)
{
}

int dchan_prov_noop_recv_arm(dchan_handle_t *h, uint32_t slot)
{
    return DCHAN_SUCCESS;
}

int dchan_prov_nosys_map_slot(dchan_handle_t *h, size_t offset, void **ptr)
{
    return DCHAN_ERR_UNSUPPORTED;
}

void dchan_prov_noop_credit_close(dchan_handle_t *h)
{
}

int dchan_prov_nosys_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word)
{
    return DCHAN_ERR_UNSUPPORTED;
}

int dchan_prov_nosys_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src)
{
    return DCHAN_ERR_UNSUPPORTED;
}

void dchan_prov_noop_put_abandon(dchan_handle_t *h)
{
}

int dchan_prov_noop_progress(struct dchan_prov *p)
{
    return 0;
}

int dchan_prov_nowake_fd(struct dchan_prov *p, int *fd)
{
    *fd = -1;
    return DCHAN_SUCCESS;
}

int dchan_prov_noop_wake_arm(struct dchan_prov *p)
{
    return DCHAN_SUCCESS;
}

void dchan_prov_noop_wake_disarm(struct dchan_prov *p)
{
}
