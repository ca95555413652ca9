/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Gathered send sides and completion callbacks (lib/strided.c): the
 * subarray-to-runs conversion, every bad input of dchan_assoc_local_iov,
 * dchan_assoc_local_subarray and dchan_set_completion with its code (the
 * channel working afterwards), completion callbacks under a progress
 * budget, in every detection mode on self channels, and get on self.
 */
#include "config.h"

#include "unit.h"

#include "core.h"
#include "strided.h"

#define OOB 0x0b0b0b0b0b0b0b0bull
#define UNTOUCHED ((dchan_handle_t *)(uintptr_t)0x5a5a5a5a)

/* ---- subarray to runs ------------------------------------------------------------ */

static void runs(const void *base, int nd, const size_t *sz, const size_t *sub, const size_t *st,
                 size_t elem, size_t want_n, size_t want_total, dchan_iov_t **segs)
{
    size_t n = 0, total = 0;
    assert_int_equal(dchan_subarray_runs(base, nd, sz, sub, st, elem, segs, &n, &total),
                     DCHAN_SUCCESS);
    assert_int_equal(n, want_n);
    assert_int_equal(total, want_total);
    size_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (*segs)[i].len;
    assert_int_equal(sum, total);
}

static void test_runs(void **state)
{
    static double a[4][5][6];
    dchan_iov_t *s = NULL;
    const char *b = (const char *)a;

    /* 1-D: one run. */
    runs(a, 1, (size_t[]){120}, (size_t[]){7}, (size_t[]){3}, 8, 1, 56, &s);
    assert_ptr_equal(s[0].base, b + 24);
    free(s);
    /* 2-D rows of a block: one run per row, merged when rows are whole. */
    runs(a, 2, (size_t[]){20, 6}, (size_t[]){3, 4}, (size_t[]){2, 1}, 8, 3, 96, &s);
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(s[i].base, b + ((2 + i) * 6 + 1) * 8);
        assert_int_equal(s[i].len, 32);
    }
    free(s);
    runs(a, 2, (size_t[]){20, 6}, (size_t[]){3, 6}, (size_t[]){2, 0}, 8, 1, 144, &s);
    assert_ptr_equal(s[0].base, b + 12 * 8);
    free(s);
    /* 3-D faces of a 4x5x6 block: x (one plane, contiguous), y (4 rows),
     * z (20 single elements). */
    const size_t sz[3] = {4, 5, 6};
    runs(a, 3, sz, (size_t[]){1, 5, 6}, (size_t[]){2, 0, 0}, 8, 1, 240, &s);
    assert_ptr_equal(s[0].base, &a[2][0][0]);
    free(s);
    runs(a, 3, sz, (size_t[]){4, 1, 6}, (size_t[]){0, 3, 0}, 8, 4, 192, &s);
    for (int i = 0; i < 4; i++) {
        assert_ptr_equal(s[i].base, &a[i][3][0]);
        assert_int_equal(s[i].len, 48);
    }
    free(s);
    runs(a, 3, sz, (size_t[]){4, 5, 1}, (size_t[]){0, 0, 5}, 8, 20, 160, &s);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) {
            assert_ptr_equal(s[i * 5 + j].base, &a[i][j][5]);
            assert_int_equal(s[i * 5 + j].len, 8);
        }
    free(s);
    /* The whole array: one run. */
    runs(a, 3, sz, sz, (size_t[]){0, 0, 0}, 8, 1, sizeof a, &s);
    free(s);
    /* Two whole planes, then part: planes merge, rows of a partial plane do. */
    runs(a, 3, sz, (size_t[]){2, 2, 6}, (size_t[]){1, 3, 0}, 8, 2, 192, &s);
    assert_ptr_equal(s[0].base, &a[1][3][0]);
    assert_ptr_equal(s[1].base, &a[2][3][0]);
    free(s);
}

