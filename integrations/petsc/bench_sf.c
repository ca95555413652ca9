/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PETSc's SF types side by side on the same job: time per DMDA
 * global-to-local update (3D, stencil width 1, star), per MatMult of the
 * 7-point Laplacian, and per CG iteration (Jacobi) on that matrix, for
 * -sf_type basic, neighbor, window and dchan, over local sizes from
 * communication-dominated (a few points per rank) to compute-dominated.
 * Each size builds one DMDA and matrix per type; timings interleave the
 * types in rounds and keep each type's median round, the slowest rank's.
 *
 *   mpirun -np 2 bench_sf [-sizes 2,4,8,16,32,64] [-types basic,neighbor,window,dchan]
 *                         [-rounds 7] [-target_ms 20] [-min]
 *
 * -min shows each type's best round instead of its median (on a loaded
 * machine the best round is the one least disturbed by other work).
 *
 * Prints a table (one line per size and measure, with the ratio of dchan
 * to the best other type) and a RESULT line per row for scripts.
 */
#include <string.h>

#include <petscdmda.h>
#include <petscksp.h>

#include "dchan_petsc.h"

#define MAXT 8
#define MAXS 16

typedef struct {
  char type[32];
  DM   da;
  Mat  A;
  Vec  g, l, x, y, b;
  KSP  ksp;
  int  ok;
} Case;

static PetscErrorCode laplacian(DM da, Mat A)
{
  PetscInt    xs, ys, zs, xm, ym, zm, mx, my, mz, i, j, k;
  MatStencil  row, col[7];
  PetscScalar v[7];

  PetscFunctionBeginUser;
  PetscCall(DMDAGetInfo(da, NULL, &mx, &my, &mz, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL));
  PetscCall(DMDAGetCorners(da, &xs, &ys, &zs, &xm, &ym, &zm));
  for (k = zs; k < zs + zm; k++)
    for (j = ys; j < ys + ym; j++)
      for (i = xs; i < xs + xm; i++) {
        PetscInt n = 0;
        row.i = i; row.j = j; row.k = k;
        col[n] = row; v[n++] = 6.0;
        if (i > 0) { col[n] = row; col[n].i = i - 1; v[n++] = -1.0; }
        if (i < mx - 1) { col[n] = row; col[n].i = i + 1; v[n++] = -1.0; }
        if (j > 0) { col[n] = row; col[n].j = j - 1; v[n++] = -1.0; }
        if (j < my - 1) { col[n] = row; col[n].j = j + 1; v[n++] = -1.0; }
        if (k > 0) { col[n] = row; col[n].k = k - 1; v[n++] = -1.0; }
        if (k < mz - 1) { col[n] = row; col[n].k = k + 1; v[n++] = -1.0; }
        PetscCall(MatSetValuesStencil(A, 1, &row, n, col, v, INSERT_VALUES));
      }
  PetscCall(MatAssemblyBegin(A, MAT_FINAL_ASSEMBLY));
  PetscCall(MatAssemblyEnd(A, MAT_FINAL_ASSEMBLY));
  PetscFunctionReturn(0);
}

/* Everything that makes an SF reads -sf_type while the option is set. */
static PetscErrorCode case_create(Case *c, PetscInt m, PetscMPIInt size)
{
  PetscErrorCode ierr;

  PetscFunctionBeginUser;
  PetscCall(PetscOptionsSetValue(NULL, "-sf_type", c->type));
  PetscCall(PetscPushErrorHandler(PetscReturnErrorHandler, NULL));
  ierr = DMDACreate3d(PETSC_COMM_WORLD, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DM_BOUNDARY_NONE, DMDA_STENCIL_STAR, m * size, m, m, size, 1, 1, 1, 1, NULL, NULL, NULL, &c->da);
  if (!ierr) ierr = DMSetFromOptions(c->da);
  if (!ierr) ierr = DMSetUp(c->da);
  if (!ierr) ierr = DMCreateMatrix(c->da, &c->A);
  if (!ierr) ierr = laplacian(c->da, c->A);
  if (!ierr) ierr = DMCreateGlobalVector(c->da, &c->g);
  if (!ierr) ierr = DMCreateLocalVector(c->da, &c->l);
  if (!ierr) ierr = VecDuplicate(c->g, &c->x);
  if (!ierr) ierr = VecDuplicate(c->g, &c->y);
  if (!ierr) ierr = VecDuplicate(c->g, &c->b);
  if (!ierr) ierr = VecSetRandom(c->x, NULL);
  if (!ierr) ierr = VecSet(c->b, 1.0);
  if (!ierr) ierr = KSPCreate(PETSC_COMM_WORLD, &c->ksp);
  if (!ierr) ierr = KSPSetOperators(c->ksp, c->A, c->A);
  if (!ierr) ierr = KSPSetType(c->ksp, KSPCG);
  if (!ierr) ierr = KSPSetTolerances(c->ksp, 1e-30, 1e-30, PETSC_DEFAULT, 50);
  if (!ierr) {
    PC pc;
    ierr = KSPGetPC(c->ksp, &pc);
    if (!ierr) ierr = PCSetType(pc, PCJACOBI);
  }
  if (!ierr) ierr = KSPSetUp(c->ksp);
  PetscCall(PetscPopErrorHandler());
  PetscCall(PetscOptionsClearValue(NULL, "-sf_type"));
  c->ok = !ierr;
  if (ierr) PetscCall(PetscPrintf(PETSC_COMM_WORLD, "# type %s: setup failed (PETSc error %d), left out\n", c->type, (int)ierr));
  PetscFunctionReturn(0);
}

