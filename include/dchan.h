/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan: persistent, one-sided, unsynchronised communication channels.
 *
 * A receiver publishes a buffer once (dchan_create_handle), ships the
 * 128-byte wire form to the sender, and the sender writes the whole buffer
 * with one dchan_put per iteration. The receiver learns of the arrival from
 * dchan_progress, which runs a plain C callback. See dchan(7) and the man
 * page of each call for the full contract.
 */
#ifndef DCHAN_H
#define DCHAN_H

#include <stddef.h>
#include <stdint.h>

#include <dchan_version.h>

#if defined(DCHAN_BUILDING_LIBRARY) && defined(__GNUC__)
#define DCHAN_API __attribute__((visibility("default")))
#else
#define DCHAN_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes: 0 is success, failures are negative. */
enum {
    DCHAN_SUCCESS = 0,
    DCHAN_ERR_INVALID_ARG = -1, /* NULL, zero or out-of-range argument */
    DCHAN_ERR_NO_MEMORY = -2,   /* allocation or resource exhaustion */
    DCHAN_ERR_STATE = -3,       /* call not allowed in the handle's state */
    DCHAN_ERR_SIZE = -4,        /* sizes differ or violate the mode's rules */
    DCHAN_ERR_SENTINEL = -5,    /* put data ends with the oob pattern */
    DCHAN_ERR_HANDLE = -6,      /* wire form invalid or not for this job */
    DCHAN_ERR_PEER = -7,        /* peer unreachable or failed */
    DCHAN_ERR_PROVIDER = -8,    /* transport failure */
    DCHAN_ERR_UNSUPPORTED = -9, /* not offered by this provider or build */
    DCHAN_ERR_AGAIN = -10,      /* resources busy: progress and retry */
    DCHAN_ERR_TIMEOUT = -11,    /* a wait ran out of time */
    DCHAN_ERR_OVERRUN = -12     /* sender put again before the receiver re-armed */
};

/* Detection modes (dchan_attr_t.detect, DCHAN_DETECT). */
enum {
    DCHAN_DETECT_AUTO = 0,     /* the provider's fastest correct mode */
    DCHAN_DETECT_SENTINEL = 1, /* last 8 bytes of the buffer differ from oob */
    DCHAN_DETECT_FLAG = 2,     /* a library-owned sequence word per handle */
    DCHAN_DETECT_EVENT = 3     /* a provider completion per arrival */
};

/* Thread levels (dchan_attr_t.thread_level), with MPI's meanings. */
enum {
    DCHAN_THREAD_SINGLE = 0,
    DCHAN_THREAD_FUNNELED = 1,
    DCHAN_THREAD_SERIALIZED = 2,
    DCHAN_THREAD_MULTIPLE = 3
};

/* Bootstrap methods (dchan_attr_t.bootstrap, DCHAN_BOOTSTRAP). */
enum {
    DCHAN_BOOT_AUTO = 0,     /* MPI if initialised, else PMIx if launched, else singleton */
    DCHAN_BOOT_MPI = 1,      /* the program has initialised MPI */
    DCHAN_BOOT_PMIX = 2,     /* started by a PMIx launcher (mpirun, prterun, srun) */
    DCHAN_BOOT_EXTERNAL = 3, /* rank, size and allgather given in dchan_attr_t */
    DCHAN_BOOT_SINGLETON = 4 /* one process, rank 0 of 1 */
};

/* Log levels (dchan_attr_t.log_level, DCHAN_LOG). Logging goes to stderr. */
enum {
    DCHAN_LOG_NONE = 0,
    DCHAN_LOG_ERROR = 1,
    DCHAN_LOG_WARN = 2,
    DCHAN_LOG_INFO = 3,
    DCHAN_LOG_DEBUG = 4
};

typedef struct dchan_ctx dchan_ctx_t;       /* one per process (or per thread domain) */
typedef struct dchan_handle dchan_handle_t; /* one end of one channel */

/* Arrival callback: runs once per arrival, on the thread calling
 * dchan_progress, with the handle already off the polling queue. */
typedef void (*dchan_arrival_fn)(dchan_handle_t *h, void *arg);
/* Asynchronous error on a handle, reported from dchan_progress. */
typedef void (*dchan_error_fn)(dchan_handle_t *h, int rc, void *arg);
/* External bootstrap: gather len bytes from every rank into out (rank
 * order, nranks * len bytes). Collective; returns 0 on success. */
typedef int (*dchan_allgather_fn)(const void *in, void *out, size_t len, void *arg);

/*
 * Context attributes. Always start from dchan_attr_init(), which sets the
 * defaults, reads the DCHAN_* environment variables and records the size of
 * the structure the caller was compiled with, so fields can be added later
 * without breaking callers.
 */
