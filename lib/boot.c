/* SPDX-License-Identifier: BSD-3-Clause */
/* Bootstrap selection, and the singleton and external methods. */
#include "config.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

static const struct dchan_boot_ops *const methods[] = {
#ifdef HAVE_MPI
    &dchan_boot_mpi_ops,
#endif
#ifdef HAVE_PMIX
    &dchan_boot_pmix_ops,
#endif
    &dchan_boot_external_ops,
    &dchan_boot_singleton_ops,
};
#define NMETHODS (sizeof methods / sizeof methods[0])

const char *dchan_boot_name(int method)
{
    return dchan_enum_word(DCHAN_PT_BOOT, method);
}

int dchan_boot_init(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx)
{
    const struct dchan_boot_ops *ops = NULL;
    int want = attr->bootstrap;

    memset(b, 0, sizeof *b);
    b->ctx = ctx;
    if (want == DCHAN_BOOT_AUTO) {
        /* DESIGN §4: MPI if initialised, else a PMIx launcher, else singleton.
         * The external method is never guessed: it needs callbacks. */
        if (attr->ext_allgather)
            want = DCHAN_BOOT_EXTERNAL;
        for (size_t i = 0; want == DCHAN_BOOT_AUTO && !ops && i < NMETHODS; i++)
            if (methods[i]->detect && methods[i]->detect())
                ops = methods[i];
        if (!ops && want == DCHAN_BOOT_AUTO)
            ops = &dchan_boot_singleton_ops;
    }
    for (size_t i = 0; !ops && i < NMETHODS; i++)
        if (methods[i]->method == want)
            ops = methods[i];
    if (!ops) {
        dchan_err(ctx, NULL, "bootstrap '%s' is not built into this library (see dchan_info)",
                  dchan_boot_name(want));
        return DCHAN_ERR_UNSUPPORTED;
    }
    b->ops = ops;
    int rc = ops->init(b, attr, ctx);
    if (rc != DCHAN_SUCCESS)
        return rc;
    if (b->size < 1 || b->rank < 0 || b->rank >= b->size) {
        dchan_err(ctx, NULL, "bootstrap '%s' gave rank %d of %d", ops->name, b->rank, b->size);
        ops->fini(b);
        return DCHAN_ERR_PROVIDER;
    }
    return DCHAN_SUCCESS;
}

int dchan_boot_allgather(struct dchan_boot *b, const void *in, void *out, size_t len)
{
    if (len == 0)
        return DCHAN_SUCCESS;
    return b->ops->allgather(b, in, out, len);
}

int dchan_boot_barrier(struct dchan_boot *b, int (*poll)(void *), void *arg)
{
    unsigned char one = 1;
    if (b->size == 1)
        return DCHAN_SUCCESS;
    if (b->ops->barrier)
        return b->ops->barrier(b, poll, arg);
    unsigned char *buf = malloc((size_t)b->size);
    if (!buf)
        return DCHAN_ERR_NO_MEMORY;
    int rc = b->ops->allgather(b, &one, buf, 1);
    free(buf);
    return rc;
}

void dchan_boot_fini(struct dchan_boot *b)
{
    if (b->ops)
        b->ops->fini(b);
    b->ops = NULL;
}

/* ---- singleton ---------------------------------------------------------- */

static int single_init(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx)
{
    b->rank = 0;
    b->size = 1;
    return DCHAN_SUCCESS;
}

static int single_allgather(struct dchan_boot *b, const void *in, void *out, size_t len)
{
    memmove(out, in, len);
    return DCHAN_SUCCESS;
}

static void single_fini(struct dchan_boot *b)
{
}

const struct dchan_boot_ops dchan_boot_singleton_ops = {
    .name = "singleton",
    .method = DCHAN_BOOT_SINGLETON,
    .detect = NULL,
    .init = single_init,
    .allgather = single_allgather,
    .fini = single_fini,
};

/* ---- external: the embedding runtime's callbacks ------------------------- */

struct ext_state {
    dchan_allgather_fn fn;
    void *arg;
};

static int ext_init(struct dchan_boot *b, const dchan_attr_t *attr, dchan_ctx_t *ctx)
{
    if (!attr->ext_allgather || attr->ext_size < 1 || attr->ext_rank < 0 ||
        attr->ext_rank >= attr->ext_size) {
        dchan_err(ctx, NULL,
                  "external bootstrap needs ext_allgather and 0 <= ext_rank (%d) < ext_size (%d)",
                  attr->ext_rank, attr->ext_size);
        return DCHAN_ERR_INVALID_ARG;
    }
    struct ext_state *s = malloc(sizeof *s);
    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    s->fn = attr->ext_allgather;
    s->arg = attr->ext_arg;
    b->state = s;
    b->rank = attr->ext_rank;
    b->size = attr->ext_size;
    return DCHAN_SUCCESS;
}

static int ext_allgather(struct dchan_boot *b, const void *in, void *out, size_t len)
{
    struct ext_state *s = b->state;
    int rc = s->fn(in, out, len, s->arg);
    if (rc != 0) {
        dchan_err(b->ctx, NULL, "external allgather callback failed (%d)", rc);
        return DCHAN_ERR_PROVIDER;
    }
    return DCHAN_SUCCESS;
}

static void ext_fini(struct dchan_boot *b)
{
    free(b->state);
    b->state = NULL;
}

const struct dchan_boot_ops dchan_boot_external_ops = {
    .name = "external",
    .method = DCHAN_BOOT_EXTERNAL,
    .detect = NULL,
    .init = ext_init,
    .allgather = ext_allgather,
    .fini = ext_fini,
};
