/* SPDX-License-Identifier: BSD-3-Clause */
/* DCHAN_THREAD_MULTIPLE: concurrent drivers of one context, and callbacks
 * running on one thread while another calls progress. */
#include "config.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "unit.h"

#include "core.h"

#define OOB 0x0b0b0b0b0b0b0b0bull
#define NPER 4
#define ITERS 3000

struct tchan {
    dchan_handle_t *rh, *sh;
    unsigned char *rbuf, *sbuf;
    size_t size;
    int id;
    int it;                 /* written by the owner before its put */
    atomic_int fired;       /* callbacks seen */
    atomic_int bad;         /* wrong data or handle seen in the callback */
};

struct worker {
    dchan_ctx_t *ctx;
    struct tchan ch[NPER];
    int failures;
    pthread_t tid;
};

static void tcb(dchan_handle_t *h, void *arg)
{
    struct tchan *c = arg;
    /* The owner's put happened before the arrival this callback reports. */
    if (h != c->rh || !unit_check(c->rbuf, c->size, c->id, c->it))
        atomic_fetch_add(&c->bad, 1);
    atomic_fetch_add_explicit(&c->fired, 1, memory_order_release);
}

static void tchan_open(dchan_ctx_t *ctx, struct tchan *c, int id, size_t size)
{
    dchan_wire_t w;
    memset(c, 0, sizeof *c);
    c->id = id;
    c->size = size;
    c->rbuf = calloc(1, size);
    c->sbuf = calloc(1, size);
    atomic_init(&c->fired, 0);
    atomic_init(&c->bad, 0);
    assert_int_equal(dchan_create_handle(ctx, 0, c->rbuf, size, OOB, tcb, c, &c->rh),
                     DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_export(c->rh, &w), DCHAN_SUCCESS);
    assert_int_equal(dchan_assoc_local(ctx, &w, c->sbuf, size, &c->sh), DCHAN_SUCCESS);
}

static void tchan_close(struct tchan *c)
{
    assert_int_equal(dchan_handle_destroy(c->sh), DCHAN_SUCCESS);
    assert_int_equal(dchan_handle_destroy(c->rh), DCHAN_SUCCESS);
    free(c->rbuf);
    free(c->sbuf);
}

/* No cmocka asserts off the main thread: count failures instead. */
static void *drive(void *arg)
{
    struct worker *w = arg;
    for (int it = 1; it <= ITERS && !w->failures; it++) {
        for (int i = 0; i < NPER; i++) {
            struct tchan *c = &w->ch[i];
            c->it = it;
            unit_fill(c->sbuf, c->size, c->id, it);
            if (dchan_put(c->sh) != DCHAN_SUCCESS)
                w->failures++;
        }
        /* Progress until each of this worker's channels fired; another
         * thread's progress may run some of the callbacks. */
        for (long spins = 0;; spins++) {
            int done = 0;
            for (int i = 0; i < NPER; i++)
                done += atomic_load_explicit(&w->ch[i].fired, memory_order_acquire) >= it;
            if (done == NPER)
                break;
            if (dchan_progress(w->ctx) < 0 || spins > 50000000L) {
                w->failures++;
                break;
            }
            if (spins % 64 == 63)
                sched_yield();
        }
        for (int i = 0; i < NPER; i++) {
            struct tchan *c = &w->ch[i];
            if (atomic_load(&c->fired) != it || !unit_check(c->rbuf, c->size, c->id, it))
                w->failures++;
            if (dchan_ready(c->rh) != DCHAN_SUCCESS)
                w->failures++;
        }
    }
    return NULL;
}

static void test_two_drivers(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    struct worker w[2];
    dchan_stats_t st;

    unit_attr(&a, mode, DCHAN_THREAD_MULTIPLE);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    for (int t = 0; t < 2; t++) {
        memset(&w[t], 0, sizeof w[t]);
        w[t].ctx = ctx;
        for (int i = 0; i < NPER; i++)
            tchan_open(ctx, &w[t].ch[i], t * NPER + i, 8 * (size_t)(1 + i * 5 + t));
    }
    for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_create(&w[t].tid, NULL, drive, &w[t]), 0);
    for (int t = 0; t < 2; t++)
        assert_int_equal(pthread_join(w[t].tid, NULL), 0);
    for (int t = 0; t < 2; t++) {
        assert_int_equal(w[t].failures, 0);
        for (int i = 0; i < NPER; i++) {
            assert_int_equal(atomic_load(&w[t].ch[i].fired), ITERS);
            assert_int_equal(atomic_load(&w[t].ch[i].bad), 0);
        }
    }
    assert_int_equal(dchan_get_stats(ctx, &st), DCHAN_SUCCESS);
    assert_true(st.puts == 2 * NPER * ITERS);
    assert_true(st.arrivals == 2 * NPER * ITERS);
    assert_true(st.callbacks == 2 * NPER * ITERS);
    assert_true(st.errors == 0);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < NPER; i++)
            tchan_close(&w[t].ch[i]);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
}

