/* SPDX-License-Identifier: BSD-3-Clause */
/* Wire form: encoding, structural validation, and import of corrupted,
 * foreign and stale wires through dchan_assoc_local. */
#include "config.h"

#include "unit.h"

#include "core.h"
#include "wire.h"

#define OFF_HGEN 28
#define OFF_RSV2 112
#define OFF_SUM 120

/* Recompute the checksum after editing bytes, so only the edit is wrong. */
static void reseal(dchan_wire_t *w)
{
    dchan_put_le64(w->bytes + OFF_SUM, dchan_fnv1a64(w->bytes, OFF_SUM));
}

static void sample_fields(struct dchan_wire_fields *f, int detect)
{
    memset(f, 0, sizeof *f);
    f->provider_id = DCHAN_PROV_ID_VERBS;
    f->detect = (uint8_t)detect;
    f->job_key = 0x0123456789abcdefull;
    f->recv_rank = 70000;
    f->send_rank = 123456;
    f->handle_id = 0x01abcdefu;
    f->handle_gen = 0x7f3c2a01u; /* its low byte is the id's top byte */
    f->size = 0x123456789ull * 8;
    f->oob = detect == DCHAN_DETECT_SENTINEL ? 0xfedcba9876543210ull : 0;
    for (int i = 0; i < DCHAN_WIRE_PROV_BYTES; i++)
        f->prov[i] = (unsigned char)(0xa0 + i);
}

static void assert_fields_equal(const struct dchan_wire_fields *a,
                                const struct dchan_wire_fields *b)
{
    assert_int_equal(a->provider_id, b->provider_id);
    assert_int_equal(a->detect, b->detect);
    assert_true(a->job_key == b->job_key);
    assert_int_equal(a->recv_rank, b->recv_rank);
    assert_int_equal(a->send_rank, b->send_rank);
    assert_int_equal(a->handle_id, b->handle_id);
    assert_int_equal(a->handle_gen, b->handle_gen);
    assert_true(a->size == b->size);
    assert_true(a->oob == b->oob);
    assert_memory_equal(a->prov, b->prov, DCHAN_WIRE_PROV_BYTES);
}

/* ---- structural level ---------------------------------------------------------------- */

static void test_roundtrip(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct dchan_wire_fields f, g;
        dchan_wire_t w;
        sample_fields(&f, unit_modes[m]);
        memset(&w, 0x5a, sizeof w);
        dchan_wire_encode(&f, &w);
        memset(&g, 0x77, sizeof g);
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
        assert_fields_equal(&f, &g);

        /* The documented little-endian layout (wire.h). */
        const unsigned char *b = w.bytes;
        assert_memory_equal(b, "DCHW", 4);
        assert_int_equal(dchan_get_le16(b + 4), DCHAN_WIRE_VERSION);
        assert_int_equal(b[6], DCHAN_PROV_ID_VERBS);
        assert_int_equal(b[7], unit_modes[m]);
        assert_true(dchan_get_le64(b + 8) == f.job_key);
        assert_int_equal(b[8], 0xef); /* least significant byte first */
        assert_int_equal(dchan_get_le32(b + 16), f.recv_rank);
        assert_int_equal(dchan_get_le32(b + 20), f.send_rank);
        assert_int_equal(dchan_get_le32(b + 24), f.handle_id);
        assert_int_equal(dchan_get_le32(b + OFF_HGEN), f.handle_gen);
        assert_true(dchan_get_le64(b + 32) == f.size);
        assert_true(dchan_get_le64(b + 40) == f.oob);
        assert_memory_equal(b + 48, f.prov, DCHAN_WIRE_PROV_BYTES);
        assert_true(dchan_get_le64(b + OFF_RSV2) == 0);
        assert_true(dchan_get_le64(b + OFF_SUM) == dchan_fnv1a64(b, OFF_SUM));
    }
}

