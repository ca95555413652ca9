/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the shm provider's ring consumer: any input becomes
 * a ring of records (seq, id, len, inline data, credit hints, signalling
 * words) as a faulty peer could write them, consumed by
 * dchan_shm_ring_consume on the shm provider of a live singleton context,
 * one per detection mode, each with receive handles of sizes around the
 * inline limit, in the segment and on the heap.
 * Ids are mostly those of live handles (or near them), so that records
 * reach the core. A small model says what each record must do (arrival,
 * DCHAN_ERR_SIZE, DCHAN_ERR_OVERRUN, dropped, or stop at a seq that is not
 * the position's), and after each input the target checks the callbacks,
 * every byte of every buffer and of the guards around them, the ring (the
 * consumer writes only the seq of a staged body's lines, which it zeroes)
 * and, now and then, the whole of each segment
 * outside the buffers (AddressSanitizer does not see into a mapping).
 */
#define _GNU_SOURCE
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dchan.h"
#include "provider.h"
#include "shm_ring.h"

#define NCTX 3  /* one context per detection mode */
#define NH 6    /* receive handles per context */
#define SLOTS 16
#define GUARD 64
#define SLOT_BYTES 8 /* input bytes per ring record: a full ring is 137 */
#define MAXSZ 4096

enum { ARMED, ARRIVED, FAILED };

static const int modes[NCTX] = {DCHAN_DETECT_EVENT, DCHAN_DETECT_FLAG, DCHAN_DETECT_SENTINEL};
static const size_t sizes[NH] = {8, 16, 48, 56, 64, MAXSZ};

struct fh {
    dchan_handle_t *h;
    uint32_t id;
    size_t size;
    unsigned char *block; /* buffer with GUARD bytes either side */
    int in_segment;
    /* the model */
    int state, rc;
    unsigned char expect[MAXSZ];
    /* FLAG: the sequence value of the last arrival, and the word as the
     * records left it (the scan after the consumer judges it). */
    uint64_t seq, word;
    const uint64_t *wordp;
    /* what the callbacks saw */
    int arrivals, errors, err_rc;
};

static dchan_ctx_t *ctx[NCTX];
static struct fh fh[NCTX][NH];
static const uint64_t oob = 0x5a5a5a5a5a5a5a5aull;


static void die(const char *what, int c, int k)
{
    fprintf(stderr, "fuzz_shmring: %s (context %d, handle %d)\n", what, c, k);
    abort();
}

static void on_arrival(dchan_handle_t *h, void *arg)
{
    ((struct fh *)arg)->arrivals++;
}

static void on_error(dchan_handle_t *h, int rc, void *arg)
{
    struct fh *f = arg;
    for (int k = 0; k < NH; k++)
        if (f[k].h == h) {
            f[k].errors++;
            f[k].err_rc = rc;
            return;
        }
    die("error_fn for a handle that is not ours", -1, -1);
}

/* The segments, and a copy of each: only buffers (and the FLAG words
 * that records may set) may change. */
struct seg {
    unsigned char *base, *copy;
    size_t len;
};
static struct seg segs[NCTX];
static int nsegs;

/* A FLAG word as it is now, into the copy of its segment. */
static void sync_word(const uint64_t *w)
{
    for (int s = 0; w && s < nsegs; s++)
        if ((const unsigned char *)w >= segs[s].base &&
            (const unsigned char *)w < segs[s].base + segs[s].len)
            memcpy(segs[s].copy + ((const unsigned char *)w - segs[s].base), w, 8);
}

static void make_handle(int c, int k)
{
    struct fh *f = &fh[c][k];
    if (dchan_create_handle(ctx[c], 0, f->block + GUARD, f->size, oob, on_arrival, f,
                            &f->h) != DCHAN_SUCCESS)
        die("dchan_create_handle", c, k);
    f->id = dchan_h_id(f->h);
    f->state = ARMED;
    f->rc = 0;
    f->seq = f->word = 0;
    f->wordp = modes[c] == DCHAN_DETECT_FLAG ? dchan_h_seq_word(f->h) : NULL;
    sync_word(f->wordp); /* zeroed for the new handle */
    memcpy(f->expect, f->block + GUARD, f->size);
}

static void find_segments(void)
{
    FILE *m = fopen("/proc/self/maps", "r");
    char line[512];
    if (!m)
        die("cannot read /proc/self/maps", -1, -1);
    while (fgets(line, sizeof line, m) && nsegs < NCTX) {
        unsigned long lo, hi;
        if (!strstr(line, "memfd:dchan-") || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
            continue;
        struct seg *s = &segs[nsegs++];
        s->base = (unsigned char *)lo;
        s->len = hi - lo;
        s->copy = malloc(s->len);
        if (!s->copy)
            die("no memory", -1, -1);
        memcpy(s->copy, s->base, s->len);
    }
    fclose(m);
    if (nsegs != NCTX)
        die("not one segment per context", nsegs, -1);
}

static void setup(void)
{
    /* Small segments and rings: a context each. */
    setenv("DCHAN_SHM_SEGMENT_SIZE", "1048576", 1);
    setenv("DCHAN_SHM_RING_SLOTS", "16", 1);
    for (int c = 0; c < NCTX; c++) {
        dchan_attr_t a;
        dchan_attr_init(&a);
        a.bootstrap = DCHAN_BOOT_SINGLETON;
        a.provider = "shm";
        a.detect = modes[c];
        a.log_level = DCHAN_LOG_NONE;
        a.error_fn = on_error;
        a.error_arg = fh[c];
        if (dchan_init(&a, &ctx[c]) != DCHAN_SUCCESS)
            die("dchan_init with provider shm", c, -1);
        for (int k = 0; k < NH; k++) {
            struct fh *f = &fh[c][k];
            size_t len = sizes[k] + 2 * GUARD;
            f->size = sizes[k];
            f->in_segment = k % 2 == 0;
            if (f->in_segment) {
                if (dchan_alloc(ctx[c], len, (void **)&f->block) != DCHAN_SUCCESS)
                    die("dchan_alloc", c, k);
            } else if (posix_memalign((void **)&f->block, 64, len) != 0) {
                die("no memory", c, k);
            }
            memset(f->block, 0xa5, len);
            for (size_t i = 0; i < f->size; i++)
                f->block[GUARD + i] = (unsigned char)(i * 7 + k);
            make_handle(c, k);
            if (strcmp(dchan_handle_provider(f->h), "shm") != 0)
                die("handle not served by shm", c, k);
        }
    }
    find_segments();
}

/* The handle of context c that id names, as the core looks it up. */
static struct fh *lookup(int c, uint32_t id)
{
    for (int k = 0; k < NH; k++)
        if (fh[c][k].id == id)
            return &fh[c][k];
    return NULL;
}

static void fail(struct fh *f, int rc)
{
    f->state = FAILED;
    f->rc = rc;
}

static uint64_t get_le(const unsigned char *b, int n)
{
    uint64_t v = 0;
    for (int i = n; i-- > 0;)
        v = v << 8 | b[i];
    return v;
}

/* A record with a signalling word (len SHM_LEN_WORD | n): the core copies
 * the n bytes of inline body, which must be the body's size (all but the
 * tail for SENTINEL, all for FLAG), then stores the word (the tail, or the
 * FLAG word) where the scan after the consumer finds it; a handle that
 * failed takes nothing, one whose data the application holds fails with
 * DCHAN_ERR_OVERRUN. */
static bool model_word(int c, uint32_t id, size_t n, const unsigned char *data, bool staged)
{
    struct fh *f = id ? lookup(c, id) : NULL;
    uint64_t value = get_le(data, 8);
    if (!f || modes[c] == DCHAN_DETECT_EVENT || get_le(data + 8, 4) != 0)
        return false; /* depth 1 here: slot 0 only */
    size_t body = modes[c] == DCHAN_DETECT_SENTINEL ? f->size - 8 : f->size;
    if (staged ? n != body : n && (n > SHM_WORD_INLINE || n != body)) {
        if (f->state != FAILED)
            fail(f, DCHAN_ERR_SIZE);
        return true;
    }
    if (f->state == FAILED)
        return true;
    if (f->state == ARRIVED) {
        fail(f, DCHAN_ERR_OVERRUN);
        return true;
    }
    memcpy(f->expect, data + SHM_WORD_BODY_AT, n);
    if (modes[c] == DCHAN_DETECT_SENTINEL)
        memcpy(f->expect + body, &value, 8);
    else
        f->word = value;
    return true;
}

/* The scan after the consumer, on a handle still armed. */
static void model_scan(int c, struct fh *f)
{
    if (f->state != ARMED)
        return;
    if (modes[c] == DCHAN_DETECT_SENTINEL) {
        uint64_t tail;
        memcpy(&tail, f->expect + f->size - 8, 8);
        if (tail != oob)
            f->state = ARRIVED;
    } else if (modes[c] == DCHAN_DETECT_FLAG && f->word != f->seq) {
        /* The next count of the same epoch, or the first of a new one. */
        uint64_t v = f->word;
        bool next = (v >> 32) == (f->seq >> 32)
                        ? v == ((f->seq & ~0xffffffffull) | (uint32_t)((uint32_t)f->seq + 1))
                        : (uint32_t)v == 1;
        if (next) {
            f->seq = v;
            f->state = ARRIVED;
        } else {
            fail(f, DCHAN_ERR_OVERRUN);
        }
    }
}

/* An EVENT arrival carrying len bytes (0: the body is in the buffer) of
 * at most limit. */
static bool model_event(int c, uint32_t id, size_t len, size_t limit, const unsigned char *data)
{
    struct fh *f = lookup(c, id);
    if (!f || modes[c] != DCHAN_DETECT_EVENT)
        return false;
    if (f->state == FAILED)
        return true;
    /* Carried: up to the limit, and the handle's size. */
    if (len && (len > limit || len != f->size)) {
        fail(f, DCHAN_ERR_SIZE);
        return true;
    }
    if (f->state == ARRIVED) {
        fail(f, DCHAN_ERR_OVERRUN);
        return true;
    }
    if (len)
        memcpy(f->expect, data, len);
    f->state = ARRIVED;
    return true;
}

/* What one complete record at position pos must do; false when it is
 * dropped. *k: the positions it takes (a staged body's lines, shm_ring.h,
 * if their span is one a producer makes; else it is taken alone, with a
 * length no handle has). */
static bool model(int c, uint64_t pos, uint32_t id, uint32_t len, const unsigned char *data,
                  uint64_t *k)
{
    *k = 1;
    if ((len & ~(SHM_LEN_WORD | SHM_STAGED_LEN_MASK)) == SHM_LEN_STAGED) {
        bool word = len & SHM_LEN_WORD;
        uint32_t n = len & SHM_STAGED_LEN_MASK;
        uint64_t span = shm_staged_records(word ? SHM_WORD_BODY_AT : 0, n);
        bool ok = n && n <= SHM_STAGE_MAX && span <= SLOTS / 4 &&
                  (pos & (SLOTS - 1)) + span <= SLOTS;
        if (ok)
            *k = span;
        size_t body = ok ? n : SIZE_MAX;
        if (!id)
            return ok; /* a filler before a body at the ring's end */
        return word ? model_word(c, id, body, data, true) : model_event(c, id, body, SIZE_MAX, data);
    }
    if ((len & ~SHM_WORD_LEN_MASK) == SHM_LEN_WORD)
        return model_word(c, id, len & SHM_WORD_LEN_MASK, data, false);
    /* A credit hint rides along: no send handle here has a credit word,
     * so it changes nothing, and the length is the rest. */
    len &= ~SHM_LEN_HINT;
    if (id == 0)
        return len == 0;
    /* Inline: 1 ... SHM_INLINE_BYTES; 0: the body is in the buffer. */
    return model_event(c, id, len, SHM_INLINE_BYTES, data);
}

static void check_segments(void)
{
    for (int s = 0; s < nsegs; s++) {
        /* Buffers and their guards are checked byte by byte elsewhere. */
        for (int c = 0; c < NCTX; c++)
            for (int k = 0; k < NH; k++) {
                struct fh *f = &fh[c][k];
                if (f->block >= segs[s].base && f->block < segs[s].base + segs[s].len)
                    memcpy(segs[s].copy + (f->block - segs[s].base), f->block,
                           f->size + 2 * GUARD);
            }
        for (int c = 0; c < NCTX; c++)
            for (int k = 0; k < NH; k++)
                sync_word(fh[c][k].wordp);
        if (memcmp(segs[s].copy, segs[s].base, segs[s].len) != 0)
            die("a segment changed outside the receive buffers", s, -1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    static unsigned long runs;
    static struct shm_slot mem[SLOTS + 2], before[SLOTS + 2];
    struct shm_slot *ring = mem + 1; /* a guard record either side */
    unsigned char in[9 + SLOTS * SLOT_BYTES];

    if (!ready) {
        setup();
        ready = 1;
    }
    memset(in, 0, sizeof in);
    memcpy(in, data, size < sizeof in ? size : sizeof in);
    int c = in[0] % NCTX;
    uint64_t head = get_le(in + 1, 8), pub = head;
    size_t nslots = size > 9 ? (size - 9 + SLOT_BYTES - 1) / SLOT_BYTES : 0;

    /* Lay the input out as the records of positions head, head + 1, ... */
    memset(mem, 0xc3, sizeof mem);
    for (uint64_t i = 0; i < SLOTS; i++) {
        uint64_t pos = head + i;
        struct shm_slot *sl = &ring[pos & (SLOTS - 1)];
        const unsigned char *b = in + 9 + i * SLOT_BYTES;
        uint32_t raw = (uint32_t)get_le(b + 4, 4);
        struct fh *named = &fh[c][b[1] % NH];
        if (i >= nslots) {
            sl->seq = pos + 1 - SLOTS; /* the last lap's: not complete */
            continue;
        }
        switch (b[0] & 7) {
        case 5: sl->seq = pos + 1 - SLOTS; break;
        case 6: sl->seq = pos + 1 + SLOTS; break;
        case 7: sl->seq = pos + 1 + raw; break;
        default: sl->seq = pos + 1;
        }
        if (b[1] < 0xc0)
            sl->id = named->id;
        else if (b[1] < 0xd0)
            sl->id = 0;
        else if (b[1] < 0xe0)
            sl->id = named->id ^ (raw & 0xff0000ffu); /* another generation or index */
        else
            sl->id = raw;
        if (b[2] < 0x80)
            sl->len = (uint32_t)named->size;
        else if (b[2] < 0xc0)
            sl->len = b[2] & 63;
        else if (b[2] < 0xcc)
            /* A staged body: the handle's size, or any length (and bits). */
            sl->len = SHM_LEN_STAGED | (b[3] & 3 ? (uint32_t)named->size : raw & 0x1ffffu);
        else if (b[2] < 0xf0)
            sl->len = 0;
        else
            sl->len = raw;
        for (int j = 0; j < (int)SHM_INLINE_BYTES; j++)
            sl->data[j] = (unsigned char)(b[3] + 31 * j + (int)i);
        if (b[2] >= 0xe8 && b[2] < 0xf0) {
            /* A signalling word: mostly slot 0; the sentinel, the next
             * FLAG count, or anything. */
            struct shm_word w = {.value = raw, .slot = b[3] < 0xe0 ? 0 : raw};
            if (b[3] % 4 == 0)
                w.value = oob;
            else if (b[3] % 4 == 1)
                w.value = named->seq + 1;
            /* No body, the body's size, or any length. */
            size_t body = modes[c] == DCHAN_DETECT_SENTINEL ? named->size - 8 : named->size;
            sl->len = SHM_LEN_WORD | (b[3] & 0x30 ? 0 : b[3] & 0x40 ? (uint32_t)body : raw >> 26);
            if ((sl->len & SHM_WORD_LEN_MASK) != (sl->len & ~SHM_LEN_WORD))
                sl->len = SHM_LEN_WORD; /* a body too large for its bits: none */
            if (b[3] & 0x80) /* staged: the body's size, or any length (and bits) */
                sl->len = SHM_LEN_WORD | SHM_LEN_STAGED |
                          (b[3] & 0x40 ? (uint32_t)body : raw & 0x1ffffu);
            memcpy(sl->data, &w, sizeof w);
        }
    }
    memcpy(before, mem, sizeof mem);

    /* What the consumer must do, record by record, on a copy of the ring
     * where the seq of each staged body's lines is zeroed as it passes
     * them (and nothing else changes). */
    int want = 0;
    uint64_t dropped = 0;
    struct shm_slot *after = before + 1;
    do {
        uint64_t pos = head + (uint64_t)want, k;
        const struct shm_slot *sl = &after[pos & (SLOTS - 1)];
        if (sl->seq != pos + 1)
            break;
        if (!model(c, pos, sl->id, sl->len, sl->data, &k))
            dropped++;
        for (uint64_t j = 1; j < k; j++)
            after[(pos + j) & (SLOTS - 1)].seq = 0;
        want += (int)k;
    } while (want < SLOTS);

    struct shm_ring r = {.slots = ring, .mask = SLOTS - 1, .head = head, .head_pub = &pub};
    int n = dchan_shm_ring_consume(dchan_h_prov(fh[c][0].h), &r);
    if (n != want || r.head != head + (uint64_t)want || pub != r.head)
        die("records consumed", c, n);
    if (r.dropped != dropped)
        die("records dropped", c, (int)r.dropped);
    if (memcmp(before, mem, sizeof mem) != 0)
        die("the consumer wrote the ring (beyond the seq of staged lines)", c, -1);

    /* Callbacks as the model says; every byte where it says; then re-arm. */
    for (int k = 0; k < NH; k++)
        model_scan(c, &fh[c][k]);
    if (dchan_progress(ctx[c]) < 0)
        die("dchan_progress", c, -1);
    for (int k = 0; k < NH; k++) {
        struct fh *f = &fh[c][k];
        for (int g = 0; g < GUARD; g++)
            if (f->block[g] != 0xa5 || f->block[GUARD + f->size + g] != 0xa5)
                die("a guard byte changed", c, k);
        if (memcmp(f->block + GUARD, f->expect, f->size) != 0)
            die("buffer content", c, k);
        if (f->arrivals != (f->state == ARRIVED) ||
            f->errors != (f->state == FAILED) || (f->errors && f->err_rc != f->rc))
            die("callbacks", c, k);
        if (f->wordp && __atomic_load_n(f->wordp, __ATOMIC_RELAXED) != f->word)
            die("FLAG word", c, k);
        if (f->state == ARRIVED && dchan_ready(f->h) != DCHAN_SUCCESS)
            die("dchan_ready after an arrival", c, k);
        if (f->state == ARRIVED && modes[c] == DCHAN_DETECT_SENTINEL)
            memcpy(f->expect + f->size - 8, &oob, 8); /* the re-arm's sentinel */
        if (f->state == FAILED) {
            /* The error sticks to the handle: later calls return it. */
            if (dchan_ready(f->h) != f->rc)
                die("dchan_ready on a failed handle", c, k);
            sync_word(f->wordp); /* as the records left it */
            if (dchan_handle_destroy(f->h) != DCHAN_SUCCESS)
                die("dchan_handle_destroy", c, k);
            make_handle(c, k);
        }
        f->state = ARMED;
        f->arrivals = f->errors = 0;
    }
    if (++runs % 1024 == 0)
        check_segments();
    return 0;
}
