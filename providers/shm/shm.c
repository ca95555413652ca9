/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * shm: channels between ranks of one host.
 *
 * Each rank owns one segment (a sealed memfd, mode 0600, named after the
 * job key) that every other rank of the host maps while the provider
 * connects; the owner then closes its descriptor, so nothing outside the
 * job can open the segment afterwards. A segment holds, after a header:
 *
 *   - the EVENT ring: arrival records that any local peer appends and the
 *     owner consumes, O(1) per arrival however many handles are armed;
 *   - the memory of dchan_alloc, including the core's FLAG sequence words.
 *
 * A put into a receive buffer in the peer's segment is a memcpy by the
 * sender into its own mapping, then one release store that makes it
 * visible: the SENTINEL tail, the FLAG sequence word or the ring record.
 * EVENT puts of up to 48 bytes travel inside the ring record instead, and
 * the receiver copies them into the buffer when it consumes the record.
 * A receive buffer anywhere else is written with Cross Memory Attach
 * (process_vm_writev), one system call per chunk, unless the body is
 * small (below); the call has returned,
 * so every byte landed, before the arrival is signalled. The signal is
 * then never a word written through that call: the kernel copies byte
 * by byte (rep movsb) and can be preempted in the middle, so another
 * process can see a word half written, for as long as the writer is off
 * its core; a SENTINEL tail seen so would run the callback on a wrong
 * last word. EVENT signals with its ring record as always; SENTINEL and
 * FLAG send the word in a ring record, and the receiver stores it itself
 * (struct shm_word). A body of up to 32 bytes rides in that record too,
 * as EVENT's of up to 48 do in theirs: no system call at all. A body of
 * up to SHM_STAGE_MAX rides in the whole records after it (staged,
 * shm_ring.h), and the receiver copies it in as it does an inline one:
 * two copies instead of a system call, measured in bench/README.md's
 * shm-heap rows. Only where those records would take more than a quarter
 * of the ring, or find no room, does such a body go by Cross Memory
 * Attach.
 *
 * Safety: peers validate a segment's size, owner, mode, seals and header
 * (job key, rank, pid) before trusting it; offsets read from wires are
 * checked against the data area, and the ring is addressed only through
 * the geometry validated at connect, so no wire can make a sender write
 * outside a peer's buffers or its ring.
 *
 * Every process of the host can write every segment, so nothing read from
 * one is trusted twice: a faulty (or hostile) peer may make channels fail,
 * never make this process crash or touch memory outside its buffers.
 *   - The header is read once, field by field into locals, at attach: the
 *     ring size is bounded (16 ... 2^24, a power of two) before the ring's
 *     end is computed, and ring and data area must lie in the mapping.
 *     Geometry, offsets and the own ring position live in private memory
 *     afterwards and are never read back from any header.
 *   - Ring records (seq, id, len) are loaded once each; a record is
 *     consumed only when seq is the position's, so a garbage or
 *     out-of-order seq just stops consumption there (a peer that never
 *     completes its record stalls EVENT arrivals, as a dead one does). An
 *     id is only a lookup key of the core, which accepts live EVENT
 *     handles of this provider and nothing else, or, for a record with a
 *     signalling word, live SENTINEL and FLAG handles and one of their
 *     slots, whose word the peer could write anyway; a record naming none
 *     is dropped and logged. An inline length above SHM_INLINE_BYTES or other
 *     than the handle's size is DCHAN_ERR_SIZE on that handle, and no byte
 *     of it is read; a second record before the re-arm is
 *     DCHAN_ERR_OVERRUN. Length 0 says the body is in the buffer, which a
 *     peer can write anyway (a direct store into a mapped slot, DESIGN §7,
 *     would leave a body of any size there): an arrival. A credit hint
 *     (SHM_LEN_HINT) is a copy of a value the peer could as well store in
 *     the credit word, and the core takes it only as it would take the
 *     word: its own channel's, at most depth ahead. A staged body
 *     (SHM_LEN_STAGED) is read only from the records its length spans,
 *     checked against the private geometry (at most a quarter of the
 *     ring, never across its end) before a byte of it is read; any other
 *     span is DCHAN_ERR_SIZE on the handle named, the record taken alone.
 *     One of id 0 is a filler and is passed over, as a claimed position
 *     with nothing in it is.
 *     The lines it spans are zeroed where a record's seq would be, the
 *     consumer's only write to the ring. At most about one ring of
 *     records is consumed per progress call, so a peer that keeps the
 *     ring full cannot hold progress.
 *   - Producers read the peer's ring tail and head, and index the ring
 *     with the private mask: garbage there makes the ring look full (puts
 *     end in DCHAN_ERR_AGAIN, then DCHAN_ERR_TIMEOUT), or overwrites the
 *     peer's own ring, never anything else; a claim that keeps failing is
 *     bounded too.
 * The FLAG words and SENTINEL tails in a segment are only compared by the
 * core, which turns any unexpected value into an arrival or an overrun.
 */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/membarrier.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "provider.h"
#include "shm_ring.h"
#include "wire.h"

extern const struct dchan_provider_ops dchan_shm_ops;

#define SHM_ALIGN 64u
/* Largest single process_vm_writev: well under the kernel's MAX_RW_COUNT. */
#define SHM_CMA_CHUNK ((size_t)1 << 30)
/* Above this, a full fence before the signal also orders any non-temporal
 * stores a memcpy made (glibc fences them itself; others may not). */
#define SHM_NT_FENCE_BYTES ((size_t)256 << 10)
/* Failed claims of a ring position before the put answers DCHAN_ERR_AGAIN
 * (the core then drives progress and retries, within the drain time). */
#define SHM_CLAIM_TRIES 1024u

/* Wire fields (DCHAN_WIRE_PROV_BYTES): where the sender writes. */
enum { SHM_LOC_SEGMENT = 1, SHM_LOC_CMA = 2 };
#define WF_BUF_LOC 0  /* u8 SHM_LOC_* */
#define WF_SEQ_LOC 1  /* u8: 0 (not FLAG) or SHM_LOC_* */
#define WF_BUF 8      /* u64: offset in the segment, or virtual address */
#define WF_SEQ 16     /* u64: same, for the FLAG sequence word */

/* What each rank publishes through the bootstrap. */
struct shm_addr {
    uint64_t job_key;
    uint64_t base; /* the segment's address in its owner */
    uint64_t size;
    uint64_t credit_off; /* the credit area: nranks * CREDIT_WORDS words */
    int32_t pid, fd;
    int32_t efd; /* the wake-up eventfd, which peers take with pidfd_getfd */
};

struct shm_peer {
    char *base; /* our mapping of its segment (ours for this rank), or NULL */
    size_t size;
    pid_t pid;
    struct shm_slot *ring;
    uint64_t ring_mask, data_off;
    uint64_t *credit; /* the peer's credit area in our mapping: our row is ours to write */
    uint64_t head_seen; /* the peer's ring_head as last read */
    int efd;            /* its wake-up eventfd (our copy), or -1 */
    bool fenceless;     /* puts to it make no fence: see wake_peer */
    /* Our latest credit write to it, for the next record there to carry
     * (struct shm_hint), while hint_owed. */
    uint64_t hint_value;
    uint32_t hint_index;
    bool hint_owed;
};

/* Free and used extents of the own segment's data area, sorted. */
struct shm_ext {
    uint64_t off, len;
    int used;
};

struct shm_state {
    int fd;
    int efd; /* wake-up: signalled by peers that find hdr->asleep set */
    char *base;
    size_t size;
    uint64_t data_off; /* private copy: peers can write the header */
    uint64_t *credit;  /* own credit area: row r is written by rank r */
    size_t credit_words;
    struct shm_hdr *hdr;
    struct shm_ring rx; /* the own ring, consumed by progress */
    struct shm_addr addr;
    struct shm_peer *peers; /* nranks entries */
    bool refused;           /* connect: a peer's segment could not be used */
    struct shm_ext *ext;
    size_t next, ext_cap;
};

/* Sender side of a handle. */
struct shm_sh {
    char *dst;          /* segment: destination in our mapping; else NULL */
    uint64_t dst_va;    /* CMA: destination in the peer */
    uint64_t *seq_dst;  /* FLAG: sequence word in our mapping, or NULL */
    uint64_t seq_va;    /* FLAG through CMA */
    struct shm_peer *peer;
    pid_t pid;
    int local;          /* the receiver is this process: plain copies */
};

