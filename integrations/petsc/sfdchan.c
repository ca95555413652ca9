/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PetscSF type "dchan": Bcast (roots to leaves) and Reduce (leaves to
 * roots) through credited dchan channels, one per neighbour rank,
 * direction and unit size, packed straight into the peer's slot where
 * dchan_put_ptr maps it. What is not done natively (FetchAndOp, device
 * memory, units or ops outside the tables below, pattern graphs) goes to
 * a PETSc basic SF built on the same graph, so every call gives PETSc's
 * own answer.
 *
 * Messages: one per neighbour per operation, the units in the order of
 * the index list, padded to 8 bytes, then an 8-byte trailer holding the
 * operation's sequence number plus one (never 0, the sentinel pattern;
 * the receiver checks it). Operations of one channel set are numbered in
 * Begin order, which PETSc's collective semantics make the same on every
 * rank, so the n-th message of a channel belongs to the n-th Begin.
 *
 * Progress rules that keep every rank moving (no rank ever blocks in a
 * Begin; End drives all channels of all dchan SFs):
 *  - a put without credit is packed into the operation's staging area
 *    and put later, from whatever End runs next;
 *  - an End copies out (and so releases) any message that stands before
 *    its own on a channel it waits on, and any message of a channel whose
 *    slots are all held, so the sender always gets its credit back;
 *  - an End returns only once its own messages have all been put.
 */
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <petsc/private/sfimpl.h>

#include <dchan.h>

#include "dchan_petsc.h"

PETSC_EXTERN PetscErrorCode PetscDLLibraryRegister_dchan_petsc(void);
PETSC_EXTERN PetscErrorCode PetscSFCreate_DChan(PetscSF);

/* ---------------------------------------------------------------------
 * Units and operations handled natively
 * ------------------------------------------------------------------- */

typedef enum {
  DK_NONE = 0,
  DK_DOUBLE,
  DK_FLOAT,
  DK_INT,
  DK_INT64,
  DK_UINT,
  DK_SCHAR,
  DK_UCHAR,
  DK_2INT,
  DK_BYTES
} DChanKind;

typedef enum {
  DO_NONE = 0,
  DO_REPLACE,
  DO_SUM,
  DO_PROD,
  DO_MAX,
  DO_MIN,
  DO_LAND,
  DO_LOR,
  DO_LXOR,
  DO_BAND,
  DO_BOR,
  DO_BXOR,
  DO_MAXLOC,
  DO_MINLOC
} DChanOpc;

typedef struct {
  int a, b; /* value, index: MPI_2INT's layout */
} DChanPair;

static DChanOpc DChanOpCode(MPI_Op op)
{
  if (op == MPI_REPLACE) return DO_REPLACE;
  if (op == MPI_SUM || op == MPIU_SUM) return DO_SUM;
  if (op == MPI_PROD) return DO_PROD;
  if (op == MPI_MAX || op == MPIU_MAX) return DO_MAX;
  if (op == MPI_MIN || op == MPIU_MIN) return DO_MIN;
  if (op == MPI_LAND) return DO_LAND;
  if (op == MPI_LOR) return DO_LOR;
  if (op == MPI_LXOR) return DO_LXOR;
  if (op == MPI_BAND) return DO_BAND;
  if (op == MPI_BOR) return DO_BOR;
  if (op == MPI_BXOR) return DO_BXOR;
  if (op == MPI_MAXLOC) return DO_MAXLOC;
  if (op == MPI_MINLOC) return DO_MINLOC;
  return DO_NONE;
}

static PetscBool DChanOpValid(DChanKind k, DChanOpc o)
{
  if (k == DK_NONE || o == DO_NONE) return PETSC_FALSE;
  if (o == DO_REPLACE) return PETSC_TRUE;
  switch (k) {
  case DK_DOUBLE:
  case DK_FLOAT:
    return (PetscBool)(o == DO_SUM || o == DO_PROD || o == DO_MAX || o == DO_MIN);
  case DK_INT:
  case DK_INT64:
  case DK_UINT:
  case DK_SCHAR:
  case DK_UCHAR:
    return (PetscBool)(o != DO_MAXLOC && o != DO_MINLOC);
  case DK_2INT:
    return (PetscBool)(o == DO_MAXLOC || o == DO_MINLOC);
  default:
    return PETSC_FALSE;
  }
}

/* Kind of one named type, DK_NONE when it is not one of ours. */
static DChanKind DChanNamedKind(MPI_Datatype t)
{
  if (t == MPI_DOUBLE) return DK_DOUBLE;
  if (t == MPI_FLOAT) return DK_FLOAT;
  if (t == MPI_INT) return sizeof(int) == 4 ? DK_INT : DK_NONE;
  if (t == MPI_INT64_T || t == MPI_LONG_LONG_INT) return DK_INT64;
  if (t == MPI_LONG) return sizeof(long) == 8 ? DK_INT64 : DK_NONE;
  if (t == MPI_UNSIGNED) return DK_UINT;
  if (t == MPI_SIGNED_CHAR) return DK_SCHAR;
  if (t == MPI_CHAR) return ((char)-1 < 0) ? DK_SCHAR : DK_UCHAR;
  if (t == MPI_UNSIGNED_CHAR) return DK_UCHAR;
  if (t == MPI_BYTE) return DK_BYTES;
  if (t == MPI_2INT) return DK_2INT;
  return DK_NONE;
}

/* What one unit is: nel elements of a kind, ub bytes. Contiguous and
 * duplicated types are unwrapped; anything else dense is bytes (replace
 * only); the rest is DK_NONE and forwarded. */
static PetscErrorCode DChanUnitAnalyze(MPI_Datatype unit, DChanKind *kind, PetscInt *nel, size_t *ub)
{
  PetscMPIInt size, ni, na, nd, comb;
  MPI_Aint    lb, extent, tlb, textent;
  DChanKind   k;

  PetscFunctionBegin;
  *kind = DK_NONE;
  *nel  = 0;
  PetscCallMPI(MPI_Type_size(unit, &size));
  *ub = (size_t)(size > 0 ? size : 0);
  if (size <= 0) PetscFunctionReturn(0);
  k = DChanNamedKind(unit);
  if (k != DK_NONE) {
    *kind = k;
    *nel  = (k == DK_BYTES) ? size : 1;
    PetscFunctionReturn(0);
  }
  PetscCallMPI(MPI_Type_get_envelope(unit, &ni, &na, &nd, &comb));
  if ((comb == MPI_COMBINER_DUP || comb == MPI_COMBINER_CONTIGUOUS) && ni <= 1 && na == 0 && nd == 1) {
    PetscMPIInt  ints[1] = {1}, bni, bna, bnd, bcomb;
    MPI_Aint     addrs[1];
    MPI_Datatype base;
    DChanKind    bk;
    PetscInt     bn;
    size_t       bub;

    PetscCallMPI(MPI_Type_get_contents(unit, ni, na, nd, ints, addrs, &base));
    PetscCall(DChanUnitAnalyze(base, &bk, &bn, &bub));
    PetscCallMPI(MPI_Type_get_envelope(base, &bni, &bna, &bnd, &bcomb));
    if (bcomb != MPI_COMBINER_NAMED) PetscCallMPI(MPI_Type_free(&base));
    if (bk != DK_NONE && (size_t)size == bub * (size_t)(comb == MPI_COMBINER_CONTIGUOUS ? ints[0] : 1)) {
      *kind = bk;
      *nel  = bn * (comb == MPI_COMBINER_CONTIGUOUS ? ints[0] : 1);
      PetscFunctionReturn(0);
    }
  }
  /* Dense data of another shape: plain bytes, moved but never combined. */
  PetscCallMPI(MPI_Type_get_extent(unit, &lb, &extent));
  PetscCallMPI(MPI_Type_get_true_extent(unit, &tlb, &textent));
  if (lb == 0 && tlb == 0 && extent == size && textent == size) {
    *kind = DK_BYTES;
    *nel  = size;
  }
  PetscFunctionReturn(0);
}

/* dst[didx[k]] = op(dst[didx[k]], src[sidx[k]]) for count units of ub
 * bytes; a NULL index list means k itself. In order of k, as PETSc's
 * basic SF applies them, so floating-point results match bit for bit. */
static void DChanCopyUnits(PetscInt count, size_t ub, char *dst, const PetscInt *didx, const char *src, const PetscInt *sidx)
{
  PetscInt k;

  if (!didx && !sidx) {
    memcpy(dst, src, (size_t)count * ub);
    return;
  }
  if (ub == 8) {
    for (k = 0; k < count; k++) memcpy(dst + (size_t)(didx ? didx[k] : k) * 8, src + (size_t)(sidx ? sidx[k] : k) * 8, 8);
  } else if (ub == 4) {
    for (k = 0; k < count; k++) memcpy(dst + (size_t)(didx ? didx[k] : k) * 4, src + (size_t)(sidx ? sidx[k] : k) * 4, 4);
  } else {
    for (k = 0; k < count; k++) memcpy(dst + (size_t)(didx ? didx[k] : k) * ub, src + (size_t)(sidx ? sidx[k] : k) * ub, ub);
  }
}