static void test_encode_drops_oob_outside_sentinel(void **state)
{
    struct dchan_wire_fields f, g;
    dchan_wire_t w;
    sample_fields(&f, DCHAN_DETECT_FLAG);
    f.oob = 0x1111;
    dchan_wire_encode(&f, &w);
    assert_true(dchan_get_le64(w.bytes + 40) == 0);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
    assert_true(g.oob == 0);
}

static void test_le_helpers(void **state)
{
    unsigned char b[8];
    dchan_put_le16(b, 0xbeef);
    assert_int_equal(b[0], 0xef);
    assert_int_equal(b[1], 0xbe);
    assert_int_equal(dchan_get_le16(b), 0xbeef);
    dchan_put_le32(b, 0xdeadbeefu);
    assert_int_equal(b[0], 0xef);
    assert_int_equal(b[3], 0xde);
    assert_int_equal(dchan_get_le32(b), 0xdeadbeefu);
    dchan_put_le64(b, 0x0102030405060708ull);
    for (int i = 0; i < 8; i++)
        assert_int_equal(b[i], 8 - i);
    assert_true(dchan_get_le64(b) == 0x0102030405060708ull);
    /* FNV-1a 64 reference values. */
    assert_true(dchan_fnv1a64("", 0) == 0xcbf29ce484222325ull);
    assert_true(dchan_fnv1a64("a", 1) == 0xaf63dc4c8601ec8cull);
}

static void test_decode_every_flip(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct dchan_wire_fields f, g;
        dchan_wire_t w, c;
        sample_fields(&f, unit_modes[m]);
        dchan_wire_encode(&f, &w);
        for (int i = 0; i < DCHAN_WIRE_SIZE; i++) {
            c = w;
            c.bytes[i] ^= 0xff;
            assert_int_equal(dchan_wire_decode(&c, &g), DCHAN_ERR_HANDLE);
            for (int bit = 0; bit < 8; bit++) {
                c = w;
                c.bytes[i] ^= (unsigned char)(1u << bit);
                assert_int_equal(dchan_wire_decode(&c, &g), DCHAN_ERR_HANDLE);
            }
        }
        /* Truncation: anything after a prefix lost (zeroed). */
        for (int n = 0; n < DCHAN_WIRE_SIZE; n++) {
            c = w;
            memset(c.bytes + n, 0, DCHAN_WIRE_SIZE - (size_t)n);
            assert_int_equal(dchan_wire_decode(&c, &g), DCHAN_ERR_HANDLE);
        }
    }
}

static void test_decode_constant_wires(void **state)
{
    struct dchan_wire_fields g;
    dchan_wire_t w;
    for (int v = 0; v < 256; v++) {
        memset(&w, v, sizeof w);
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    }
}

static void test_decode_random_wires(void **state)
{
    struct dchan_wire_fields g;
    dchan_wire_t w;
    srand(12345);
    for (int n = 0; n < 20000; n++) {
        for (int i = 0; i < DCHAN_WIRE_SIZE; i++)
            w.bytes[i] = (unsigned char)rand();
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
        /* Random content behind a valid header and checksum. */
        memcpy(w.bytes, "DCHW\1\0", 6);
        reseal(&w);
        int rc = dchan_wire_decode(&w, &g);
        assert_true(rc == DCHAN_ERR_HANDLE || rc == DCHAN_SUCCESS);
    }
}

/* Each field made invalid in turn, with a valid checksum. */
static void expect_bad(const struct dchan_wire_fields *f)
{
    struct dchan_wire_fields g;
    dchan_wire_t w;
    dchan_wire_encode(f, &w);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
}

/* Credit and depth travel in what was the reserved word: round trip, and
 * every combination the core never writes is refused. */