static struct shm_state *st(struct dchan_prov *p)
{
    return p->state;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- probe (dchan_info) ----------------------------------------------------------- */

/* Can a process write into another that is not its descendant? A child
 * writes into us: what ptrace rules (Yama's ptrace_scope 1, for one) allow
 * between sibling ranks is what they allow there. */
static const char *cma_check(void)
{
    static volatile uint64_t target;
    target = 0;
    pid_t parent = getpid(), child = fork();
    if (child < 0)
        return "unknown (fork failed)";
    if (child == 0) {
        uint64_t v = 0x636d61;
        struct iovec l = {&v, sizeof v}, r = {(void *)&target, sizeof v};
        _exit(process_vm_writev(parent, &l, 1, &r, 1, 0) == (ssize_t)sizeof v ? 0 : 1);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && target == 0x636d61)
        return "permitted";
    return "not permitted (ptrace restrictions): shm refuses, the next provider serves the host";
}

static int shm_probe(struct dchan_probe *out)
{
    const struct dchan_params *pv = dchan_probe_params();
    unsigned long seg = pv ? pv->SHM_SEGMENT_SIZE : 0, slots = pv ? pv->SHM_RING_SLOTS : 0;
    snprintf(out->desc, sizeof out->desc,
             "memfd segment of %lu MiB per rank, EVENT ring of %lu records; Cross Memory "
             "Attach %s",
             seg >> 20, slots, pv && !pv->SHM_CMA ? "disabled by DCHAN_SHM_CMA=0" : cma_check());
    out->modes = dchan_shm_ops.modes;
    out->default_detect = DCHAN_DETECT_EVENT;
    return DCHAN_SUCCESS;
}

/* ---- open, connect, close ------------------------------------------------------------ */

/*
 * The wake-up race is Dekker's: a sender stores (an arrival, a credit),
 * then loads the receiver's "asleep"; a receiver going to sleep stores
 * "asleep", then loads what senders store. Each side needs a full fence
 * between its store and its load, and on the sender's side that fence is
 * on every put, where it stalls the sender until the put's stores left
 * its store buffer (the line of a credit word the peer reads, for one).
 * Where the kernel offers MEMBARRIER_CMD_GLOBAL_EXPEDITED, senders that
 * registered for it make no fence: the rank going to sleep, which is the
 * rare side, makes one for them with membarrier(2), a barrier on every
 * thread of every registered process (an interrupt to the cores running
 * one) that orders a sender's store before its load of "asleep" or lets
 * that load see the flag.
 *   shm_membarrier_avail: the command exists (query once per process);
 *   shm_fenceless: this process registered, its senders skip the fence.
 * The sleeper calls membarrier whenever the command exists, whatever its
 * own registration, as any peer may have registered.
 */
static int shm_membarrier_avail = -1; /* -1: not asked yet */
static int shm_fenceless;

static long membarrier(int cmd)
{
    return syscall(__NR_membarrier, cmd, 0, 0);
}

static void shm_membarrier_init(int want)
{
    if (__atomic_load_n(&shm_membarrier_avail, __ATOMIC_ACQUIRE) < 0) {
        long q = membarrier(MEMBARRIER_CMD_QUERY);
        int avail = q > 0 && (q & MEMBARRIER_CMD_GLOBAL_EXPEDITED) &&
                    (q & MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED);
        __atomic_store_n(&shm_membarrier_avail, avail, __ATOMIC_RELEASE);
    }
    /* Registration is for the process and for good: a later context that
     * asks for fences only keeps them for itself (see wake_peer). */
    if (want && shm_membarrier_avail && !__atomic_load_n(&shm_fenceless, __ATOMIC_ACQUIRE) &&
        membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) == 0)
        __atomic_store_n(&shm_fenceless, 1, __ATOMIC_RELEASE);
}

static int shm_open_(struct dchan_prov *p)
{
    dchan_ctx_t *ctx = p->ctx;
    const struct dchan_params *pv = dchan_ctx_params(ctx);
    uint64_t slots = pv->SHM_RING_SLOTS;
    char name[64];

    /* Why open fails goes in p->desc: the core logs it and quotes it. */
    if (!pv->SHM_CMA) {
        snprintf(p->desc, sizeof p->desc, "DCHAN_SHM_CMA=0: not used");
        p->declined = 1; /* as asked: no warning */
        return DCHAN_ERR_UNSUPPORTED;
    }
    if (slots < SHM_RING_MIN || slots > SHM_RING_MAX || (slots & (slots - 1))) {
        dchan_err(ctx, "shm", "DCHAN_SHM_RING_SLOTS=%lu: a power of two from 16 to 16777216",
                  (unsigned long)slots);
        return DCHAN_ERR_INVALID_ARG;
    }
    uint64_t ring_off = SHM_HDR_BYTES;
    uint64_t data_off = (ring_off + slots * sizeof(struct shm_slot) + 4095) & ~(uint64_t)4095;
    size_t size = ((size_t)pv->SHM_SEGMENT_SIZE + 4095) & ~(size_t)4095;
    if (size < data_off + 65536) {
        dchan_err(ctx, "shm", "DCHAN_SHM_SEGMENT_SIZE=%lu is too small for a ring of %lu "
                  "records (at least %lu)",
                  pv->SHM_SEGMENT_SIZE, (unsigned long)slots,
                  (unsigned long)(data_off + 65536));
        return DCHAN_ERR_INVALID_ARG;
    }

    struct shm_state *s = calloc(1, sizeof *s);
    if (!s)
        return DCHAN_ERR_NO_MEMORY;
    s->fd = -1;
    s->efd = -1;
    s->peers = calloc((size_t)dchan_ctx_nranks(ctx), sizeof *s->peers);
    s->ext = malloc(16 * sizeof *s->ext);
    if (!s->peers || !s->ext)
        goto nomem;
    s->ext_cap = 16;
    snprintf(name, sizeof name, "dchan-%016llx-%d", (unsigned long long)dchan_ctx_job_key(ctx),
             dchan_ctx_rank(ctx));
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->fd = s->efd < 0 ? -1 : memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (s->fd < 0 || fchmod(s->fd, 0600) != 0 || ftruncate(s->fd, (off_t)size) != 0 ||
        fcntl(s->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        snprintf(p->desc, sizeof p->desc, "cannot create a segment of %zu bytes: %s", size,
                 strerror(errno));
        goto fail;
    }
    s->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (s->base == MAP_FAILED) {
        s->base = NULL;
        snprintf(p->desc, sizeof p->desc, "cannot map a segment of %zu bytes: %s", size,
                 strerror(errno));
        goto fail;
    }
    s->size = size;
    s->data_off = data_off;
    s->hdr = (struct shm_hdr *)s->base;
    struct shm_slot *ring = (struct shm_slot *)(s->base + ring_off);
    for (uint64_t i = 0; i < slots; i++)
        ring[i].seq = 0; /* position i is complete when seq == i + 1 */
    s->rx = (struct shm_ring){.slots = ring, .mask = slots - 1, .head_pub = &s->hdr->ring_head};
    s->hdr->version = SHM_VERSION;
    s->hdr->job_key = dchan_ctx_job_key(ctx);
    s->hdr->rank = dchan_ctx_rank(ctx);
    s->hdr->pid = (int32_t)getpid();
    s->hdr->size = size;
    s->hdr->ring_off = ring_off;
    s->hdr->ring_slots = slots;
    s->hdr->data_off = data_off;
    __atomic_store_n(&s->hdr->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    /* The credit area opens the data area, where peers find it from what
     * this rank publishes; the segment is fresh, so it reads zero. */
    s->credit_words = pv->CREDIT_WORDS;
    uint64_t credit_bytes = ((uint64_t)dchan_ctx_nranks(ctx) * s->credit_words * 8 + SHM_ALIGN - 1) &
                            ~(uint64_t)(SHM_ALIGN - 1);
    if (credit_bytes >= size - data_off) {
        dchan_err(ctx, "shm", "DCHAN_SHM_SEGMENT_SIZE=%lu leaves no room for %lu credit words "
                  "per rank",
                  pv->SHM_SEGMENT_SIZE, pv->CREDIT_WORDS);
        errno = EINVAL;
        goto fail;
    }
    s->credit = (uint64_t *)(s->base + data_off);
    s->ext[0] = (struct shm_ext){data_off, credit_bytes, 1};
    s->ext[1] = (struct shm_ext){data_off + credit_bytes, size - data_off - credit_bytes, 0};
    s->next = 2;

    s->addr = (struct shm_addr){dchan_ctx_job_key(ctx), (uint64_t)(uintptr_t)s->base, size,
                                data_off, (int32_t)getpid(), s->fd, s->efd};
    shm_membarrier_init(pv->SHM_MEMBARRIER != 0);
    bool fenceless = pv->SHM_MEMBARRIER && __atomic_load_n(&shm_fenceless, __ATOMIC_ACQUIRE);
    s->peers[dchan_ctx_rank(ctx)] = (struct shm_peer){.base = s->base, .size = size,
                                                     .pid = getpid(), .ring = ring,
                                                     .ring_mask = slots - 1,
                                                     .data_off = data_off,
                                                     .credit = s->credit, .efd = s->efd,
                                                     .fenceless = fenceless};
    p->state = s;
    p->addr = &s->addr;
    p->addr_len = sizeof s->addr;
    p->default_detect = DCHAN_DETECT_EVENT;
    snprintf(p->desc, sizeof p->desc, "memfd segment %zu MiB, ring %lu, Cross Memory Attach",
             size >> 20, (unsigned long)slots);
    return DCHAN_SUCCESS;

nomem:
    errno = ENOMEM;
fail:
    if (s->base)
        munmap(s->base, size);
    if (s->fd >= 0)
        close(s->fd);
    if (s->efd >= 0)
        close(s->efd);
    free(s->peers);
    free(s->ext);
    free(s);
    return errno == ENOMEM ? DCHAN_ERR_NO_MEMORY : DCHAN_ERR_UNSUPPORTED;
}

/* A copy of descriptor fd of process pid (Linux 5.6), under the same ptrace
 * permission as Cross Memory Attach, which shm needs anyway; -1 on failure. */
static int take_fd(pid_t pid, int fd)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pfd < 0)
        return -1;
    int copy = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
    int e = errno;
    close(pfd);
    errno = e;
    return copy; /* the kernel sets O_CLOEXEC on it */
#else
    errno = ENOSYS;
    return -1;
#endif
}