#define DCHAN_LOOP(T, EXPR) \
  do { \
    for (PetscInt k_ = 0; k_ < count; k_++) { \
      T       *d = (T *)(void *)(dst + (size_t)(didx ? didx[k_] : k_) * ub); \
      const T *s = (const T *)(const void *)(src + (size_t)(sidx ? sidx[k_] : k_) * ub); \
      for (PetscInt e = 0; e < n; e++) { EXPR; } \
    } \
  } while (0)

/* PetscMax/PetscMin argument order, so NaN propagates as in PETSc.
 * Integer sums and products wrap (computed unsigned, UT), as MPI's do in
 * practice, instead of overflowing a signed type. */
#define DCHAN_ARITH_CASES(T, UT) \
  case DO_SUM: \
    DCHAN_LOOP(T, d[e] = (T)((UT)d[e] + (UT)s[e])); \
    break; \
  case DO_PROD: \
    DCHAN_LOOP(T, d[e] = (T)((UT)d[e] * (UT)s[e])); \
    break; \
  case DO_MAX: \
    DCHAN_LOOP(T, d[e] = (d[e] < s[e]) ? s[e] : d[e]); \
    break; \
  case DO_MIN: \
    DCHAN_LOOP(T, d[e] = (d[e] < s[e]) ? d[e] : s[e]); \
    break;

#define DCHAN_DEF_FLOAT(T, NAME) \
  static void NAME(DChanOpc o, PetscInt n, PetscInt count, size_t ub, char *dst, const PetscInt *didx, const char *src, const PetscInt *sidx) \
  { \
    switch (o) { \
      DCHAN_ARITH_CASES(T, T) \
    default: \
      break; \
    } \
  }

#define DCHAN_DEF_INT(T, UT, NAME) \
  static void NAME(DChanOpc o, PetscInt n, PetscInt count, size_t ub, char *dst, const PetscInt *didx, const char *src, const PetscInt *sidx) \
  { \
    switch (o) { \
      DCHAN_ARITH_CASES(T, UT) \
    case DO_LAND: \
      DCHAN_LOOP(T, d[e] = (T)(d[e] && s[e])); \
      break; \
    case DO_LOR: \
      DCHAN_LOOP(T, d[e] = (T)(d[e] || s[e])); \
      break; \
    case DO_LXOR: \
      DCHAN_LOOP(T, d[e] = (T)(!d[e] != !s[e])); \
      break; \
    case DO_BAND: \
      DCHAN_LOOP(T, d[e] = (T)(d[e] & s[e])); \
      break; \
    case DO_BOR: \
      DCHAN_LOOP(T, d[e] = (T)(d[e] | s[e])); \
      break; \
    case DO_BXOR: \
      DCHAN_LOOP(T, d[e] = (T)(d[e] ^ s[e])); \
      break; \
    default: \
      break; \
    } \
  }

DCHAN_DEF_FLOAT(double, DChanApplyDouble)
DCHAN_DEF_FLOAT(float, DChanApplyFloat)
DCHAN_DEF_INT(int, unsigned, DChanApplyInt)
DCHAN_DEF_INT(int64_t, uint64_t, DChanApplyInt64)
DCHAN_DEF_INT(unsigned, unsigned, DChanApplyUint)
DCHAN_DEF_INT(signed char, unsigned, DChanApplySchar)
DCHAN_DEF_INT(unsigned char, unsigned, DChanApplyUchar)

/* MAXLOC/MINLOC: the larger (smaller) value wins; on a tie, the smaller index. */
static void DChanApplyPair(DChanOpc o, PetscInt n, PetscInt count, size_t ub, char *dst, const PetscInt *didx, const char *src, const PetscInt *sidx)
{
  if (o == DO_MAXLOC) {
    DCHAN_LOOP(DChanPair, if (d[e].a == s[e].a) { if (s[e].b < d[e].b) d[e].b = s[e].b; } else if (d[e].a < s[e].a) d[e] = s[e]);
  } else if (o == DO_MINLOC) {
    DCHAN_LOOP(DChanPair, if (d[e].a == s[e].a) { if (s[e].b < d[e].b) d[e].b = s[e].b; } else if (s[e].a < d[e].a) d[e] = s[e]);
  }
}

