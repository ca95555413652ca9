/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The ofi provider's remote-access fields in the wire: every layout
 * (virtual addresses or offsets, FLAG sequence word or not, provider keys
 * or FI_MR_RAW keys) round-trips, and fields no receiver writes are
 * refused. FI_MR_RAW has no provider on the test machine: this is its test.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "ofi.h"
#include "wire.h"

static void sample(struct ofi_wire *w, bool raw, bool flag, bool virt)
{
    memset(w, 0, sizeof *w);
    w->flags = (uint8_t)((raw ? OFI_WIRE_RAW : 0) | (flag ? OFI_WIRE_SEQ : 0));
    w->buf_addr = virt ? 0x7f0012345000ull : 0;
    w->buf_key = raw ? 0x7f0012345000ull : 0x1122334455667788ull;
    if (flag) {
        w->seq_addr = virt ? 0x7f00abcde018ull : 0x18;
        w->seq_key = raw ? 0x7f00abcde000ull : 0x99;
    }
    if (raw) {
        w->buf_raw_len = 12;
        w->seq_raw_len = flag ? 12 : 0;
        for (int i = 0; i < w->buf_raw_len + w->seq_raw_len; i++)
            w->raw[i] = (uint8_t)(0x40 + i);
    }
}

static void test_roundtrip(void **state)
{
    for (int m = 0; m < 8; m++) {
        bool raw = m & 1, flag = m & 2, virt = m & 4;
        struct ofi_wire w, back;
        unsigned char bytes[DCHAN_WIRE_PROV_BYTES];
        sample(&w, raw, flag, virt);
        memset(bytes, 0, sizeof bytes);
        dchan_ofi_wire_pack(&w, bytes);
        assert_int_equal(dchan_ofi_wire_unpack(bytes, raw, flag, virt, &back), DCHAN_SUCCESS);
        assert_int_equal(back.flags, w.flags);
        assert_true(back.buf_addr == w.buf_addr && back.buf_key == w.buf_key);
        assert_true(back.seq_addr == w.seq_addr && back.seq_key == w.seq_key);
        assert_int_equal(back.buf_raw_len, w.buf_raw_len);
        assert_int_equal(back.seq_raw_len, w.seq_raw_len);
        assert_memory_equal(back.raw, w.raw, OFI_WIRE_RAW_BYTES);
        /* The other side's view of the layout must match the sender's. */
        assert_int_equal(dchan_ofi_wire_unpack(bytes, !raw, flag, virt, &back), DCHAN_ERR_HANDLE);
        assert_int_equal(dchan_ofi_wire_unpack(bytes, raw, !flag, virt, &back), DCHAN_ERR_HANDLE);
        assert_int_equal(dchan_ofi_wire_unpack(bytes, raw, flag, !virt, &back), DCHAN_ERR_HANDLE);
    }
}

/* Raw keys filling the whole area are valid; one byte more cannot be. */
static void test_raw_limits(void **state)
{
    struct ofi_wire w, back;
    unsigned char bytes[DCHAN_WIRE_PROV_BYTES];
    sample(&w, true, true, true);
    w.buf_raw_len = 14;
    w.seq_raw_len = 14;
    memset(bytes, 0, sizeof bytes);
    dchan_ofi_wire_pack(&w, bytes);
    assert_int_equal(dchan_ofi_wire_unpack(bytes, true, true, true, &back), DCHAN_SUCCESS);
    bytes[3] = 15; /* 29 bytes claimed */
    assert_int_equal(dchan_ofi_wire_unpack(bytes, true, true, true, &back), DCHAN_ERR_HANDLE);
    bytes[3] = 0; /* FLAG without the sequence word's key */
    assert_int_equal(dchan_ofi_wire_unpack(bytes, true, true, true, &back), DCHAN_ERR_HANDLE);
    bytes[2] = 0;
    bytes[3] = 14; /* no key for the buffer */
    assert_int_equal(dchan_ofi_wire_unpack(bytes, true, true, true, &back), DCHAN_ERR_HANDLE);
}

static void test_refused(void **state)
{
    for (int m = 0; m < 8; m++) {
        bool raw = m & 1, flag = m & 2, virt = m & 4;
        struct ofi_wire w, back;
        unsigned char good[DCHAN_WIRE_PROV_BYTES], bad[DCHAN_WIRE_PROV_BYTES];
        sample(&w, raw, flag, virt);
        memset(good, 0, sizeof good);
        dchan_ofi_wire_pack(&w, good);
        for (int k = 0; k < 7; k++) {
            memcpy(bad, good, sizeof bad);
            switch (k) {
            case 0: bad[0] = OFI_WIRE_VERSION + 1; break;  /* layout version */
            case 1: bad[1] |= 0x10; break;                 /* unknown flag */
            case 2: bad[DCHAN_WIRE_PROV_BYTES - 1] = 1; break; /* past the keys */
            case 3: dchan_put_le64(bad + 4, virt ? 0 : 64); break; /* buffer base */
            case 4: dchan_put_le64(bad + 20, dchan_get_le64(bad + 20) | 4); break;
            case 5: /* a sequence word past its 4 KiB chunk, or none expected */
                dchan_put_le64(bad + 20, virt ? (flag ? 0 : 8) : 4096);
                break;
            default: bad[2] = raw ? 0 : 1; break; /* raw key length */
            }
            assert_int_equal(dchan_ofi_wire_unpack(bad, raw, flag, virt, &back),
                             DCHAN_ERR_HANDLE);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_raw_limits),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