/* Rank r's segment cannot be used: say why, at DCHAN_LOG=info and, the
 * first time, in p->desc, which the error of dchan_init quotes when no
 * provider remains. */
static void __attribute__((format(printf, 2, 3))) refused(struct dchan_prov *p, const char *fmt, ...)
{
    struct shm_state *s = st(p);
    char why[sizeof p->desc];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    dchan_info(p->ctx, "shm", "%s", why);
    if (!s->refused)
        snprintf(p->desc, sizeof p->desc, "%s", why);
    s->refused = true;
}

/* Map rank r's segment through its owner's descriptor, and check that it
 * is what r published: this job's, this user's, sealed, mode 0600. Its
 * size is r's DCHAN_SHM_SEGMENT_SIZE, which may differ from ours. */
static int attach(struct dchan_prov *p, int r, const struct shm_addr *a)
{
    dchan_ctx_t *ctx = p->ctx;
    struct shm_state *s = st(p);
    char path[64];
    struct stat sb;
    int fd, rc = DCHAN_ERR_UNSUPPORTED;

    uint64_t credit_bytes = (uint64_t)dchan_ctx_nranks(ctx) * s->credit_words * 8;
    if (a->job_key != dchan_ctx_job_key(ctx) || a->pid <= 0 || a->fd < 0 ||
        a->size < SHM_HDR_BYTES || a->credit_off % 8 || a->credit_off > a->size ||
        credit_bytes > a->size - a->credit_off) {
        refused(p, "rank %d published a segment that is not this job's", r);
        return DCHAN_ERR_HANDLE;
    }
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)a->pid, (int)a->fd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        refused(p, "cannot open rank %d's segment (%s): %s", r, path, strerror(errno));
        return DCHAN_ERR_UNSUPPORTED;
    }
    int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != a->size || sb.st_uid != geteuid() ||
        (sb.st_mode & 0777) != 0600 || seals < 0 || !(seals & F_SEAL_SHRINK)) {
        refused(p, "rank %d's segment is not a sealed 0600 segment of this user", r);
        close(fd);
        return DCHAN_ERR_HANDLE;
    }
    char *base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        refused(p, "cannot map rank %d's segment: %s", r, strerror(errno));
        return DCHAN_ERR_UNSUPPORTED;
    }
    /* Each field once, into a local: the owner or any other peer can write
     * the header, so what was checked must be what is used. The ring size is
     * bounded before it is multiplied, so that the ring provably lies
     * inside the mapping. */
    struct shm_hdr *h = (struct shm_hdr *)base;
    uint32_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    uint32_t version = __atomic_load_n(&h->version, __ATOMIC_RELAXED);
    uint64_t key = __atomic_load_n(&h->job_key, __ATOMIC_RELAXED);
    int32_t hrank = __atomic_load_n(&h->rank, __ATOMIC_RELAXED);
    int32_t hpid = __atomic_load_n(&h->pid, __ATOMIC_RELAXED);
    uint64_t hsize = __atomic_load_n(&h->size, __ATOMIC_RELAXED);
    uint64_t ring_off = __atomic_load_n(&h->ring_off, __ATOMIC_RELAXED);
    uint64_t slots = __atomic_load_n(&h->ring_slots, __ATOMIC_RELAXED);
    uint64_t data_off = __atomic_load_n(&h->data_off, __ATOMIC_RELAXED);
    if (magic != SHM_MAGIC || version != SHM_VERSION || key != a->job_key || hrank != r ||
        hpid != a->pid || hsize != a->size || ring_off != SHM_HDR_BYTES ||
        slots < SHM_RING_MIN || slots > SHM_RING_MAX || (slots & (slots - 1)) ||
        data_off < ring_off + slots * sizeof(struct shm_slot) || data_off >= a->size ||
        a->credit_off < data_off) {
        refused(p, "rank %d's segment header does not match this job", r);
        rc = DCHAN_ERR_HANDLE;
        goto unmap;
    }
    /* Mapped: the owner may close its descriptor as far as we are concerned. */
    __atomic_fetch_add(&h->attached, 1, __ATOMIC_RELEASE);
    /* Cross Memory Attach must work too (buffers outside the segment). */
    uint64_t v = dchan_ctx_job_key(ctx);
    struct iovec l = {&v, sizeof v},
                 rv = {(void *)(uintptr_t)(a->base + offsetof(struct shm_hdr, cma_probe)),
                       sizeof v};
    if (process_vm_writev(a->pid, &l, 1, &rv, 1, 0) != (ssize_t)sizeof v) {
        refused(p, "Cross Memory Attach to rank %d is not permitted (%s): ptrace restrictions or "
                "another user",
                r, strerror(errno));
        goto unmap;
    }
    s->peers[r] = (struct shm_peer){.base = base, .size = a->size, .pid = a->pid,
                                    .ring = (struct shm_slot *)(base + ring_off),
                                    .ring_mask = slots - 1, .data_off = data_off,
                                    .credit = (uint64_t *)(base + a->credit_off),
                                    .efd = take_fd(a->pid, a->efd),
                                    .fenceless = s->peers[dchan_ctx_rank(p->ctx)].fenceless};
    if (s->peers[r].efd < 0) {
        /* That rank cannot be woken by us: its dchan_wakeup_fd says so. */
        dchan_info(ctx, "shm", "cannot take rank %d's wake-up eventfd (pidfd_getfd): %s", r,
                   strerror(errno));
        __atomic_fetch_add(&h->nowake, 1, __ATOMIC_RELEASE);
    }
    return DCHAN_SUCCESS;
unmap:
    munmap(base, a->size);
    return rc;
}

static int shm_connect(struct dchan_prov *p, const void *addrs, size_t len)
{
    dchan_ctx_t *ctx = p->ctx;
    struct shm_state *s = st(p);
    int me = dchan_ctx_rank(ctx), n = dchan_ctx_nranks(ctx), nlocal = 0, rc = DCHAN_SUCCESS;

    if (len < sizeof(struct shm_addr))
        return DCHAN_ERR_PROVIDER;
    for (int r = 0; r < n; r++) {
        if (r == me || !dchan_ctx_same_host(ctx, r))
            continue;
        nlocal++;
        struct shm_addr a;
        memcpy(&a, (const char *)addrs + (size_t)r * len, sizeof a);
        /* Every rank attaches every peer even after a failure, so that no
         * owner waits for a peer that gave up early. */
        int arc = attach(p, r, &a);
        if (arc != DCHAN_SUCCESS && rc == DCHAN_SUCCESS)
            rc = arc;
    }
    /* A peer that could not even map us cannot count: bound the wait. */
    uint64_t deadline = now_ns() + dchan_ctx_params(ctx)->DRAIN_TIMEOUT_MS * 1000000ull;
    while (__atomic_load_n(&s->hdr->attached, __ATOMIC_ACQUIRE) < (uint64_t)nlocal) {
        if (now_ns() > deadline) {
            refused(p, "not every peer on this host mapped this rank's segment");
            if (rc == DCHAN_SUCCESS)
                rc = DCHAN_ERR_PEER;
            break;
        }
        sched_yield();
    }
    /* From here on nothing outside the job can open the segment. */
    close(s->fd);
    s->fd = -1;
    if (rc == DCHAN_SUCCESS)
        snprintf(p->desc, sizeof p->desc,
                 "memfd segment %zu MiB, ring %lu records, %d peer%s on this host, Cross Memory "
                 "Attach, %s",
                 s->size >> 20, (unsigned long)(s->rx.mask + 1), nlocal, nlocal == 1 ? "" : "s",
                 s->peers[me].fenceless ? "puts without fences (membarrier)" : "fenced puts");
    return rc;
}

static void shm_close(struct dchan_prov *p)
{
    struct shm_state *s = st(p);
    int me = dchan_ctx_rank(p->ctx), n = dchan_ctx_nranks(p->ctx);
    if (!s)
        return;
    for (int r = 0; r < n; r++)
        if (r != me && s->peers[r].base) {
            munmap(s->peers[r].base, s->peers[r].size);
            if (s->peers[r].efd >= 0)
                close(s->peers[r].efd);
        }
    if (s->fd >= 0)
        close(s->fd);
    if (s->efd >= 0)
        close(s->efd);
    munmap(s->base, s->size);
    free(s->peers);
    free(s->ext);
    free(s);
    p->state = NULL;
}

/* ---- the segment's allocator ---------------------------------------------------------- */