static void test_runs_bad(void **state)
{
    static char a[64];
    dchan_iov_t *s = (dchan_iov_t *)UNTOUCHED;
    size_t n = 7, t = 7;
    const size_t sz[3] = {4, 4, 4}, sub[3] = {1, 1, 1}, st[3] = {0, 0, 0};
#define BAD(...) assert_int_equal(dchan_subarray_runs(__VA_ARGS__, &s, &n, &t), DCHAN_ERR_INVALID_ARG)
    BAD(NULL, 3, sz, sub, st, 1);
    BAD(a, 0, sz, sub, st, 1);
    BAD(a, 4, sz, sub, st, 1);
    BAD(a, -1, sz, sub, st, 1);
    BAD(a, 3, NULL, sub, st, 1);
    BAD(a, 3, sz, NULL, st, 1);
    BAD(a, 3, sz, sub, NULL, 1);
    BAD(a, 3, sz, sub, st, 0);
    BAD(a, 3, sz, (size_t[]){1, 0, 1}, st, 1);             /* an empty dimension */
    BAD(a, 3, sz, (size_t[]){1, 1, 5}, st, 1);             /* wider than the array */
    BAD(a, 3, sz, sub, (size_t[]){0, 4, 0}, 1);            /* starts past the end */
    BAD(a, 3, sz, (size_t[]){2, 1, 1}, (size_t[]){3, 0, 0}, 1); /* runs past the end */
    BAD(a, 1, (size_t[]){SIZE_MAX}, (size_t[]){1}, (size_t[]){SIZE_MAX - 1}, 2); /* overflow */
    BAD(a, 3, (size_t[]){SIZE_MAX / 2, 4, 1}, sub, st, 1);
#undef BAD
    assert_ptr_equal(s, (dchan_iov_t *)UNTOUCHED);
    assert_int_equal(n, 7);
    assert_int_equal(t, 7);
}

static void test_iov_import(void **state)
{
    char a[100];
    dchan_iov_t *s = NULL;
    size_t n, t;
    /* Empty segments dropped, neighbours in order merged, others kept. */
    dchan_iov_t v[] = {{a, 10}, {NULL, 0}, {a + 10, 5}, {a + 50, 5}, {a + 30, 0}, {a + 20, 5}};
    assert_int_equal(dchan_iov_import(v, 6, &s, &n, &t), DCHAN_SUCCESS);
    assert_int_equal(n, 3);
    assert_int_equal(t, 25);
    assert_ptr_equal(s[0].base, a);
    assert_int_equal(s[0].len, 15);
    assert_ptr_equal(s[1].base, a + 50);
    assert_ptr_equal(s[2].base, a + 20);
    free(s);
    /* Overlaps, in any order; touching is fine. */
    dchan_iov_t o1[] = {{a + 20, 10}, {a, 21}};
    assert_int_equal(dchan_iov_import(o1, 2, &s, &n, &t), DCHAN_ERR_INVALID_ARG);
    dchan_iov_t o2[] = {{a, 10}, {a + 40, 10}, {a + 5, 1}};
    assert_int_equal(dchan_iov_import(o2, 3, &s, &n, &t), DCHAN_ERR_INVALID_ARG);
    dchan_iov_t o3[] = {{a + 10, 10}, {a, 10}};
    assert_int_equal(dchan_iov_import(o3, 2, &s, &n, &t), DCHAN_SUCCESS);
    assert_int_equal(n, 2);
    free(s);
    dchan_iov_t nul[] = {{NULL, 1}};
    assert_int_equal(dchan_iov_import(nul, 1, &s, &n, &t), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_iov_import(NULL, 1, &s, &n, &t), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_iov_import(v, 0, &s, &n, &t), DCHAN_ERR_INVALID_ARG);
    dchan_iov_t wrap[] = {{a, SIZE_MAX}};
    assert_int_equal(dchan_iov_import(wrap, 1, &s, &n, &t), DCHAN_ERR_INVALID_ARG);
    /* Only empty segments: nothing, total 0. */
    dchan_iov_t e[] = {{NULL, 0}, {a, 0}};
    assert_int_equal(dchan_iov_import(e, 2, &s, &n, &t), DCHAN_SUCCESS);
    assert_null(s);
    assert_int_equal(t, 0);
}