static void test_credit_fields(void **state)
{
    struct dchan_wire_fields f, g;
    dchan_wire_t w;
    sample_fields(&f, DCHAN_DETECT_FLAG);
    f.size = 4096;
    f.depth = 64;
    f.credit = true;
    f.credit_index = 65535;
    f.credit_tag = 0xfedcba98u;
    dchan_wire_encode(&f, &w);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
    assert_fields_equal(&f, &g);
    assert_true(g.depth == 64 && g.credit && g.credit_index == 65535 &&
                g.credit_tag == 0xfedcba98u);
    /* Without credit and depth, the bytes are what older wires held. */
    sample_fields(&f, DCHAN_DETECT_EVENT);
    dchan_wire_encode(&f, &w);
    for (int i = 112; i < 120; i++)
        assert_int_equal(w.bytes[i], 0);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
    assert_true(g.depth == 1 && !g.credit);

    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.depth = 2; /* depth needs credit */
    expect_bad(&f);
    f.credit = true; /* credit needs a tag */
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.credit_index = 3; /* an index without credit */
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.credit_tag = 3;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.depth = 65;
    f.credit = true;
    f.credit_tag = 1;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.size = SIZE_MAX / 2; /* slots that do not fit in memory */
    f.depth = 4;
    f.credit = true;
    f.credit_tag = 1;
    expect_bad(&f);
    /* An unknown flag bit, behind a valid checksum. */
    sample_fields(&f, DCHAN_DETECT_EVENT);
    dchan_wire_encode(&f, &w);
    w.bytes[113] = 0x04;
    dchan_put_le64(w.bytes + 120, dchan_fnv1a64(w.bytes, 120));
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
}

/* The source flag (a get channel): round trip, and only with EVENT, depth 1
 * and no credit; a wire without it (every older wire) is a put channel's. */
static void test_source_flag(void **state)
{
    struct dchan_wire_fields f, g;
    dchan_wire_t w;

    sample_fields(&f, DCHAN_DETECT_EVENT);
    dchan_wire_encode(&f, &w);
    assert_int_equal(w.bytes[113], 0);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
    assert_false(g.source);
    f.source = true;
    dchan_wire_encode(&f, &w);
    assert_int_equal(w.bytes[113], 0x02);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
    assert_true(g.source);
    f.credit = true;
    f.credit_tag = 1;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_FLAG);
    f.source = true;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_SENTINEL);
    f.source = true;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.source = true;
    f.depth = 2;
    f.credit = true;
    f.credit_tag = 1;
    expect_bad(&f);
}