/* Metadata lives in private memory: peers can write the segment, never
 * its allocator's bookkeeping. */
static int ext_reserve(struct shm_state *s, size_t more)
{
    if (s->next + more <= s->ext_cap)
        return 0;
    struct shm_ext *n = realloc(s->ext, 2 * s->ext_cap * sizeof *n);
    if (!n)
        return -1;
    s->ext = n;
    s->ext_cap *= 2;
    return 0;
}

/* Room was reserved with ext_reserve. */
static void ext_insert(struct shm_state *s, size_t i, struct shm_ext e)
{
    memmove(&s->ext[i + 1], &s->ext[i], (s->next - i) * sizeof *s->ext);
    s->ext[i] = e;
    s->next++;
}

static void ext_remove(struct shm_state *s, size_t i)
{
    memmove(&s->ext[i], &s->ext[i + 1], (s->next - i - 1) * sizeof *s->ext);
    s->next--;
}

static int shm_mem_alloc(struct dchan_prov *p, size_t size, size_t align, void **ptr)
{
    struct shm_state *s = st(p);
    if (align < SHM_ALIGN)
        align = SHM_ALIGN;
    uint64_t len = ((uint64_t)size + SHM_ALIGN - 1) & ~(uint64_t)(SHM_ALIGN - 1);
    for (size_t i = 0; i < s->next; i++) {
        struct shm_ext *e = &s->ext[i];
        if (e->used)
            continue;
        uint64_t start = (e->off + align - 1) & ~(uint64_t)(align - 1);
        if (start + len > e->off + e->len)
            continue;
        /* Split into [gap][block][rest]; a gap is always a multiple of 64. */
        uint64_t gap = start - e->off, rest = e->off + e->len - start - len;
        if (ext_reserve(s, 2) != 0)
            return DCHAN_ERR_NO_MEMORY;
        e = &s->ext[i];
        size_t at = i;
        if (gap) {
            e->len = gap;
            ext_insert(s, ++at, (struct shm_ext){start, len, 1});
        } else {
            *e = (struct shm_ext){start, len, 1};
        }
        if (rest)
            ext_insert(s, at + 1, (struct shm_ext){start + len, rest, 0});
        *ptr = s->base + start;
        return DCHAN_SUCCESS;
    }
    return DCHAN_ERR_NO_MEMORY;
}

static void shm_mem_free(struct dchan_prov *p, void *ptr)
{
    struct shm_state *s = st(p);
    uint64_t off = (uint64_t)((char *)ptr - s->base);
    size_t lo = 0, hi = s->next;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->ext[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == s->next || s->ext[lo].off != off || !s->ext[lo].used)
        return; /* the core only passes what mem_alloc returned */
    struct shm_ext *e = &s->ext[lo];
    /* Give large blocks' pages back to the system; mappings refault zeros. */
    uint64_t a = (e->off + 4095) & ~(uint64_t)4095, b = (e->off + e->len) & ~(uint64_t)4095;
    if (b > a && b - a >= ((uint64_t)1 << 20))
        madvise(s->base + a, b - a, MADV_REMOVE);
    e->used = 0;
    if (lo + 1 < s->next && !s->ext[lo + 1].used) {
        e->len += s->ext[lo + 1].len;
        ext_remove(s, lo + 1);
    }
    if (lo > 0 && !s->ext[lo - 1].used) {
        s->ext[lo - 1].len += e->len;
        ext_remove(s, lo);
    }
}

/* ---- receiver ------------------------------------------------------------------------- */

/* Where peers write [ptr, ptr + len): an offset in the own segment's data
 * area, or (Cross Memory Attach) the virtual address. */
static int locate(const struct shm_state *s, const void *ptr, size_t len, uint64_t *where)
{
    uintptr_t a = (uintptr_t)ptr, lo = (uintptr_t)s->base + s->data_off,
              hi = (uintptr_t)s->base + s->size;
    if (a >= lo && a < hi && len <= hi - a) {
        *where = a - (uintptr_t)s->base;
        return SHM_LOC_SEGMENT;
    }
    *where = a;
    return SHM_LOC_CMA;
}

static int shm_recv_open(dchan_handle_t *h, unsigned char *wf)
{
    struct shm_state *s = st(dchan_h_prov(h));
    uint64_t where;

    wf[WF_BUF_LOC] = (unsigned char)locate(s, dchan_h_buf(h), dchan_h_span(h), &where);
    dchan_put_le64(wf + WF_BUF, where);
    if (dchan_h_detect(h) == DCHAN_DETECT_FLAG) {
        wf[WF_SEQ_LOC] = (unsigned char)locate(s, dchan_h_seq_word(h), 8, &where);
        dchan_put_le64(wf + WF_SEQ, where);
    }
    return DCHAN_SUCCESS;
}

static void shm_recv_close(dchan_handle_t *h)
{
}

/* The record at the head names no live handle of this provider that takes
 * its kind (an EVENT arrival, a signalling word): a late one for a handle
 * destroyed with a put in flight, or a faulty peer.
 * Counted, and logged at the 1st, 2nd, 4th, 8th ... so that a flood of
 * them cannot flood stderr. Its fields are read again for the log line
 * only: whatever they hold now is just printed. */
static void __attribute__((noinline, cold)) ring_drop(struct dchan_prov *p, struct shm_ring *r)
{
    const struct shm_slot *sl = &r->slots[r->head & r->mask];
    uint64_t n = ++r->dropped;
    if ((n & (n - 1)) == 0)
        dchan_warn(p->ctx, "shm", "ring record for handle id %#x (len %#x) names no live handle "
                   "that takes it: dropped (%llu so far)",
                   __atomic_load_n(&sl->id, __ATOMIC_RELAXED),
                   __atomic_load_n(&sl->len, __ATOMIC_RELAXED), (unsigned long long)n);
}

/* Is the record at the head complete? Its seq is the position's. The
 * acquire orders the loads of the record after it. */
static inline bool ring_ready(const struct shm_ring *r)
{
    return __atomic_load_n(&r->slots[r->head & r->mask].seq, __ATOMIC_ACQUIRE) == r->head + 1;
}

/* One complete record, whose fields were loaded once each (id, len
 * without SHM_LEN_HINT): any process of the host can write the ring, so
 * only these locals are checked and used (see the top of this file).
 * len 0: the body is in the buffer already. 1 ... SHM_INLINE_BYTES: it
 * rides in the record, and the core copies it only when that is the
 * handle's size. Any other length is passed on as one no handle has
 * (SIZE_MAX): the core raises DCHAN_ERR_SIZE on the handle named, and
 * reads no data. id 0 is a claimed position whose put failed, always
 * with len 0. */
static inline __attribute__((always_inline)) void record_take(struct dchan_prov *p,
                                                              struct shm_ring *r,
                                                              const struct shm_slot *sl,
                                                              uint32_t id, uint32_t len)
{
    if (id) {
        if (__builtin_expect(!dchan_core_arrival_id(p, id, 0, -1, len ? sl->data : NULL,
                                                    len <= SHM_INLINE_BYTES ? len : SIZE_MAX),
                             0))
            ring_drop(p, r);
    } else if (len) {
        ring_drop(p, r);
    }
}

/* A staged record (SHM_LEN_STAGED, shm_ring.h) at the head: the records
 * it takes, its own included, or 0 when its length or span is one no
 * producer of ours makes (no body, beyond SHM_STAGE_MAX, more than a
 * quarter of the ring, or across its end). */
static inline uint64_t staged_span(const struct shm_ring *r, uint64_t at, uint32_t n)
{
    uint64_t k = shm_staged_records(at, n);
    if (n == 0 || n > SHM_STAGE_MAX || k > (r->mask + 1) / 4 ||
        (r->head & r->mask) + k > r->mask + 1)
        return 0;
    return k;
}

/* A record with a credit hint (the hint is a copy of a credit value,
 * which the core checks as it checks the word), one that carries a
 * signalling word (stored by the core, for a live SENTINEL or FLAG handle
 * of this provider and one of its slots only), or a staged body. Out of
 * line, so that ring_drain keeps no more registers across its calls than
 * a record without either needs. Returns the records it took: more than
 * one for a staged body, whose lines it zeroes (shm_ring.h). A staged
 * record whose span is malformed is taken alone, with a length no handle
 * has (DCHAN_ERR_SIZE on the one named, nothing read); one with other
 * flags as well is no staged record (as a word record must be exactly
 * that). */