static PetscErrorCode case_destroy(Case *c)
{
  PetscFunctionBeginUser;
  PetscCall(KSPDestroy(&c->ksp));
  PetscCall(VecDestroy(&c->b));
  PetscCall(VecDestroy(&c->y));
  PetscCall(VecDestroy(&c->x));
  PetscCall(VecDestroy(&c->l));
  PetscCall(VecDestroy(&c->g));
  PetscCall(MatDestroy(&c->A));
  PetscCall(DMDestroy(&c->da));
  PetscFunctionReturn(0);
}

/* One timed batch: what = 0 global-to-local, 1 MatMult, 2 CG solve
 * (50 iterations). Seconds per operation (per iteration for CG), the
 * slowest rank's; a PETSc error gives a negative time. */
static PetscErrorCode batch(Case *c, int what, PetscInt reps, double *t)
{
  double         t0, t1, dt;
  PetscErrorCode ierr = 0;
  PetscInt       its  = 1;

  PetscFunctionBeginUser;
  PetscCallMPI(MPI_Barrier(PETSC_COMM_WORLD));
  PetscCall(PetscPushErrorHandler(PetscReturnErrorHandler, NULL));
  t0 = MPI_Wtime();
  for (PetscInt r = 0; r < reps && !ierr; r++) {
    if (what == 0) {
      ierr = DMGlobalToLocalBegin(c->da, c->g, INSERT_VALUES, c->l);
      if (!ierr) ierr = DMGlobalToLocalEnd(c->da, c->g, INSERT_VALUES, c->l);
    } else if (what == 1) {
      ierr = MatMult(c->A, c->x, c->y);
    } else {
      ierr = KSPSolve(c->ksp, c->b, c->y);
      if (!ierr) ierr = KSPGetIterationNumber(c->ksp, &its);
    }
  }
  t1 = MPI_Wtime();
  PetscCall(PetscPopErrorHandler());
  dt = ierr ? -1.0 : (t1 - t0) / (double)reps / (double)(its > 0 ? its : 1);
  PetscCallMPI(MPI_Allreduce(&dt, t, 1, MPI_DOUBLE, MPI_MAX, PETSC_COMM_WORLD));
  if (ierr) *t = -1.0;
  PetscFunctionReturn(0);
}