/* ---- a callback in progress on one thread, progress on another -------------------------- */

struct block {
    dchan_ctx_t *ctx;
    struct unit_chan x, y;
    atomic_int x_in, x_release, x_done, y_fired_during_x;
    pthread_t x_thread, y_thread;
    int x_nested_rc;
};

static struct block B;

/* Deadlock guard: false once 5 s have passed since start. */
static int within_guard(const struct timespec *start)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec - start->tv_sec < 5;
}

static void x_cb(dchan_handle_t *h, void *arg)
{
    B.x_thread = pthread_self();
    atomic_store(&B.x_in, 1);
    /* Hold the callback until the other thread has had its arrival. */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!atomic_load(&B.x_release) && within_guard(&t0))
        sched_yield();
    B.x_nested_rc = dchan_progress(B.ctx); /* still refused in here */
    atomic_store(&B.x_done, 1);
}

static void y_cb(dchan_handle_t *h, void *arg)
{
    B.y_thread = pthread_self();
    B.y.calls++;
    B.y.last_h = h;
    if (atomic_load(&B.x_in) && !atomic_load(&B.x_done))
        atomic_store(&B.y_fired_during_x, 1);
}

static void *x_runner(void *arg)
{
    while (!atomic_load(&B.x_done))
        if (dchan_progress(B.ctx) < 0)
            break;
    return NULL;
}

static void test_callback_while_other_progresses(void **state)
{
    int mode = UNIT_MODE(state);
    dchan_attr_t a;
    pthread_t t;

    memset(&B, 0, sizeof B);
    unit_attr(&a, mode, DCHAN_THREAD_MULTIPLE);
    assert_int_equal(dchan_init(&a, &B.ctx), DCHAN_SUCCESS);
    unit_chan_open_cb(&B.x, B.ctx, 64, OOB, x_cb, NULL);
    unit_chan_open_cb(&B.y, B.ctx, 64, OOB, y_cb, NULL);
    B.y.id = 1;

    unit_fill(B.x.sbuf, 64, 0, 1);
    assert_int_equal(dchan_put(B.x.sh), DCHAN_SUCCESS);
    assert_int_equal(pthread_create(&t, NULL, x_runner, NULL), 0);
    /* Wait until the other thread is inside x's callback. */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!atomic_load(&B.x_in) && within_guard(&t0))
        sched_yield();
    assert_true(atomic_load(&B.x_in));

    /* This thread: put on y, progress, its callback runs here, now. */
    unit_fill(B.y.sbuf, 64, 1, 1);
    assert_int_equal(dchan_put(B.y.sh), DCHAN_SUCCESS);
    int got = 0;
    for (long i = 0; i < 10000000L && B.y.calls == 0; i++) {
        int n = dchan_progress(B.ctx);
        assert_true(n >= 0);
        got += n;
    }
    assert_int_equal(B.y.calls, 1);
    assert_int_equal(got, 1);
    assert_true(atomic_load(&B.y_fired_during_x));
    assert_true(pthread_equal(B.y_thread, pthread_self()));
    assert_true(unit_check(B.y.rbuf, 64, 1, 1));
    /* Receiver calls from this thread while x's callback still runs. */
    assert_int_equal(dchan_ready(B.y.rh), DCHAN_SUCCESS);

    atomic_store(&B.x_release, 1);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(atomic_load(&B.x_done));
    assert_false(pthread_equal(B.x_thread, pthread_self()));
    assert_int_equal(B.x_nested_rc, DCHAN_ERR_STATE);
    assert_true(unit_check(B.x.rbuf, 64, 0, 1));

    /* Both channels work afterwards from the main thread. */
    assert_int_equal(dchan_ready(B.x.rh), DCHAN_SUCCESS);
    unit_cycle(&B.y, 2);
    unit_chan_close(&B.x);
    unit_chan_close(&B.y);
    assert_int_equal(dchan_finalize(B.ctx), DCHAN_SUCCESS);
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        UNIT_TEST_MODES(test_two_drivers),
        UNIT_TEST_MODES(test_callback_while_other_progresses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