static uint64_t __attribute__((noinline)) record_take_rare(struct dchan_prov *p,
                                                           struct shm_ring *r,
                                                           const struct shm_slot *sl, uint32_t id,
                                                           uint32_t len)
{
    uint64_t k = 1;
    if ((len & ~(SHM_LEN_WORD | SHM_STAGED_LEN_MASK)) == SHM_LEN_STAGED) {
        bool word = len & SHM_LEN_WORD;
        uint32_t n = len & SHM_STAGED_LEN_MASK;
        k = staged_span(r, word ? SHM_WORD_BODY_AT : 0, n);
        size_t body = k ? n : SIZE_MAX;
        const unsigned char *data = word ? sl->data + SHM_WORD_BODY_AT : sl->data;
        bool taken;
        if (word) {
            const struct shm_word *w = (const struct shm_word *)sl->data;
            taken = id && dchan_core_signal_id(p, id, __atomic_load_n(&w->slot, __ATOMIC_RELAXED),
                                               __atomic_load_n(&w->value, __ATOMIC_RELAXED),
                                               data, body);
        } else {
            taken = id && dchan_core_arrival_id(p, id, 0, -1, data, body);
        }
        /* Id 0 over a span a producer makes: the filler before a staged
         * body that would have run across the ring's end. */
        if (!taken && (id || !k))
            ring_drop(p, r);
        if (k == 0)
            return 1;
        for (uint64_t j = 1; j < k; j++)
            __atomic_store_n(&r->slots[(r->head + j) & r->mask].seq, 0, __ATOMIC_RELAXED);
        return k;
    }
    if ((len & ~SHM_WORD_LEN_MASK) == SHM_LEN_WORD) {
        /* n past what a record holds is a length no handle has: the core
         * raises DCHAN_ERR_SIZE on the one named and reads nothing. */
        const struct shm_word *w = (const struct shm_word *)sl->data;
        size_t n = len & SHM_WORD_LEN_MASK;
        if (!id || !dchan_core_signal_id(p, id, __atomic_load_n(&w->slot, __ATOMIC_RELAXED),
                                         __atomic_load_n(&w->value, __ATOMIC_RELAXED),
                                         n ? sl->data + SHM_WORD_BODY_AT : NULL,
                                         n <= SHM_WORD_INLINE ? n : SIZE_MAX))
            ring_drop(p, r);
        return k;
    }
    len &= ~SHM_LEN_HINT;
    if (id && len <= SHM_HINT_AT) {
        const struct shm_hint *hn = (const struct shm_hint *)(sl->data + SHM_HINT_AT);
        if (__builtin_expect(!dchan_core_arrival_id_hint(
                                 p, id, len ? sl->data : NULL, len,
                                 __atomic_load_n(&hn->index, __ATOMIC_RELAXED),
                                 __atomic_load_n(&hn->value, __ATOMIC_RELAXED)),
                             0))
            ring_drop(p, r);
        return k;
    }
    record_take(p, r, sl, id, len);
    return k;
}

/* Consume the own ring from a complete record at the head on; position
 * and geometry are the private ones. */
static int ring_drain(struct dchan_prov *p, struct shm_ring *r)
{
    uint64_t n = 0;
    do {
        const struct shm_slot *sl = &r->slots[r->head & r->mask];
        uint32_t id = __atomic_load_n(&sl->id, __ATOMIC_RELAXED),
                 len = __atomic_load_n(&sl->len, __ATOMIC_RELAXED);
        uint64_t k = 1;
        if (__builtin_expect(len & (SHM_LEN_HINT | SHM_LEN_WORD | SHM_LEN_STAGED), 0))
            k = record_take_rare(p, r, sl, id, len);
        else
            record_take(p, r, sl, id, len);
        /* Producers reuse the slot once they see the head past it (the
         * release also orders the zeroed lines of a staged body). */
        r->head += k;
        __atomic_store_n(r->head_pub, r->head, __ATOMIC_RELEASE);
        n += k;
        /* One ring's worth at most: a producer that keeps the ring full
         * cannot hold this call, and other providers and callbacks get
         * their turn. */
    } while (n <= r->mask && ring_ready(r));
    return (int)n;
}

int dchan_shm_ring_consume(struct dchan_prov *p, struct shm_ring *r)
{
    return ring_ready(r) ? ring_drain(p, r) : 0;
}

/* On every dchan_progress: an empty ring costs one acquire load. */
static int shm_progress(struct dchan_prov *p)
{
    struct shm_ring *r = &st(p)->rx;
    return ring_ready(r) ? ring_drain(p, r) : 0;
}

/* ---- sender ------------------------------------------------------------------------------ */

/* Import a wire's fields for h: the peer's buffer of size bytes (at an
 * address that is a multiple of align), and its words of nwords * 8 bytes
 * (none: the wire must name none). Everything a peer wrote is checked
 * against the geometry validated at attach. */
static int import_wire(dchan_handle_t *h, const unsigned char *wf, uint64_t size, uint64_t align,
                       uint64_t nwords)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct shm_sh *sh = DCHAN_PROV_PRIV(h, struct shm_sh);
    int peer = dchan_h_peer(h);
    struct shm_peer *pr = &st(p)->peers[peer];
    uint64_t buf = dchan_get_le64(wf + WF_BUF), word = dchan_get_le64(wf + WF_SEQ);

    if (!pr->base)
        return DCHAN_ERR_HANDLE; /* not a peer of this host */
    for (int i = WF_SEQ + 8; i < DCHAN_WIRE_PROV_BYTES; i++)
        if (wf[i])
            return DCHAN_ERR_HANDLE;
    for (int i = 2; i < WF_BUF; i++)
        if (wf[i])
            return DCHAN_ERR_HANDLE;
    sh->peer = pr;
    sh->pid = pr->pid;
    sh->local = peer == dchan_ctx_rank(p->ctx);
    if (buf % align)
        return DCHAN_ERR_HANDLE;
    if (wf[WF_BUF_LOC] == SHM_LOC_SEGMENT) {
        if (buf < pr->data_off || buf > pr->size || size > pr->size - buf)
            return DCHAN_ERR_HANDLE;
        sh->dst = pr->base + buf;
    } else if (wf[WF_BUF_LOC] == SHM_LOC_CMA && buf != 0 && buf + size > buf) {
        sh->dst_va = buf;
    } else {
        return DCHAN_ERR_HANDLE;
    }
    if (nwords == 0)
        return wf[WF_SEQ_LOC] != 0 || word != 0 ? DCHAN_ERR_HANDLE : DCHAN_SUCCESS;
    if (word % 8)
        return DCHAN_ERR_HANDLE;
    if (wf[WF_SEQ_LOC] == SHM_LOC_SEGMENT) {
        if (word < pr->data_off || word > pr->size - nwords * 8)
            return DCHAN_ERR_HANDLE;
        sh->seq_dst = (uint64_t *)(pr->base + word);
    } else if (wf[WF_SEQ_LOC] == SHM_LOC_CMA && word != 0) {
        sh->seq_va = word;
    } else {
        return DCHAN_ERR_HANDLE;
    }
    return DCHAN_SUCCESS;
}

/* SENTINEL's tail is stored as one word: an aligned buffer; FLAG has its
 * sequence word. */
static int shm_send_open(dchan_handle_t *h, const unsigned char *wf)
{
    int detect = dchan_h_detect(h);
    return import_wire(h, wf, dchan_h_span(h), detect == DCHAN_DETECT_SENTINEL ? 8 : 1,
                       detect == DCHAN_DETECT_FLAG);
}

static int errno_code(int e)
{
    switch (e) {
    case ESRCH:
        return DCHAN_ERR_PEER; /* the receiver's process is gone */
    case EFAULT:
        return DCHAN_ERR_HANDLE; /* its buffer is no longer mapped there */
    case ENOMEM:
        return DCHAN_ERR_NO_MEMORY;
    default:
        return DCHAN_ERR_PROVIDER;
    }
}

