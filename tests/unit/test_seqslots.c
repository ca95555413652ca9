/* SPDX-License-Identifier: BSD-3-Clause */
/* FLAG sequence-word pool: distinct, zeroed, aligned slots in page-aligned
 * chunks that never move; freed slots are reused. */
#include "config.h"

#include "unit.h"

#include "seqslots.h"

struct got {
    struct dchan_seqslot s;
    uint64_t *w;
};

static void check_slot(const struct dchan_seqpool *p, const struct got *g)
{
    void *base;
    size_t len;
    assert_true(g->s.chunk < p->nchunks);
    assert_true(g->s.index < DCHAN_SEQ_PER_CHUNK);
    dchan_seqpool_chunk(p, g->s.chunk, &base, &len);
    assert_int_equal(len, DCHAN_SEQ_CHUNK_BYTES);
    assert_int_equal((uintptr_t)base % 4096, 0);
    assert_int_equal((uintptr_t)g->w % 8, 0);
    assert_true((char *)g->w >= (char *)base && (char *)g->w < (char *)base + len);
    assert_ptr_equal(g->w, (uint64_t *)base + g->s.index);
}

static void test_distinct_zeroed_aligned(void **state)
{
    struct dchan_seqpool p;
    struct got g[100];
    memset(&p, 0, sizeof p);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(dchan_seqpool_get(&p, &g[i].s, &g[i].w), DCHAN_SUCCESS);
        assert_true(*g[i].w == 0);
        check_slot(&p, &g[i]);
        *g[i].w = 0x1000 + (uint64_t)i; /* used: later slots must not see it */
        for (int j = 0; j < i; j++)
            assert_ptr_not_equal(g[i].w, g[j].w);
    }
    for (int i = 0; i < 100; i++)
        assert_true(*g[i].w == 0x1000 + (uint64_t)i);
    assert_int_equal(p.nchunks, 1);
    /* Dense: handed out in address order within the chunk. */
    for (int i = 1; i < 100; i++)
        assert_ptr_equal(g[i].w, g[i - 1].w + 1);
    dchan_seqpool_fini(&p);
    assert_int_equal(p.nchunks, 0);
    assert_null(p.chunks);
}

static void test_reuse(void **state)
{
    struct dchan_seqpool p;
    struct got a, b, c;
    memset(&p, 0, sizeof p);
    assert_int_equal(dchan_seqpool_get(&p, &a.s, &a.w), DCHAN_SUCCESS);
    assert_int_equal(dchan_seqpool_get(&p, &b.s, &b.w), DCHAN_SUCCESS);
    *a.w = 41;
    *b.w = 42;
    dchan_seqpool_put(&p, a.s);
    assert_int_equal(dchan_seqpool_get(&p, &c.s, &c.w), DCHAN_SUCCESS);
    assert_ptr_equal(c.w, a.w); /* the freed slot, not a new one */
    assert_int_equal(c.s.chunk, a.s.chunk);
    assert_int_equal(c.s.index, a.s.index);
    assert_true(*c.w == 0);     /* zeroed again */
    assert_true(*b.w == 42);    /* neighbours untouched */
    /* Many get/put cycles never add chunks. */
    for (int i = 0; i < 10000; i++) {
        assert_int_equal(dchan_seqpool_get(&p, &c.s, &c.w), DCHAN_SUCCESS);
        assert_true(*c.w == 0);
        *c.w = (uint64_t)i + 1;
        dchan_seqpool_put(&p, c.s);
    }
    assert_int_equal(p.nchunks, 1);
    dchan_seqpool_fini(&p);
}

static void test_many_chunks(void **state)
{
    struct dchan_seqpool p;
    const int n = (int)DCHAN_SEQ_PER_CHUNK * 3 + 7;
    struct got *g = calloc((size_t)n, sizeof *g);
    memset(&p, 0, sizeof p);
    for (int i = 0; i < n; i++) {
        assert_int_equal(dchan_seqpool_get(&p, &g[i].s, &g[i].w), DCHAN_SUCCESS);
        assert_true(*g[i].w == 0);
        *g[i].w = ~(uint64_t)i;
    }
    assert_int_equal(p.nchunks, 4);
    for (int i = 0; i < n; i++) {
        check_slot(&p, &g[i]);
        assert_int_equal(g[i].s.chunk, i / (int)DCHAN_SEQ_PER_CHUNK);
        assert_true(*g[i].w == ~(uint64_t)i);
    }
    /* Chunks never move or overlap. */
    for (uint32_t a = 0; a < p.nchunks; a++)
        for (uint32_t b = a + 1; b < p.nchunks; b++) {
            void *ba, *bb;
            size_t la, lb;
            dchan_seqpool_chunk(&p, a, &ba, &la);
            dchan_seqpool_chunk(&p, b, &bb, &lb);
            assert_true((char *)ba + la <= (char *)bb || (char *)bb + lb <= (char *)ba);
        }
    /* Free a slot of each chunk, get them back, no new chunk. */
    for (int i = 0; i < n; i += (int)DCHAN_SEQ_PER_CHUNK)
        dchan_seqpool_put(&p, g[i].s);
    for (int i = 0; i < n; i += (int)DCHAN_SEQ_PER_CHUNK) {
        struct got x;
        assert_int_equal(dchan_seqpool_get(&p, &x.s, &x.w), DCHAN_SUCCESS);
        assert_true(*x.w == 0);
        check_slot(&p, &x);
    }
    assert_int_equal(p.nchunks, 4);
    for (int i = 0; i < n; i++)
        if (i % (int)DCHAN_SEQ_PER_CHUNK != 0)
            assert_true(*g[i].w == ~(uint64_t)i);
    dchan_seqpool_fini(&p);
    free(g);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distinct_zeroed_aligned),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_many_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