static void DChanApply(DChanKind k, DChanOpc o, PetscInt n, PetscInt count, size_t ub, char *dst, const PetscInt *didx, const char *src, const PetscInt *sidx)
{
  if (count <= 0) return;
  if (o == DO_REPLACE) {
    DChanCopyUnits(count, ub, dst, didx, src, sidx);
    return;
  }
  switch (k) {
  case DK_DOUBLE:
    DChanApplyDouble(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_FLOAT:
    DChanApplyFloat(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_INT:
    DChanApplyInt(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_INT64:
    DChanApplyInt64(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_UINT:
    DChanApplyUint(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_SCHAR:
    DChanApplySchar(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_UCHAR:
    DChanApplyUchar(o, n, count, ub, dst, didx, src, sidx);
    break;
  case DK_2INT:
    DChanApplyPair(o, n, count, ub, dst, didx, src, sidx);
    break;
  default:
    break;
  }
}

/* Index lists as runs of consecutive indices, so that packing a DMDA
 * row or a contiguous block is one memcpy (or one tight loop) instead of
 * one call per unit. Run r covers list positions [pos, pos+len) with
 * indices a, a+1, ... (and b, b+1, ... for a second list). */
typedef struct {
  PetscInt pos, a, b, len;
} DChanRun;

static PetscErrorCode DChanRunsBuild(PetscInt n, const PetscInt *ia, const PetscInt *ib, PetscInt *nruns, DChanRun **runs)
{
  PetscInt k, r = 0;

  PetscFunctionBegin;
  PetscCall(PetscMalloc1(n > 0 ? n : 1, runs));
  for (k = 0; k < n; k++) {
    DChanRun *c = r ? &(*runs)[r - 1] : NULL;
    if (c && ia[k] == c->a + c->len && (!ib || ib[k] == c->b + c->len)) {
      c->len++;
    } else {
      (*runs)[r].pos = k;
      (*runs)[r].a   = ia[k];
      (*runs)[r].b   = ib ? ib[k] : k;
      (*runs)[r].len = 1;
      r++;
    }
  }
  *nruns = r;
  PetscFunctionReturn(0);
}

/* Message <-> data through runs: pack (to_msg) copies units from base at
 * the run's indices into msg at its positions; unpack applies the op the
 * other way, in list order. */
/* Runs pay off when they are long; short ones (a strided face) go unit
 * by unit through the index list, where 4- and 8-byte units are copied
 * inline. */
static PetscBool DChanRunsPay(PetscInt nruns, PetscInt n)
{
  return (PetscBool)(4 * nruns <= n);
}

static void DChanRunsPack(PetscInt n, const PetscInt *idx, PetscInt nruns, const DChanRun *runs, size_t ub, char *msg, const char *base)
{
  if (!DChanRunsPay(nruns, n)) {
    DChanCopyUnits(n, ub, msg, NULL, base, idx);
    return;
  }
  for (PetscInt r = 0; r < nruns; r++) memcpy(msg + (size_t)runs[r].pos * ub, base + (size_t)runs[r].a * ub, (size_t)runs[r].len * ub);
}

static void DChanRunsUnpack(DChanKind k, DChanOpc o, PetscInt nel, PetscInt n, const PetscInt *idx, PetscInt nruns, const DChanRun *runs, size_t ub, char *base, const char *msg)
{
  if (!DChanRunsPay(nruns, n)) {
    DChanApply(k, o, nel, n, ub, base, idx, msg, NULL);
    return;
  }
  for (PetscInt r = 0; r < nruns; r++) DChanApply(k, o, nel, runs[r].len, ub, base + (size_t)runs[r].a * ub, NULL, msg + (size_t)runs[r].pos * ub, NULL);
}

/* ---------------------------------------------------------------------
 * One dchan context per communicator, cached as an attribute on it
 * ------------------------------------------------------------------- */

typedef struct _n_DChanComm *DChanComm;
struct _n_DChanComm {
  dchan_ctx_t *ctx;
  MPI_Comm     comm;     /* the communicator it is attached to */
  PetscInt     refct;    /* the attribute's reference, plus one per SF */
  PetscBool    attached; /* the attribute still holds its reference */
  PetscBool    failed;   /* dchan_init failed on some rank: never used */
  DChanComm    next;
};

static DChanComm   dchan_comms  = NULL;
static PetscMPIInt dchan_keyval = MPI_KEYVAL_INVALID;
static PetscBool   dchan_registered = PETSC_FALSE;
/* Waits yield the CPU only where ranks outnumber cores (as Open MPI's
 * yield_when_idle): there the peer needs the core; elsewhere a yield
 * hands the core to unrelated work and the wait grows by a time slice. */
static PetscBool   dchan_yield = PETSC_FALSE;

/* Counters for -sf_dchan_summary. */
static struct {
  PetscLogDouble sfs, native_bcast, native_reduce, forwarded, bytes, staged, copied_out;
} dchan_count;

static void DChanCommRelease(DChanComm c)
{
  DChanComm *p;

  if (--c->refct > 0) return;
  /* Collective over the communicator: reached when it is freed (its
   * attribute goes) or at PetscFinalize, on every rank alike. */
  if (c->ctx && !c->failed) (void)dchan_finalize(c->ctx);
  for (p = &dchan_comms; *p; p = &(*p)->next) {
    if (*p == c) {
      *p = c->next;
      break;
    }
  }
  free(c);
}

static PetscMPIInt MPIAPI DChanCommDelete(MPI_Comm comm, PetscMPIInt keyval, void *attr, void *extra)
{
  DChanComm c = (DChanComm)attr;

  (void)comm;
  (void)keyval;
  (void)extra;
  if (c && c->attached) {
    c->attached = PETSC_FALSE;
    DChanCommRelease(c);
  }
  return MPI_SUCCESS;
}

static const char *const DChanDetectNames[] = {"auto", "sentinel", "flag", "event", "DChanDetect", "DCHAN_DETECT_", NULL};

typedef struct {
  char      provider[64];
  PetscInt  detect; /* DCHAN_DETECT_*, or -1: the environment's */
} DChanInitOpts;

static PetscErrorCode DChanCommGet(MPI_Comm comm, const DChanInitOpts *opts, DChanComm *out)
{
  DChanComm    c;
  PetscMPIInt  flag, ok, gok;
  void        *attr;
  dchan_attr_t a;
  int          rc;

  PetscFunctionBegin;
  *out = NULL;
  if (dchan_keyval == MPI_KEYVAL_INVALID) PetscCallMPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, DChanCommDelete, &dchan_keyval, NULL));
  PetscCallMPI(MPI_Comm_get_attr(comm, dchan_keyval, &attr, &flag));
  if (flag) {
    c = (DChanComm)attr;
    if (!c->failed) {
      c->refct++;
      *out = c;
    }
    PetscFunctionReturn(0);
  }
  c = (DChanComm)calloc(1, sizeof(*c));
  PetscCheck(c, PETSC_COMM_SELF, PETSC_ERR_MEM, "dchan SF: out of memory");
  c->comm = comm;
  dchan_attr_init(&a);
  a.bootstrap = DCHAN_BOOT_MPI;
  a.mpi_comm  = &c->comm;
  if (opts->provider[0]) a.provider = opts->provider;
  if (opts->detect >= 0) a.detect = (int)opts->detect;
  rc = dchan_init(&a, &c->ctx);
  ok = (rc == DCHAN_SUCCESS && !a.config_error) ? 1 : 0;
  PetscCall(MPIU_Allreduce(&ok, &gok, 1, MPI_INT, MPI_MIN, comm));
  if (!gok) {
    /* A context that some rank lacks cannot be finalised collectively:
     * keep it, unused, so the comm falls back to the basic SF for good. */
    c->failed = PETSC_TRUE;
    PetscCall(PetscInfo(NULL, "dchan SF: dchan_init failed on some rank (here: %s); SFs on this communicator use the basic SF\n", rc ? dchan_strerror(rc) : "ok"));
  }
  {
    MPI_Comm    node;
    PetscMPIInt nlocal = 1;
    long        ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    PetscCallMPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    PetscCallMPI(MPI_Comm_size(node, &nlocal));
    PetscCallMPI(MPI_Comm_free(&node));
    if (ncpu > 0 && nlocal > ncpu) dchan_yield = PETSC_TRUE;
  }
  c->refct    = 1;
  c->attached = PETSC_TRUE;
  PetscCallMPI(MPI_Comm_set_attr(comm, dchan_keyval, c));
  /* Creation order, so that finalisation runs in the same order everywhere. */
  {
    DChanComm *p = &dchan_comms;
    while (*p) p = &(*p)->next;
    *p = c;
  }
  if (!c->failed) {
    c->refct++;
    *out = c;
  }
  PetscFunctionReturn(0);
}

/* ---------------------------------------------------------------------
 * Channel sets and in-flight operations
 * ------------------------------------------------------------------- */

typedef struct {
  dchan_handle_t *h;
  void           *buf;     /* dchan_alloc: depth slots (receive), one message (send) */
  PetscMPIInt     rank;    /* the peer */
  PetscInt        cnt;     /* units per message */
  const PetscInt *idx;     /* local indices of those units */
  DChanRun       *runs;    /* the same as runs */
  PetscInt        nruns;
  size_t          bytes;   /* message bytes, trailer included */
  size_t          off;     /* place in an operation's staging area */
  uint64_t        next;    /* send: sequence of the next message to put */
  uint64_t        arrived; /* receive: arrival callbacks run */
  uint64_t        taken;   /* receive: messages released */
  PetscBool       held;    /* receive: head slot held by the End that runs */
} DChanPeer;

typedef struct _n_DChanLink *DChanLink;
typedef struct _n_DChanSet  *DChanSet;

struct _n_DChanSet {
  DChanSet         next;
  size_t           ub;
  PetscSFDirection dir;
  PetscBool        native;
  PetscInt         nsend, nrecv;
  DChanPeer       *send, *recv;
  size_t           sbytes, rbytes; /* staging bytes for all sends, all receives */
  uint64_t         posted;         /* Begins so far */
  DChanLink        pool;           /* spare operation records */
};

struct _n_DChanLink {
  DChanLink        next; /* the SF's in-flight list, in Begin order */
  DChanSet         set;  /* NULL: forwarded, or nothing remote */
  PetscBool        fwd;  /* forwarded to the basic SF */
  PetscSFDirection dir;
  MPI_Datatype     unit;
  const void      *rootdata;
  void            *leafdata;
  MPI_Op           op;
  DChanKind        kind;
  DChanOpc         opc;
  PetscInt         nel;
  uint64_t         seq;
  char            *sstage, *rstage; /* staging, allocated on first need */
  char           **rptr;           /* per receive peer: where its message is */
  PetscInt         nrdone;         /* receive peers whose message is staged or held */
  PetscInt         npend;          /* messages still to put */
};

typedef struct _n_PetscSF_DChan PetscSF_DChan;
struct _n_PetscSF_DChan {
  /* options */
  PetscInt      depth;
  PetscInt      maxbytes; /* largest message sent natively */
  PetscBool     forward;  /* everything to the basic SF */
  DChanInitOpts init;
  /* state after SetUp */
  PetscSF       inner;    /* basic SF on the same graph */
  PetscBool     fwdall;
  const char   *fwdwhy;
  DChanComm     dc;
  PetscMPIInt   tagwire;
  PetscInt      niranks;
  const PetscMPIInt *iranks;
  const PetscInt    *ioffset, *irootloc;
  DChanSet      sets;
  DChanLink     links;
  DChanRun     *lruns; /* the same-rank part */
  PetscInt      nlruns, nlocal;
  /* busy list: SFs with operations in flight */
  PetscSF_DChan *busy_next, *busy_prev;
  PetscBool      busy;
  PetscBool      viewed; /* -sf_view done */
  PetscSF        sf;
};

static PetscSF_DChan *dchan_busy = NULL;

static void DChanBusyAdd(PetscSF_DChan *s)
{
  if (s->busy) return;
  s->busy      = PETSC_TRUE;
  s->busy_prev = NULL;
  s->busy_next = dchan_busy;
  if (dchan_busy) dchan_busy->busy_prev = s;
  dchan_busy = s;
}

static void DChanBusyRemove(PetscSF_DChan *s)
{
  if (!s->busy) return;
  if (s->busy_prev) s->busy_prev->busy_next = s->busy_next;
  else dchan_busy = s->busy_next;
  if (s->busy_next) s->busy_next->busy_prev = s->busy_prev;
  s->busy = PETSC_FALSE;
}

static size_t DChanRound8(size_t n)
{
  return (n + 7) & ~(size_t)7;
}

static void DChanArrived(dchan_handle_t *h, void *arg)
{
  (void)h;
  ((DChanPeer *)arg)->arrived++;
}

static PetscErrorCode DChanCheck(int rc, const char *what)
{
  PetscFunctionBegin;
  PetscCheck(rc >= 0, PETSC_COMM_SELF, PETSC_ERR_LIB, "dchan SF: %s failed: %s (%d)", what, dchan_strerror(rc), rc);
  PetscFunctionReturn(0);
}

static DChanLink DChanFindSeq(PetscSF_DChan *s, DChanSet set, uint64_t seq)
{
  DChanLink l;
  for (l = s->links; l; l = l->next)
    if (l->set == set && l->seq == seq) return l;
  return NULL;
}

static void DChanTrailer(char *msg, size_t bytes, uint64_t seq)
{
  uint64_t t = seq + 1;
  memcpy(msg + bytes - 8, &t, 8);
}

static PetscErrorCode DChanCheckTrailer(const char *msg, size_t bytes, uint64_t seq, PetscMPIInt peer)
{
  uint64_t t;

  PetscFunctionBegin;
  memcpy(&t, msg + bytes - 8, 8);
  PetscCheck(t == seq + 1, PETSC_COMM_SELF, PETSC_ERR_PLIB, "dchan SF: message from rank %d carries operation %llu where %llu was expected (operations on this SF were not called in the same order on all ranks?)", (int)peer,
             (unsigned long long)t - 1, (unsigned long long)seq);
  PetscFunctionReturn(0);
}

/* One pass over every channel of every busy dchan SF: progress the
 * contexts, put what waited for credit, copy out messages that stand in
 * the way. "ending" is the operation whose End runs (its messages are
 * held in their slots rather than copied). */
static PetscErrorCode DChanDrive(DChanLink ending, PetscBool *moved)
{
  DChanComm      c;
  PetscSF_DChan *s;

  PetscFunctionBegin;
  for (c = dchan_comms; c; c = c->next) {
    int rc;
    if (!c->ctx || c->failed) continue;
    rc = dchan_progress(c->ctx);
    PetscCall(DChanCheck(rc, "dchan_progress"));
    if (rc > 0) *moved = PETSC_TRUE;
  }
  for (s = dchan_busy; s; s = s->busy_next) {
    DChanSet set;
    for (set = s->sets; set; set = set->next) {
      PetscInt i;
      if (!set->native) continue;
      for (i = 0; i < set->nsend; i++) {
        DChanPeer *p = &set->send[i];
        while (p->next < set->posted) {
          DChanLink l = DChanFindSeq(s, set, p->next);
          void     *dst;
          int       rc;
          if (!l) break;
          rc = dchan_put_ptr(p->h, &dst);
          if (rc == DCHAN_ERR_AGAIN) break;
          PetscCall(DChanCheck(rc, "dchan_put_ptr"));
          memcpy(dst, l->sstage + p->off, p->bytes);
          PetscCall(DChanCheck(dchan_put(p->h), "dchan_put"));
          p->next++;
          l->npend--;
          *moved = PETSC_TRUE;
        }
      }
      for (i = 0; i < set->nrecv; i++) {
        DChanPeer *q     = &set->recv[i];
        PetscBool  mine  = (PetscBool)(ending && ending->set == set);
        while (!q->held && q->arrived > q->taken) {
          DChanLink l = DChanFindSeq(s, set, q->taken);
          void     *slot;
          if (!l) break; /* the peer is ahead of this rank's Begin: keep it */
          PetscCall(DChanCheck(dchan_slot(q->h, &slot), "dchan_slot"));
          PetscCall(DChanCheckTrailer((const char *)slot, q->bytes, l->seq, q->rank));
          if (l == ending) {
            q->held    = PETSC_TRUE;
            l->rptr[i] = (char *)slot;
            l->nrdone++;
            *moved = PETSC_TRUE;
            break;
          }
          /* Someone else's message: copy it out only when it blocks our
           * own or the sender may be out of credit. */
          if (!mine && q->arrived - q->taken < (uint64_t)s->depth) break;
          if (!l->rstage) PetscCall(PetscMalloc1(set->rbytes, &l->rstage));
          memcpy(l->rstage + q->off, slot, q->bytes);
          l->rptr[i] = l->rstage + q->off;
          l->nrdone++;
          PetscCall(DChanCheck(dchan_ready(q->h), "dchan_ready"));
          q->taken++;
          dchan_count.copied_out += 1;
          *moved = PETSC_TRUE;
        }
      }
    }
  }
  PetscFunctionReturn(0);
}

static void DChanIdle(PetscInt *spins, PetscBool moved)
{
  if (moved) {
    *spins = 0;
    return;
  }
  if (dchan_yield && ++*spins > 64) sched_yield();
}

/* Waits for MPI requests while keeping dchan traffic moving. */
static PetscErrorCode DChanWaitMPI(PetscMPIInt n, MPI_Request *reqs)
{
  PetscMPIInt done = 0;
  PetscInt    spins = 0;

  PetscFunctionBegin;
  for (;;) {
    PetscBool moved = PETSC_FALSE;
    PetscCallMPI(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE));
    if (done) break;
    PetscCall(DChanDrive(NULL, &moved));
    DChanIdle(&spins, moved);
  }
  PetscFunctionReturn(0);
}

static PetscErrorCode DChanSetDestroy(PetscSF_DChan *s, DChanSet set)
{
  dchan_ctx_t *ctx = s->dc ? s->dc->ctx : NULL;
  PetscInt     i;
  DChanLink    l;

  PetscFunctionBegin;
  for (i = 0; i < set->nsend; i++) {
    DChanPeer *p = &set->send[i];
    if (p->h) {
      /* A put still on its way would be cancelled by the destroy. */
      while (dchan_put_test(p->h) == 0) (void)dchan_progress(ctx);
      (void)dchan_handle_destroy(p->h);
    }
    if (p->buf) (void)dchan_free(ctx, p->buf);
    PetscCall(PetscFree(p->runs));
  }
  for (i = 0; i < set->nrecv; i++) {
    DChanPeer *q = &set->recv[i];
    if (q->h) (void)dchan_handle_destroy(q->h);
    if (q->buf) (void)dchan_free(ctx, q->buf);
    PetscCall(PetscFree(q->runs));
  }
  while ((l = set->pool)) {
    set->pool = l->next;
    PetscCall(PetscFree(l->sstage));
    PetscCall(PetscFree(l->rstage));
    PetscCall(PetscFree(l->rptr));
    PetscCall(PetscFree(l));
  }
  PetscCall(PetscFree(set->send));
  PetscCall(PetscFree(set->recv));
  PetscCall(PetscFree(set));
  PetscFunctionReturn(0);
}

typedef struct {
  int          ok;
  int          pad;
  dchan_wire_t wire;
} DChanWireMsg;

/* Collective over the SF: the channels of one unit size and direction. */
static PetscErrorCode DChanSetCreate(PetscSF sf, size_t ub, PetscSFDirection dir, DChanSet *out)
{
  PetscSF_DChan     *s    = (PetscSF_DChan *)sf->data;
  MPI_Comm           comm = PetscObjectComm((PetscObject)sf);
  dchan_ctx_t       *ctx  = s->dc->ctx;
  DChanSet           set;
  DChanWireMsg      *smsg = NULL, *rmsg = NULL;
  MPI_Request       *reqs = NULL, red;
  PetscMPIInt        ok = 1, gok = 0, me;
  PetscInt           i, n, nl, nlr, nir;
  const PetscInt    *lidx, *loff, *iidx = s->irootloc, *ioff = s->ioffset;
  const PetscMPIInt *lranks;
  dchan_handle_attr_t ha;

  PetscFunctionBegin;
  PetscCallMPI(MPI_Comm_rank(comm, &me));
  /* Remote neighbours only; the same-rank part is a copy. */
  PetscCall(PetscSFGetRootRanks(sf, &nl, &lranks, &loff, &lidx, NULL));
  for (i = 0, nlr = 0; i < nl; i++) nlr += lranks[i] != me;
  for (i = 0, nir = 0; i < s->niranks; i++) nir += s->iranks[i] != me;
  PetscCall(PetscNew(&set));
  set->ub  = ub;
  set->dir = dir;
  /* Bcast: I send to the ranks whose leaves use my roots and receive
   * from the ranks that own roots of my leaves; Reduce the other way. */
  set->nsend = dir == PETSCSF_ROOT2LEAF ? nir : nlr;
  set->nrecv = dir == PETSCSF_ROOT2LEAF ? nlr : nir;
  PetscCall(PetscCalloc1(set->nsend, &set->send));
  PetscCall(PetscCalloc1(set->nrecv, &set->recv));
  for (i = 0, n = 0; i < nl; i++) {
    DChanPeer *p;
    if (lranks[i] == me) continue;
    p       = dir == PETSCSF_ROOT2LEAF ? &set->recv[n++] : &set->send[n++];
    p->rank = lranks[i];
    p->cnt  = loff[i + 1] - loff[i];
    p->idx  = lidx + loff[i];
  }
  /* In the basic SF's order (ascending rank): reductions then add up
   * in the same order and give the same bits. */
  for (i = 0, n = 0; i < s->niranks; i++) {
    DChanPeer *p;
    if (s->iranks[i] == me) continue;
    p       = dir == PETSCSF_ROOT2LEAF ? &set->send[n++] : &set->recv[n++];
    p->rank = s->iranks[i];
    p->cnt  = ioff[i + 1] - ioff[i];
    p->idx  = iidx + ioff[i];
  }
  for (i = 0; i < set->nsend; i++) PetscCall(DChanRunsBuild(set->send[i].cnt, set->send[i].idx, NULL, &set->send[i].nruns, &set->send[i].runs));
  for (i = 0; i < set->nrecv; i++) PetscCall(DChanRunsBuild(set->recv[i].cnt, set->recv[i].idx, NULL, &set->recv[i].nruns, &set->recv[i].runs));
  for (i = 0; i < set->nsend; i++) {
    DChanPeer *p = &set->send[i];
    p->bytes     = DChanRound8((size_t)p->cnt * ub) + 8;
    p->off       = set->sbytes;
    set->sbytes += p->bytes;
    if (p->bytes > (size_t)s->maxbytes) ok = 0;
  }
  for (i = 0; i < set->nrecv; i++) {
    DChanPeer *q = &set->recv[i];
    q->bytes     = DChanRound8((size_t)q->cnt * ub) + 8;
    q->off       = set->rbytes;
    set->rbytes += q->bytes;
    if (q->bytes > (size_t)s->maxbytes) ok = 0;
  }
  PetscCall(PetscCalloc3(set->nrecv, &smsg, set->nsend, &rmsg, set->nsend + set->nrecv, &reqs));
  /* The wire exchange below calls MPI directly, not through petsclog.h's
   * counting macros: -log_view counts the channels' messages instead. */
  dchan_handle_attr_init(&ha);
  ha.credit = 1;
  ha.depth  = (int)s->depth;
  for (i = 0; i < set->nrecv; i++) {
    DChanPeer *q = &set->recv[i];
    int        rc = DCHAN_ERR_SIZE;
    if (ok) {
      rc = dchan_alloc(ctx, (size_t)s->depth * q->bytes, &q->buf);
      if (rc == DCHAN_SUCCESS) rc = dchan_create_handle_attr(ctx, q->rank, q->buf, q->bytes, 0, DChanArrived, q, &ha, &q->h);
      if (rc == DCHAN_SUCCESS) rc = dchan_handle_export(q->h, &smsg[i].wire);
      if (rc != DCHAN_SUCCESS) PetscCall(PetscInfo(sf, "dchan SF: receive channel from rank %d (%zu bytes): %s\n", (int)q->rank, q->bytes, dchan_strerror(rc)));
    }
    smsg[i].ok = rc == DCHAN_SUCCESS;
    if (!smsg[i].ok) ok = 0;
    PetscCallMPI((MPI_Isend)(&smsg[i], (PetscMPIInt)sizeof(DChanWireMsg), MPI_BYTE, q->rank, s->tagwire, comm, &reqs[i]));
  }
  for (i = 0; i < set->nsend; i++) PetscCallMPI((MPI_Irecv)(&rmsg[i], (PetscMPIInt)sizeof(DChanWireMsg), MPI_BYTE, set->send[i].rank, s->tagwire, comm, &reqs[set->nrecv + i]));
  PetscCall(DChanWaitMPI((PetscMPIInt)(set->nsend + set->nrecv), reqs));
  for (i = 0; i < set->nsend; i++) {
    DChanPeer *p = &set->send[i];
    int        rc;
    if (!ok || !rmsg[i].ok) {
      ok = 0;
      continue;
    }
    rc = dchan_alloc(ctx, p->bytes, &p->buf);
    if (rc == DCHAN_SUCCESS) rc = dchan_assoc_local(ctx, &rmsg[i].wire, p->buf, p->bytes, &p->h);
    if (rc != DCHAN_SUCCESS) {
      PetscCall(PetscInfo(sf, "dchan SF: send channel to rank %d (%zu bytes): %s\n", (int)p->rank, p->bytes, dchan_strerror(rc)));
      ok = 0;
    }
  }
  PetscCall(PetscFree3(smsg, rmsg, reqs));
  PetscCallMPI(MPI_Iallreduce(&ok, &gok, 1, MPI_INT, MPI_MIN, comm, &red));
  PetscCall(DChanWaitMPI(1, &red));
  set->native = gok ? PETSC_TRUE : PETSC_FALSE;
  if (!set->native) {
    /* Forwarded for good: free the channels now. */
    DChanSet empty;
    PetscCall(PetscInfo(sf, "dchan SF: unit of %zu bytes, %s: channels unavailable on some rank, using the basic SF\n", ub, dir == PETSCSF_ROOT2LEAF ? "bcast" : "reduce"));
    PetscCall(DChanSetDestroy(s, set));
    PetscCall(PetscNew(&empty));
    empty->ub  = ub;
    empty->dir = dir;
    set        = empty;
  }
  set->next = s->sets;
  s->sets   = set;
  *out      = set;
  /* PETSc 3.18 has no -sf_view of its own: offer it once the first
   * channels are open, so that the view names their provider. */
  if (!s->viewed) {
    s->viewed = PETSC_TRUE;
    PetscCall(PetscSFViewFromOptions(sf, NULL, "-sf_view"));
  }
  PetscFunctionReturn(0);
}

static PetscErrorCode DChanLinkGet(DChanSet set, DChanLink *out)
{
  DChanLink l = set->pool;

  PetscFunctionBegin;
  if (l) {
    set->pool = l->next;
  } else {
    PetscCall(PetscNew(&l));
    PetscCall(PetscCalloc1(set->nrecv ? set->nrecv : 1, &l->rptr));
  }
  l->next   = NULL;
  l->nrdone = 0;
  l->npend  = 0;
  *out      = l;
  PetscFunctionReturn(0);
}

static PetscErrorCode DChanLinkRemove(PetscSF_DChan *s, DChanLink l)
{
  DChanLink *p;

  PetscFunctionBegin;
  for (p = &s->links; *p; p = &(*p)->next) {
    if (*p == l) {
      *p = l->next;
      break;
    }
  }
  if (l->set) {
    l->next        = l->set->pool;
    l->set->pool   = l;
  } else {
    PetscCall(PetscFree(l->rptr));
    PetscCall(PetscFree(l));
  }
  if (!s->links) DChanBusyRemove(s);
  PetscFunctionReturn(0);
}

static void DChanLinkAppend(PetscSF_DChan *s, DChanLink l)
{
  DChanLink *p = &s->links;
  while (*p) p = &(*p)->next;
  *p = l;
  DChanBusyAdd(s);
}

static PetscErrorCode DChanLinkFind(PetscSF_DChan *s, PetscSFDirection dir, MPI_Datatype unit, const void *rootdata, const void *leafdata, DChanLink *out)
{
  DChanLink l;

  PetscFunctionBegin;
  for (l = s->links; l; l = l->next) {
    if (l->dir == dir && l->unit == unit && l->rootdata == rootdata && l->leafdata == leafdata) {
      *out = l;
      PetscFunctionReturn(0);
    }
  }
  SETERRQ(PETSC_COMM_SELF, PETSC_ERR_ARG_WRONGSTATE, "dchan SF: %s End called without a matching Begin on the same unit, root and leaf data", dir == PETSCSF_ROOT2LEAF ? "Bcast" : "Reduce");
}

/* ---------------------------------------------------------------------
 * Bcast and Reduce
 * ------------------------------------------------------------------- */

/* The same-rank part, as the basic SF does it: in the order of the
 * leaves that reference this rank (runs: a = leaf index, b = root index). */
static PetscErrorCode DChanLocal(PetscSF sf, PetscSFDirection dir, DChanKind k, DChanOpc o, PetscInt nel, size_t ub, const void *rootdata, void *leafdata)
{
  PetscSF_DChan  *s = (PetscSF_DChan *)sf->data;
  const DChanRun *runs = s->lruns;
  PetscInt        r, n = s->nlocal;
  char           *tmp = NULL;

  PetscFunctionBegin;
  if (!n) PetscFunctionReturn(0);
  if (!DChanRunsPay(s->nlruns, n) && rootdata != (const void *)leafdata) {
    if (dir == PETSCSF_ROOT2LEAF) DChanApply(k, o, nel, n, ub, (char *)leafdata, sf->rmine, (const char *)rootdata, sf->rremote);
    else DChanApply(k, o, nel, n, ub, (char *)rootdata, sf->rremote, (const char *)leafdata, sf->rmine);
    PetscFunctionReturn(0);
  }
  if (rootdata == (const void *)leafdata) {
    /* In place: read every source unit before writing any. */
    PetscCall(PetscMalloc1((size_t)n * ub, &tmp));
    for (r = 0; r < s->nlruns; r++)
      memcpy(tmp + (size_t)runs[r].pos * ub, (const char *)(dir == PETSCSF_ROOT2LEAF ? rootdata : leafdata) + (size_t)(dir == PETSCSF_ROOT2LEAF ? runs[r].b : runs[r].a) * ub, (size_t)runs[r].len * ub);
  }
  for (r = 0; r < s->nlruns; r++) {
    size_t      ra = (size_t)runs[r].a * ub, rb = (size_t)runs[r].b * ub;
    const char *src;
    char       *dst;
    if (dir == PETSCSF_ROOT2LEAF) {
      dst = (char *)leafdata + ra;
      src = tmp ? tmp + (size_t)runs[r].pos * ub : (const char *)rootdata + rb;
    } else {
      dst = (char *)rootdata + rb;
      src = tmp ? tmp + (size_t)runs[r].pos * ub : (const char *)leafdata + ra;
    }
    DChanApply(k, o, nel, runs[r].len, ub, dst, NULL, src, NULL);
  }
  PetscCall(PetscFree(tmp));
  PetscFunctionReturn(0);
}

static PetscErrorCode DChanBegin(PetscSF sf, PetscSFDirection dir, MPI_Datatype unit, PetscMemType rootmtype, const void *rootdata, PetscMemType leafmtype, void *leafdata, MPI_Op op)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;
  DChanKind      k = DK_NONE;
  DChanOpc       o = DChanOpCode(op);
  PetscInt       nel = 0, i;
  size_t         ub = 0;
  DChanSet       set = NULL;
  DChanLink      l;
  const char    *src;

  PetscFunctionBegin;
  if (!s->viewed && (!s->dc || s->fwdall)) {
    /* No channels will open: -sf_view at the first operation. */
    s->viewed = PETSC_TRUE;
    PetscCall(PetscSFViewFromOptions(sf, NULL, "-sf_view"));
  }
  if (!s->fwdall && rootmtype == PETSC_MEMTYPE_HOST && leafmtype == PETSC_MEMTYPE_HOST) {
    PetscCall(DChanUnitAnalyze(unit, &k, &nel, &ub));
    if (DChanOpValid(k, o) && !s->dc) {
      /* One rank: the local copy is all there is. */
      PetscCall(PetscNew(&l));
      l->dir      = dir;
      l->unit     = unit;
      l->rootdata = rootdata;
      l->leafdata = leafdata;
      l->op       = op;
      PetscCall(DChanLocal(sf, dir, k, o, nel, ub, rootdata, leafdata));
      DChanLinkAppend(s, l);
      PetscFunctionReturn(0);
    }
    if (DChanOpValid(k, o)) {
      for (set = s->sets; set; set = set->next)
        if (set->ub == ub && set->dir == dir) break;
      if (!set) PetscCall(DChanSetCreate(sf, ub, dir, &set));
      if (!set->native) set = NULL;
    }
  }
  if (!set) {
    PetscCall(PetscNew(&l));
    l->dir      = dir;
    l->unit     = unit;
    l->rootdata = rootdata;
    l->leafdata = leafdata;
    l->op       = op;
    l->fwd      = PETSC_TRUE;
    if (dir == PETSCSF_ROOT2LEAF) PetscCall((*s->inner->ops->BcastBegin)(s->inner, unit, rootmtype, rootdata, leafmtype, leafdata, op));
    else PetscCall((*s->inner->ops->ReduceBegin)(s->inner, unit, leafmtype, leafdata, rootmtype, (void *)rootdata, op));
    DChanLinkAppend(s, l);
    dchan_count.forwarded += 1;
    PetscFunctionReturn(0);
  }
  PetscCall(DChanLinkGet(set, &l));
  l->set      = set;
  l->dir      = dir;
  l->unit     = unit;
  l->rootdata = rootdata;
  l->leafdata = leafdata;
  l->op       = op;
  l->kind     = k;
  l->opc      = o;
  l->nel      = nel;
  l->seq      = set->posted++;
  src         = dir == PETSCSF_ROOT2LEAF ? (const char *)rootdata : (const char *)leafdata;
  for (i = 0; i < set->nsend; i++) {
    DChanPeer *p = &set->send[i];
    void      *dst = NULL;
    int        rc  = DCHAN_ERR_AGAIN;
    if (p->next == l->seq) {
      rc = dchan_put_ptr(p->h, &dst);
      if (rc != DCHAN_ERR_AGAIN) PetscCall(DChanCheck(rc, "dchan_put_ptr"));
    }
    if (rc == DCHAN_SUCCESS) {
      DChanRunsPack(p->cnt, p->idx, p->nruns, p->runs, ub, (char *)dst, src);
      DChanTrailer((char *)dst, p->bytes, l->seq);
      PetscCall(DChanCheck(dchan_put(p->h), "dchan_put"));
      p->next++;
    } else {
      /* No credit yet, or older messages wait: stage it for later. */
      if (!l->sstage) PetscCall(PetscMalloc1(set->sbytes, &l->sstage));
      DChanRunsPack(p->cnt, p->idx, p->nruns, p->runs, ub, l->sstage + p->off, src);
      DChanTrailer(l->sstage + p->off, p->bytes, l->seq);
      l->npend++;
      dchan_count.staged += 1;
    }
    dchan_count.bytes += (PetscLogDouble)p->bytes;
#if defined(PETSC_USE_LOG)
    /* In PETSc's message counts (-log_view) as the basic SF's sends. */
    petsc_isend_ct += 1;
    petsc_isend_len += (PetscLogDouble)((size_t)p->cnt * ub);
#endif
  }
#if defined(PETSC_USE_LOG)
  for (i = 0; i < set->nrecv; i++) {
    petsc_irecv_ct += 1;
    petsc_irecv_len += (PetscLogDouble)((size_t)set->recv[i].cnt * ub);
  }
#endif
  DChanLinkAppend(s, l);
  PetscCall(DChanLocal(sf, dir, k, o, nel, ub, rootdata, leafdata));
  if (dir == PETSCSF_ROOT2LEAF) dchan_count.native_bcast += 1;
  else dchan_count.native_reduce += 1;
  PetscFunctionReturn(0);
}

static PetscErrorCode DChanEnd(PetscSF sf, PetscSFDirection dir, MPI_Datatype unit, const void *rootdata, void *leafdata, MPI_Op op)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;
  DChanLink      l;
  DChanSet       set;
  PetscInt       i, spins = 0;
  char          *dst;

  PetscFunctionBegin;
  PetscCall(DChanLinkFind(s, dir, unit, rootdata, leafdata, &l));
  PetscCheck(l->op == op, PETSC_COMM_SELF, PETSC_ERR_ARG_WRONG, "dchan SF: the MPI_Op given to End differs from the one given to Begin");
  set = l->set;
  if (!set) {
    if (l->fwd && dir == PETSCSF_ROOT2LEAF) PetscCall((*s->inner->ops->BcastEnd)(s->inner, unit, rootdata, leafdata, op));
    else if (l->fwd) PetscCall((*s->inner->ops->ReduceEnd)(s->inner, unit, leafdata, (void *)rootdata, op));
    PetscCall(DChanLinkRemove(s, l));
    PetscFunctionReturn(0);
  }
  while (l->nrdone < set->nrecv) {
    PetscBool moved = PETSC_FALSE;
    PetscCall(DChanDrive(l, &moved));
    DChanIdle(&spins, moved);
  }
  /* Remote contributions in rank order, after the local ones (Begin). */
  dst = dir == PETSCSF_ROOT2LEAF ? (char *)leafdata : (char *)rootdata;
  for (i = 0; i < set->nrecv; i++) {
    DChanPeer *q = &set->recv[i];
    DChanRunsUnpack(l->kind, l->opc, l->nel, q->cnt, q->idx, q->nruns, q->runs, set->ub, dst, l->rptr[i]);
  }
  for (i = 0; i < set->nrecv; i++) {
    DChanPeer *q = &set->recv[i];
    if (q->held && q->taken == l->seq) {
      PetscCall(DChanCheck(dchan_ready(q->h), "dchan_ready"));
      q->held = PETSC_FALSE;
      q->taken++;
    }
  }
  /* Our own messages must be out before End returns: the peer may wait
   * for them while this rank goes on to a blocking MPI call. */
  spins = 0;
  while (l->npend > 0) {
    PetscBool moved = PETSC_FALSE;
    PetscCall(DChanDrive(NULL, &moved));
    DChanIdle(&spins, moved);
  }
  PetscCall(DChanLinkRemove(s, l));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFBcastBegin_DChan(PetscSF sf, MPI_Datatype unit, PetscMemType rootmtype, const void *rootdata, PetscMemType leafmtype, void *leafdata, MPI_Op op)
{
  PetscFunctionBegin;
  PetscCall(DChanBegin(sf, PETSCSF_ROOT2LEAF, unit, rootmtype, rootdata, leafmtype, leafdata, op));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFBcastEnd_DChan(PetscSF sf, MPI_Datatype unit, const void *rootdata, void *leafdata, MPI_Op op)
{
  PetscFunctionBegin;
  PetscCall(DChanEnd(sf, PETSCSF_ROOT2LEAF, unit, rootdata, leafdata, op));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFReduceBegin_DChan(PetscSF sf, MPI_Datatype unit, PetscMemType leafmtype, const void *leafdata, PetscMemType rootmtype, void *rootdata, MPI_Op op)
{
  PetscFunctionBegin;
  PetscCall(DChanBegin(sf, PETSCSF_LEAF2ROOT, unit, rootmtype, rootdata, leafmtype, (void *)leafdata, op));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFReduceEnd_DChan(PetscSF sf, MPI_Datatype unit, const void *leafdata, void *rootdata, MPI_Op op)
{
  PetscFunctionBegin;
  PetscCall(DChanEnd(sf, PETSCSF_LEAF2ROOT, unit, rootdata, (void *)leafdata, op));
  PetscFunctionReturn(0);
}

/* FetchAndOp needs root-side atomicity across leaves: the basic SF's. */
static PetscErrorCode PetscSFFetchAndOpBegin_DChan(PetscSF sf, MPI_Datatype unit, PetscMemType rootmtype, void *rootdata, PetscMemType leafmtype, const void *leafdata, void *leafupdate, MPI_Op op)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  PetscCall((*s->inner->ops->FetchAndOpBegin)(s->inner, unit, rootmtype, rootdata, leafmtype, leafdata, leafupdate, op));
  dchan_count.forwarded += 1;
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFFetchAndOpEnd_DChan(PetscSF sf, MPI_Datatype unit, void *rootdata, const void *leafdata, void *leafupdate, MPI_Op op)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  PetscCall((*s->inner->ops->FetchAndOpEnd)(s->inner, unit, rootdata, leafdata, leafupdate, op));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFBcastToZero_DChan(PetscSF sf, MPI_Datatype unit, PetscMemType rootmtype, const void *rootdata, PetscMemType leafmtype, void *leafdata)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  PetscCheck(s->inner && s->inner->ops->BcastToZero, PetscObjectComm((PetscObject)sf), PETSC_ERR_SUP, "dchan SF: BcastToZero needs a gather-pattern graph (PetscSFSetGraphWithPattern)");
  PetscCall((*s->inner->ops->BcastToZero)(s->inner, unit, rootmtype, rootdata, leafmtype, leafdata));
  dchan_count.forwarded += 1;
  PetscFunctionReturn(0);
}

/* ---------------------------------------------------------------------
 * Graph queries, setup, options, view
 * ------------------------------------------------------------------- */

/* The inner basic SF, on the same graph (or pattern). */
static PetscErrorCode DChanInnerCreate(PetscSF sf)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  if (s->inner) PetscFunctionReturn(0);
  PetscCall(PetscSFCreate(PetscObjectComm((PetscObject)sf), &s->inner));
  if (sf->pattern != PETSCSF_PATTERN_GENERAL) {
    PetscCall(PetscSFSetGraphWithPattern(s->inner, sf->map, sf->pattern));
  } else {
    PetscCall(PetscSFSetType(s->inner, PETSCSFBASIC));
    s->inner->allow_multi_leaves = sf->allow_multi_leaves; /* VecScatter's duplicated leaves */
    PetscCall(PetscSFSetGraph(s->inner, sf->nroots, sf->nleaves, sf->mine, PETSC_USE_POINTER, sf->remote, PETSC_USE_POINTER));
  }
  PetscCall(PetscSFSetRankOrder(s->inner, sf->rankorder));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFGetGraph_DChan(PetscSF sf, PetscInt *nroots, PetscInt *nleaves, const PetscInt **ilocal, const PetscSFNode **iremote)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  if (sf->pattern != PETSCSF_PATTERN_GENERAL && sf->graphset) {
    PetscCall(DChanInnerCreate(sf));
    PetscCall(PetscSFGetGraph(s->inner, nroots, nleaves, ilocal, iremote));
    PetscFunctionReturn(0);
  }
  if (nroots) *nroots = sf->nroots;
  if (nleaves) *nleaves = sf->nleaves;
  if (ilocal) *ilocal = sf->mine;
  if (iremote) *iremote = sf->remote;
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFGetRootRanks_DChan(PetscSF sf, PetscInt *nranks, const PetscMPIInt **ranks, const PetscInt **roffset, const PetscInt **rmine, const PetscInt **rremote)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  if (s->fwdall && sf->pattern != PETSCSF_PATTERN_GENERAL) {
    PetscCall(PetscSFGetRootRanks(s->inner, nranks, ranks, roffset, rmine, rremote));
    PetscFunctionReturn(0);
  }
  if (nranks) *nranks = sf->nranks;
  if (ranks) *ranks = sf->ranks;
  if (roffset) *roffset = sf->roffset;
  if (rmine) *rmine = sf->rmine;
  if (rremote) *rremote = sf->rremote;
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFGetLeafRanks_DChan(PetscSF sf, PetscInt *niranks, const PetscMPIInt **iranks, const PetscInt **ioffset, const PetscInt **irootloc)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;

  PetscFunctionBegin;
  PetscCall(PetscSFGetLeafRanks(s->inner, niranks, iranks, ioffset, irootloc));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFSetUp_DChan(PetscSF sf)
{
  PetscSF_DChan *s    = (PetscSF_DChan *)sf->data;
  MPI_Comm       comm = PetscObjectComm((PetscObject)sf);
  PetscMPIInt    size;
  MPI_Group      selfg;
  PetscBool      flg;
  PetscInt       depth;

  PetscFunctionBegin;
  /* Options also for SFs that never see PetscSFSetFromOptions. */
  {
    PetscOptions o = ((PetscObject)sf)->options;
    const char  *pre = ((PetscObject)sf)->prefix;
    PetscInt     v;
    PetscBool    b;
    PetscCall(PetscOptionsGetInt(o, pre, "-sf_dchan_depth", &depth, &flg));
    if (flg) s->depth = depth;
    PetscCall(PetscOptionsGetInt(o, pre, "-sf_dchan_max_message", &v, &flg));
    if (flg) s->maxbytes = v;
    PetscCall(PetscOptionsGetBool(o, pre, "-sf_dchan_forward", &b, &flg));
    if (flg) s->forward = b;
    PetscCall(PetscOptionsGetString(o, pre, "-sf_dchan_provider", s->init.provider, sizeof(s->init.provider), NULL));
    PetscCall(PetscOptionsGetEList(o, pre, "-sf_dchan_detect", DChanDetectNames, 4, &v, &flg));
    if (flg) s->init.detect = v;
  }
  PetscCheck(s->maxbytes >= 16, comm, PETSC_ERR_ARG_OUTOFRANGE, "dchan SF: -sf_dchan_max_message %" PetscInt_FMT " is below 16 bytes", s->maxbytes);
  PetscCheck(s->depth >= 1 && s->depth <= DCHAN_MAX_DEPTH, comm, PETSC_ERR_ARG_OUTOFRANGE, "dchan SF: -sf_dchan_depth %" PetscInt_FMT " is outside 1 ... %d", s->depth, DCHAN_MAX_DEPTH);
  PetscCall(DChanInnerCreate(sf));
  PetscCall(PetscSFSetUp(s->inner));
  s->fwdall = PETSC_FALSE;
  s->fwdwhy = NULL;
  if (sf->pattern != PETSCSF_PATTERN_GENERAL) {
    s->fwdall = PETSC_TRUE;
    s->fwdwhy = "pattern graph (allgather, gather, alltoall)";
    PetscFunctionReturn(0);
  }
  PetscCallMPI(MPI_Comm_group(PETSC_COMM_SELF, &selfg));
  PetscCall(PetscSFSetUpRanks(sf, selfg));
  PetscCallMPI(MPI_Group_free(&selfg));
  PetscCall(PetscSFGetLeafRanks(s->inner, &s->niranks, &s->iranks, &s->ioffset, &s->irootloc));
  s->nlocal = sf->ndranks ? sf->roffset[1] - sf->roffset[0] : 0;
  PetscCall(DChanRunsBuild(s->nlocal, sf->rmine, sf->rremote, &s->nlruns, &s->lruns));
  PetscCallMPI(MPI_Comm_size(comm, &size));
  if (s->forward) {
    s->fwdall = PETSC_TRUE;
    s->fwdwhy = "-sf_dchan_forward";
  } else if (size == 1) {
    s->fwdall = PETSC_FALSE; /* only the local copy: no channels */
  } else {
    PetscCall(DChanCommGet(comm, &s->init, &s->dc));
    if (!s->dc) {
      s->fwdall = PETSC_TRUE;
      s->fwdwhy = "dchan_init failed";
    } else {
      PetscCall(PetscCommGetNewTag(comm, &s->tagwire));
    }
  }
  dchan_count.sfs += 1;
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFReset_DChan(PetscSF sf)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;
  DChanSet       set;
  DChanLink      l;

  PetscFunctionBegin;
  while ((l = s->links)) {
    s->links = l->next;
    if (!l->set) {
      PetscCall(PetscFree(l->rptr));
      PetscCall(PetscFree(l));
    } else {
      l->next      = l->set->pool;
      l->set->pool = l;
    }
  }
  DChanBusyRemove(s);
  while ((set = s->sets)) {
    s->sets = set->next;
    PetscCall(DChanSetDestroy(s, set));
  }
  if (s->dc) DChanCommRelease(s->dc);
  s->dc = NULL;
  PetscCall(PetscSFDestroy(&s->inner));
  PetscCall(PetscFree(s->lruns));
  s->nlruns = s->nlocal = 0;
  s->niranks = 0;
  s->iranks                = NULL;
  s->ioffset = s->irootloc = NULL;
  s->fwdall                = PETSC_FALSE;
  s->fwdwhy                = NULL;
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFDestroy_DChan(PetscSF sf)
{
  PetscFunctionBegin;
  PetscCall(PetscSFReset_DChan(sf));
  PetscCall(PetscFree(sf->data));
  PetscFunctionReturn(0);
}


static PetscErrorCode PetscSFSetFromOptions_DChan(PetscSF sf, PetscOptionItems *PetscOptionsObject)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;
  PetscInt       detect = s->init.detect < 0 ? 0 : s->init.detect;
  PetscBool      flg;

  PetscFunctionBegin;
  PetscOptionsHeadBegin(PetscOptionsObject, "PetscSF dchan options");
  PetscCall(PetscOptionsInt("-sf_dchan_depth", "Slots per channel: operations a sender may run ahead of its receiver (1 ... 64)", "PetscSFSetType", s->depth, &s->depth, NULL));
  PetscCall(PetscOptionsEList("-sf_dchan_detect", "Arrival detection of the dchan context (set by the first dchan SF on a communicator)", "dchan_attr_init", DChanDetectNames, 4, DChanDetectNames[detect], &detect, &flg));
  if (flg) s->init.detect = detect;
  PetscCall(PetscOptionsString("-sf_dchan_provider", "dchan provider list, as DCHAN_PROVIDER (set by the first dchan SF on a communicator)", "dchan_attr_init", s->init.provider, s->init.provider, sizeof(s->init.provider), NULL));
  PetscCall(PetscOptionsInt("-sf_dchan_max_message", "Largest message (bytes) sent through a channel; larger go through the basic SF", "PetscSFSetType", s->maxbytes, &s->maxbytes, NULL));
  PetscCall(PetscOptionsBool("-sf_dchan_forward", "Forward every operation to the basic SF (for comparison)", "PetscSFSetType", s->forward, &s->forward, NULL));
  PetscOptionsHeadEnd();
  PetscCheck(s->depth >= 1 && s->depth <= DCHAN_MAX_DEPTH, PetscObjectComm((PetscObject)sf), PETSC_ERR_ARG_OUTOFRANGE, "dchan SF: -sf_dchan_depth %" PetscInt_FMT " is outside 1 ... %d", s->depth, DCHAN_MAX_DEPTH);
  PetscCheck(s->maxbytes >= 16, PetscObjectComm((PetscObject)sf), PETSC_ERR_ARG_OUTOFRANGE, "dchan SF: -sf_dchan_max_message %" PetscInt_FMT " is below 16 bytes", s->maxbytes);
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFView_DChan(PetscSF sf, PetscViewer viewer)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data;
  PetscBool      isascii;
  const char    *prov = NULL;
  PetscInt       npeers = 0, nsets = 0;
  PetscLogDouble sputs = 0, scopied = 0, sstalls = 0;
  DChanSet       set;

  PetscFunctionBegin;
  PetscCall(PetscObjectTypeCompare((PetscObject)viewer, PETSCVIEWERASCII, &isascii));
  if (!isascii) PetscFunctionReturn(0);
  if (!sf->setupcalled) {
    PetscCall(PetscViewerASCIIPrintf(viewer, "  dchan: not set up, depth %" PetscInt_FMT "\n", s->depth));
    PetscFunctionReturn(0);
  }
  if (s->fwdall) {
    PetscCall(PetscViewerASCIIPrintf(viewer, "  dchan: every operation through the basic SF (%s)\n", s->fwdwhy));
    PetscFunctionReturn(0);
  }
  if (!s->dc) {
    PetscCall(PetscViewerASCIIPrintf(viewer, "  dchan: one rank, local copies only\n"));
    PetscFunctionReturn(0);
  }
  char        provs[128] = "";
  for (set = s->sets; set; set = set->next) {
    PetscInt i;
    if (!set->native) continue;
    nsets++;
    /* Each provider that serves a channel, once (shm for this host's
     * peers, a network provider for the others). */
    for (i = 0; i < set->nsend + set->nrecv; i++) {
      dchan_handle_t *h = i < set->nsend ? set->send[i].h : set->recv[i - set->nsend].h;
      const char     *p = h ? dchan_handle_provider(h) : NULL;
      char            tok[40];
      if (!p) continue;
      PetscCall(PetscSNPrintf(tok, sizeof(tok), "%s%s", provs[0] ? "," : "", p));
      if (!strstr(provs, p) && strlen(provs) + strlen(tok) < sizeof(provs)) PetscCall(PetscStrlcat(provs, tok, sizeof(provs)));
    }
  }
  if (provs[0]) prov = provs;
  {
    /* Whether packing went straight into the peers' slots. */
    PetscLogDouble puts = 0, copied = 0, stalls = 0;
    for (set = s->sets; set; set = set->next) {
      PetscInt i;
      if (!set->native) continue;
      for (i = 0; i < set->nsend; i++) {
        dchan_handle_stats_t st;
        memset(&st, 0, sizeof(st));
        st.struct_size = sizeof(st);
        if (set->send[i].h && dchan_handle_stats(set->send[i].h, &st) == DCHAN_SUCCESS) {
          puts += (PetscLogDouble)st.puts;
          copied += (PetscLogDouble)st.copied;
          stalls += (PetscLogDouble)st.credit_stalls;
        }
      }
    }
    sputs = puts;
    scopied = copied;
    sstalls = stalls;
  }
  {
    PetscMPIInt me;
    PetscInt    i, a = 0, b = 0;
    PetscCallMPI(MPI_Comm_rank(PetscObjectComm((PetscObject)sf), &me));
    for (i = 0; i < sf->nranks; i++) a += sf->ranks[i] != me;
    for (i = 0; i < s->niranks; i++) b += s->iranks[i] != me;
    npeers = a > b ? a : b;
  }
  if (!prov) prov = dchan_provider_name(s->dc->ctx); /* no channel open yet */
  PetscCall(PetscViewerASCIIPushSynchronized(viewer));
  PetscCall(PetscViewerASCIISynchronizedPrintf(viewer, "  dchan: [%d] provider %s, %" PetscInt_FMT " neighbour(s), depth %" PetscInt_FMT ", %" PetscInt_FMT " channel set(s) open, %.0f puts (%.0f bytes copied by the library, %.0f credit stalls)\n", (int)PetscGlobalRank, prov ? prov : "unknown", npeers, s->depth, nsets, sputs, scopied, sstalls));
  PetscCall(PetscViewerFlush(viewer));
  PetscCall(PetscViewerASCIIPopSynchronized(viewer));
  PetscFunctionReturn(0);
}

static PetscErrorCode PetscSFDuplicate_DChan(PetscSF sf, PetscSFDuplicateOption opt, PetscSF newsf)
{
  PetscSF_DChan *s = (PetscSF_DChan *)sf->data, *t = (PetscSF_DChan *)newsf->data;

  PetscFunctionBegin;
  (void)opt;
  t->depth    = s->depth;
  t->maxbytes = s->maxbytes;
  t->forward  = s->forward;
  t->init     = s->init;
  PetscFunctionReturn(0);
}

PetscErrorCode PetscSFCreate_DChan(PetscSF sf)
{
  PetscSF_DChan *s;

  PetscFunctionBegin;
  PetscCall(PetscNew(&s));
  s->depth       = 2;
  s->maxbytes    = 64 * 1024 * 1024;
  s->init.detect = -1;
  s->sf          = sf;
  sf->data       = (void *)s;

  sf->ops->SetUp           = PetscSFSetUp_DChan;
  sf->ops->Reset           = PetscSFReset_DChan;
  sf->ops->Destroy         = PetscSFDestroy_DChan;
  sf->ops->SetFromOptions  = PetscSFSetFromOptions_DChan;
  sf->ops->View            = PetscSFView_DChan;
  sf->ops->Duplicate       = PetscSFDuplicate_DChan;
  sf->ops->BcastBegin      = PetscSFBcastBegin_DChan;
  sf->ops->BcastEnd        = PetscSFBcastEnd_DChan;
  sf->ops->ReduceBegin     = PetscSFReduceBegin_DChan;
  sf->ops->ReduceEnd       = PetscSFReduceEnd_DChan;
  sf->ops->FetchAndOpBegin = PetscSFFetchAndOpBegin_DChan;
  sf->ops->FetchAndOpEnd   = PetscSFFetchAndOpEnd_DChan;
  sf->ops->BcastToZero     = PetscSFBcastToZero_DChan;
  sf->ops->GetGraph        = PetscSFGetGraph_DChan;
  sf->ops->GetRootRanks    = PetscSFGetRootRanks_DChan;
  sf->ops->GetLeafRanks    = PetscSFGetLeafRanks_DChan;
  PetscFunctionReturn(0);
}

/* ---------------------------------------------------------------------
 * Registration and finalisation
 * ------------------------------------------------------------------- */

static PetscErrorCode DChanPetscFinalize(void)
{
  PetscBool flg = PETSC_FALSE;

  PetscFunctionBegin;
  PetscCall(PetscOptionsHasName(NULL, NULL, "-sf_dchan_summary", &flg));
  if (flg) {
    PetscLogDouble in[7], out[7];
    in[0] = dchan_count.sfs;
    in[1] = dchan_count.native_bcast;
    in[2] = dchan_count.native_reduce;
    in[3] = dchan_count.forwarded;
    in[4] = dchan_count.bytes;
    in[5] = dchan_count.staged;
    in[6] = dchan_count.copied_out;
    PetscCall(MPIU_Allreduce(in, out, 7, MPI_DOUBLE, MPI_SUM, PETSC_COMM_WORLD));
    PetscCall(PetscPrintf(PETSC_COMM_WORLD, "dchan SF summary (all ranks): %.0f SFs set up, %.0f bcasts and %.0f reduces on channels, %.0f operations forwarded to the basic SF, %.0f bytes put, %.0f messages staged for credit, %.0f copied out of order\n", out[0], out[1], out[2], out[3], out[4], out[5], out[6]));
  }
  /* Contexts whose communicator outlives PETSc's objects: finalise them
   * now, in creation order, while MPI still runs. */
  while (dchan_comms) {
    DChanComm c = dchan_comms;
    while (c && !c->attached) c = c->next;
    if (!c) break;
    PetscCallMPI(MPI_Comm_delete_attr(c->comm, dchan_keyval));
  }
  if (dchan_keyval != MPI_KEYVAL_INVALID) PetscCallMPI(MPI_Comm_free_keyval(&dchan_keyval));
  memset(&dchan_count, 0, sizeof(dchan_count));
  dchan_registered = PETSC_FALSE;
  PetscFunctionReturn(0);
}

PetscErrorCode DChanPetscSFRegister(void)
{
  PetscFunctionBegin;
  if (dchan_registered) PetscFunctionReturn(0);
  dchan_registered = PETSC_TRUE;
  PetscCall(PetscSFInitializePackage());
  PetscCall(PetscSFRegister(PETSCSFDCHAN, PetscSFCreate_DChan));
  PetscCall(PetscRegisterFinalize(DChanPetscFinalize));
  PetscFunctionReturn(0);
}

/* Run by PETSc when -dll_append (or PetscDLLibraryAppend) opens
 * libdchan_petsc: the name is PetscDLLibraryRegister_ followed by the
 * file name without "lib" and the suffix. */
PetscErrorCode PetscDLLibraryRegister_dchan_petsc(void)
{
  PetscFunctionBegin;
  PetscCall(DChanPetscSFRegister());
  PetscFunctionReturn(0);
}
