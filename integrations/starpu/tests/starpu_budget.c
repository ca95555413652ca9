/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libdchan_starpu's contract, on 2 ranks (or 1): K channels from the
 * previous rank, each arrival releasing a StarPU task through a tag, the
 * progression hook driving progress with a budget B < K.
 *
 * Round 0 lands every face before the hook is registered, so the hook's
 * first call finds K arrivals due: it must run exactly B callbacks (the
 * budget binds) and never more in any call. Every task checks the content
 * of its channel's message and hands the slot back; later rounds put again
 * (credit returned by those re-arms). Checked: per-call maximum <= B, at
 * least one call used its whole budget, K * rounds tags notified, every
 * task ran once with the right data, bad arguments refused.
 */
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <starpu.h>
#include <starpu_mpi.h>

#include <dchan.h>

#include "dchan_starpu.h"

#define M 32 /* doubles per message */
#define TAG_ARRIVAL (UINT64_C(1) << 62)
#define TAG_TASK (UINT64_C(1) << 61)

static int K = 24, ROUNDS = 3, BUDGET = 3;
static int me, nranks;
static dchan_starpu_recv_t **rr;
static _Atomic int tasks_ran, bad_data;

static double value(int rank, int round, int ch, int j)
{
    return rank * 1e6 + round * 1e4 + ch * 100 + j + 0.25;
}

struct targ {
    int ch, round;
};

static void check_cpu(void *buffers[], void *cl_arg)
{
    const struct targ *a = cl_arg;
    const int from = (me + nranks - 1) % nranks;
    dchan_handle_t *h = dchan_starpu_recv_handle(rr[a->ch]);
    double *slot;

    (void)buffers;
    if (dchan_slot(h, (void **)&slot) != DCHAN_SUCCESS) {
        atomic_fetch_add(&bad_data, 1);
        return;
    }
    for (int j = 0; j < M; j++)
        if (slot[j] != value(from, a->round, a->ch, j)) {
            atomic_fetch_add(&bad_data, 1);
            break;
        }
    if (dchan_ready(h) != DCHAN_SUCCESS)
        atomic_fetch_add(&bad_data, 1);
    atomic_fetch_add(&tasks_ran, 1);
}

static struct starpu_codelet check_cl = { .cpu_funcs = { check_cpu }, .nbuffers = 0,
                                          .name = "budget_check" };

#define FAIL(...)                                                                            \
    do {                                                                                     \
        fprintf(stderr, "starpu_budget: rank %d: ", me);                                     \
        fprintf(stderr, __VA_ARGS__);                                                        \
        fputc('\n', stderr);                                                                 \
        MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
    } while (0)

