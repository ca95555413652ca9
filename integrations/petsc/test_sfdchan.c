/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dchan SF against PETSc's basic SF on the same graphs: every unit and
 * MPI_Op PETSc passes to Bcast and Reduce (native ones and forwarded ones),
 * several operations in flight on one SF, SFs on the world, on
 * sub-communicators with reordered ranks and on PETSC_COMM_SELF, depth 1
 * and 2, bad input through PETSc's error path, and 2000 SFs created and
 * destroyed without growing memory or descriptors. Results are compared
 * byte for byte: the dchan SF applies contributions in the basic SF's
 * order. Prints "test_sfdchan: OK ..." on rank 0 when everything held.
 */
#include <dirent.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include <petscsf.h>

#include "dchan_petsc.h"

static int failures = 0;
static int contiguous_graph = 0; /* make_graph's shape */

/* Equal data, ignoring the padding at the end of each unit of ext bytes
 * (struct units: PETSc leaves padding as it finds it). */
static int same_data(const char *a, const char *b, size_t bytes, size_t ext, size_t size)
{
  if (ext == size) return !memcmp(a, b, bytes);
  for (size_t i = 0; i + ext <= bytes; i += ext)
    if (memcmp(a + i, b + i, size)) return 0;
  return 1;
}

#define CHECK(cond, ...) \
  do { \
    if (!(cond)) { \
      failures++; \
      PetscCall(PetscPrintf(PETSC_COMM_SELF, "[%d] FAIL %s:%d: ", (int)PetscGlobalRank, __FILE__, __LINE__)); \
      PetscCall(PetscPrintf(PETSC_COMM_SELF, __VA_ARGS__)); \
      PetscCall(PetscPrintf(PETSC_COMM_SELF, "\n")); \
    } \
  } while (0)

typedef struct {
  const char  *name;
  MPI_Datatype unit;
  int          elem; /* 0 double, 1 float, 2 int, 3 int64, 4 uint, 5 schar, 6 uchar, 7 2int, 8 bytes */
} Unit;

typedef struct {
  const char *name;
  MPI_Op      op;
} Op;

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
  (void)dt;
  for (int i = 0; i < *len; i++) ((double *)inout)[i] += ((double *)in)[i];
}

/* Which ops a unit is tested with: those MPI defines for it. */
static PetscBool op_fits(int elem, const char *op)
{
  if (!strcmp(op, "replace")) return PETSC_TRUE;
  if (elem == 8) return PETSC_FALSE;
  if (elem == 7) return (PetscBool)(!strcmp(op, "maxloc") || !strcmp(op, "minloc"));
  if (!strcmp(op, "maxloc") || !strcmp(op, "minloc")) return PETSC_FALSE;
  if (!strcmp(op, "user")) return (PetscBool)(elem == 0);
  if (elem <= 1) return (PetscBool)(!strcmp(op, "sum") || !strcmp(op, "prod") || !strcmp(op, "max") || !strcmp(op, "min"));
  return PETSC_TRUE;
}

/* Deterministic contents, different per rank, array and seed; small
 * values so that products and sums stay exact and logical ops see zeros. */
static void fill(char *buf, size_t bytes, int elem, int seed)
{
  size_t i;
  int    r = (int)PetscGlobalRank;

  switch (elem) {
  case 0:
    for (i = 0; i < bytes / 8; i++) ((double *)buf)[i] = (double)((int)((i * 7 + (size_t)seed * 3 + (size_t)r * 5) % 11) - 4) * 0.5;
    break;
  case 1:
    for (i = 0; i < bytes / 4; i++) ((float *)buf)[i] = (float)((int)((i * 7 + (size_t)seed * 3 + (size_t)r * 5) % 11) - 4) * 0.25f;
    break;
  case 2:
  case 4:
  case 7:
    for (i = 0; i < bytes / 4; i++) ((int *)buf)[i] = (int)((i * 5 + (size_t)seed * 3 + (size_t)r * 7) % 9) - (elem == 4 ? 0 : 3);
    break;
  case 3:
    for (i = 0; i < bytes / 8; i++) ((int64_t *)buf)[i] = (int64_t)((i * 5 + (size_t)seed * 3 + (size_t)r * 7) % 9) - 3 + ((int64_t)1 << 40);
    break;
  default:
    for (i = 0; i < bytes; i++) buf[i] = (char)((i * 13 + (size_t)seed * 3 + (size_t)r * 7) % 7);
    break;
  }
}