static void test_decode_bad_fields(void **state)
{
    struct dchan_wire_fields f;
    dchan_wire_t w;
    struct dchan_wire_fields g;

    sample_fields(&f, DCHAN_DETECT_SENTINEL);
    f.size = 0;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_FLAG);
    f.size = 0;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.size = 0;
    expect_bad(&f);

    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.provider_id = 0;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.job_key = 0;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.handle_id = 0;
    expect_bad(&f);
    /* The generation: never 0 in its low byte, which the id repeats. */
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.handle_gen = 0;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.handle_gen = 0x7f3c2a00u;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.handle_gen = 0x7f3c2a02u;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.recv_rank = 0x80000000u;
    expect_bad(&f);
    sample_fields(&f, DCHAN_DETECT_EVENT);
    f.send_rank = 0xffffffffu;
    expect_bad(&f);

    /* Unknown detection modes, AUTO included (a wire has a resolved mode). */
    int bad_modes[] = {DCHAN_DETECT_AUTO, 4, 5, 0x80, 0xff};
    for (size_t i = 0; i < sizeof bad_modes / sizeof bad_modes[0]; i++) {
        sample_fields(&f, DCHAN_DETECT_EVENT);
        f.detect = (uint8_t)bad_modes[i];
        expect_bad(&f);
    }

    /* SENTINEL sizes must be >= 8 and a multiple of 8. */
    uint64_t bad_sizes[] = {1, 4, 7, 9, 12, 15, 4097};
    for (size_t i = 0; i < sizeof bad_sizes / sizeof bad_sizes[0]; i++) {
        sample_fields(&f, DCHAN_DETECT_SENTINEL);
        f.size = bad_sizes[i];
        expect_bad(&f);
        /* ... while FLAG and EVENT take any size. */
        sample_fields(&f, DCHAN_DETECT_FLAG);
        f.size = bad_sizes[i];
        dchan_wire_encode(&f, &w);
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_SUCCESS);
        assert_true(g.size == bad_sizes[i]);
    }

    /* Non-zero oob outside SENTINEL (encode drops it: write it by hand). */
    for (int m = DCHAN_DETECT_FLAG; m <= DCHAN_DETECT_EVENT; m++) {
        sample_fields(&f, m);
        dchan_wire_encode(&f, &w);
        dchan_put_le64(w.bytes + 40, 1);
        reseal(&w);
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    }

    /* The generation's low byte out of step with the id, resealed. */
    sample_fields(&f, DCHAN_DETECT_EVENT);
    dchan_wire_encode(&f, &w);
    w.bytes[OFF_HGEN] ^= 0x10;
    reseal(&w);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    /* Reserved bytes, each one non-zero in turn. */
    for (int i = 0; i < 8; i++) {
        sample_fields(&f, DCHAN_DETECT_EVENT);
        dchan_wire_encode(&f, &w);
        w.bytes[OFF_RSV2 + i] = 0x80;
        reseal(&w);
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    }

    /* Other magic and other format versions. */
    sample_fields(&f, DCHAN_DETECT_EVENT);
    dchan_wire_encode(&f, &w);
    memcpy(w.bytes, "DCHX", 4);
    reseal(&w);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    for (unsigned v = 0; v < 4; v++) {
        if (v == DCHAN_WIRE_VERSION)
            continue;
        dchan_wire_encode(&f, &w);
        dchan_put_le16(w.bytes + 4, (uint16_t)v);
        reseal(&w);
        assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    }

    /* All zeros and all ones, even with a valid checksum. */
    memset(&w, 0, sizeof w);
    reseal(&w);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
    memset(&w, 0xff, sizeof w);
    reseal(&w);
    assert_int_equal(dchan_wire_decode(&w, &g), DCHAN_ERR_HANDLE);
}

/* ---- through the public API of a live singleton context ------------------------------ */

struct live {
    dchan_ctx_t *ctx;
    unsigned char *rbuf, *sbuf;
    size_t size;
    dchan_handle_t *rh;
    dchan_wire_t wire;
    struct dchan_wire_fields f;
    int calls;
};

static void live_cb(dchan_handle_t *h, void *arg)
{
    struct live *l = arg;
    l->calls++;
}

static void int_cb(dchan_handle_t *h, void *arg)
{
    (*(int *)arg)++;
}

static void live_open(struct live *l, int mode)
{
    memset(l, 0, sizeof *l);
    l->ctx = unit_ctx(mode);
    l->size = 64;
    l->rbuf = calloc(1, l->size);
    l->sbuf = calloc(1, l->size);
    assert_int_equal(dchan_create_handle(l->ctx, 0, l->rbuf, l->size, 0x0b0b0b0b0b0b0b0bull,
                                         live_cb, l, &l->rh),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(l->rh, &l->wire), DCHAN_SUCCESS);
    assert_int_equal(dchan_wire_decode(&l->wire, &l->f), DCHAN_SUCCESS);
}

static void live_close(struct live *l)
{
    assert_int_equal(dchan_finalize(l->ctx), DCHAN_SUCCESS);
    free(l->rbuf);
    free(l->sbuf);
}

/* Import must fail with DCHAN_ERR_HANDLE, create nothing, write no output. */
static void expect_refused(struct live *l, const dchan_wire_t *w)
{
    dchan_handle_t *sh = (dchan_handle_t *)l; /* must stay untouched */
    uint64_t live_before = l->ctx->nlive;
    assert_int_equal(dchan_assoc_local(l->ctx, w, l->sbuf, l->size, &sh), DCHAN_ERR_HANDLE);
    assert_ptr_equal(sh, (dchan_handle_t *)l);
    assert_true(l->ctx->nlive == live_before);
}

