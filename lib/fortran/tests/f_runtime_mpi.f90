! SPDX-License-Identifier: BSD-3-Clause
! f_channels with MPI: MPI initialised around the test, so that dchan can
! bootstrap from it and use the mpi provider (DCHAN_BOOTSTRAP=mpi).
subroutine f_runtime_init()
  use mpi
  implicit none
  integer :: ierr

  call MPI_Init(ierr)
end subroutine f_runtime_init

subroutine f_runtime_finalize()
  use mpi
  implicit none
  integer :: ierr

  call MPI_Finalize(ierr)
end subroutine f_runtime_finalize
