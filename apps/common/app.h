/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the demo solvers share: fatal errors that stop the whole job, aligned
 * buffers, the dchan error callback, waiting for a put's local completion,
 * and the options every app takes (--iters, --mode, --verify, --detect).
 */
#ifndef DCHAN_APP_H
#define DCHAN_APP_H

#include <stddef.h>

#include <dchan.h>

/* MODE_NONE: no communication at all, the compute floor (apps that offer it). */
enum { MODE_MSG = 0, MODE_DCHAN = 1, MODE_NONE = 2 };

/* Set by the app before anything can fail: its name and MPI rank. */
extern const char *app_name;
extern int app_rank;
/* The last asynchronous error app_on_error saw, 0 while none. */
extern volatile int app_async_error;

/* Fatal error after the ranks went their own ways: stop the whole job. */
void app_die(const char *msg) __attribute__((noreturn));
void app_die_dchan(const char *what, int rc) __attribute__((noreturn));
/* count doubles, 64-byte aligned (vectorisable rows, dgemm, and SENTINEL's
 * 8-byte alignment rule for every receive buffer carved from it). */
double *app_xalloc(size_t count);
/* count doubles for a channel buffer: from dchan_alloc when ctx is set (the
 * shared segment under shm: a put into it is one copy, no system call),
 * else from app_xalloc. Freed with app_buf_free on the same ctx. */
double *app_buf_alloc(dchan_ctx_t *ctx, size_t count);
void app_buf_free(dchan_ctx_t *ctx, double *p);
/* dchan error callback: says what broke and records it in app_async_error. */
void app_on_error(dchan_handle_t *h, int rc, void *arg);
/* Arrival callback counting into the int that arg points to. */
void app_count_arrival(dchan_handle_t *h, void *arg);
/* Waits until the last put from a send buffer no longer reads it. */
void app_wait_put_done(dchan_handle_t *sh);
/* A barrier of all ranks that keeps ctx's channels moving while it waits
 * (dchan_barrier); MPI_Barrier when ctx is NULL. A rank blocked in
 * MPI_Barrier makes no progress on its channels, and a neighbour already
 * past the barrier may need that progress for its puts to go (libfabric's
 * shm moves data only in the target's progress). */
void app_barrier(dchan_ctx_t *ctx);
const char *app_detect_name(int detect);
const char *app_mode_name(int mode);
/* "A,B,C": three positive ints into out; 0 on success, -1 otherwise. */
int app_parse_triple(const char *s, int out[3]);
/* A positive int (1 ... INT_MAX) and nothing after it into *out: 0, or -1. */
int app_parse_positive(const char *s, int *out);

/* The options every app takes. */
struct app_common {
    int iters;
    int mode;   /* MODE_MSG, MODE_DCHAN, or MODE_NONE where none_ok */
    int none_ok; /* set by an app that offers --mode none */
    int verify;
    int detect; /* -1: from DCHAN_DETECT */
};
/* getopt_long entries for them (values 'i', 'm', 'v', 'd'). */
#define APP_COMMON_LONGOPTS                                                                \
    {"iters", required_argument, NULL, 'i'}, {"mode", required_argument, NULL, 'm'},      \
        {"verify", no_argument, NULL, 'v'}, {                                              \
        "detect", required_argument, NULL, 'd'                                             \
    }
/* Handles one of those options: 1 when c was one (*bad set on a malformed
 * value), 0 when it is the app's own. */
int app_common_option(int c, const char *arg, struct app_common *o, const char **bad);
/* dchan_init with the error callback and --detect, or die. */
dchan_ctx_t *app_dchan_init(const struct app_common *o);

#endif
