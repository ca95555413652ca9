/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for wire import: any input becomes a 128-byte wire and
 * goes through dchan_wire_decode and the public dchan_assoc_local of live
 * singleton contexts, one per detection mode. When the first input byte is
 * odd the checksum is recomputed first, so that the fuzzer also reaches the
 * checks behind it (job key, ranks, provider fields, sizes) instead of
 * stopping at the checksum. Nothing may crash, and only wires that really
 * describe a live handle of the context may be accepted.
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dchan.h"
#include "wire.h"

#define NMODES 3
static dchan_ctx_t *ctx[NMODES];
static dchan_handle_t *rh[NMODES];
static dchan_wire_t good[NMODES];
static uint64_t rbuf[NMODES][8];
static unsigned char sbuf[4096];

static void on_arrival(dchan_handle_t *h, void *arg)
{
}

static void setup(void)
{
    static const int modes[NMODES] = {DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG,
                                      DCHAN_DETECT_EVENT};
    for (int m = 0; m < NMODES; m++) {
        dchan_attr_t a;
        dchan_attr_init(&a);
        a.bootstrap = DCHAN_BOOT_SINGLETON;
        a.provider = NULL;
        a.detect = modes[m];
        a.log_level = DCHAN_LOG_NONE;
        if (dchan_init(&a, &ctx[m]) != DCHAN_SUCCESS ||
            dchan_create_handle(ctx[m], 0, rbuf[m], sizeof rbuf[m], 0x5a5a5a5a5a5a5a5aull,
                                on_arrival, NULL, &rh[m]) != DCHAN_SUCCESS ||
            dchan_handle_export(rh[m], &good[m]) != DCHAN_SUCCESS)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    dchan_wire_t w;
    struct dchan_wire_fields f;

    if (!ready) {
        setup();
        ready = 1;
    }
    if (size == 0)
        return 0;
    int reseal = data[0] & 1;
    int m = (data[0] >> 1) % NMODES;
    /* Start from a real wire so that small mutations stay near valid. */
    w = good[m];
    memcpy(w.bytes, data + 1, size - 1 < DCHAN_WIRE_SIZE ? size - 1 : DCHAN_WIRE_SIZE);
    if (reseal)
        dchan_put_le64(w.bytes + 120, dchan_fnv1a64(w.bytes, 120));

    int drc = dchan_wire_decode(&w, &f);
    if (drc != DCHAN_SUCCESS && drc != DCHAN_ERR_HANDLE)
        abort();
    /* The size the wire asks for when it decoded, so that the checks after
     * the size check are reached too; any other size otherwise. */
    size_t want = drc == DCHAN_SUCCESS && f.size > 0 && f.size <= sizeof sbuf ? f.size : 64;
    for (int c = 0; c < NMODES; c++) {
        dchan_handle_t *sh = NULL;
        int rc = dchan_assoc_local(ctx[c], &w, sbuf, want, &sh);
        if (rc == DCHAN_SUCCESS) {
            /* Only this context's own live handle may be accepted. */
            if (drc != DCHAN_SUCCESS || memcmp(&w, &good[c], sizeof w) != 0)
                abort();
            if (dchan_handle_destroy(sh) != DCHAN_SUCCESS)
                abort();
        } else if (rc != DCHAN_ERR_HANDLE && rc != DCHAN_ERR_SIZE) {
            abort();
        }
    }
    return 0;
}