typedef struct dchan_attr {
    size_t struct_size;     /* set by dchan_attr_init */
    const char *provider;   /* NULL: automatic; else a comma-separated list, first that works */
    int detect;             /* DCHAN_DETECT_* */
    int thread_level;       /* DCHAN_THREAD_* */
    int bootstrap;          /* DCHAN_BOOT_* */
    int log_level;          /* DCHAN_LOG_* */
    const void *mpi_comm;   /* DCHAN_BOOT_MPI: address of an MPI_Comm; NULL: MPI_COMM_WORLD */
    int mpi_fcomm;          /* ... or a Fortran communicator handle when >= 0 and mpi_comm is NULL */
    int ext_rank;           /* DCHAN_BOOT_EXTERNAL: this process's rank */
    int ext_size;           /* DCHAN_BOOT_EXTERNAL: number of ranks */
    dchan_allgather_fn ext_allgather; /* DCHAN_BOOT_EXTERNAL: collective allgather */
    void *ext_arg;          /* passed to ext_allgather */
    dchan_error_fn error_fn; /* NULL: errors are only returned by later calls */
    void *error_arg;        /* passed to error_fn */
    int config_error;       /* set by dchan_attr_init: nonzero when a DCHAN_* variable was malformed */
    int reserved_int;
    void *reserved[6];      /* zero */
} dchan_attr_t;

/* Defaults, then the DCHAN_* environment variables. */
DCHAN_API void dchan_attr_init(dchan_attr_t *attr);

/* Collective over the job: bootstrap, agree on a job key, open providers. */
DCHAN_API int dchan_init(const dchan_attr_t *attr, dchan_ctx_t **ctx);
/* Collective: complete or cancel outstanding operations, free everything. */
DCHAN_API int dchan_finalize(dchan_ctx_t *ctx);
/* This process's rank, or a negative DCHAN_ERR_* for a bad context. */
DCHAN_API int dchan_rank(const dchan_ctx_t *ctx);
/* Number of ranks, or a negative DCHAN_ERR_* for a bad context. */
DCHAN_API int dchan_nranks(const dchan_ctx_t *ctx);
/* Name of the network provider chosen ("mpi", "ofi", ...), NULL for a bad context. */
DCHAN_API const char *dchan_provider_name(const dchan_ctx_t *ctx);
/* Name of the provider serving one handle, NULL for a bad handle. */
DCHAN_API const char *dchan_handle_provider(const dchan_handle_t *h);
/* Detection mode in use on a handle (DCHAN_DETECT_*), or a negative DCHAN_ERR_*. */
DCHAN_API int dchan_handle_detect(const dchan_handle_t *h);
/* Error string for a return code; never NULL. */
DCHAN_API const char *dchan_strerror(int rc);
/* Version of the library in use, as DCHAN_VERSION (compare with the header's). */
DCHAN_API unsigned dchan_version(void);

#define DCHAN_WIRE_SIZE 128
/* Plain, endian-defined wire form of a receive handle; ship it by any means. */
typedef struct dchan_wire {
    unsigned char bytes[DCHAN_WIRE_SIZE];
} dchan_wire_t;

/* Receiver: publish [buf, buf+size) for puts from sender_rank. */
DCHAN_API int dchan_create_handle(dchan_ctx_t *ctx, int sender_rank, void *buf, size_t size,
                                  uint64_t oob, dchan_arrival_fn fn, void *arg,
                                  dchan_handle_t **h);
/*
 * Handle attributes (dchan_create_handle_attr). Always start from
 * dchan_handle_attr_init(), which gives dchan_create_handle's behaviour
 * and records the size of the structure the caller was compiled with.
 */
typedef struct dchan_handle_attr {
    size_t struct_size; /* set by dchan_handle_attr_init */
    int credit;         /* 0: the application keeps puts and re-arms in step
                         * (CkDirect's contract); 1: each re-arm returns a
                         * credit to the sender, whose put needs one */
    int depth;          /* slots, 1 ... DCHAN_MAX_DEPTH (> 1 implies credit) */
    int reserved_int[2];
    void *reserved[4];  /* zero */
} dchan_handle_attr_t;
#define DCHAN_MAX_DEPTH 64

/* Defaults: no credit, depth 1. */
DCHAN_API void dchan_handle_attr_init(dchan_handle_attr_t *hattr);
/* Receiver: as dchan_create_handle, with attributes. buf holds depth slots
 * of size bytes each (depth * size bytes). */
DCHAN_API int dchan_create_handle_attr(dchan_ctx_t *ctx, int sender_rank, void *buf, size_t size,
                                       uint64_t oob, dchan_arrival_fn fn, void *arg,
                                       const dchan_handle_attr_t *hattr, dchan_handle_t **h);
