! SPDX-License-Identifier: BSD-3-Clause
!
! f_channels: channels driven from Fortran through module dchan, on any
! number of ranks (each rank sends to the next on a ring; one rank sends to
! itself). Run by tests/mprun, scenarios fortran-* in apps/scenarios:
!
!   --test exchange  puts of 8 B to 1 MiB, every word of every put checked,
!                    nothing written past the receive buffer, the counters;
!   --test badsize   dchan_assoc_local with the wrong size returns
!                    DCHAN_ERR_SIZE, and the channel then works;
!   --test rearm     the arrival callback copies the data and re-arms its
!                    own handle with dchan_ready;
!   --test garbage   wires of garbage and every one-byte corruption of a
!                    real wire return DCHAN_ERR_HANDLE, and the real wire
!                    then works.
!   --iters N        puts per channel (default 40)
!
! f_channels_nompi (singleton and pmix bootstraps) and f_channels (MPI
! initialised: the mpi bootstrap and provider) differ only in
! f_runtime_*.f90; wires travel by dchan_allgather in both.
program f_channels
  use dchan
  use f_testlib
  implicit none

  interface
    subroutine f_runtime_init()
    end subroutine f_runtime_init
    subroutine f_runtime_finalize()
    end subroutine f_runtime_finalize
  end interface

  ! SENTINEL's out-of-band pattern: negative, unlike every data word.
  integer(c_int64_t), parameter :: OOB = -6148914691236517206_c_int64_t
  type(dchan_attr_t) :: attr
  type(c_ptr) :: ctx
  character(len=32) :: test = 'exchange', arg
  integer :: iters = 40, nranks, to, from, k, ios
  integer(c_int) :: detect = -1

  call f_runtime_init()
  k = 1
  do while (k <= command_argument_count())
    call get_command_argument(k, arg)
    select case (arg)
    case ('--test')
      call get_command_argument(k + 1, test)
      k = k + 1
    case ('--iters')
      call get_command_argument(k + 1, arg)
      read (arg, *, iostat=ios) iters
      if (ios /= 0 .or. iters < 1) call fail('--iters wants a positive integer')
      k = k + 1
    case default
      call fail('unknown argument ' // trim(arg) // &
                ' (usage: f_channels [--test exchange|badsize|rearm|garbage] [--iters N])')
    end select
    k = k + 1
  end do

  call dchan_attr_init(attr)
  ! The library recorded the size of the structure it was given: the
  ! Fortran type's, which must be the C one's.
  if (attr%struct_size /= c_sizeof(attr)) call fail('dchan_attr_init: struct_size differs')
  if (attr%config_error /= 0) call fail('a DCHAN_* variable is malformed')
  call expect('dchan_init', dchan_init(attr, ctx), DCHAN_SUCCESS)
  my_rank = dchan_rank(ctx)
  nranks = dchan_nranks(ctx)
  if (my_rank < 0 .or. nranks < 1 .or. my_rank >= nranks) call fail('dchan_rank/dchan_nranks')
  if (dchan_rank(c_null_ptr) /= DCHAN_ERR_INVALID_ARG) call fail('dchan_rank(NULL)')
  if (len(dchan_provider_name_f(ctx)) == 0) call fail('dchan_provider_name')
  if (dchan_version() /= DCHAN_VERSION_NUMBER) call fail('dchan_version differs from the module''s')
  to = modulo(my_rank + 1, nranks)
  from = modulo(my_rank - 1, nranks)

  select case (test)
  case ('exchange')
    call test_exchange()
  case ('badsize')
    call test_badsize()
  case ('rearm')
    call test_rearm()
  case ('garbage')
    call test_garbage()
  case default
    call fail('unknown test ' // trim(test))
  end select

  call expect('dchan_finalize', dchan_finalize(ctx), DCHAN_SUCCESS)
  call f_runtime_finalize()

contains

  ! A receive handle from `from' on rbuf(1:n), and the send handle to `to'
  ! made from that rank's wire, with the given size in bytes.
  subroutine make_channel(rbuf, n, fn, st, rh, wires)
    integer(c_int64_t), target, contiguous, intent(inout) :: rbuf(:)
    integer, intent(in) :: n
    ! By value: gfortran puts c_funloc(p) given to a reference argument in
    ! .rodata with an absolute relocation (a text relocation in a PIE).
    type(c_funptr), value :: fn
    type(channel_state), target, intent(inout) :: st
    type(c_ptr), intent(out) :: rh
    type(dchan_wire_t), contiguous, intent(out) :: wires(0:)
    type(dchan_wire_t) :: mine

    call expect('dchan_create_handle', &
                dchan_create_handle(ctx, from, c_loc(rbuf), int(8 * n, c_size_t), OOB, fn, &
                                    c_loc(st), rh), DCHAN_SUCCESS)
    st%h = rh
    detect = dchan_handle_detect(rh)
    if (detect < 0) call fail('dchan_handle_detect')
    if (len(dchan_handle_provider_f(rh)) == 0) call fail('dchan_handle_provider')
    call expect('dchan_handle_export', dchan_handle_export(rh, mine), DCHAN_SUCCESS)
    call share_wires(ctx, mine, wires)
  end subroutine make_channel

  ! One put per iteration from sbuf, each checked word by word at the
  ! receiver; the barrier keeps one put per armed period.
  subroutine run_puts(sh, sbuf, rbuf, n, st, first, last)
    type(c_ptr), intent(in) :: sh
    integer(c_int64_t), intent(inout) :: sbuf(:)
    ! Written by the library inside wait_arrivals, which does not get it.
    integer(c_int64_t), volatile :: rbuf(:)
    integer, intent(in) :: n, first, last
    type(channel_state), intent(inout), volatile :: st
    integer :: it, i, nbad

    do it = first, last
      call wait_put_done(sh)
      sbuf(1:n) = pattern(my_rank, it, [(i, i = 1, n)])
      call expect('dchan_put', dchan_put(sh), DCHAN_SUCCESS)
      call wait_arrivals(ctx, st, it)
      nbad = count(rbuf(1:n) /= pattern(from, it, [(i, i = 1, n)]))
      if (nbad /= 0) call fail('wrong data in a put')
      call expect('dchan_ready', dchan_ready(st%h), DCHAN_SUCCESS)
      call expect('dchan_barrier', dchan_barrier(ctx), DCHAN_SUCCESS)
    end do
  end subroutine run_puts

  subroutine close_channel(sh, rh)
    type(c_ptr), intent(in) :: sh, rh

    call wait_put_done(sh)
    ! No put may still be heading for a handle about to go.
    call expect('dchan_barrier', dchan_barrier(ctx), DCHAN_SUCCESS)
    call expect('dchan_handle_destroy', dchan_handle_destroy(sh), DCHAN_SUCCESS)
    call expect('dchan_handle_destroy', dchan_handle_destroy(rh), DCHAN_SUCCESS)
  end subroutine close_channel

  subroutine test_exchange()
    ! int64 words: 8 B to 1 MiB.
    integer, parameter :: sizes(5) = [1, 125, 512, 8192, 131072]
    integer(c_int64_t), parameter :: GUARD = 7777777777_c_int64_t
    integer(c_int64_t), allocatable, target :: rbuf(:), sbuf(:)
    type(channel_state), target, volatile :: st
    type(dchan_wire_t) :: wires(0:nranks - 1)
    type(dchan_stats_t) :: stats
    type(c_ptr) :: rh, sh
    integer :: s, n

    do s = 1, size(sizes)
      n = sizes(s)
      ! One word past the channel's bytes, which no put may touch.
      allocate (rbuf(n + 1), sbuf(n))
      rbuf(n + 1) = GUARD
      st = channel_state()
      call make_channel(rbuf, n, c_funloc(count_arrival), st, rh, wires)
      call expect('dchan_assoc_local', &
                  dchan_assoc_local(ctx, wires(to), c_loc(sbuf), int(8 * n, c_size_t), sh), &
                  DCHAN_SUCCESS)
      call run_puts(sh, sbuf, rbuf, n, st, 1, iters)
      if (rbuf(n + 1) /= GUARD) call fail('a put wrote past the receive buffer')
      call close_channel(sh, rh)
      deallocate (rbuf, sbuf)
    end do
    call expect('dchan_get_stats', dchan_get_stats(ctx, stats), DCHAN_SUCCESS)
    if (stats%puts < size(sizes) * iters .or. stats%callbacks < size(sizes) * iters) &
      call fail('dchan_get_stats: fewer puts or callbacks than made')
    if (my_rank == 0) &
      write (*, '(a, i0, a, i0, a, a, a, a, a)') 'f_channels: exchange: ', size(sizes) * iters, &
        ' puts of 8 B to 1 MiB on ', nranks, ' ranks, provider ', dchan_provider_name_f(ctx), &
        ', detection ', trim(detect_name(detect)), ': every word verified'
  end subroutine test_exchange

  function detect_name(d)
    integer(c_int), intent(in) :: d
    character(len=8) :: detect_name

    select case (d)
    case (DCHAN_DETECT_SENTINEL)
      detect_name = 'sentinel'
    case (DCHAN_DETECT_FLAG)
      detect_name = 'flag'
    case (DCHAN_DETECT_EVENT)
      detect_name = 'event'
    case default
      detect_name = 'auto'
    end select
  end function detect_name

  subroutine test_badsize()
    integer, parameter :: n = 64
    integer(c_int64_t), allocatable, target :: rbuf(:), sbuf(:)
    type(channel_state), target, volatile :: st
    type(dchan_wire_t) :: wires(0:nranks - 1)
    type(c_ptr) :: rh, sh
    integer :: k
    integer(c_size_t), parameter :: wrong(4) = [int(8 * n + 8, c_size_t), int(8 * n - 8, c_size_t), &
                                                1_c_size_t, int(16 * n, c_size_t)]

    allocate (rbuf(n), sbuf(n))
    call make_channel(rbuf, n, c_funloc(count_arrival), st, rh, wires)
    do k = 1, size(wrong)
      call expect('dchan_assoc_local with the wrong size', &
                  dchan_assoc_local(ctx, wires(to), c_loc(sbuf), wrong(k), sh), DCHAN_ERR_SIZE)
    end do
    if (dchan_strerror_f(DCHAN_ERR_SIZE) == dchan_strerror_f(DCHAN_SUCCESS)) &
      call fail('dchan_strerror: DCHAN_ERR_SIZE reads as success')
    ! The refusals left the channel as it was.
    call expect('dchan_assoc_local', &
                dchan_assoc_local(ctx, wires(to), c_loc(sbuf), int(8 * n, c_size_t), sh), DCHAN_SUCCESS)
    call expect('dchan_barrier', dchan_barrier(ctx), DCHAN_SUCCESS)
    call run_puts(sh, sbuf, rbuf, n, st, 1, iters)
    call close_channel(sh, rh)
    if (my_rank == 0) write (*, '(a, i0, a)') 'f_channels: badsize: ', size(wrong), &
      ' wrong sizes refused with DCHAN_ERR_SIZE, then the channel worked'
  end subroutine test_badsize

  subroutine test_rearm()
    integer, parameter :: n = 1000
    integer(c_int64_t), allocatable, target :: rbuf(:), sbuf(:), copy(:)
    type(channel_state), target, volatile :: st
    type(dchan_wire_t) :: wires(0:nranks - 1)
    type(c_ptr) :: rh, sh
    integer :: it, i

    allocate (rbuf(n), sbuf(n), copy(n))
    st%buf = c_loc(rbuf)
    st%copy = c_loc(copy)
    st%n = n
    call make_channel(rbuf, n, c_funloc(copy_and_rearm), st, rh, wires)
    call expect('dchan_assoc_local', &
                dchan_assoc_local(ctx, wires(to), c_loc(sbuf), int(8 * n, c_size_t), sh), DCHAN_SUCCESS)
    do it = 1, iters
      call wait_put_done(sh)
      sbuf = pattern(my_rank, it, [(i, i = 1, n)])
      call expect('dchan_put', dchan_put(sh), DCHAN_SUCCESS)
      call wait_arrivals(ctx, st, it)
      call expect('dchan_ready in the callback', st%rearm_rc, DCHAN_SUCCESS)
      if (any(copy /= pattern(from, it, [(i, i = 1, n)]))) call fail('wrong data copied by the callback')
      ! Armed already: a second re-arm is a state error, and harmless.
      call expect('dchan_ready on an armed handle', dchan_ready(rh), DCHAN_ERR_STATE)
      call expect('dchan_barrier', dchan_barrier(ctx), DCHAN_SUCCESS)
    end do
    call close_channel(sh, rh)
    if (my_rank == 0) write (*, '(a, i0, a)') 'f_channels: rearm: ', iters, &
      ' arrivals, each copied and re-armed by its callback'
  end subroutine test_rearm

  subroutine test_garbage()
    integer, parameter :: n = 256
    integer(c_int64_t), allocatable, target :: rbuf(:), sbuf(:)
    type(channel_state), target, volatile :: st
    type(dchan_wire_t) :: wires(0:nranks - 1), bad
    type(c_ptr) :: rh, sh
    integer :: i, k, nbad

    allocate (rbuf(n), sbuf(n))
    call make_channel(rbuf, n, c_funloc(count_arrival), st, rh, wires)
    nbad = 0
    ! Zeros, all ones, a byte ramp.
    bad%bytes = 0_c_signed_char
    call refuse(bad, 'zeros', sbuf, nbad)
    bad%bytes = -1_c_signed_char
    call refuse(bad, 'ones', sbuf, nbad)
    bad%bytes = [(int(modulo(37 * i + 11, 256) - 128, c_signed_char), i = 1, DCHAN_WIRE_SIZE)]
    call refuse(bad, 'a byte ramp', sbuf, nbad)
    ! Every single-byte corruption of the real wire.
    do k = 1, DCHAN_WIRE_SIZE
      bad = wires(to)
      bad%bytes(k) = not(bad%bytes(k))
      call refuse(bad, 'a corrupted byte', sbuf, nbad)
    end do
    ! The wire of a channel whose sender is another rank.
    if (from /= my_rank) call refuse(wires(my_rank), 'a wire for another sender', sbuf, nbad)
    ! The real wire still works.
    call expect('dchan_assoc_local', &
                dchan_assoc_local(ctx, wires(to), c_loc(sbuf), int(8 * n, c_size_t), sh), DCHAN_SUCCESS)
    call expect('dchan_barrier', dchan_barrier(ctx), DCHAN_SUCCESS)
    call run_puts(sh, sbuf, rbuf, n, st, 1, iters)
    call close_channel(sh, rh)
    if (my_rank == 0) write (*, '(a, i0, a)') 'f_channels: garbage: ', nbad, &
      ' bad wires refused with DCHAN_ERR_HANDLE, then the real one worked'
  end subroutine test_garbage

  subroutine refuse(wire, what, sbuf, nbad)
    type(dchan_wire_t), intent(in) :: wire
    character(len=*), intent(in) :: what
    integer(c_int64_t), target, contiguous, intent(in) :: sbuf(:)
    integer, intent(inout) :: nbad
    type(c_ptr) :: h

    call expect('dchan_assoc_local of ' // what, &
                dchan_assoc_local(ctx, wire, c_loc(sbuf), int(8 * size(sbuf), c_size_t), h), &
                DCHAN_ERR_HANDLE)
    nbad = nbad + 1
  end subroutine refuse
end program f_channels
