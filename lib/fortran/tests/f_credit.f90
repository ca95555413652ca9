! SPDX-License-Identifier: BSD-3-Clause
!
! f_credit: a channel with credit and two slots, driven from Fortran through
! module dchan, in one process (singleton bootstrap: the self provider, or
! the one DCHAN_PROVIDER names if it serves a rank's own channels). For
! each detection mode (SENTINEL, FLAG, EVENT), it checks that
!   - dchan_handle_attr_init gives no credit, depth 1 and the struct_size of
!     the Fortran type; dchan_create_handle_attr refuses depth 0 and 65 and
!     a wrong struct_size (DCHAN_ERR_INVALID_ARG), and slots that overflow
!     their dchan_alloc block (DCHAN_ERR_SIZE);
!   - two puts without a re-arm take dchan_credits from 2 to 1 to 0, and a
!     third put, like dchan_put_ptr, is then refused with DCHAN_ERR_AGAIN
!     (one credit stall, nothing sent);
!   - progress delivers both arrivals in put order, one callback each; the
!     second callback's dchan_slot still gives slot 0 (the oldest held);
!     dchan_slot gives slot 0, then after dchan_ready slot 1, each with the
!     data of its put; each dchan_ready gives one credit back;
!   - dchan_put_ptr gives the receiver's slot itself (self, shm) except in
!     SENTINEL mode, where it gives the send buffer, and the counter
!     `copied' grows only for puts from the send buffer;
!   - a stream of puts as fast as credit allows, every other one written
!     through dchan_put_ptr, each callback checking and releasing its slot;
!   - credit 0 with depth 2 has credit; a channel without credit answers
!     dchan_credits and dchan_put_ptr with DCHAN_ERR_STATE, as a receive
!     handle does.
module f_credit_cb
  ! iso_c_binding by name too: gfortran 12 stops with an internal error on
  ! c_associated(p, c_loc(x)) when the two come only through module dchan.
  use, intrinsic :: iso_c_binding
  use dchan
  implicit none
  private
  public :: credit_state, on_arrival, pattern, slot_index, slot_ok, fail, expect

  integer, parameter :: MAXSEEN = 512

  ! What the arrival callback sees through its arg pointer.
  type :: credit_state
    type(c_ptr) :: h = c_null_ptr        ! the receive handle
    type(c_ptr) :: base = c_null_ptr     ! slot 0 of its buffer
    integer :: n = 0                     ! int64 words per slot
    integer :: count = 0                 ! callbacks so far
    integer :: bad = 0                   ! callbacks that found something wrong
    logical :: release = .false.         ! release each slot in its callback
    integer :: seen(MAXSEEN) = -9        ! slot that dchan_slot gave in callback k
  end type credit_state

contains

  ! Word i of the k-th put (from 1): positive, so never the oob pattern.
  elemental function pattern(k, i)
    integer, intent(in) :: k, i
    integer(c_int64_t) :: pattern

    pattern = ishft(int(k, c_int64_t), 24) + i
  end function pattern

  ! Which slot of the buffer at base (n int64 words each) p is: 0 or 1,
  ! -1 for neither.
  integer function slot_index(base, n, p)
    type(c_ptr), intent(in) :: base, p
    integer, intent(in) :: n
    integer(c_int64_t), pointer :: w(:, :)

    call c_f_pointer(base, w, [n, 2])
    slot_index = -1
    if (c_associated(p, c_loc(w(1, 1)))) slot_index = 0
    if (c_associated(p, c_loc(w(1, 2)))) slot_index = 1
  end function slot_index

  ! The n words at p hold the k-th put.
  logical function slot_ok(p, n, k)
    type(c_ptr), intent(in) :: p
    integer, intent(in) :: n, k
    integer(c_int64_t), pointer :: w(:)
    integer :: i

    call c_f_pointer(p, w, [n])
    slot_ok = all(w == pattern(k, [(i, i = 1, n)]))
  end function slot_ok

  ! Callback k (from 1) is the arrival of the k-th put, in slot k-1 mod 2,
  ! which must hold that put. dchan_slot gives the oldest slot held: that
  ! one when the program released every older slot (always so with
  ! `release'), which the callback then releases.
  subroutine on_arrival(h, arg) bind(C)
    type(c_ptr), value :: h, arg
    type(credit_state), pointer :: st
    integer(c_int64_t), pointer :: w(:, :)
    type(c_ptr) :: p
    integer :: k

    call c_f_pointer(arg, st)
    k = st%count + 1
    call c_f_pointer(st%base, w, [st%n, 2])
    if (.not. c_associated(h, st%h)) st%bad = st%bad + 1
    if (.not. slot_ok(c_loc(w(1, modulo(k - 1, 2) + 1)), st%n, k)) st%bad = st%bad + 1
    if (dchan_slot(h, p) == DCHAN_SUCCESS) then
      if (k <= size(st%seen)) st%seen(k) = slot_index(st%base, st%n, p)
    else
      st%bad = st%bad + 1
    end if
    if (st%release) then
      if (slot_index(st%base, st%n, p) /= modulo(k - 1, 2)) st%bad = st%bad + 1
      if (dchan_ready(h) /= DCHAN_SUCCESS) st%bad = st%bad + 1
    end if
    st%count = k
  end subroutine on_arrival

  subroutine fail(what)
    character(len=*), intent(in) :: what

    write (0, '(a, a)') 'f_credit: FAIL: ', what
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
end module f_credit_cb

program f_credit
  use, intrinsic :: iso_c_binding
  use dchan
  use f_credit_cb
  implicit none

  integer, parameter :: N = 512         ! int64 words per slot: 4 KiB
  integer, parameter :: STREAM = 200    ! puts of the streaming part
  ! SENTINEL's out-of-band pattern: negative, unlike every data word.
  integer(c_int64_t), parameter :: OOB = -6148914691236517206_c_int64_t
  integer(c_size_t), parameter :: SLOT = 8 * N
  integer(c_int), parameter :: modes(3) = [DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG, &
                                           DCHAN_DETECT_EVENT]
  character(len=8), parameter :: names(3) = [character(len=8) :: 'sentinel', 'flag', 'event']
  integer :: m, nrun = 0

  do m = 1, size(modes)
    call run_mode(modes(m), trim(names(m)))
  end do
  if (nrun == 0) call fail('no detection mode could run')

contains

  subroutine run_mode(detect, name)
    integer(c_int), intent(in) :: detect
    character(len=*), intent(in) :: name
    type(dchan_attr_t) :: attr
    type(dchan_handle_attr_t) :: hattr, bad
    type(dchan_handle_stats_t) :: ss, rs
    type(dchan_wire_t) :: wire
    type(credit_state), target, volatile :: st
    integer(c_int64_t), allocatable, target :: sbuf(:)
    integer(c_int64_t), pointer :: w(:)
    type(c_ptr) :: ctx, rbase, rh, sh, h2, p, sarg
    character(len=:), allocatable :: prov
    integer(c_int) :: rc
    integer :: i, k, last
    logical :: in_place

    call dchan_attr_init(attr)
    attr%bootstrap = DCHAN_BOOT_SINGLETON
    attr%detect = detect
    rc = dchan_init(attr, ctx)
    if (rc == DCHAN_ERR_UNSUPPORTED) then
      print '(3a)', 'f_credit: ', name, ': not offered here, skipped'
      return
    end if
    call expect('dchan_init', rc, DCHAN_SUCCESS)
    nrun = nrun + 1

    ! The defaults, and the size of the structure as Fortran lays it out.
    call dchan_handle_attr_init(hattr)
    if (hattr%struct_size /= c_sizeof(hattr)) call fail('dchan_handle_attr_init: struct_size')
    if (hattr%credit /= 0 .or. hattr%depth /= 1) call fail('dchan_handle_attr_init: defaults')

    ! Two slots from dchan_alloc, and the send buffer.
    call expect('dchan_alloc', dchan_alloc(ctx, 2 * SLOT, rbase), DCHAN_SUCCESS)
    allocate (sbuf(N))
    st%base = rbase
    st%n = N
    sarg = c_loc(st)

    ! Refusals: nothing is created.
    bad = hattr
    bad%depth = 0
    call expect('dchan_create_handle_attr, depth 0', &
                create(ctx, rbase, sarg, bad, h2), DCHAN_ERR_INVALID_ARG)
    bad%depth = DCHAN_MAX_DEPTH + 1
    call expect('dchan_create_handle_attr, depth 65', &
                create(ctx, rbase, sarg, bad, h2), DCHAN_ERR_INVALID_ARG)
    bad = hattr
    bad%struct_size = bad%struct_size - 8
    call expect('dchan_create_handle_attr, wrong struct_size', create(ctx, rbase, sarg, bad, h2), &
                DCHAN_ERR_INVALID_ARG)
    bad = hattr
    bad%depth = 3
    call expect('dchan_create_handle_attr, 3 slots in a block of 2', &
                create(ctx, rbase, sarg, bad, h2), DCHAN_ERR_SIZE)

    ! The channel: credit, two slots.
    hattr%credit = 1
    hattr%depth = 2
    call expect('dchan_create_handle_attr', create(ctx, rbase, sarg, hattr, rh), DCHAN_SUCCESS)
    st%h = rh
    call expect('dchan_handle_export', dchan_handle_export(rh, wire), DCHAN_SUCCESS)
    call expect('dchan_assoc_local', dchan_assoc_local(ctx, wire, c_loc(sbuf), SLOT, sh), &
                DCHAN_SUCCESS)
    prov = dchan_handle_provider_f(sh)

    ! Calls for the other end, or for a slot not delivered yet.
    call expect('dchan_credits on a receive handle', dchan_credits(rh), DCHAN_ERR_STATE)
    call expect('dchan_put_ptr on a receive handle', dchan_put_ptr(rh, p), DCHAN_ERR_STATE)
    call expect('dchan_slot on a send handle', dchan_slot(sh, p), DCHAN_ERR_STATE)
    call expect('dchan_slot before any arrival', dchan_slot(rh, p), DCHAN_ERR_STATE)

    ! Two puts, the receiver not re-arming: 2, 1, 0 credits.
    call expect('dchan_credits at the start', dchan_credits(sh), 2)
    do k = 1, 2
      call put_from_sbuf(sh, sbuf, k)
      call expect('dchan_credits after a put', dchan_credits(sh), 2 - k)
    end do
    ! A third is refused, and counted; so is dchan_put_ptr.
    call wait_put_done(sh)
    sbuf = pattern(3, [(i, i = 1, N)])
    call expect('dchan_put without credit', dchan_put(sh), DCHAN_ERR_AGAIN)
    call stats(sh, ss)
    if (ss%puts /= 2 .or. ss%credit_stalls /= 1) call fail('puts or credit_stalls after a refusal')
    call expect('dchan_put_ptr without credit', dchan_put_ptr(sh, p), DCHAN_ERR_AGAIN)
    call expect('dchan_credits after the refusals', dchan_credits(sh), 0)
    if (st%count /= 0) call fail('a callback ran outside progress')

    ! Progress delivers both, in order; the second callback still sees
    ! slot 0 as the oldest held.
    call wait_arrivals(ctx, st, 2)
    if (st%seen(1) /= 0 .or. st%seen(2) /= 0) call fail('dchan_slot in the callbacks')
    call expect('dchan_slot, first', dchan_slot(rh, p), DCHAN_SUCCESS)
    if (slot_index(rbase, N, p) /= 0) call fail('dchan_slot: not slot 0')
    if (.not. slot_ok(p, N, 1)) call fail('slot 0: not the first put')
    call expect('dchan_ready, slot 0', dchan_ready(rh), DCHAN_SUCCESS)
    call expect('dchan_credits after one release', dchan_credits(sh), 1)
    call expect('dchan_slot, second', dchan_slot(rh, p), DCHAN_SUCCESS)
    if (slot_index(rbase, N, p) /= 1) call fail('dchan_slot: not slot 1')
    if (.not. slot_ok(p, N, 2)) call fail('slot 1: not the second put')
    call expect('dchan_ready, slot 1', dchan_ready(rh), DCHAN_SUCCESS)
    call expect('dchan_credits after two releases', dchan_credits(sh), 2)
    call expect('dchan_slot with nothing held', dchan_slot(rh, p), DCHAN_ERR_STATE)
    call expect('dchan_ready with nothing held', dchan_ready(rh), DCHAN_ERR_STATE)
    call expect('dchan_ready_pollq on a deep handle', dchan_ready_pollq(rh), DCHAN_SUCCESS)

    ! Direct store: the third put goes to slot 0.
    call stats(sh, ss)
    call expect('dchan_put_ptr', dchan_put_ptr(sh, p), DCHAN_SUCCESS)
    in_place = slot_index(rbase, N, p) == 0
    if (.not. in_place .and. .not. c_associated(p, c_loc(sbuf))) &
      call fail('dchan_put_ptr: neither the slot nor the send buffer')
    if (detect == DCHAN_DETECT_SENTINEL .and. in_place) &
      call fail('dchan_put_ptr gave the slot in SENTINEL mode')
    if (detect /= DCHAN_DETECT_SENTINEL .and. (prov == 'self' .or. prov == 'shm') .and. &
        .not. in_place) call fail('dchan_put_ptr did not give the mapped slot (' // prov // ')')
    call c_f_pointer(p, w, [N])
    w = pattern(3, [(i, i = 1, N)])
    call expect('dchan_put after dchan_put_ptr', dchan_put(sh), DCHAN_SUCCESS)
    call expect('dchan_credits after the third put', dchan_credits(sh), 1)
    call stats(sh, rs)
    if (rs%puts /= ss%puts + 1 .or. rs%bytes /= ss%bytes + SLOT) call fail('puts or bytes')
    if (in_place .neqv. rs%copied == ss%copied) call fail('copied after dchan_put_ptr')
    call wait_arrivals(ctx, st, 3)
    if (st%seen(3) /= 0) call fail('third arrival: not in slot 0')
    call expect('dchan_ready, third', dchan_ready(rh), DCHAN_SUCCESS)

    ! A stream: the sender puts whenever it has credit, the callback checks
    ! and releases each slot.
    st%release = .true.
    last = 3 + STREAM
    do k = 4, last
      do
        rc = dchan_credits(sh)
        if (rc < 0) call expect('dchan_credits', rc, 0)
        if (rc > 0) exit
        rc = dchan_progress(ctx)
        if (rc < 0) call expect('dchan_progress', rc, 0)
      end do
      if (modulo(k, 2) == 0) then
        call put_from_sbuf(sh, sbuf, k)
      else
        call expect('dchan_put_ptr', dchan_put_ptr(sh, p), DCHAN_SUCCESS)
        call c_f_pointer(p, w, [N])
        w = pattern(k, [(i, i = 1, N)])
        call expect('dchan_put', dchan_put(sh), DCHAN_SUCCESS)
      end if
      ! Progress only now and then, so that the sender often runs ahead.
      if (modulo(k, 3) == 0) then
        rc = dchan_progress(ctx)
        if (rc < 0) call expect('dchan_progress', rc, 0)
      end if
    end do
    call wait_arrivals(ctx, st, last)
    call expect('dchan_credits after the stream', dchan_credits(sh), 2)
    call stats(sh, ss)
    call stats(rh, rs)
    if (ss%puts /= last .or. ss%bytes /= last * SLOT) call fail('sender counters')
    if (rs%arrivals /= last .or. rs%overruns /= 0) call fail('receiver counters')
    if (in_place .and. ss%copied >= ss%bytes) call fail('copied: nothing was written in place')
    if (.not. in_place .and. ss%copied /= ss%bytes) call fail('copied: not every put copied')

    ! No put may be in flight to a handle about to go.
    call wait_put_done(sh)
    call expect('dchan_handle_destroy', dchan_handle_destroy(sh), DCHAN_SUCCESS)
    call expect('dchan_handle_destroy', dchan_handle_destroy(rh), DCHAN_SUCCESS)

    ! Credit 0 with depth 2 still has credit.
    call dchan_handle_attr_init(hattr)
    hattr%depth = 2
    call expect('dchan_create_handle_attr, credit 0 depth 2', &
                create(ctx, rbase, sarg, hattr, rh), DCHAN_SUCCESS)
    call expect('dchan_handle_export', dchan_handle_export(rh, wire), DCHAN_SUCCESS)
    call expect('dchan_assoc_local', dchan_assoc_local(ctx, wire, c_loc(sbuf), SLOT, sh), &
                DCHAN_SUCCESS)
    call expect('dchan_credits, depth 2 without credit asked', dchan_credits(sh), 2)
    call expect('dchan_handle_destroy', dchan_handle_destroy(sh), DCHAN_SUCCESS)
    call expect('dchan_handle_destroy', dchan_handle_destroy(rh), DCHAN_SUCCESS)

    ! The defaults: no credit.
    call dchan_handle_attr_init(hattr)
    call expect('dchan_create_handle_attr, defaults', &
                create(ctx, rbase, sarg, hattr, rh), DCHAN_SUCCESS)
    call expect('dchan_handle_export', dchan_handle_export(rh, wire), DCHAN_SUCCESS)
    call expect('dchan_assoc_local', dchan_assoc_local(ctx, wire, c_loc(sbuf), SLOT, sh), &
                DCHAN_SUCCESS)
    call expect('dchan_credits without credit', dchan_credits(sh), DCHAN_ERR_STATE)
    call expect('dchan_put_ptr without credit', dchan_put_ptr(sh, p), DCHAN_ERR_STATE)
    call expect('dchan_handle_destroy', dchan_handle_destroy(sh), DCHAN_SUCCESS)
    call expect('dchan_handle_destroy', dchan_handle_destroy(rh), DCHAN_SUCCESS)

    call expect('dchan_free', dchan_free(ctx, rbase), DCHAN_SUCCESS)
    call expect('dchan_finalize', dchan_finalize(ctx), DCHAN_SUCCESS)
    write (*, '(5a, i0, 2a)') 'f_credit: ', name, ' on ', prov, &
      ': credits 2, 1, 0, then AGAIN; slots 0, 1 in order; ', last, &
      ' puts checked; dchan_put_ptr ', trim(merge('in place      ', 'via the buffer', in_place))
  end subroutine run_mode

  ! A receive handle from this rank on the two slots at rbase, its
  ! callback's state at arg.
  integer(c_int) function create(ctx, rbase, arg, ha, h)
    type(c_ptr), intent(in) :: ctx, rbase, arg
    type(dchan_handle_attr_t), intent(in) :: ha
    type(c_ptr), intent(out) :: h

    create = dchan_create_handle_attr(ctx, 0, rbase, SLOT, OOB, c_funloc(on_arrival), arg, ha, h)
  end function create

  ! The k-th put, from the send buffer.
  subroutine put_from_sbuf(sh, sbuf, k)
    type(c_ptr), intent(in) :: sh
    integer(c_int64_t), intent(inout) :: sbuf(:)
    integer, intent(in) :: k
    integer :: i

    call wait_put_done(sh)
    sbuf = pattern(k, [(i, i = 1, size(sbuf))])
    call expect('dchan_put', dchan_put(sh), DCHAN_SUCCESS)
  end subroutine put_from_sbuf

  ! The send buffer may be written once the last put no longer reads it.
  subroutine wait_put_done(sh)
    type(c_ptr), intent(in) :: sh
    integer(c_int) :: rc

    do
      rc = dchan_put_test(sh)
      if (rc == 1) exit
      if (rc < 0) call expect('dchan_put_test', rc, 1)
    end do
  end subroutine wait_put_done

  ! Progress until `count' callbacks ran in all, and none found a fault.
  subroutine wait_arrivals(ctx, st, count)
    type(c_ptr), intent(in) :: ctx
    type(credit_state), intent(inout), volatile :: st
    integer, intent(in) :: count
    integer(c_int) :: rc

    do while (st%count < count)
      rc = dchan_wait(ctx, 10000)
      if (rc < 0) call expect('dchan_wait', rc, 1)
    end do
    if (st%count /= count) call fail('more arrivals than puts')
    if (st%bad /= 0) call fail('a callback found the wrong handle, slot or data')
  end subroutine wait_arrivals

  subroutine stats(h, s)
    type(c_ptr), intent(in) :: h
    type(dchan_handle_stats_t), intent(out) :: s

    s%struct_size = c_sizeof(s)
    call expect('dchan_handle_stats', dchan_handle_stats(h, s), DCHAN_SUCCESS)
  end subroutine stats
end program f_credit