/* Sender, credited channel: puts allowed now (>= 0), or a negative DCHAN_ERR_*. */
DCHAN_API int dchan_credits(const dchan_handle_t *h);
/* Receiver: address of the oldest delivered slot not yet released (the one
 * the next dchan_ready releases); DCHAN_ERR_STATE when there is none. */
DCHAN_API int dchan_slot(dchan_handle_t *h, void **ptr);
/* Sender, credited channel: where to write the next message (the
 * receiver's slot itself where it is mapped here, else the send buffer);
 * the next dchan_put delivers it. DCHAN_ERR_AGAIN without credit. */
DCHAN_API int dchan_put_ptr(dchan_handle_t *h, void **ptr);

/* Receiver: write the wire form the sender passes to dchan_assoc_local. */
DCHAN_API int dchan_handle_export(const dchan_handle_t *h, dchan_wire_t *wire);
/* Receiver: re-arm and requeue (dchan_ready_mark + dchan_ready_pollq). */
DCHAN_API int dchan_ready(dchan_handle_t *h);
/* Receiver: re-arm detection; the buffer may be written from now on. */
DCHAN_API int dchan_ready_mark(dchan_handle_t *h);
/* Receiver: put a marked handle back on the polling queue. */
DCHAN_API int dchan_ready_pollq(dchan_handle_t *h);
/* Sender: bind the send buffer [buf, buf+size) to the channel in wire. */
DCHAN_API int dchan_assoc_local(dchan_ctx_t *ctx, const dchan_wire_t *wire, const void *buf,
                                size_t size, dchan_handle_t **h);
/* Sender: write the whole send buffer into the receive buffer (non-blocking). */
DCHAN_API int dchan_put(dchan_handle_t *h);
/* Sender: 1 if the last put completed locally (send buffer reusable), 0 if not, < 0 on error. */
DCHAN_API int dchan_put_test(dchan_handle_t *h);
/* Sender: run fn(h, arg) from dchan_progress once per put that completed
 * locally (its data left the send buffer), in put order; NULL removes it. */
DCHAN_API int dchan_set_completion(dchan_handle_t *h, dchan_arrival_fn fn, void *arg);

/* Get. Source: publish [buf, buf+size) for receiver_rank to read; export
 * its wire with dchan_handle_export; done_fn runs when a version was taken
 * (the buffer may be written again), and dchan_ready publishes the next. */
DCHAN_API int dchan_create_source(dchan_ctx_t *ctx, int receiver_rank, const void *buf,
                                  size_t size, dchan_arrival_fn done_fn, void *arg,
                                  dchan_handle_t **h);
/* Get. Receiver: bind [buf, buf+size) to the source in wire. */
DCHAN_API int dchan_assoc_remote(dchan_ctx_t *ctx, const dchan_wire_t *wire, void *buf, size_t size,
                                 dchan_arrival_fn arrival_fn, void *arg, dchan_handle_t **h);
/* Get. Receiver: read the source's current version (non-blocking);
 * arrival_fn runs when it is here. DCHAN_ERR_AGAIN until the source
 * published a version not taken yet, or while a get is in flight (until
 * its arrival_fn ran). */
DCHAN_API int dchan_get(dchan_handle_t *h);

/* One segment of a non-contiguous send side (dchan_assoc_local_iov). */
typedef struct dchan_iov {
    const void *base;
    size_t len; /* 0 is allowed, as in writev */
} dchan_iov_t;
/* Sender: bind n segments (gathered in order, not overlapping) whose total
 * is the receive size; the provider gathers them at each put. */
DCHAN_API int dchan_assoc_local_iov(dchan_ctx_t *ctx, const dchan_wire_t *wire,
                                    const dchan_iov_t *iov, int n, dchan_handle_t **h);
/* Sender: bind a subarray of a C-order array of ndims (1 ... 3) dimensions
 * of elem_size-byte elements, as MPI_Type_create_subarray describes it. */
DCHAN_API int dchan_assoc_local_subarray(dchan_ctx_t *ctx, const dchan_wire_t *wire,
                                         const void *base, int ndims, const size_t sizes[],
                                         const size_t subsizes[], const size_t starts[],
                                         size_t elem_size, dchan_handle_t **h);
/* Both: poll for arrivals and completions; >= 0 callbacks run, < 0 error. */
DCHAN_API int dchan_progress(dchan_ctx_t *ctx);
/* Both: dchan_progress running at most max (>= 1) callbacks and error
 * reports; those left over run at the next call. */