/* A graph with remote and same-rank leaves, sparse leaf locations and
 * roots shared by several leaves (so reductions combine). */
static PetscErrorCode make_graph(MPI_Comm comm, PetscInt *nroots, PetscInt *nleaves, PetscInt **ilocal, PetscSFNode **iremote, PetscInt *leafspan)
{
  PetscMPIInt rank, size;
  PetscInt    i, nl;

  PetscFunctionBeginUser;
  PetscCallMPI(MPI_Comm_rank(comm, &rank));
  PetscCallMPI(MPI_Comm_size(comm, &size));
  *nroots = 5 + rank;
  nl      = contiguous_graph ? 20 + 5 * rank : 9 + 2 * rank;
  PetscCall(PetscMalloc1(nl, ilocal));
  PetscCall(PetscMalloc1(nl, iremote));
  for (i = 0; i < nl; i++) {
    if (contiguous_graph) {
      /* Blocks of 5 consecutive leaves on 5 consecutive roots: the
       * run-based packing path. */
      PetscMPIInt owner   = (PetscMPIInt)((rank + i / 5) % size);
      (*ilocal)[i]        = i + 1;
      (*iremote)[i].rank  = owner;
      (*iremote)[i].index = i % 5;
    } else {
      PetscMPIInt owner   = (PetscMPIInt)((rank + i) % size);
      (*ilocal)[i]        = 2 * (nl - 1 - i) + 1; /* reversed and sparse */
      (*iremote)[i].rank  = owner;
      (*iremote)[i].index = (i * 3) % (5 + owner);
    }
  }
  *nleaves  = nl;
  *leafspan = 2 * nl + 1;
  PetscFunctionReturn(0);
}

static PetscErrorCode make_sf(MPI_Comm comm, const char *type, const char *prefix, PetscSF *sf, PetscInt *nroots, PetscInt *leafspan)
{
  PetscInt     nl, *ilocal;
  PetscSFNode *iremote;

  PetscFunctionBeginUser;
  PetscCall(make_graph(comm, nroots, &nl, &ilocal, &iremote, leafspan));
  PetscCall(PetscSFCreate(comm, sf));
  if (prefix) PetscCall(PetscObjectSetOptionsPrefix((PetscObject)*sf, prefix));
  PetscCall(PetscSFSetType(*sf, type));
  PetscCall(PetscSFSetGraph(*sf, *nroots, nl, ilocal, PETSC_OWN_POINTER, iremote, PETSC_OWN_POINTER));
  PetscCall(PetscSFSetUp(*sf));
  PetscFunctionReturn(0);
}

/* Every unit x op, Bcast and Reduce, dchan against basic; then
 * operations in flight together (ends in reverse order). */
