! SPDX-License-Identifier: BSD-3-Clause
! Two ranks, one channel each way, in ping-pong (Fortran, module dchan).
module pingpong_cb
  use dchan
  implicit none
contains
  ! Runs inside dchan_progress or dchan_wait: counts arrivals in arg.
  subroutine on_arrival(h, arg) bind(C)
    type(c_ptr), value :: h, arg
    integer(c_int), pointer :: got

    call c_f_pointer(arg, got)
    got = got + 1
  end subroutine on_arrival
end module pingpong_cb

program pingpong
  use mpi
  use pingpong_cb
  implicit none
  integer, parameter :: N = 4096      ! doubles per block
  integer, parameter :: ITERS = 1000
  ! target: the library gets their addresses; asynchronous: it writes
  ! rbuf, and reads sbuf, while the program is in other calls.
  real(c_double), target, asynchronous :: rbuf(N), sbuf(N)
  integer(c_int), target, volatile :: got = 0
  type(dchan_attr_t) :: attr
  type(dchan_wire_t) :: mine, theirs
  type(c_ptr) :: ctx, rh, sh
  integer(c_int) :: rc
  integer :: rank, nranks, peer, it, ierr
  logical :: bad = .false., failed

  call MPI_Init(ierr)                 ! dchan never does
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  if (nranks /= 2) call MPI_Abort(MPI_COMM_WORLD, 2, ierr)
  peer = 1 - rank

  call dchan_attr_init(attr)          ! defaults, then DCHAN_*
  rc = dchan_init(attr, ctx)          ! collective
  if (rc /= DCHAN_SUCCESS) then
    print "(2a)", "dchan_init: ", dchan_strerror_f(rc)
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if

  ! Receiver: publish rbuf to the peer, ship the wire form.
  rc = dchan_create_handle(ctx, peer, c_loc(rbuf), c_sizeof(rbuf), 0_c_int64_t, &
                           c_funloc(on_arrival), c_loc(got), rh)
  if (rc == DCHAN_SUCCESS) rc = dchan_handle_export(rh, mine)
  call MPI_Sendrecv(mine%bytes, DCHAN_WIRE_SIZE, MPI_BYTE, peer, 0, &
                    theirs%bytes, DCHAN_WIRE_SIZE, MPI_BYTE, peer, 0, &
                    MPI_COMM_WORLD, MPI_STATUS_IGNORE, ierr)
  ! Sender: bind sbuf to the peer's rbuf.
  if (rc == DCHAN_SUCCESS) &
    rc = dchan_assoc_local(ctx, theirs, c_loc(sbuf), c_sizeof(sbuf), sh)
  if (rc /= DCHAN_SUCCESS) then
    print "(2a)", "setup: ", dchan_strerror_f(rc)
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
  end if

  ! Ping-pong: a rank puts only after the peer's put told it that
  ! the peer re-armed: one put per armed period.
  do it = 0, ITERS - 1
    if (rank == 0) rc = send_block(it)
    do while (got == 0 .and. rc >= 0)
      rc = dchan_wait(ctx, 10000)     ! runs on_arrival
    end do
    if (rc < 0) exit
    got = 0
    bad = bad .or. rbuf(1) /= it .or. rbuf(N) /= it + N - 1
    rc = dchan_ready(rh)              ! done with rbuf: re-arm
    if (rank == 1 .and. rc == DCHAN_SUCCESS) rc = send_block(it)
    if (rc < 0) exit
  end do
  failed = rc < 0 .or. bad
  if (rc < 0) print "(a, i0, 2a)", "rank ", rank, ": ", dchan_strerror_f(rc)
  if (bad) print "(a, i0, a)", "rank ", rank, ": wrong data"
  if (rank == 0 .and. .not. failed) print "(i0, a)", ITERS, " round trips"

  ! No put may still be heading for a destroyed handle.
  rc = dchan_barrier(ctx)
  rc = dchan_handle_destroy(sh)
  rc = dchan_handle_destroy(rh)
  rc = dchan_finalize(ctx)            ! before MPI_Finalize
  call MPI_Finalize(ierr)
  if (failed) error stop 1

contains

  ! Refills sbuf once the last put is done with it, and puts it.
  integer(c_int) function send_block(v)
    integer, intent(in) :: v
    integer :: i

    do
      send_block = dchan_put_test(sh)
      if (send_block /= 0) exit
    end do
    if (send_block < 0) return
    sbuf = [(real(v + i - 1, c_double), i = 1, N)]
    send_block = dchan_put(sh)
  end function send_block
end program pingpong
