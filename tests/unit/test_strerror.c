/* SPDX-License-Identifier: BSD-3-Clause */
/* dchan_strerror: a distinct message for every code, never NULL. */
#include "config.h"

#include <limits.h>

#include "unit.h"

static void test_every_code(void **state)
{
    const char *seen[DCHAN_SUCCESS - DCHAN_ERR_OVERRUN + 1];
    for (int rc = DCHAN_SUCCESS; rc >= DCHAN_ERR_OVERRUN; rc--) {
        const char *s = dchan_strerror(rc);
        assert_non_null(s);
        assert_true(strlen(s) > 3);
        for (int j = DCHAN_SUCCESS; j > rc; j--)
            if (strcmp(seen[-j], s) == 0)
                fail_msg("codes %d and %d share the message '%s'", j, rc, s);
        seen[-rc] = s;
        /* Stable: the same pointer content each time. */
        assert_string_equal(dchan_strerror(rc), s);
    }
    /* Every code also differs from what an unknown code gives. */
    const char *unknown = dchan_strerror(DCHAN_ERR_OVERRUN - 1);
    for (int rc = DCHAN_SUCCESS; rc >= DCHAN_ERR_OVERRUN; rc--)
        assert_string_not_equal(dchan_strerror(rc), unknown);
}

static void test_unknown_codes(void **state)
{
    int codes[] = {DCHAN_ERR_OVERRUN - 1, -13, -100, -1000000, INT_MIN, 1, 2, 1000, INT_MAX};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *s = dchan_strerror(codes[i]);
        assert_non_null(s);
        assert_true(s[0] != '\0');
    }
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_code),
        cmocka_unit_test(test_unknown_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