static PetscErrorCode check_comm(MPI_Comm comm, const char *what, const char *prefix, const Unit *units, int nunits, const Op *ops, int nops, int *ncmp)
{
  PetscSF  sfb, sfd;
  PetscInt nroots, span;

  PetscFunctionBeginUser;
  PetscCall(make_sf(comm, PETSCSFBASIC, NULL, &sfb, &nroots, &span));
  PetscCall(make_sf(comm, PETSCSFDCHAN, prefix, &sfd, &nroots, &span));
  for (int u = 0; u < nunits; u++) {
    MPI_Aint    lbnd, ext;
    size_t      ub, rb, lb, us;
    PetscMPIInt tsize;
    /* The extent: a struct unit has padding that PETSc strides over. */
    PetscCallMPI(MPI_Type_get_extent(units[u].unit, &lbnd, &ext));
    ub = (size_t)ext;
    PetscCallMPI(MPI_Type_size(units[u].unit, &tsize));
    us = (size_t)tsize;
    rb = ub * (size_t)nroots;
    lb = ub * (size_t)span;
    for (int o = 0; o < nops; o++) {
      char *r1, *r2, *l1, *l2;
      if (!op_fits(units[u].elem, ops[o].name)) continue;
      PetscCall(PetscMalloc4(rb + 1, &r1, rb + 1, &r2, lb + 1, &l1, lb + 1, &l2));
      /* Bcast */
      fill(r1, rb, units[u].elem, 1);
      memcpy(r2, r1, rb);
      fill(l1, lb, units[u].elem, 2);
      memcpy(l2, l1, lb);
      PetscCall(PetscSFBcastBegin(sfb, units[u].unit, r1, l1, ops[o].op));
      PetscCall(PetscSFBcastEnd(sfb, units[u].unit, r1, l1, ops[o].op));
      PetscCall(PetscSFBcastBegin(sfd, units[u].unit, r2, l2, ops[o].op));
      PetscCall(PetscSFBcastEnd(sfd, units[u].unit, r2, l2, ops[o].op));
      CHECK(same_data(l1, l2, lb, ub, us), "%s: bcast %s %s: leaves differ from basic", what, units[u].name, ops[o].name);
      CHECK(same_data(r1, r2, rb, ub, us), "%s: bcast %s %s: roots changed", what, units[u].name, ops[o].name);
      /* Reduce */
      fill(r1, rb, units[u].elem, 3);
      memcpy(r2, r1, rb);
      fill(l1, lb, units[u].elem, 4);
      memcpy(l2, l1, lb);
      PetscCall(PetscSFReduceBegin(sfb, units[u].unit, l1, r1, ops[o].op));
      PetscCall(PetscSFReduceEnd(sfb, units[u].unit, l1, r1, ops[o].op));
      PetscCall(PetscSFReduceBegin(sfd, units[u].unit, l2, r2, ops[o].op));
      PetscCall(PetscSFReduceEnd(sfd, units[u].unit, l2, r2, ops[o].op));
      CHECK(same_data(r1, r2, rb, ub, us), "%s: reduce %s %s: roots differ from basic", what, units[u].name, ops[o].name);
      *ncmp += 2;
      PetscCall(PetscFree4(r1, r2, l1, l2));
    }
  }
  /* Three in flight (more than the default depth of 2), bcasts and
   * reduces mixed, ended in another order than begun. */
  {
    const int K = 3;
    double   *rb_[3], *lb_[3], *rd[3], *ld[3];
    size_t    rbytes = sizeof(double) * (size_t)nroots, lbytes = sizeof(double) * (size_t)span;
    for (int k = 0; k < K; k++) {
      PetscCall(PetscMalloc4(nroots, &rb_[k], span, &lb_[k], nroots, &rd[k], span, &ld[k]));
      fill((char *)rb_[k], rbytes, 0, 10 + k);
      fill((char *)lb_[k], lbytes, 0, 20 + k);
      memcpy(rd[k], rb_[k], rbytes);
      memcpy(ld[k], lb_[k], lbytes);
    }
    /* reference, one at a time */
    PetscCall(PetscSFBcastBegin(sfb, MPIU_SCALAR, rb_[0], lb_[0], MPI_REPLACE));
    PetscCall(PetscSFBcastEnd(sfb, MPIU_SCALAR, rb_[0], lb_[0], MPI_REPLACE));
    PetscCall(PetscSFReduceBegin(sfb, MPIU_SCALAR, lb_[1], rb_[1], MPI_SUM));
    PetscCall(PetscSFReduceEnd(sfb, MPIU_SCALAR, lb_[1], rb_[1], MPI_SUM));
    PetscCall(PetscSFBcastBegin(sfb, MPIU_SCALAR, rb_[2], lb_[2], MPI_SUM));
    PetscCall(PetscSFBcastEnd(sfb, MPIU_SCALAR, rb_[2], lb_[2], MPI_SUM));
    /* dchan, all in flight */
    PetscCall(PetscSFBcastBegin(sfd, MPIU_SCALAR, rd[0], ld[0], MPI_REPLACE));
    PetscCall(PetscSFReduceBegin(sfd, MPIU_SCALAR, ld[1], rd[1], MPI_SUM));
    PetscCall(PetscSFBcastBegin(sfd, MPIU_SCALAR, rd[2], ld[2], MPI_SUM));
    PetscCall(PetscSFBcastEnd(sfd, MPIU_SCALAR, rd[2], ld[2], MPI_SUM));
    PetscCall(PetscSFBcastEnd(sfd, MPIU_SCALAR, rd[0], ld[0], MPI_REPLACE));
    PetscCall(PetscSFReduceEnd(sfd, MPIU_SCALAR, ld[1], rd[1], MPI_SUM));
    for (int k = 0; k < K; k++) {
      CHECK(!memcmp(lb_[k], ld[k], lbytes) && !memcmp(rb_[k], rd[k], rbytes), "%s: operation %d of three in flight differs from basic", what, k);
      PetscCall(PetscFree4(rb_[k], lb_[k], rd[k], ld[k]));
    }
    /* Five bcasts of the same unit in flight, ended in reverse. */
    {
      double *r[5], *l[5], *lref[5];
      for (int k = 0; k < 5; k++) {
        PetscCall(PetscMalloc3(nroots, &r[k], span, &l[k], span, &lref[k]));
        fill((char *)r[k], rbytes, 0, 30 + k);
        fill((char *)l[k], lbytes, 0, 40 + k);
        memcpy(lref[k], l[k], lbytes);
        PetscCall(PetscSFBcastBegin(sfb, MPIU_SCALAR, r[k], lref[k], MPI_REPLACE));
        PetscCall(PetscSFBcastEnd(sfb, MPIU_SCALAR, r[k], lref[k], MPI_REPLACE));
      }
      for (int k = 0; k < 5; k++) PetscCall(PetscSFBcastBegin(sfd, MPIU_SCALAR, r[k], l[k], MPI_REPLACE));
      for (int k = 4; k >= 0; k--) PetscCall(PetscSFBcastEnd(sfd, MPIU_SCALAR, r[k], l[k], MPI_REPLACE));
      for (int k = 0; k < 5; k++) {
        CHECK(!memcmp(l[k], lref[k], lbytes), "%s: bcast %d of five in flight differs from basic", what, k);
        PetscCall(PetscFree3(r[k], l[k], lref[k]));
      }
    }
    *ncmp += 8;
  }
  PetscCall(PetscSFDestroy(&sfb));
  PetscCall(PetscSFDestroy(&sfd));
  PetscFunctionReturn(0);
}

