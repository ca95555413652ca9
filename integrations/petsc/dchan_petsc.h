/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * PetscSF type "dchan": PETSc star-forest communication over dchan
 * channels. A program selects it with -sf_type dchan once the type is
 * registered, either by loading libdchan_petsc at run time
 * (-dll_append /path/libdchan_petsc.so) or by calling
 * DChanPetscSFRegister() after PetscInitialize(). See dchan_petsc(7).
 */
#ifndef DCHAN_PETSC_H
#define DCHAN_PETSC_H

#include <petscsf.h>

#define PETSCSFDCHAN "dchan"

/* Registers the type; call it on every rank of PETSC_COMM_WORLD (it
 * also arranges the clean-up that PetscFinalize runs). Calling it again
 * does nothing. */
PETSC_EXTERN PetscErrorCode DChanPetscSFRegister(void);

#endif /* DCHAN_PETSC_H */