DCHAN_API int dchan_progress_n(dchan_ctx_t *ctx, int max);
/* Both: progress until a callback ran or timeout_ms passed (-1: no limit);
 * >= 1 callbacks run, DCHAN_ERR_TIMEOUT, or another error. Yields the CPU
 * when polling finds nothing for a while. */
DCHAN_API int dchan_wait(dchan_ctx_t *ctx, int timeout_ms);
/* Both: release a handle; outstanding operations are completed or cancelled. */
DCHAN_API int dchan_handle_destroy(dchan_handle_t *h);

/*
 * Wake-up descriptor (dchan_wakeup_fd(3), dchan_embed(7)): sleep in
 * poll/epoll/select instead of calling dchan_progress in a loop.
 *   for (;;) {
 *       while (dchan_progress_n(ctx, 64) > 0) ;     (or until idle)
 *       if (dchan_wakeup_arm(ctx) == DCHAN_ERR_AGAIN) continue;
 *       poll(&(struct pollfd){fd, POLLIN}, 1, -1);
 *   }
 */
/* A descriptor that becomes readable when progress has work, owned by the
 * context (never close it; dchan_finalize does). Asked again: the same
 * descriptor. DCHAN_ERR_INVALID_ARG: NULL fd, an invalid or finalised context. */
DCHAN_API int dchan_wakeup_fd(dchan_ctx_t *ctx, int *fd);
/* About to sleep on the descriptor: DCHAN_SUCCESS when it is safe (the next
 * arrival, returned credit or asynchronous error makes it readable),
 * DCHAN_ERR_AGAIN when progress has work first. The first progress call
 * afterwards ends the armed period. DCHAN_ERR_STATE before dchan_wakeup_fd
 * or inside a callback; DCHAN_ERR_INVALID_ARG: invalid or finalised context. */
DCHAN_API int dchan_wakeup_arm(dchan_ctx_t *ctx);

/* Memory for buffers: from the shared segment that peers on this host map
 * when the shm provider runs (a put into a receive buffer from here is a
 * plain copy by the sender, no system call), else from the heap. Aligned to
 * 64 bytes; valid until dchan_free or dchan_finalize. DCHAN_ERR_NO_MEMORY
 * when the segment (DCHAN_SHM_SEGMENT_SIZE) is full. */
DCHAN_API int dchan_alloc(dchan_ctx_t *ctx, size_t size, void **ptr);
/* Return memory from dchan_alloc (NULL: nothing to do). DCHAN_ERR_STATE
 * while a live handle uses it; DCHAN_ERR_INVALID_ARG for any other pointer. */
DCHAN_API int dchan_free(dchan_ctx_t *ctx, void *ptr);

/* Collective helpers over the context's bootstrap, for programs that have
 * no other means (a non-MPI program started by mpirun) to ship wires. */
DCHAN_API int dchan_allgather(dchan_ctx_t *ctx, const void *in, void *out, size_t len);
DCHAN_API int dchan_barrier(dchan_ctx_t *ctx);

/* Counters of one context, for tests, benchmarks and tuning. */
typedef struct dchan_stats {
    uint64_t puts;           /* dchan_put calls that started a transfer */
    uint64_t arrivals;       /* arrivals detected */
    uint64_t callbacks;      /* arrival callbacks run */
    uint64_t progress_calls; /* dchan_progress calls */
    uint64_t registrations;  /* memory registrations made by providers */
    uint64_t reg_cache_hits; /* registrations served from the cache */
    uint64_t errors;         /* asynchronous errors raised on handles */
    uint64_t reserved[9];
} dchan_stats_t;
DCHAN_API int dchan_get_stats(const dchan_ctx_t *ctx, dchan_stats_t *stats);

/* Counters of one handle. The caller sets struct_size (to
 * sizeof(dchan_handle_stats_t) of the header it was built with); the
 * library fills the fields that fit in it. */
typedef struct dchan_handle_stats {
    size_t struct_size;
    uint64_t puts;           /* sender: puts started */
    uint64_t bytes;          /* sender: bytes of those puts */
    uint64_t arrivals;       /* receiver: arrivals detected */
    uint64_t overruns;       /* receiver: puts that landed before the re-arm */
    uint64_t credit_stalls;  /* sender: puts refused for want of credit */
    uint64_t credit_wait_ns; /* sender: time from the first refusal to the put that went */
    uint64_t copied;         /* sender: bytes the library moved from the send buffer (a
                              * message written in place through dchan_put_ptr moves none) */
    uint64_t reserved[7];
} dchan_handle_stats_t;
DCHAN_API int dchan_handle_stats(const dchan_handle_t *h, dchan_handle_stats_t *stats);

#ifdef __cplusplus
}
#endif

#endif /* DCHAN_H */