static int cmpd(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
  PetscInt    sizes[MAXS] = {2, 4, 8, 16, 32, 64}, nsizes = 6, rounds = 7;
  char      **tnames = NULL, tbuf[256] = "basic,neighbor,window,dchan";
  int         ntypes = 0;
  PetscReal   target_ms = 20.0;
  PetscBool   usemin    = PETSC_FALSE;
  PetscMPIInt size;
  const char *what[3] = {"g2l", "matmult", "cg_iter"};

  PetscCall(PetscInitialize(&argc, &argv, NULL, "SF types side by side on DMDA scatters and MatMult"));
  PetscCall(DChanPetscSFRegister());
  PetscCallMPI(MPI_Comm_size(PETSC_COMM_WORLD, &size));
  {
    PetscBool flg;
    PetscInt  n = MAXS;
    PetscCall(PetscOptionsGetIntArray(NULL, NULL, "-sizes", sizes, &n, &flg));
    if (flg) nsizes = n;
  }
  PetscCall(PetscOptionsGetInt(NULL, NULL, "-rounds", &rounds, NULL));
  PetscCall(PetscOptionsGetReal(NULL, NULL, "-target_ms", &target_ms, NULL));
  PetscCall(PetscOptionsGetString(NULL, NULL, "-types", tbuf, sizeof(tbuf), NULL));
  PetscCall(PetscOptionsGetBool(NULL, NULL, "-min", &usemin, NULL));
  PetscCall(PetscStrToArray(tbuf, ',', &ntypes, &tnames));
  PetscCheck(ntypes >= 1 && ntypes <= MAXT, PETSC_COMM_WORLD, PETSC_ERR_ARG_OUTOFRANGE, "-types: 1 to %d names", MAXT);
  if (rounds < 1) rounds = 1;
  if (rounds > 31) rounds = 31;

  PetscCall(PetscPrintf(PETSC_COMM_WORLD, "# %d ranks; local block m^3 per rank, split along x; time per operation in microseconds (%s of %d rounds, slowest rank)\n", (int)size, usemin ? "best" : "median", (int)rounds));
  PetscCall(PetscPrintf(PETSC_COMM_WORLD, "# %-8s %4s", "measure", "m"));
  for (int t = 0; t < ntypes; t++) PetscCall(PetscPrintf(PETSC_COMM_WORLD, " %10s", tnames[t]));
  PetscCall(PetscPrintf(PETSC_COMM_WORLD, "   dchan/best-other\n"));
  for (PetscInt s = 0; s < nsizes; s++) {
    Case     cs[MAXT];
    PetscInt m = sizes[s];
    memset(cs, 0, sizeof(cs));
    for (int t = 0; t < ntypes; t++) {
      PetscCall(PetscStrncpy(cs[t].type, tnames[t], sizeof(cs[t].type)));
      PetscCall(case_create(&cs[t], m, size));
    }
    for (int w = 0; w < 3; w++) {
      double   med[MAXT], best_[MAXT], shown[MAXT], samples[MAXT][32], probe = 0;
      PetscInt reps[MAXT];
      /* Per type, repetitions for about target_ms per batch (window's
       * fences make it far slower than the others). */
      for (int t = 0; t < ntypes; t++) {
        reps[t] = 1;
        if (!cs[t].ok) continue;
        PetscCall(batch(&cs[t], w, w == 2 ? 1 : 10, &probe)); /* warm-up */
        PetscCall(batch(&cs[t], w, w == 2 ? 1 : 10, &probe));
        if (probe > 0) reps[t] = (PetscInt)(target_ms * 1e-3 / (probe * (w == 2 ? 50 : 1)));
        if (reps[t] < 1) reps[t] = 1;
        if (w != 2 && reps[t] < 5) reps[t] = 5;
        if (reps[t] > 100000) reps[t] = 100000;
      }
      for (PetscInt r = 0; r < rounds; r++)
        for (int t = 0; t < ntypes; t++) {
          samples[t][r] = -1;
          if (cs[t].ok) PetscCall(batch(&cs[t], w, reps[t], &samples[t][r]));
        }
      for (int t = 0; t < ntypes; t++) {
        int bad = !cs[t].ok;
        for (PetscInt r = 0; r < rounds; r++) bad |= samples[t][r] < 0;
        qsort(samples[t], (size_t)rounds, sizeof(double), cmpd);
        med[t]   = bad ? -1 : samples[t][rounds / 2];
        best_[t] = bad ? -1 : samples[t][0];
        shown[t] = usemin ? best_[t] : med[t];
      }
      {
        double best = -1, dch = -1, bmed = -1, dmed = -1;
        PetscCall(PetscPrintf(PETSC_COMM_WORLD, "  %-8s %4" PetscInt_FMT, what[w], m));
        for (int t = 0; t < ntypes; t++) {
          if (shown[t] < 0) PetscCall(PetscPrintf(PETSC_COMM_WORLD, " %10s", "n/a"));
          else PetscCall(PetscPrintf(PETSC_COMM_WORLD, " %10.2f", shown[t] * 1e6));
          if (shown[t] < 0) continue;
          if (!strcmp(tnames[t], "dchan")) {
            dch  = shown[t];
            dmed = med[t];
          } else {
            if (best < 0 || shown[t] < best) best = shown[t];
            if (bmed < 0 || med[t] < bmed) bmed = med[t];
          }
        }
        if (dch > 0 && best > 0) PetscCall(PetscPrintf(PETSC_COMM_WORLD, "   %.3f\n", dch / best));
        else PetscCall(PetscPrintf(PETSC_COMM_WORLD, "   n/a\n"));
        PetscCall(PetscPrintf(PETSC_COMM_WORLD, "RESULT app=bench_sf mode=dchan ranks=%d measure=%s m=%" PetscInt_FMT, (int)size, what[w], m));
        for (int t = 0; t < ntypes; t++) PetscCall(PetscPrintf(PETSC_COMM_WORLD, " %s_min_us=%.3f %s_med_us=%.3f", tnames[t], best_[t] < 0 ? -1.0 : best_[t] * 1e6, tnames[t], med[t] < 0 ? -1.0 : med[t] * 1e6));
        PetscCall(PetscPrintf(PETSC_COMM_WORLD, " ratio_min=%.3f ratio_med=%.3f\n", (dch > 0 && best > 0) ? dch / best : -1.0, (dmed > 0 && bmed > 0) ? dmed / bmed : -1.0));
      }
    }
    for (int t = 0; t < ntypes; t++) PetscCall(case_destroy(&cs[t]));
  }
  PetscCall(PetscStrToArrayDestroy(ntypes, tnames));
  PetscCall(PetscFinalize());
  return 0;
}