int main(int argc, char **argv)
{
    static const struct option opts[] = { { "channels", required_argument, NULL, 'k' },
                                          { "rounds", required_argument, NULL, 'r' },
                                          { "budget", required_argument, NULL, 'b' },
                                          { NULL, 0, NULL, 0 } };
    struct starpu_conf conf;
    dchan_starpu_t *ds;
    dchan_ctx_t *ctx;
    dchan_handle_attr_t hattr;
    int provided, c, rc;

    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int v = atoi(optarg);
        if (v < 1)
            FAIL("bad argument %s", optarg);
        if (c == 'k')
            K = v;
        else if (c == 'r')
            ROUNDS = v;
        else if (c == 'b')
            BUDGET = v;
        else
            FAIL("unknown option");
    }
    if (BUDGET >= K)
        FAIL("the budget must be below the number of channels to bind");
    const int to = (me + 1) % nranks, from = (me + nranks - 1) % nranks;

    starpu_conf_init(&conf);
    conf.ncuda = 0;
    conf.nopencl = 0;
    conf.sched_policy_name = "eager";
    if (starpu_mpi_init_conf(&argc, &argv, 0, MPI_COMM_WORLD, &conf) != 0)
        FAIL("starpu_mpi_init_conf");
    if ((rc = dchan_starpu_init(MPI_COMM_WORLD, NULL, &ds)) != DCHAN_SUCCESS)
        FAIL("dchan_starpu_init: %s", dchan_strerror(rc));
    ctx = dchan_starpu_ctx(ds);

    /* Channels from the previous rank, and wires over StarPU-MPI. */
    dchan_wire_t *mine = calloc(K, sizeof *mine), *theirs = calloc(K, sizeof *theirs);
    double **rbuf = calloc(K, sizeof *rbuf), **sbuf = calloc(K, sizeof *sbuf);
    dchan_handle_t **sh = calloc(K, sizeof *sh);
    rr = calloc(K, sizeof *rr);
    if (!mine || !theirs || !rbuf || !sbuf || !sh || !rr)
        FAIL("out of memory");
    dchan_handle_attr_init(&hattr);
    hattr.credit = 1;
    for (int i = 0; i < K; i++) {
        if (dchan_alloc(ctx, M * sizeof(double), (void **)&rbuf[i]) != DCHAN_SUCCESS ||
            dchan_alloc(ctx, M * sizeof(double), (void **)&sbuf[i]) != DCHAN_SUCCESS)
            FAIL("dchan_alloc");
        rc = dchan_starpu_recv_create(ds, from, rbuf[i], M * sizeof(double), 0xfff4dc4a6e5e0bbbull,
                                      &hattr, TAG_ARRIVAL | i, K, ROUNDS, &rr[i]);
        if (rc == DCHAN_SUCCESS)
            rc = dchan_handle_export(dchan_starpu_recv_handle(rr[i]), &mine[i]);
        if (rc != DCHAN_SUCCESS)
            FAIL("dchan_starpu_recv_create: %s", dchan_strerror(rc));
    }
    if (dchan_starpu_wires_post(ds, from, mine, K, NULL, 0, 7) != DCHAN_SUCCESS ||
        dchan_starpu_wires_post(ds, to, NULL, 0, theirs, K, 7) != DCHAN_SUCCESS ||
        dchan_starpu_wires_wait(ds) != DCHAN_SUCCESS)
        FAIL("shipping wires over StarPU-MPI");
    for (int i = 0; i < K; i++)
        if ((rc = dchan_assoc_local(ctx, &theirs[i], sbuf[i], M * sizeof(double), &sh[i])))
            FAIL("dchan_assoc_local: %s", dchan_strerror(rc));

    if (dchan_starpu_hook_start(ds, 0) != DCHAN_ERR_INVALID_ARG)
        FAIL("a budget of 0 was accepted");
    if (dchan_starpu_progress(ds, 0) != DCHAN_ERR_INVALID_ARG)
        FAIL("dchan_starpu_progress with budget 0 was accepted");

    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < K; i++) {
            double *p;
            if ((rc = dchan_starpu_put_ptr(ds, sh[i], (void **)&p, 60000)) != DCHAN_SUCCESS)
                FAIL("dchan_starpu_put_ptr: %s", dchan_strerror(rc));
            for (int j = 0; j < M; j++)
                p[j] = value(me, round, i, j);
            if ((rc = dchan_put(sh[i])) != DCHAN_SUCCESS)
                FAIL("dchan_put: %s", dchan_strerror(rc));
        }
        if (round == 0) {
            /* Everything lands before anyone polls: the hook's first call
             * finds K arrivals due. */
            for (int i = 0; i < K; i++)
                while ((rc = dchan_put_test(sh[i])) == 0)
                    ;
            starpu_mpi_barrier(MPI_COMM_WORLD);
            if ((rc = dchan_starpu_hook_start(ds, BUDGET)) != DCHAN_SUCCESS)
                FAIL("dchan_starpu_hook_start: %s", dchan_strerror(rc));
            if (dchan_starpu_hook_start(ds, BUDGET) != DCHAN_ERR_STATE)
                FAIL("a second hook was registered");
        }
        for (int i = 0; i < K; i++) {
            struct starpu_task *t = starpu_task_create();
            struct targ *a = malloc(sizeof *a);
            starpu_tag_t dep = TAG_ARRIVAL | ((uint64_t)round * K + i);
            if (!a)
                FAIL("out of memory");
            a->ch = i;
            a->round = round;
            t->cl = &check_cl;
            t->cl_arg = a;
            t->cl_arg_size = sizeof *a;
            t->cl_arg_free = 1;
            t->use_tag = 1;
            t->tag_id = TAG_TASK | ((uint64_t)round * K + i);
            starpu_tag_declare_deps_array(t->tag_id, 1, &dep);
            if (starpu_task_submit(t) != 0)
                FAIL("starpu_task_submit");
        }
        starpu_task_wait_for_all();
    }

    struct dchan_starpu_stats st;
    dchan_starpu_hook_stop(ds);
    dchan_starpu_get_stats(ds, &st);
    uint64_t arrived = 0;
    for (int i = 0; i < K; i++)
        arrived += dchan_starpu_recv_arrived(rr[i]);
    for (int i = 0; i < K; i++)
        while ((rc = dchan_put_test(sh[i])) == 0)
            ;
    starpu_mpi_barrier(MPI_COMM_WORLD);
    for (int i = 0; i < K; i++) {
        dchan_handle_destroy(sh[i]);
        dchan_starpu_recv_destroy(rr[i]);
        dchan_free(ctx, rbuf[i]);
        dchan_free(ctx, sbuf[i]);
    }
    if ((rc = dchan_starpu_finalize(ds)) != DCHAN_SUCCESS)
        FAIL("dchan_starpu_finalize: %s", dchan_strerror(rc));
    starpu_mpi_shutdown();

    int ok = 1;
    const uint64_t total = (uint64_t)K * ROUNDS;
    printf("rank %d: hook calls %llu, callbacks in hook %llu, most in one call %llu (budget %d), "
           "calls that used the whole budget %llu, skipped (busy) %llu, tags notified %llu of "
           "%llu, tasks %d, bad data %d\n",
           me, (unsigned long long)st.hook_calls, (unsigned long long)st.hook_callbacks,
           (unsigned long long)st.hook_max, BUDGET, (unsigned long long)st.hook_full,
           (unsigned long long)st.hook_busy, (unsigned long long)st.notified,
           (unsigned long long)total, tasks_ran, bad_data);
    if (st.hook_max > (uint64_t)BUDGET || st.hook_max < 1 || st.hook_full < 1 ||
        st.notified != total || arrived != total || tasks_ran != (int)total || bad_data)
        ok = 0;
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (me == 0 && all)
        printf("BUDGET OK: %d ranks, %d channels, %d rounds, budget %d\n", nranks, K, ROUNDS,
               BUDGET);
    fflush(stdout);
    free(mine);
    free(theirs);
    free(rbuf);
    free(sbuf);
    free(sh);
    free(rr);
    MPI_Finalize();
    return all ? 0 : 1;
}