/* The channel survived: the genuine wire still imports and carries data. */
static void expect_channel_works(struct live *l, int it)
{
    dchan_handle_t *sh;
    int before = l->calls;
    assert_int_equal(dchan_assoc_local(l->ctx, &l->wire, l->sbuf, l->size, &sh),
                     DCHAN_SUCCESS);
    unit_fill(l->sbuf, l->size, 3, it);
    assert_int_equal(dchan_put(sh), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(l->ctx, &l->calls, before + 1), DCHAN_SUCCESS);
    assert_int_equal(l->calls, before + 1);
    assert_true(unit_check(l->rbuf, l->size, 3, it));
    assert_int_equal(dchan_ready(l->rh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(sh), DCHAN_SUCCESS);
}

static void reencode(struct live *l, const struct dchan_wire_fields *f, dchan_wire_t *w)
{
    dchan_wire_encode(f, w);
    (void)l;
}

static void test_import_every_flip(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct live l;
        dchan_wire_t c;
        live_open(&l, unit_modes[m]);
        for (int i = 0; i < DCHAN_WIRE_SIZE; i++) {
            c = l.wire;
            c.bytes[i] ^= 0xff;
            expect_refused(&l, &c);
            for (int bit = 0; bit < 8; bit++) {
                c = l.wire;
                c.bytes[i] ^= (unsigned char)(1u << bit);
                expect_refused(&l, &c);
            }
        }
        memset(&c, 0, sizeof c);
        expect_refused(&l, &c);
        memset(&c, 0xff, sizeof c);
        expect_refused(&l, &c);
        memset(&c, 0, sizeof c);
        reseal(&c);
        expect_refused(&l, &c);
        memset(&c, 0xff, sizeof c);
        reseal(&c);
        expect_refused(&l, &c);
        srand(777);
        for (int n = 0; n < 2000; n++) {
            for (int i = 0; i < DCHAN_WIRE_SIZE; i++)
                c.bytes[i] = (unsigned char)rand();
            expect_refused(&l, &c);
        }
        expect_channel_works(&l, 1);
        live_close(&l);
    }
}