/* Bad input must come back through PETSc's error path. */
static PetscErrorCode check_errors(MPI_Comm comm)
{
  PetscSF        sf;
  PetscInt       nroots, span;
  PetscErrorCode ierr;
  double         r[16], l[64];

  PetscFunctionBeginUser;
  PetscCall(make_sf(comm, PETSCSFDCHAN, NULL, &sf, &nroots, &span));
  PetscCall(PetscPushErrorHandler(PetscReturnErrorHandler, NULL));
  ierr = PetscSFBcastEnd(sf, MPIU_SCALAR, r, l, MPI_REPLACE);
  PetscCall(PetscPopErrorHandler());
  CHECK(ierr == PETSC_ERR_ARG_WRONGSTATE, "End without Begin gave %d", (int)ierr);
  PetscCall(PetscSFDestroy(&sf));

  /* A depth outside 1 ... 64 stops SetUp with an error on every rank. */
  PetscCall(PetscOptionsSetValue(NULL, "-bad_sf_dchan_depth", "65"));
  PetscCall(PetscSFCreate(comm, &sf));
  PetscCall(PetscObjectSetOptionsPrefix((PetscObject)sf, "bad_"));
  PetscCall(PetscSFSetType(sf, PETSCSFDCHAN));
  {
    PetscInt     nl, *ilocal;
    PetscSFNode *iremote;
    PetscCall(make_graph(comm, &nroots, &nl, &ilocal, &iremote, &span));
    PetscCall(PetscSFSetGraph(sf, nroots, nl, ilocal, PETSC_OWN_POINTER, iremote, PETSC_OWN_POINTER));
  }
  PetscCall(PetscPushErrorHandler(PetscReturnErrorHandler, NULL));
  ierr = PetscSFSetUp(sf);
  PetscCall(PetscPopErrorHandler());
  CHECK(ierr == PETSC_ERR_ARG_OUTOFRANGE, "depth 65 gave %d", (int)ierr);
  PetscCall(PetscSFDestroy(&sf));
  PetscCall(PetscOptionsClearValue(NULL, "-bad_sf_dchan_depth"));
  PetscFunctionReturn(0);
}

