! SPDX-License-Identifier: BSD-3-Clause
! f_channels without MPI: nothing to start (singleton or PMIx bootstrap).
subroutine f_runtime_init()
end subroutine f_runtime_init

subroutine f_runtime_finalize()
end subroutine f_runtime_finalize