static void test_import_bad_fields(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct live l;
        struct dchan_wire_fields f;
        dchan_wire_t c;
        live_open(&l, unit_modes[m]);

        /* Another job's key, valid checksum. */
        f = l.f;
        f.job_key ^= 1;
        reencode(&l, &f, &c);
        expect_refused(&l, &c);
        f = l.f;
        f.job_key = ~l.f.job_key;
        reencode(&l, &f, &c);
        expect_refused(&l, &c);

        /* Another provider (known and unknown ids). */
        int provs[] = {DCHAN_PROV_ID_MPI, DCHAN_PROV_ID_OFI, DCHAN_PROV_ID_VERBS,
                       DCHAN_PROV_ID_SHM, 0, 6, 0xff};
        for (size_t i = 0; i < sizeof provs / sizeof provs[0]; i++) {
            f = l.f;
            f.provider_id = (uint8_t)provs[i];
            reencode(&l, &f, &c);
            expect_refused(&l, &c);
        }

        /* Receiver rank >= nranks, sender rank other than this rank. */
        uint32_t ranks[] = {1, 2, 0x7fffffffu, 0x80000000u, 0xffffffffu};
        for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++) {
            f = l.f;
            f.recv_rank = ranks[i];
            reencode(&l, &f, &c);
            expect_refused(&l, &c);
            f = l.f;
            f.send_rank = ranks[i];
            reencode(&l, &f, &c);
            expect_refused(&l, &c);
        }

        /* Size 0 and sizes that do not match the receive handle (the send
         * size given matches the wire, so this is not a size error). */
        f = l.f;
        f.size = 0;
        reencode(&l, &f, &c);
        expect_refused(&l, &c);
        {
            dchan_handle_t *sh = NULL;
            f = l.f;
            f.size = l.size * 2;
            reencode(&l, &f, &c);
            unsigned char *big = calloc(1, l.size * 2);
            int rc = dchan_assoc_local(l.ctx, &c, big, l.size * 2, &sh);
            assert_int_equal(rc, DCHAN_ERR_HANDLE);
            assert_null(sh);
            free(big);
        }

        /* Unknown detection mode, and a mode other than the handle's. */
        int modes[] = {0, 4, 0xff, DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG,
                       DCHAN_DETECT_EVENT};
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
            if (modes[i] == unit_modes[m])
                continue;
            f = l.f;
            f.detect = (uint8_t)modes[i];
            f.oob = modes[i] == DCHAN_DETECT_SENTINEL ? 0x0b0b0b0b0b0b0b0bull : 0;
            reencode(&l, &f, &c);
            expect_refused(&l, &c);
        }

        /* A handle id that names no handle, or a stale generation. */
        uint32_t ids[] = {l.f.handle_id + 1, l.f.handle_id ^ (1u << 24), 0xffffffffu,
                          DCHAN_ID_MAKE(DCHAN_ID_INDEX_MASK, 1)};
        for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
            f = l.f;
            f.handle_id = ids[i];
            reencode(&l, &f, &c);
            expect_refused(&l, &c);
        }

        /* Provider fields where self has none. */
        f = l.f;
        f.prov[DCHAN_WIRE_PROV_BYTES - 1] = 1;
        reencode(&l, &f, &c);
        expect_refused(&l, &c);

        /* Generation bytes, resealed: out of step with the id, or only the
         * high bytes changed (a stale generation of the same slot). */
        c = l.wire;
        c.bytes[OFF_HGEN] ^= 0x40;
        reseal(&c);
        expect_refused(&l, &c);
        c = l.wire;
        c.bytes[OFF_HGEN + 2] ^= 0x01;
        reseal(&c);
        expect_refused(&l, &c);
        c = l.wire;
        c.bytes[OFF_RSV2 + 7] = 1;
        reseal(&c);
        expect_refused(&l, &c);

        /* SENTINEL with a size not a multiple of 8; oob outside SENTINEL. */
        if (unit_modes[m] == DCHAN_DETECT_SENTINEL) {
            f = l.f;
            f.size = 60;
            reencode(&l, &f, &c);
            expect_refused(&l, &c);
        } else {
            c = l.wire;
            dchan_put_le64(c.bytes + 40, 0x0b0b0b0b0b0b0b0bull);
            reseal(&c);
            expect_refused(&l, &c);
        }

        expect_channel_works(&l, 2);
        live_close(&l);
    }
}

/* A wire exported from another job (a second singleton context). */
static void test_import_other_context(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct live a, b;
        live_open(&a, unit_modes[m]);
        live_open(&b, unit_modes[m]);
        assert_true(a.f.job_key != b.f.job_key);
        /* Same id, size, mode and ranks: only the job key tells them apart. */
        assert_int_equal(a.f.handle_id, b.f.handle_id);
        expect_refused(&a, &b.wire);
        expect_refused(&b, &a.wire);
        expect_channel_works(&a, 4);
        expect_channel_works(&b, 5);
        live_close(&b);
        live_close(&a);
    }
}

/* The wire of a destroyed receive handle is refused; so is its sender's put. */
static void test_import_destroyed(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct live l;
        dchan_handle_t *sh;
        live_open(&l, unit_modes[m]);
        assert_int_equal(dchan_assoc_local(l.ctx, &l.wire, l.sbuf, l.size, &sh), DCHAN_SUCCESS);
        assert_int_equal(dchan_handle_destroy(l.rh), DCHAN_SUCCESS);
        expect_refused(&l, &l.wire);
        unit_fill(l.sbuf, l.size, 1, 1);
        assert_int_equal(dchan_put(sh), DCHAN_ERR_PEER);
        assert_int_equal(dchan_progress(l.ctx), 0);
        assert_int_equal(l.calls, 0);
        assert_int_equal(dchan_handle_destroy(sh), DCHAN_SUCCESS);
        live_close(&l);
    }
}

