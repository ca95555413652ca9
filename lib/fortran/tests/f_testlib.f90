! SPDX-License-Identifier: BSD-3-Clause
!
! Shared parts of the Fortran channel tests: the arrival callbacks (which
! must be bind(C) module or external procedures, never internal ones), the
! data pattern, wire exchange and failure reporting.
module f_testlib
  use dchan
  implicit none
  private
  public :: channel_state, count_arrival, copy_and_rearm, pattern, fail, expect, &
            share_wires, wait_arrivals, wait_put_done, my_rank

  ! What an arrival callback sees through its arg pointer.
  type :: channel_state
    type(c_ptr) :: h = c_null_ptr        ! the handle the callback must get
    integer :: count = 0                 ! arrivals so far
    integer :: wrong_handle = 0          ! callbacks that got another handle
    ! copy_and_rearm: the receive buffer, where to copy it, in int64 words
    type(c_ptr) :: buf = c_null_ptr, copy = c_null_ptr
    integer(c_size_t) :: n = 0
    integer(c_int) :: rearm_rc = DCHAN_SUCCESS
  end type channel_state

  integer, save :: my_rank = -1

contains

  ! Counts one arrival.
  subroutine count_arrival(h, arg) bind(C)
    type(c_ptr), value :: h, arg
    type(channel_state), pointer :: st

    call c_f_pointer(arg, st)
    if (.not. c_associated(h, st%h)) st%wrong_handle = st%wrong_handle + 1
    st%count = st%count + 1
  end subroutine count_arrival

  ! Copies the data out, then re-arms its own handle from inside the
  ! callback (allowed: dchan_progress(3)), as a solver that consumes a block
  ! at once would.
  subroutine copy_and_rearm(h, arg) bind(C)
    type(c_ptr), value :: h, arg
    type(channel_state), pointer :: st
    integer(c_int64_t), pointer :: src(:), dst(:)

    call c_f_pointer(arg, st)
    if (.not. c_associated(h, st%h)) st%wrong_handle = st%wrong_handle + 1
    call c_f_pointer(st%buf, src, [st%n])
    call c_f_pointer(st%copy, dst, [st%n])
    dst = src
    st%rearm_rc = dchan_ready(h)
    st%count = st%count + 1
  end subroutine copy_and_rearm

  ! Word i of the put of iteration it by rank sender: positive, distinct for
  ! every (sender, it, i), so never the oob pattern (negative).
  elemental function pattern(sender, it, i)
    integer, intent(in) :: sender, it, i
    integer(c_int64_t) :: pattern

    pattern = ishft(int(sender + 1, c_int64_t), 48) + ishft(int(it, c_int64_t), 24) + i
  end function pattern

  subroutine fail(what)
    character(len=*), intent(in) :: what

    write (0, '(a, i0, a, a)') 'f_channels: rank ', my_rank, ': FAIL: ', what
    flush (0)
    error stop 1
  end subroutine fail

  ! A call that must return exactly `want'.
  subroutine expect(what, rc, want)
    character(len=*), intent(in) :: what
    integer(c_int), intent(in) :: rc, want
    character(len=24) :: got, wanted

    if (rc == want) return
    write (got, '(i0)') rc
    write (wanted, '(i0)') want
    call fail(what // ' returned ' // trim(got) // ' (' // dchan_strerror_f(rc) // '), expected ' &
              // trim(wanted) // ' (' // dchan_strerror_f(want) // ')')
  end subroutine expect

  ! Every rank's wire, indexed by rank, through the context's bootstrap.
  subroutine share_wires(ctx, mine, all)
    type(c_ptr), intent(in) :: ctx
    type(dchan_wire_t), target, intent(in) :: mine
    type(dchan_wire_t), target, contiguous, intent(out) :: all(0:)

    call expect('dchan_allgather', &
                dchan_allgather(ctx, c_loc(mine), c_loc(all), c_sizeof(mine)), DCHAN_SUCCESS)
  end subroutine share_wires

  ! Drives dchan_wait until st has seen `count' arrivals.
  subroutine wait_arrivals(ctx, st, count)
    type(c_ptr), intent(in) :: ctx
    type(channel_state), intent(inout), volatile :: st
    integer, intent(in) :: count
    integer(c_int) :: rc

    do while (st%count < count)
      rc = dchan_wait(ctx, 30000)
      if (rc < 0) call fail('dchan_wait: ' // dchan_strerror_f(rc))
    end do
    if (st%count /= count) call fail('more arrivals than puts')
    if (st%wrong_handle /= 0) call fail('a callback got the wrong handle')
  end subroutine wait_arrivals

  ! The send buffer may be refilled once the last put no longer reads it.
  subroutine wait_put_done(sh)
    type(c_ptr), intent(in) :: sh
    integer(c_int) :: rc

    do
      rc = dchan_put_test(sh)
      if (rc == 1) exit
      if (rc < 0) call fail('dchan_put_test: ' // dchan_strerror_f(rc))
    end do
  end subroutine wait_put_done
end module f_testlib