/* Write len bytes at the peer's virtual address va. */
static int cma_write(const struct shm_sh *sh, const void *src, uint64_t va, size_t len)
{
    if (sh->local) {
        memcpy((void *)(uintptr_t)va, src, len);
        return DCHAN_SUCCESS;
    }
    while (len) {
        size_t n = len < SHM_CMA_CHUNK ? len : SHM_CMA_CHUNK;
        struct iovec l = {(void *)src, n}, r = {(void *)(uintptr_t)va, n};
        ssize_t w = process_vm_writev(sh->pid, &l, 1, &r, 1, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return errno_code(w < 0 ? errno : EFAULT);
        src = (const char *)src + w;
        va += (uint64_t)w;
        len -= (size_t)w;
    }
    return DCHAN_SUCCESS;
}

/* A copy into a mapped slot. Up to a line in words: a call to memcpy
 * would cost more than such a copy. */
static inline void copy_mapped(char *dst, const char *src, size_t len)
{
    if (len <= 64) {
        for (; len >= 8; len -= 8, dst += 8, src += 8) {
            uint64_t w;
            memcpy(&w, src, 8);
            memcpy(dst, &w, 8);
        }
        while (len--)
            *dst++ = *src++;
        return;
    }
    memcpy(dst, src, len);
    if (len >= SHM_NT_FENCE_BYTES)
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* The body into the slot at off; nothing when it was written in place
 * (src NULL: dchan_put_ptr gave the mapped slot). */
static int write_body(const struct shm_sh *sh, size_t off, const void *src, size_t len)
{
    if (len == 0 || !src)
        return DCHAN_SUCCESS;
    if (!sh->dst)
        return cma_write(sh, src, sh->dst_va + off, len);
    copy_mapped(sh->dst + off, src, len);
    return DCHAN_SUCCESS;
}

/* Bytes [from, to) of a gathered message (d->iov) into the slot: a
 * gathering copy where the slot is mapped here, else process_vm_writev
 * with the segments as the local iovec list, SHM_IOV_BATCH at a time. */
#define SHM_IOV_BATCH 256
static int write_gather(const struct shm_sh *sh, const struct dchan_put_desc *d, size_t from,
                        size_t to)
{
    if (from >= to)
        return DCHAN_SUCCESS;
    if (sh->dst || sh->local) {
        char *dst = sh->dst ? sh->dst : (char *)(uintptr_t)sh->dst_va;
        dchan_gather_copy(d, from, to, dst + d->offset + from);
        if (to - from >= SHM_NT_FENCE_BYTES)
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
        return DCHAN_SUCCESS;
    }
    dchan_iov_t seg[SHM_IOV_BATCH];
    struct iovec l[SHM_IOV_BATCH];
    while (from < to) {
        size_t next = from, k = dchan_gather_slice(d, &next, to, seg, SHM_IOV_BATCH);
        for (size_t i = 0; i < k; i++)
            l[i] = (struct iovec){(void *)seg[i].base, seg[i].len};
        struct iovec r = {(void *)(uintptr_t)(sh->dst_va + d->offset + from), next - from};
        ssize_t w = process_vm_writev(sh->pid, l, k, &r, 1, 0);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return errno_code(w < 0 ? errno : EFAULT);
        from += (size_t)w; /* a short write goes on from where it stopped */
    }
    return DCHAN_SUCCESS;
}

/* Claim the next k positions of the receiver's ring (for k > 1, in one
 * piece: see below); DCHAN_ERR_AGAIN when it is full (the receiver has
 * not polled for a whole ring of arrivals). The
 * claim comes before the body is written, so that its locked instruction
 * does not wait for the body's stores to leave the store buffer. Tail and
 * head are the peer's to write: whatever they hold, the slot is addressed
 * through the mask validated at attach, so garbage there can make the ring
 * look full, never make this write outside it; and a tail that keeps
 * moving under the claim ends in DCHAN_ERR_AGAIN, which the core bounds by
 * the drain time, instead of spinning here. */
static void ring_publish(struct shm_slot *sl, uint64_t pos, uint32_t id, uint32_t len);

static int ring_claim_n(struct shm_peer *pr, uint64_t k, struct shm_slot **slot, uint64_t *pos)
{
    struct shm_hdr *hdr = (struct shm_hdr *)pr->base;
    uint64_t p = __atomic_load_n(&hdr->ring_tail, __ATOMIC_RELAXED), pad;
    for (unsigned tries = 0;; tries++) {
        /* A staged body's records lie in one piece (shm_ring.h): where
         * they would run across the ring's end, the positions up to it
         * are claimed too, for a filler record. (Falling back to Cross
         * Memory Attach there instead cost every put of a lap whose
         * start passed the end minus k: 16 in 256 at 17 records.) */
        pad = k > 1 && (p & pr->ring_mask) + k > pr->ring_mask + 1
                  ? pr->ring_mask + 1 - (p & pr->ring_mask)
                  : 0;
        uint64_t last = p + pad + k - 1;
        if (last - pr->head_seen > pr->ring_mask) {
            pr->head_seen = __atomic_load_n(&hdr->ring_head, __ATOMIC_ACQUIRE);
            if (last - pr->head_seen > pr->ring_mask)
                return DCHAN_ERR_AGAIN;
        }
        if (__atomic_compare_exchange_n(&hdr->ring_tail, &p, last + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
        if (tries == SHM_CLAIM_TRIES)
            return DCHAN_ERR_AGAIN;
    }
    if (pad) {
        /* A staged record of no handle over the pad positions (fewer than
         * k, so a span the consumer accepts), which it passes over. */
        ring_publish(&pr->ring[p & pr->ring_mask], p, 0,
                     SHM_LEN_STAGED | (uint32_t)(pad * 64 - SHM_SLOT_DATA_AT));
        p += pad;
    }
    *slot = &pr->ring[p & pr->ring_mask];
    *pos = p;
    return DCHAN_SUCCESS;
}

static inline int ring_claim(struct shm_peer *pr, struct shm_slot **slot, uint64_t *pos)
{
    return ring_claim_n(pr, 1, slot, pos);
}

/* A body of n bytes at offset at of a record's data, for a receive buffer
 * that is neither mapped here nor in this process, rides in the records
 * after it (SHM_LEN_STAGED) when it is small enough: claim them. AGAIN
 * (nothing claimed) where the caller writes the body by Cross Memory
 * Attach instead: too large, a ring too small, or a ring without room
 * for them (and, at its end, the filler before them). */
static int stage_claim(const struct shm_sh *sh, const struct dchan_put_desc *d, uint64_t at,
                       size_t n, struct shm_slot **slot, uint64_t *pos)
{
    if (sh->dst || sh->local || (!d->src && !d->iov) || n > SHM_STAGE_MAX)
        return DCHAN_ERR_AGAIN;
    uint64_t k = shm_staged_records(at, n);
    if (k > (sh->peer->ring_mask + 1) / 4)
        return DCHAN_ERR_AGAIN;
    return ring_claim_n(sh->peer, k, slot, pos);
}

/* The first n bytes of the message into a record's data (inline), and on
 * over the records claimed after it (staged). */
static void record_body(const struct dchan_put_desc *d, unsigned char *at, size_t n)
{
    if (d->iov)
        dchan_gather_copy(d, 0, n, at);
    else
        copy_mapped((char *)at, d->src, n);
}

/* A record of len <= SHM_HINT_AT that names a handle takes along the
 * credit write owed to its consumer, if any: the len to publish. */
static inline uint32_t hint_attach(struct shm_peer *pr, struct shm_slot *sl, uint32_t len)
{
    if (!pr->hint_owed)
        return len;
    struct shm_hint *hn = (struct shm_hint *)(sl->data + SHM_HINT_AT);
    hn->value = pr->hint_value;
    hn->index = pr->hint_index;
    pr->hint_owed = false;
    return len | SHM_LEN_HINT;
}

/* Release: the body (or the inline data) and the id are visible before the
 * record is. A claimed position is always published, with id 0 when the
 * put failed, or the consumer would wait on it forever. */
static void ring_publish(struct shm_slot *sl, uint64_t pos, uint32_t id, uint32_t len)
{
    sl->id = id;
    sl->len = len;
    __atomic_store_n(&sl->seq, pos + 1, __ATOMIC_RELEASE);
}

/* ---- wake-up ---------------------------------------------------------------------------- */

/* The receiver declared itself asleep: one signal per sleep (whoever takes
 * the flag writes). */
static void __attribute__((noinline, cold)) wake_signal(struct shm_peer *pr)
{
    struct shm_hdr *hdr = (struct shm_hdr *)pr->base;
    uint64_t one = 1;
    if (__atomic_exchange_n(&hdr->asleep, 0, __ATOMIC_ACQ_REL) && pr->efd >= 0 &&
        write(pr->efd, &one, sizeof one) < 0) {
        /* EAGAIN: the counter is full, so readable anyway. */
    }
}

/* After the store that signals an arrival or a credit: an awake receiver
 * costs a load of a line it does not write, no system call, and no fence
 * where membarrier serves (above). */
static inline void wake_peer(struct shm_peer *pr)
{
    if (pr->fenceless)
        __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the compiler keeps the order */
    else
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__builtin_expect(__atomic_load_n(&((struct shm_hdr *)pr->base)->asleep, __ATOMIC_RELAXED),
                         0))
        wake_signal(pr);
}

static int shm_wake_fd(struct dchan_prov *p, int *fd)
{
    struct shm_state *s = st(p);
    if (__atomic_load_n(&s->hdr->nowake, __ATOMIC_ACQUIRE)) {
        dchan_err(p->ctx, "shm", "a peer could not take this rank's eventfd (pidfd_getfd, "
                  "Linux 5.6): no wake-up descriptor with shm");
        return DCHAN_ERR_UNSUPPORTED;
    }
    *fd = s->efd;
    return DCHAN_SUCCESS;
}

static int shm_wake_arm(struct dchan_prov *p)
{
    struct shm_state *s = st(p);
    uint64_t v;
    /* Signals of an earlier sleep: the flag below asks for new ones. */
    while (read(s->efd, &v, sizeof v) < 0 && errno == EINTR)
        ;
    __atomic_store_n(&s->hdr->asleep, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* The fence of peers that make none (above). It cannot fail once the
     * query offered it; if it did, stay awake rather than miss a put. */
    if (shm_membarrier_avail > 0 && membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0) {
        dchan_debug(p->ctx, "shm", "membarrier: %s", strerror(errno));
        __atomic_store_n(&s->hdr->asleep, 0, __ATOMIC_RELAXED);
        return DCHAN_ERR_AGAIN;
    }
    /* SENTINEL and FLAG words and credit words: the core looks after this. */
    if (ring_ready(&s->rx)) {
        __atomic_store_n(&s->hdr->asleep, 0, __ATOMIC_RELAXED);
        return DCHAN_ERR_AGAIN;
    }
    return DCHAN_SUCCESS;
}

static void shm_wake_disarm(struct dchan_prov *p)
{
    __atomic_store_n(&st(p)->hdr->asleep, 0, __ATOMIC_RELAXED);
}

static int __attribute__((noinline)) put_any(dchan_handle_t *h, const struct dchan_put_desc *d);

static int shm_put(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct shm_sh *sh = d->priv;

    /* The put of nearly every iteration: a contiguous message into a slot
     * and sequence word mapped here, in a scanned mode. */
    if (__builtin_expect(sh->dst && !d->iov, 1)) {
        char *slot = sh->dst + d->offset;
        if (d->detect == DCHAN_DETECT_SENTINEL) {
            uint64_t tail;
            memcpy(&tail, (const char *)d->src + d->size - 8, 8);
            copy_mapped(slot, d->src, d->size - 8);
            __atomic_store_n((uint64_t *)(slot + d->size - 8), tail, __ATOMIC_RELEASE);
            wake_peer(sh->peer);
            return DCHAN_PROV_PUT_DONE;
        }
        if (d->detect == DCHAN_DETECT_FLAG && sh->seq_dst) {
            if (d->src)
                copy_mapped(slot, d->src, d->size);
            else
                __atomic_thread_fence(__ATOMIC_RELEASE); /* the stores made in place */
            __atomic_store_n(sh->seq_dst, d->seq, __ATOMIC_RELEASE);
            wake_peer(sh->peer);
            return DCHAN_PROV_PUT_DONE;
        }
    }
    /* EVENT, a message small enough to ride in the record. */
    if (d->detect == DCHAN_DETECT_EVENT && d->size <= SHM_INLINE_BYTES && d->src && !d->iov) {
        struct shm_slot *sl;
        uint64_t pos;
        if (ring_claim(sh->peer, &sl, &pos) != DCHAN_SUCCESS)
            return DCHAN_ERR_AGAIN; /* nothing written: the core drives progress and retries */
        copy_mapped((char *)sl->data, d->src, d->size);
        ring_publish(sl, pos, d->remote_id,
                     d->size <= SHM_HINT_AT ? hint_attach(sh->peer, sl, (uint32_t)d->size)
                                            : (uint32_t)d->size);
        wake_peer(sh->peer);
        return DCHAN_PROV_PUT_DONE;
    }
    return put_any(h, d);
}

/* A failure that belongs to the handle is reported there (the put call
 * returns the code too); anything else is only returned. */
static int put_failed(dchan_handle_t *h, int rc)
{
    if (rc == DCHAN_ERR_PEER || rc == DCHAN_ERR_HANDLE)
        dchan_core_put_done(h, rc);
    return rc;
}

/* SENTINEL or FLAG into a receiver's buffer or word outside its segment:
 * the body by Cross Memory Attach, or in the record when it is small,
 * then the signalling word (the tail, or the sequence value) in a record,
 * which the receiver stores in one aligned store; written here by the
 * kernel's byte copy, it could be seen half done. The position is claimed
 * first, so that a full ring costs nothing written. */
static int put_word(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct shm_sh *sh = d->priv;
    struct shm_slot *sl;
    uint64_t pos, value = d->seq;
    size_t body = d->detect == DCHAN_DETECT_SENTINEL ? d->size - 8 : d->size;
    uint32_t len = SHM_LEN_WORD;
    int rc;
    if (body > SHM_WORD_INLINE &&
        stage_claim(sh, d, SHM_WORD_BODY_AT, body, &sl, &pos) == DCHAN_SUCCESS) {
        len |= SHM_LEN_STAGED | (uint32_t)body;
    } else if ((rc = ring_claim(sh->peer, &sl, &pos)) != DCHAN_SUCCESS) {
        return rc; /* nothing written: the core drives progress and retries */
    } else if (body <= SHM_WORD_INLINE && (d->src || d->iov)) {
        len |= (uint32_t)body;
    } else if ((rc = d->iov ? write_gather(sh, d, 0, body)
                            : write_body(sh, d->offset, d->src, body)) != DCHAN_SUCCESS) {
        ring_publish(sl, pos, 0, 0);
        return put_failed(h, rc);
    }
    /* A body that rides in the records (inline or staged). */
    if (len != SHM_LEN_WORD)
        record_body(d, sl->data + SHM_WORD_BODY_AT, body);
    if (d->detect == DCHAN_DETECT_SENTINEL && d->iov)
        dchan_gather_copy(d, body, d->size, &value);
    else if (d->detect == DCHAN_DETECT_SENTINEL)
        memcpy(&value, (const char *)d->src + body, 8);
    struct shm_word *w = (struct shm_word *)sl->data;
    w->value = value;
    w->slot = d->slot;
    w->unused = 0;
    ring_publish(sl, pos, d->remote_id, len);
    wake_peer(sh->peer);
    return DCHAN_PROV_PUT_DONE;
}

/* Every put: through CMA, gathered, or EVENT. */
static int put_any(dchan_handle_t *h, const struct dchan_put_desc *d)
{
    struct shm_sh *sh = d->priv;
    int rc = DCHAN_SUCCESS;

    /* The signalling word of a receiver outside the segment goes in a
     * record, which the receiver stores (struct shm_word); so does a FLAG
     * message of up to SHM_STAGE_MAX bytes into such a buffer, whose body
     * then rides in the records and costs no system call. */
    if (d->detect != DCHAN_DETECT_EVENT && !sh->local &&
        (d->detect == DCHAN_DETECT_SENTINEL
             ? !sh->dst
             : !sh->seq_dst || (!sh->dst && d->size <= SHM_STAGE_MAX && (d->src || d->iov))))
        return put_word(h, d);
    switch (d->detect) {
    case DCHAN_DETECT_SENTINEL: {
        /* The body, then the tail: the receiver polls the tail. */
        uint64_t tail, at = d->offset + d->size - 8;
        if (d->iov) {
            dchan_gather_copy(d, d->size - 8, d->size, &tail);
            rc = write_gather(sh, d, 0, d->size - 8);
        } else {
            memcpy(&tail, (const char *)d->src + d->size - 8, 8);
            rc = write_body(sh, d->offset, d->src, d->size - 8);
        }
        if (rc != DCHAN_SUCCESS)
            break;
        /* Mapped here, or in this very process (put_word took the rest). */
        __atomic_store_n((uint64_t *)(sh->dst ? sh->dst + at : (char *)(uintptr_t)sh->dst_va + at),
                         tail, __ATOMIC_RELEASE);
        break;
    }
    case DCHAN_DETECT_FLAG:
        if (!d->src && !d->iov)
            __atomic_thread_fence(__ATOMIC_RELEASE); /* the stores made in place */
        rc = d->iov ? write_gather(sh, d, 0, d->size) : write_body(sh, d->offset, d->src, d->size);
        if (rc != DCHAN_SUCCESS)
            break;
        __atomic_store_n(sh->seq_dst ? sh->seq_dst : (uint64_t *)(uintptr_t)sh->seq_va, d->seq,
                         __ATOMIC_RELEASE);
        break;
    default: {
        struct shm_slot *sl;
        uint64_t pos;
        if (d->size > SHM_INLINE_BYTES &&
            stage_claim(sh, d, 0, d->size, &sl, &pos) == DCHAN_SUCCESS) {
            record_body(d, sl->data, d->size);
            ring_publish(sl, pos, d->remote_id, SHM_LEN_STAGED | (uint32_t)d->size);
            break;
        }
        rc = ring_claim(sh->peer, &sl, &pos);
        if (rc != DCHAN_SUCCESS)
            return rc; /* nothing written: the core drives progress and retries */
        if (d->size <= SHM_INLINE_BYTES && (d->src || d->iov)) {
            record_body(d, sl->data, d->size);
            ring_publish(sl, pos, d->remote_id,
                         d->size <= SHM_HINT_AT ? hint_attach(sh->peer, sl, (uint32_t)d->size)
                                                : (uint32_t)d->size);
            break;
        }
        rc = d->iov ? write_gather(sh, d, 0, d->size) : write_body(sh, d->offset, d->src, d->size);
        if (rc == DCHAN_SUCCESS)
            ring_publish(sl, pos, d->remote_id, hint_attach(sh->peer, sl, 0));
        else
            ring_publish(sl, pos, 0, 0);
        break;
    }
    }
    if (rc != DCHAN_SUCCESS)
        return put_failed(h, rc);
    wake_peer(sh->peer);
    return DCHAN_PROV_PUT_DONE;
}

static void shm_send_close(dchan_handle_t *h)
{
}

/* The receiver's slot is in our address space when its buffer is in its
 * segment (mapped here) or in this very process. */
static int shm_map_slot(dchan_handle_t *h, size_t offset, void **ptr)
{
    struct shm_sh *sh = DCHAN_PROV_PRIV(h, struct shm_sh);
    if (sh->dst)
        *ptr = sh->dst + offset;
    else if (sh->local)
        *ptr = (char *)(uintptr_t)sh->dst_va + offset;
    else
        return DCHAN_ERR_UNSUPPORTED;
    return DCHAN_SUCCESS;
}

/* Credit: the receiver stores into its row of the sender's area, which it
 * maps; the sender reads its own segment. */
static int shm_credit_open(dchan_handle_t *h, uint32_t index, const volatile uint64_t **word)
{
    struct shm_state *s = st(dchan_h_prov(h));
    if (index >= s->credit_words)
        return DCHAN_ERR_HANDLE; /* beyond the receiver's row: a forged wire */
    *word = s->credit + (size_t)dchan_h_peer(h) * s->credit_words + index;
    return DCHAN_SUCCESS;
}

/* A receive handle's credit word in the sender's area and that sender,
 * found at its first credit (one index per handle). */
struct shm_rh {
    uint64_t *cword;
    struct shm_peer *peer;
};

static int __attribute__((noinline)) credit_locate(dchan_handle_t *h, uint32_t index)
{
    struct dchan_prov *p = dchan_h_prov(h);
    struct shm_state *s = st(p);
    struct shm_rh *rh = DCHAN_PROV_PRIV(h, struct shm_rh);
    struct shm_peer *pr = &s->peers[dchan_h_peer(h)];
    if (!pr->credit)
        return DCHAN_ERR_PEER;
    if (index >= s->credit_words)
        return DCHAN_ERR_HANDLE; /* the core allocates below it: never so */
    rh->cword = pr->credit + (size_t)dchan_ctx_rank(p->ctx) * s->credit_words + index;
    rh->peer = pr;
    return DCHAN_SUCCESS;
}

static int shm_credit_write(dchan_handle_t *h, uint32_t index, const uint64_t *src)
{
    struct shm_rh *rh = DCHAN_PROV_PRIV(h, struct shm_rh);
    int rc;
    if (__builtin_expect(!rh->cword, 0) && (rc = credit_locate(h, index)) != DCHAN_SUCCESS)
        return rc;
    __atomic_store_n(rh->cword, *src, __ATOMIC_RELEASE);
    rh->peer->hint_value = *src; /* for the next record to that rank */
    rh->peer->hint_index = index;
    rh->peer->hint_owed = true;
    wake_peer(rh->peer); /* a sender may sleep until its credit comes back */
    return DCHAN_PROV_PUT_DONE;
}

/* Measured on the 8-byte credited pingpong (bench/dchan_credit): EVENT's
 * credited one-way falls by about 30 ns, FLAG's by about 25. */
static void shm_credit_prefetch(dchan_handle_t *h)
{
    struct shm_rh *rh = DCHAN_PROV_PRIV(h, struct shm_rh);
    if (rh->cword)
        dchan_prefetch_owned(rh->cword);
}

/* ---- get --------------------------------------------------------------------------------- */

/* The source publishes where its buffer and control words are, as a
 * receiver does for its buffer and sequence word; the getter reads the
 * buffer and the published word, and writes the taken word, through its
 * mapping of the segment or with Cross Memory Attach. A getter's handle
 * reuses struct shm_sh: dst/dst_va the source buffer, seq_dst/seq_va the
 * control words. */
static int shm_src_open(dchan_handle_t *h, unsigned char *wf)
{
    struct shm_state *s = st(dchan_h_prov(h));
    uint64_t where;
    wf[WF_BUF_LOC] = (unsigned char)locate(s, dchan_h_buf(h), dchan_h_size(h), &where);
    dchan_put_le64(wf + WF_BUF, where);
    wf[WF_SEQ_LOC] = (unsigned char)locate(s, dchan_h_ctl(h), 16, &where);
    dchan_put_le64(wf + WF_SEQ, where);
    return DCHAN_SUCCESS;
}

static void shm_src_close(dchan_handle_t *h)
{
}

static int shm_src_publish(dchan_handle_t *h)
{
    /* The getter reads the word where it lies; one asleep must wake. */
    wake_peer(&st(dchan_h_prov(h))->peers[dchan_h_peer(h)]);
    return DCHAN_SUCCESS;
}

/* The source's buffer and its two control words. */
static int shm_get_open(dchan_handle_t *h, const unsigned char *wf)
{
    return import_wire(h, wf, dchan_h_size(h), 1, 2);
}

static void shm_get_close(dchan_handle_t *h)
{
}

/* Read len bytes at the peer's virtual address va. */
static int cma_read(const struct shm_sh *sh, void *dst, uint64_t va, size_t len)
{
    if (sh->local) {
        memcpy(dst, (const void *)(uintptr_t)va, len);
        return DCHAN_SUCCESS;
    }
    while (len) {
        size_t n = len < SHM_CMA_CHUNK ? len : SHM_CMA_CHUNK;
        struct iovec l = {dst, n}, r = {(void *)(uintptr_t)va, n};
        ssize_t got = process_vm_readv(sh->pid, &l, 1, &r, 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return errno_code(got < 0 ? errno : EFAULT);
        dst = (char *)dst + got;
        va += (uint64_t)got;
        len -= (size_t)got;
    }
    return DCHAN_SUCCESS;
}

static int shm_get_peek(dchan_handle_t *h, uint64_t *v)
{
    struct shm_sh *sh = DCHAN_PROV_PRIV(h, struct shm_sh);
    if (sh->seq_dst) {
        *v = __atomic_load_n(sh->seq_dst, __ATOMIC_ACQUIRE);
        return DCHAN_SUCCESS;
    }
    if (sh->local) {
        *v = __atomic_load_n((uint64_t *)(uintptr_t)sh->seq_va, __ATOMIC_ACQUIRE);
        return DCHAN_SUCCESS;
    }
    uint64_t w;
    int rc = cma_read(sh, &w, sh->seq_va, 8);
    /* Memory the source freed: gone, as its zeroed word says. */
    *v = rc == DCHAN_SUCCESS ? w : 0;
    return rc == DCHAN_SUCCESS || rc == DCHAN_ERR_HANDLE ? DCHAN_SUCCESS : rc;
}

static int shm_get(dchan_handle_t *h)
{
    struct shm_sh *sh = DCHAN_PROV_PRIV(h, struct shm_sh);
    if (sh->dst) {
        memcpy(dchan_h_buf(h), sh->dst, dchan_h_size(h));
        return DCHAN_PROV_PUT_DONE;
    }
    int rc = cma_read(sh, dchan_h_buf(h), sh->dst_va, dchan_h_size(h));
    return rc == DCHAN_SUCCESS ? DCHAN_PROV_PUT_DONE : rc;
}

static int shm_get_ack(dchan_handle_t *h, uint64_t v)
{
    struct shm_sh *sh = DCHAN_PROV_PRIV(h, struct shm_sh);
    int rc = DCHAN_SUCCESS;
    /* Release: the reads of the buffer are done before the source reuses it. */
    if (sh->seq_dst)
        __atomic_store_n(sh->seq_dst + 1, v, __ATOMIC_RELEASE);
    else if (sh->local)
        __atomic_store_n((uint64_t *)(uintptr_t)sh->seq_va + 1, v, __ATOMIC_RELEASE);
    else
        rc = cma_write(sh, &v, sh->seq_va + 8, 8);
    if (rc == DCHAN_SUCCESS)
        wake_peer(sh->peer);
    return rc;
}

static const struct dchan_get_ops shm_get_ops = {
    .src_open = shm_src_open,
    .src_close = shm_src_close,
    .src_publish = shm_src_publish,
    .get_open = shm_get_open,
    .get_close = shm_get_close,
    .get_peek = shm_get_peek,
    .get = shm_get,
    .get_ack = shm_get_ack,
};

const struct dchan_provider_ops dchan_shm_ops = {
    .name = "shm",
    .wire_id = DCHAN_PROV_ID_SHM,
    .scope = DCHAN_SCOPE_HOST,
    .modes = DCHAN_MODE_BIT(DCHAN_DETECT_SENTINEL) | DCHAN_MODE_BIT(DCHAN_DETECT_FLAG) |
             DCHAN_MODE_BIT(DCHAN_DETECT_EVENT),
    .probe = shm_probe,
    .open = shm_open_,
    .connect = shm_connect,
    .close = shm_close,
    .mr_reg = dchan_prov_nosys_mr_reg,
    .mr_dereg = dchan_prov_nosys_mr_dereg,
    .mem_alloc = shm_mem_alloc,
    .mem_free = shm_mem_free,
    .recv_open = shm_recv_open,
    .recv_arm = dchan_prov_noop_recv_arm,
    .recv_close = shm_recv_close,
    .send_open = shm_send_open,
    .put = shm_put,
    .put_abandon = dchan_prov_noop_put_abandon,
    .send_close = shm_send_close,
    .map_slot = shm_map_slot,
    .credit_open = shm_credit_open,
    .credit_close = dchan_prov_noop_credit_close,
    .credit_write = shm_credit_write,
    .credit_prefetch = shm_credit_prefetch,
    .progress = shm_progress,
    .wake_fd = shm_wake_fd,
    .wake_arm = shm_wake_arm,
    .wake_disarm = shm_wake_disarm,
    .sleeps = DCHAN_SLEEPS_EVENT,
    .gather = true, /* a gathering copy into the slot, or a process_vm_writev iovec list */
    .get = &shm_get_ops,
};