/*
 * A stale wire must stay refused when its slot is reused by a new handle:
 * with an 8-bit generation the id comes back after 255 reuses of the slot,
 * and the old wire (and an old sender handle) would then reach a channel
 * they were never given.
 */
static void test_import_stale_after_reuse(void **state)
{
    for (int m = 0; m < UNIT_NMODES; m++) {
        struct live l;
        dchan_handle_t *sh, *nh;
        live_open(&l, unit_modes[m]);
        assert_int_equal(dchan_assoc_local(l.ctx, &l.wire, l.sbuf, l.size, &sh), DCHAN_SUCCESS);
        assert_int_equal(dchan_handle_destroy(l.rh), DCHAN_SUCCESS);
        l.rh = NULL;
        int calls_new = 0;
        unsigned char *nbuf = calloc(1, l.size);
        for (int i = 0; i < 300; i++) {
            dchan_wire_t nw;
            struct dchan_wire_fields nf;
            assert_int_equal(dchan_create_handle(l.ctx, 0, nbuf, l.size, 0x0b0b0b0b0b0b0b0bull,
                                                 int_cb, &calls_new, &nh),
                             DCHAN_SUCCESS);
            assert_int_equal(dchan_handle_export(nh, &nw), DCHAN_SUCCESS);
            assert_int_equal(dchan_wire_decode(&nw, &nf), DCHAN_SUCCESS);
            if (DCHAN_ID_INDEX(nf.handle_id) == DCHAN_ID_INDEX(l.f.handle_id)) {
                /* dchan_handle_destroy(3): "a late or stale put can never
                 * reach a handle made later"; the old wire is stale too. */
                dchan_handle_t *x = NULL;
                unit_fill(l.sbuf, l.size, 9, i);
                int put_rc = dchan_put(sh);
                int fired = put_rc == DCHAN_SUCCESS ? dchan_progress(l.ctx) : 0;
                int reached = calls_new > 0 || unit_check(nbuf, l.size, 9, i);
                int rc = dchan_assoc_local(l.ctx, &l.wire, l.sbuf, l.size, &x);
                if (reached || put_rc != DCHAN_ERR_PEER || rc != DCHAN_ERR_HANDLE) {
                    free(nbuf);
                    live_close(&l); /* no leak report on top of the failure */
                    fail_msg("%s: new handle %d in the slot (id 0x%08x, old 0x%08x): stale "
                             "put gave '%s' (%d callbacks on the new handle, data %s), stale "
                             "wire import gave '%s'",
                             unit_mode_name(unit_modes[m]), i + 1, (unsigned)nf.handle_id,
                             (unsigned)l.f.handle_id, dchan_strerror(put_rc), fired,
                             reached ? "delivered" : "not delivered", dchan_strerror(rc));
                }
            }
            assert_int_equal(dchan_handle_destroy(nh), DCHAN_SUCCESS);
        }
        free(nbuf);
        assert_int_equal(dchan_handle_destroy(sh), DCHAN_SUCCESS);
        live_close(&l);
    }
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_encode_drops_oob_outside_sentinel),
        cmocka_unit_test(test_le_helpers),
        cmocka_unit_test(test_decode_every_flip),
        cmocka_unit_test(test_decode_constant_wires),
        cmocka_unit_test(test_decode_random_wires),
        cmocka_unit_test(test_decode_bad_fields),
        cmocka_unit_test(test_credit_fields),
        cmocka_unit_test(test_source_flag),
        cmocka_unit_test(test_import_every_flip),
        cmocka_unit_test(test_import_bad_fields),
        cmocka_unit_test(test_import_other_context),
        cmocka_unit_test(test_import_destroyed),
        cmocka_unit_test(test_import_stale_after_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