static int count_fds(void)
{
  DIR           *d = opendir("/proc/self/fd");
  struct dirent *e;
  int            n = 0;
  if (!d) return -1;
  while ((e = readdir(d))) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* Create, use and destroy SFs in a loop: heap and descriptors must not grow.
 * The heap is measured over two halves of the loop and the smaller growth
 * reported: a leak grows both alike, while a pool that MPI or the allocator
 * enlarges once (Open MPI's free lists grow by whole chunks) shows in one. */
static PetscErrorCode check_churn(MPI_Comm comm, int n, size_t *growth, int *fdgrowth)
{
  size_t before = 0, mid = 0;
  int    fds    = 0;

  PetscFunctionBeginUser;
  for (int i = 0; i < 100 + n; i++) {
    PetscSF  sf;
    PetscInt nroots, span;
    double   r[32], l[64];
    if (i == 100) {
      before = mallinfo2().uordblks;
      fds    = count_fds();
    }
    if (i == 100 + n / 2) mid = mallinfo2().uordblks;
    PetscCall(make_sf(comm, PETSCSFDCHAN, NULL, &sf, &nroots, &span));
    for (PetscInt k = 0; k < nroots; k++) r[k] = (double)k;
    PetscCall(PetscSFBcastBegin(sf, MPIU_SCALAR, r, l, MPI_REPLACE));
    PetscCall(PetscSFBcastEnd(sf, MPIU_SCALAR, r, l, MPI_REPLACE));
    PetscCall(PetscSFReduceBegin(sf, MPIU_INT, (PetscInt *)l, (PetscInt *)r, MPI_SUM));
    PetscCall(PetscSFReduceEnd(sf, MPIU_INT, (PetscInt *)l, (PetscInt *)r, MPI_SUM));
    PetscCall(PetscSFDestroy(&sf));
  }
  {
    size_t after = mallinfo2().uordblks;
    size_t g1    = mid > before ? mid - before : 0, g2 = after > mid ? after - mid : 0;
    *growth      = g1 < g2 ? g1 : g2;
    *fdgrowth    = count_fds() - fds;
  }
  PetscFunctionReturn(0);
}

int main(int argc, char **argv)
{
  PetscMPIInt  rank, size;
  MPI_Comm     sub, rev;
  MPI_Datatype c3, c2i;
  MPI_Op       uop;
  int          ncmp = 0, fdg = 0;
  size_t       growth = 0;

  /* dchan keeps destroyed handles in a bounded quarantine (16384 by
   * default): keep it small so that the churn below reaches steady state
   * and any growth left is a leak. */
  setenv("DCHAN_QUARANTINE", "64", 0);
  PetscCall(PetscInitialize(&argc, &argv, NULL, "dchan SF against the basic SF"));
  PetscCall(DChanPetscSFRegister());
  PetscCallMPI(MPI_Comm_rank(PETSC_COMM_WORLD, &rank));
  PetscCallMPI(MPI_Comm_size(PETSC_COMM_WORLD, &size));
  PetscCallMPI(MPI_Type_contiguous(3, MPIU_SCALAR, &c3));
  PetscCallMPI(MPI_Type_commit(&c3));
  PetscCallMPI(MPI_Type_contiguous(2, MPIU_INT, &c2i));
  PetscCallMPI(MPI_Type_commit(&c2i));
  PetscCallMPI(MPI_Op_create(user_sum, 1, &uop));
  {
    const Unit units[] = {
      {"MPIU_SCALAR", MPIU_SCALAR, 0},
      {"MPIU_REAL", MPIU_REAL, 0},
      {"MPI_FLOAT", MPI_FLOAT, 1},
      {"MPIU_INT", MPIU_INT, 2},
      {"MPI_INT", MPI_INT, 2},
      {"MPIU_INT64", MPIU_INT64, 3},
      {"MPI_UNSIGNED", MPI_UNSIGNED, 4},
      {"MPI_SIGNED_CHAR", MPI_SIGNED_CHAR, 5},
      {"MPI_CHAR", MPI_CHAR, 5},
      {"MPI_UNSIGNED_CHAR", MPI_UNSIGNED_CHAR, 6},
      {"MPIU_2INT", MPIU_2INT, 7},
      {"MPI_BYTE", MPI_BYTE, 8},
      {"MPIU_BOOL", MPIU_BOOL, 8},
      {"3 x MPIU_SCALAR", c3, 0},
      {"2 x MPIU_INT", c2i, 2},
      {"MPIU_REAL_INT (forwarded)", MPIU_REAL_INT, 8},
    };
    const Op ops[] = {
      {"replace", MPI_REPLACE}, {"sum", MPI_SUM}, {"prod", MPI_PROD}, {"max", MPI_MAX}, {"min", MPI_MIN}, {"land", MPI_LAND}, {"lor", MPI_LOR}, {"lxor", MPI_LXOR}, {"band", MPI_BAND}, {"bor", MPI_BOR}, {"bxor", MPI_BXOR}, {"maxloc", MPI_MAXLOC}, {"minloc", MPI_MINLOC}, {"user", uop},
    };
    const int nu = (int)(sizeof(units) / sizeof(units[0])), no = (int)(sizeof(ops) / sizeof(ops[0]));

    PetscCall(check_comm(PETSC_COMM_WORLD, "world", NULL, units, nu, ops, no, &ncmp));
    PetscCall(PetscOptionsSetValue(NULL, "-d1_sf_dchan_depth", "1"));
    PetscCall(check_comm(PETSC_COMM_WORLD, "world depth 1", "d1_", units, nu, ops, no, &ncmp));
    PetscCall(check_comm(PETSC_COMM_SELF, "self", NULL, units, nu, ops, no, &ncmp));
    contiguous_graph = 1;
    PetscCall(check_comm(PETSC_COMM_WORLD, "world, contiguous blocks", NULL, units, nu, ops, no, &ncmp));
    PetscCall(check_comm(PETSC_COMM_SELF, "self, contiguous blocks", NULL, units, nu, ops, no, &ncmp));
    contiguous_graph = 0;
    /* A sub-communicator without rank 0 (where there are 3 or more ranks),
     * with ranks in reverse order: ranks must be translated. */
    PetscCallMPI(MPI_Comm_split(PETSC_COMM_WORLD, (size > 2 && rank == 0) ? MPI_UNDEFINED : 1, -rank, &sub));
    if (sub != MPI_COMM_NULL) {
      PetscCall(check_comm(sub, "sub-communicator", NULL, units, nu, ops, no, &ncmp));
      PetscCallMPI(MPI_Comm_free(&sub));
    }
    PetscCallMPI(MPI_Comm_split(PETSC_COMM_WORLD, 0, size - rank, &rev));
    PetscCall(check_comm(rev, "reversed world", "d1_", units, 2, ops, 2, &ncmp));
    PetscCallMPI(MPI_Comm_free(&rev));
  }
  PetscCall(check_errors(PETSC_COMM_WORLD));
  {
    /* -sf_view's text: the type and the provider that carries the traffic
     * (checked by the driver script). */
    PetscSF  sf;
    PetscInt nroots, span;
    double   r[32], l[64];
    PetscCall(make_sf(PETSC_COMM_WORLD, PETSCSFDCHAN, NULL, &sf, &nroots, &span));
    for (PetscInt k = 0; k < nroots; k++) r[k] = (double)k;
    PetscCall(PetscSFBcastBegin(sf, MPIU_SCALAR, r, l, MPI_REPLACE));
    PetscCall(PetscSFBcastEnd(sf, MPIU_SCALAR, r, l, MPI_REPLACE));
    PetscCall(PetscSFView(sf, PETSC_VIEWER_STDOUT_WORLD));
    PetscCall(PetscSFDestroy(&sf));
  }
  PetscCall(check_churn(PETSC_COMM_WORLD, 2000, &growth, &fdg));
  /* A leak of 32 bytes per SF would show as 32 kB in each half; what
   * remains below that is allocator noise. */
  CHECK(growth < 32 * 1024, "each half of 2000 SFs grew the heap by %zu bytes at least", growth);
  CHECK(fdg <= 0, "2000 SFs left %d more descriptors open", fdg);
  PetscCallMPI(MPI_Type_free(&c3));
  PetscCallMPI(MPI_Type_free(&c2i));
  PetscCallMPI(MPI_Op_free(&uop));
  {
    int allfail = 0;
    PetscCallMPI(MPI_Allreduce(&failures, &allfail, 1, MPI_INT, MPI_SUM, PETSC_COMM_WORLD));
    if (!allfail) PetscCall(PetscPrintf(PETSC_COMM_WORLD, "test_sfdchan: OK on %d ranks: %d comparisons with the basic SF per rank 0, 2000 SFs churned (heap +%zu bytes, descriptors %+d)\n", (int)size, ncmp, growth, fdg));
    else PetscCall(PetscPrintf(PETSC_COMM_WORLD, "test_sfdchan: %d failures\n", allfail));
    failures = allfail;
  }
  PetscCall(PetscFinalize());
  return failures ? 1 : 0;
}
