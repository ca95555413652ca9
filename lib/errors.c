/* SPDX-License-Identifier: BSD-3-Clause */
#include "config.h"

#include "core.h"

DCHAN_API const char *dchan_strerror(int rc)
{
    switch (rc) {
    case DCHAN_SUCCESS:
        return "success";
    case DCHAN_ERR_INVALID_ARG:
        return "invalid argument";
    case DCHAN_ERR_NO_MEMORY:
        return "out of memory or resources";
    case DCHAN_ERR_STATE:
        return "call not allowed in the current state";
    case DCHAN_ERR_SIZE:
        return "size mismatch or size not allowed";
    case DCHAN_ERR_SENTINEL:
        return "put data ends with the out-of-band pattern";
    case DCHAN_ERR_HANDLE:
        return "invalid or foreign handle wire form";
    case DCHAN_ERR_PEER:
        return "peer unreachable or failed";
    case DCHAN_ERR_PROVIDER:
        return "provider failure";
    case DCHAN_ERR_UNSUPPORTED:
        return "operation not supported";
    case DCHAN_ERR_AGAIN:
        return "resources busy, progress and retry";
    case DCHAN_ERR_TIMEOUT:
        return "timed out";
    case DCHAN_ERR_OVERRUN:
        return "sender put again before the receiver re-armed";
    default:
        return rc > 0 ? "success (positive count)" : "unknown error code";
    }
}

DCHAN_API unsigned dchan_version(void)
{
    return DCHAN_VERSION;
}