static void test_segs_copy(void **state)
{
    const char x[] = "abcdefghij", y[] = "KLMNO";
    dchan_iov_t v[] = {{y, 5}, {x + 2, 3}, {x, 1}};
    char out[16] = {0};
    dchan_segs_copy(v, 3, 0, 9, out);
    assert_memory_equal(out, "KLMNOcdea", 9);
    memset(out, 0, sizeof out);
    dchan_segs_copy(v, 3, 3, 8, out);
    assert_memory_equal(out, "NOcde", 5);
    struct dchan_put_desc d = {.iov = v, .iovcnt = 3, .size = 9};
    dchan_iov_t sl[2];
    size_t from = 4;
    assert_int_equal(dchan_gather_slice(&d, &from, 9, sl, 2), 2);
    assert_int_equal(from, 8);
    assert_ptr_equal(sl[0].base, y + 4);
    assert_int_equal(sl[0].len, 1);
    assert_ptr_equal(sl[1].base, x + 2);
    assert_int_equal(sl[1].len, 3);
    assert_int_equal(dchan_gather_slice(&d, &from, 9, sl, 2), 1);
    assert_int_equal(from, 9);
    assert_ptr_equal(sl[0].base, x);
}

/* Runs of equal length at a constant stride become one vector (a face
 * across the last axis), and a copy through vectors equals one through the
 * segments, over any byte range. */
static void test_vectors(void **state)
{
    static double a[4][5][6];
    for (int i = 0; i < 120; i++)
        (&a[0][0][0])[i] = i * 1.5;
    struct {
        size_t sub[3], st[3];
        size_t nvec;
    } cases[] = {
        {{4, 5, 1}, {0, 0, 5}, 1}, /* z face: 20 elements, one stride */
        {{4, 1, 6}, {0, 3, 0}, 1}, /* y face: 4 rows of 6 */
        {{2, 3, 2}, {1, 1, 2}, 2}, /* rows of 2, a jump between planes */
        {{4, 5, 6}, {0, 0, 0}, 1}, /* the whole block */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        dchan_iov_t *s = NULL;
        size_t n, t, nv = 0;
        assert_int_equal(dchan_subarray_runs(a, 3, (size_t[]){4, 5, 6}, cases[c].sub,
                                             cases[c].st, 8, &s, &n, &t),
                         DCHAN_SUCCESS);
        struct dchan_gvec *v = dchan_segs_vectorize(s, n, &nv);
        assert_non_null(v);
        assert_int_equal(nv, cases[c].nvec);
        unsigned char x[960], y[960];
        for (size_t from = 0; from < t; from += 3)
            for (size_t to = from; to <= t; to += 5) {
                memset(x, 0, sizeof x);
                memset(y, 1, sizeof y);
                dchan_segs_copy(s, n, from, to, x);
                dchan_gvec_copy(v, nv, from, to, y);
                assert_memory_equal(x, y, to - from);
            }
        free(v);
        free(s);
    }
    /* Reverse order and mixed lengths, as an iov list may give. */
    char m[64];
    for (int i = 0; i < 64; i++)
        m[i] = (char)i;
    dchan_iov_t l[] = {{m + 40, 4}, {m + 30, 4}, {m + 20, 4}, {m + 2, 3}, {m + 60, 4}};
    size_t nv = 0;
    struct dchan_gvec *v = dchan_segs_vectorize(l, 5, &nv);
    assert_int_equal(nv, 3);
    char x[19], y[19];
    dchan_segs_copy(l, 5, 0, 19, x);
    dchan_gvec_copy(v, nv, 0, 19, y);
    assert_memory_equal(x, y, 19);
    free(v);
}

