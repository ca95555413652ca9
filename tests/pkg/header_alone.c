/* SPDX-License-Identifier: BSD-3-Clause */
/* dchan.h must compile on its own, first, in strict ISO C99 (and as C++:
 * see header_alone_cxx), and every name it promises must be there. */
#include <dchan.h>

int main(void)
{
    dchan_attr_t a;
    dchan_wire_t w;
    dchan_stats_t s;
    dchan_arrival_fn fn = 0;
    dchan_error_fn efn = 0;
    dchan_allgather_fn ag = 0;
    (void)fn;
    (void)efn;
    (void)ag;
    (void)s;
    dchan_attr_init(&a);
    /* The wire form is exactly 128 plain bytes. */
    return sizeof w == DCHAN_WIRE_SIZE && DCHAN_WIRE_SIZE == 128 &&
                   DCHAN_VERSION == ((DCHAN_VERSION_MAJOR << 16) | (DCHAN_VERSION_MINOR << 8) |
                                     DCHAN_VERSION_PATCH) &&
                   dchan_version() == DCHAN_VERSION && a.struct_size == sizeof a
               ? 0
               : 1;
}