/* ---- through the API, on self channels ----------------------------------------------- */

struct cc {
    int done;
    int order[64];
    dchan_handle_t *h;
};

static void on_done(dchan_handle_t *h, void *arg)
{
    struct cc *c = arg;
    assert_ptr_equal(h, c->h);
    if (c->done < 64)
        c->order[c->done] = c->done;
    c->done++;
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    (*(int *)arg)++;
}

/* A receive handle of size bytes (depth slots); its wire in w. */
static dchan_handle_t *recv_side(dchan_ctx_t *ctx, void *buf, size_t size, int depth,
                                 int *count, dchan_wire_t *w)
{
    dchan_handle_attr_t ha;
    dchan_handle_t *r;
    dchan_handle_attr_init(&ha);
    ha.depth = depth;
    assert_int_equal(dchan_create_handle_attr(ctx, 0, buf, size, OOB, on_arrival, count, &ha, &r),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(r, w), DCHAN_SUCCESS);
    return r;
}

static void test_iov_channel(void **state)
{
    int mode = UNIT_MODE(state), arrivals = 0;
    dchan_ctx_t *ctx = unit_ctx(mode);
    enum { SIZE = 64 };
    uint64_t *rbuf = calloc(2, SIZE);
    unsigned char pool[256];
    dchan_wire_t w;
    dchan_handle_t *r = recv_side(ctx, rbuf, SIZE, 2, &arrivals, &w), *s = UNTOUCHED;

    /* Bad input first: each leaves *h alone and breaks nothing. */
    dchan_iov_t short_[] = {{pool, SIZE - 1}};
    assert_int_equal(dchan_assoc_local_iov(ctx, &w, short_, 1, &s), DCHAN_ERR_SIZE);
    dchan_iov_t ovl[] = {{pool, 40}, {pool + 39, 24}};
    assert_int_equal(dchan_assoc_local_iov(ctx, &w, ovl, 2, &s), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local_iov(NULL, &w, ovl, 2, &s), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local_iov(ctx, NULL, ovl, 2, &s), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local_iov(ctx, &w, ovl, 2, NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local_iov(ctx, &w, NULL, 2, &s), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local_iov(ctx, &w, ovl, -1, &s), DCHAN_ERR_INVALID_ARG);
    dchan_wire_t bad = w;
    bad.bytes[3] ^= 0x40;
    dchan_iov_t ok[] = {{pool + 100, 30}, {NULL, 0}, {pool + 7, 29}, {pool + 200, 5}};
    assert_int_equal(dchan_assoc_local_iov(ctx, &bad, ok, 4, &s), DCHAN_ERR_HANDLE);
    assert_int_equal(dchan_assoc_local_subarray(ctx, &w, pool, 1, (size_t[]){32},
                                                (size_t[]){8}, (size_t[]){25}, 8, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local_subarray(ctx, &w, pool, 1, (size_t[]){32},
                                                (size_t[]){7}, (size_t[]){25}, 8, &s),
                     DCHAN_ERR_SIZE);
    assert_int_equal(dchan_assoc_local_subarray(NULL, &w, pool, 1, (size_t[]){32},
                                                (size_t[]){8}, (size_t[]){0}, 8, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(s, UNTOUCHED);
    /* A receive handle takes no completion callback. */
    assert_int_equal(dchan_set_completion(r, on_done, NULL), DCHAN_ERR_STATE);
    assert_int_equal(dchan_set_completion(NULL, on_done, NULL), DCHAN_ERR_INVALID_ARG);

    /* Now the real one: 30 + 29 + 5 bytes, the tail across two segments. */
    struct cc cc = {0};
    assert_int_equal(dchan_assoc_local_iov(ctx, &w, ok, 4, &s), DCHAN_SUCCESS);
    cc.h = s;
    void *p = UNTOUCHED;
    assert_int_equal(dchan_put_ptr(s, &p), DCHAN_ERR_STATE);
    assert_ptr_equal(p, UNTOUCHED);
    assert_int_equal(dchan_set_completion(s, on_done, &cc), DCHAN_SUCCESS);
    for (int it = 0; it < 10; it++) {
        unsigned char msg[SIZE];
        unit_fill(msg, SIZE, 3, it);
        memcpy(pool + 100, msg, 30);
        memcpy(pool + 7, msg + 30, 29);
        memcpy(pool + 200, msg + 59, 5);
        assert_int_equal(dchan_put(s), DCHAN_SUCCESS);
        /* The callback never runs inside dchan_put. */
        assert_int_equal(cc.done, it);
        assert_int_equal(unit_progress_until(ctx, &arrivals, it + 1), DCHAN_SUCCESS);
        assert_int_equal(cc.done, it + 1);
        assert_true(unit_check((unsigned char *)rbuf + (it % 2) * SIZE, SIZE, 3, it));
        assert_int_equal(dchan_ready(r), DCHAN_SUCCESS);
    }
    if (mode == DCHAN_DETECT_SENTINEL) {
        /* The gathered tail equal to oob: refused, nothing sent. */
        uint64_t o = OOB;
        unsigned char t[8];
        memcpy(t, &o, 8);
        memcpy(pool + 7 + 26, t, 3);
        memcpy(pool + 200, t + 3, 5);
        assert_int_equal(dchan_put(s), DCHAN_ERR_SENTINEL);
    }
    assert_int_equal(dchan_handle_destroy(s), DCHAN_SUCCESS);
    assert_int_equal(dchan_set_completion(s, on_done, &cc), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put(s), DCHAN_ERR_STATE);
    assert_int_equal(dchan_handle_destroy(r), DCHAN_SUCCESS);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    free(rbuf);
}

static void test_subarray_channel(void **state)
{
    int mode = UNIT_MODE(state), arrivals = 0;
    dchan_ctx_t *ctx = unit_ctx(mode);
    enum { E = 6 };
    static double blk[E][E][E];
    double face[E * E];
    dchan_wire_t w;
    dchan_handle_t *r = recv_side(ctx, face, sizeof face, 1, &arrivals, &w), *s = NULL;
    const size_t sz[3] = {E, E, E};
    /* Each face in turn through the same receive handle: x, y, z. */
    for (int f = 0; f < 3; f++) {
        size_t sub[3] = {E, E, E}, st[3] = {0, 0, 0};
        sub[f] = 1;
        st[f] = 4;
        assert_int_equal(dchan_assoc_local_subarray(ctx, &w, blk, 3, sz, sub, st, 8, &s),
                         DCHAN_SUCCESS);
        for (int it = 0; it < 5; it++) {
            for (int i = 0; i < E; i++)
                for (int j = 0; j < E; j++)
                    for (int k = 0; k < E; k++)
                        blk[i][j][k] = i * 10000 + j * 100 + k + it * 1e6 + f * 1e7;
            assert_int_equal(dchan_put(s), DCHAN_SUCCESS);
            int before = arrivals;
            assert_int_equal(unit_progress_until(ctx, &arrivals, before + 1), DCHAN_SUCCESS);
            for (int a = 0; a < E; a++)
                for (int b = 0; b < E; b++) {
                    int i = f == 0 ? 4 : a, j = f == 1 ? 4 : (f == 0 ? a : b),
                        k = f == 2 ? 4 : b;
                    assert_true(face[a * E + b] == blk[i][j][k]);
                }
            assert_int_equal(dchan_ready(r), DCHAN_SUCCESS);
        }
        assert_int_equal(dchan_handle_destroy(s), DCHAN_SUCCESS);
    }
    assert_int_equal(dchan_handle_destroy(r), DCHAN_SUCCESS);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* Completion callbacks obey dchan_progress_n, come in put order, and stop
 * when removed; the channel goes on afterwards. */
static void test_completion_budget(void **state)
{
    int mode = UNIT_MODE(state), arrivals = 0;
    dchan_ctx_t *ctx = unit_ctx(mode);
    enum { SIZE = 32, K = 4 };
    unsigned char *rbuf = calloc(K, SIZE), sbuf[SIZE];
    dchan_wire_t w;
    dchan_handle_t *r = recv_side(ctx, rbuf, SIZE, K, &arrivals, &w), *s;
    assert_int_equal(dchan_assoc_local(ctx, &w, sbuf, SIZE, &s), DCHAN_SUCCESS);
    struct cc cc = {.h = s};
    assert_int_equal(dchan_set_completion(s, on_done, &cc), DCHAN_SUCCESS);
    for (int i = 0; i < K; i++) {
        unit_fill(sbuf, SIZE, 1, i);
        assert_int_equal(dchan_put(s), DCHAN_SUCCESS);
    }
    assert_int_equal(cc.done, 0);
    /* K arrivals and K completions: 2K callbacks, at most 3 per call. */
    int total = 0;
    for (int n; (n = dchan_progress_n(ctx, 3)) > 0;) {
        assert_true(n <= 3);
        total += n;
    }
    assert_int_equal(total, 2 * K);
    assert_int_equal(cc.done, K);
    assert_int_equal(arrivals, K);
    for (int i = 0; i < K; i++)
        assert_int_equal(cc.order[i], i);
    for (int i = 0; i < K; i++)
        assert_int_equal(dchan_ready(r), DCHAN_SUCCESS);
    /* Removed with callbacks due: they are dropped. */
    unit_fill(sbuf, SIZE, 1, 9);
    assert_int_equal(dchan_put(s), DCHAN_SUCCESS);
    assert_int_equal(dchan_set_completion(s, NULL, NULL), DCHAN_SUCCESS);
    assert_int_equal(unit_progress_until(ctx, &arrivals, K + 1), DCHAN_SUCCESS);
    assert_int_equal(dchan_progress(ctx), 0);
    assert_int_equal(cc.done, K);
    assert_int_equal(dchan_handle_destroy(s), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(r), DCHAN_SUCCESS);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    free(rbuf);
}

/* Get on self: bad input with its codes, versions taken once each, the
 * callbacks on both sides, a destroyed source. */
static void test_get_self(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(DCHAN_DETECT_AUTO);
    unsigned char src[40], dst[40];
    int done = 0, arrived = 0;
    dchan_handle_t *s = UNTOUCHED, *g = UNTOUCHED;
    dchan_wire_t w;

    assert_int_equal(dchan_create_source(NULL, 0, src, 40, on_arrival, &done, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_source(ctx, 1, src, 40, on_arrival, &done, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_source(ctx, -1, src, 40, on_arrival, &done, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_source(ctx, 0, NULL, 40, on_arrival, &done, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_source(ctx, 0, src, 0, on_arrival, &done, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_source(ctx, 0, src, 40, NULL, &done, &s),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_create_source(ctx, 0, src, 40, on_arrival, &done, NULL),
                     DCHAN_ERR_INVALID_ARG);
    assert_ptr_equal(s, UNTOUCHED);
    unit_fill(src, 40, 5, 0);
    assert_int_equal(dchan_create_source(ctx, 0, src, 40, on_arrival, &done, &s), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(s, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_remote(ctx, &w, dst, 41, on_arrival, &arrived, &g),
                     DCHAN_ERR_SIZE);
    assert_int_equal(dchan_assoc_remote(ctx, NULL, dst, 40, on_arrival, &arrived, &g),
                     DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_assoc_local(ctx, &w, dst, 40, &g), DCHAN_ERR_HANDLE);
    assert_ptr_equal(g, UNTOUCHED);
    assert_int_equal(dchan_assoc_remote(ctx, &w, dst, 40, on_arrival, &arrived, &g),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_get(NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_get(s), DCHAN_ERR_STATE);
    assert_int_equal(dchan_put(g), DCHAN_ERR_STATE);
    assert_int_equal(dchan_ready(g), DCHAN_ERR_STATE);
    for (int v = 0; v < 5; v++) {
        assert_int_equal(dchan_ready(s), DCHAN_ERR_STATE); /* not taken yet */
        assert_int_equal(dchan_get(g), DCHAN_SUCCESS);
        assert_int_equal(dchan_get(g), DCHAN_ERR_AGAIN); /* taken: wait for the next */
        assert_true(unit_check(dst, 40, 5, v));
        /* The arrival and done_fn, one per call under a budget of 1. */
        assert_int_equal(dchan_progress_n(ctx, 1), 1);
        assert_int_equal(dchan_progress_n(ctx, 1), 1);
        assert_int_equal(dchan_progress(ctx), 0);
        assert_int_equal(arrived, v + 1);
        assert_int_equal(done, v + 1);
        assert_int_equal(dchan_get(g), DCHAN_ERR_AGAIN);
        unit_fill(src, 40, 5, v + 1);
        assert_int_equal(dchan_ready(s), DCHAN_SUCCESS);
    }
    /* A destroyed source: the getter fails, the context goes on. */
    assert_int_equal(dchan_handle_destroy(s), DCHAN_SUCCESS);
    assert_int_equal(dchan_ready(s), DCHAN_ERR_STATE);
    assert_int_equal(dchan_get(g), DCHAN_ERR_PEER);
    assert_int_equal(dchan_handle_destroy(g), DCHAN_SUCCESS);
    assert_int_equal(dchan_get(g), DCHAN_ERR_STATE);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* The words of a source carry a tag no later source of the context takes,
 * wherever its words are allocated: a getter of a destroyed source (on
 * shm it reads the words where they lie) never takes a later source's
 * words for its own. Here the later source gets a fresh slot of the
 * handle table, whose generation starts where the first one's did. */
static void test_get_tags(void **state)
{
    dchan_ctx_t *ctx = unit_ctx(DCHAN_DETECT_AUTO);
    unsigned char src[40], dst[40], rbuf[40];
    int done = 0, arrived = 0;
    dchan_handle_t *a, *g, *r, *b[4];
    dchan_wire_t w;

    unit_fill(src, 40, 7, 0);
    assert_int_equal(dchan_create_source(ctx, 0, src, 40, on_arrival, &done, &a), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(a, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_remote(ctx, &w, dst, 40, on_arrival, &arrived, &g),
                     DCHAN_SUCCESS);
    uint32_t tag = a->gen;
    assert_int_equal(dchan_handle_destroy(a), DCHAN_SUCCESS);
    /* The freed slot goes to a receive handle; the sources after it take
     * slots never used. */
    assert_int_equal(dchan_create_handle(ctx, 0, rbuf, 40, OOB, on_arrival, &arrived, &r),
                     DCHAN_SUCCESS);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(dchan_create_source(ctx, 0, src, 40, on_arrival, &done, &b[i]),
                         DCHAN_SUCCESS);
        assert_int_not_equal(b[i]->gen, tag);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(b[i]->gen, b[j]->gen);
        assert_int_equal(b[i]->gen & 0xffu, DCHAN_ID_GEN(b[i]->id)); /* the wire's rule */
    }
    assert_int_equal(dchan_get(g), DCHAN_ERR_PEER);
    for (int i = 0; i < 4; i++)
        assert_int_equal(dchan_handle_destroy(b[i]), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(r), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(g), DCHAN_SUCCESS);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runs),
        cmocka_unit_test(test_runs_bad),
        cmocka_unit_test(test_iov_import),
        cmocka_unit_test(test_segs_copy),
        cmocka_unit_test(test_vectors),
        UNIT_TEST_MODES(test_iov_channel),
        UNIT_TEST_MODES(test_subarray_channel),
        UNIT_TEST_MODES(test_completion_budget),
        cmocka_unit_test(test_get_self),
        cmocka_unit_test(test_get_tags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
