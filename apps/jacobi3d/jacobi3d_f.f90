! SPDX-License-Identifier: BSD-3-Clause
!
! jacobi3d_f: apps/jacobi3d/jacobi3d.c in Fortran, on the dchan module and
! MPI's mpi module. 7-point Jacobi sweeps for the Laplace equation on an
! NX x NY x NZ grid of unknowns with fixed values on the surrounding
! boundary layer, split into PX x PY x PZ blocks, one per MPI rank. Each
! iteration sweeps the interior of the block (the cells that read no
! neighbour's face) while the faces are in flight, then the boundary layer
! once they arrived, packing the next faces as it computes them.
!   msg    MPI_Isend/MPI_Irecv of packed faces, two buffers per face
!          (iterations alternate);
!   dchan  one credited channel of depth 2 per face (--faces pack of the C
!          program): the receiver's buffer holds two slots, the sweep reads
!          the face where it landed (dchan_slot) and hands the slot back
!          (dchan_ready); the sender packs straight into the neighbour's
!          slot where the provider maps it here (dchan_put_ptr), else into
!          the channel's send buffer, then puts;
!   none   no exchange (the faces from neighbours read zeros): the compute
!          floor of the same decomposition, not verified.
! jacobi3d.c's --blocks, --modes and --faces subarray are not here.
!
! Same flags, same stderr lines (prefixed jacobi3d_f) and the same RESULT
! line as the C version with --faces pack, and the same floating-point
! operations in the same order, so both print the same residual on the same
! problem (lib/fortran/tests/jacobi-compare.sh checks): a drop-in for the C
! program in apps/scaling/scaling-study. See jacobi3d.c for the design
! notes; the comments here say where Fortran differs.
!
! Arrays follow the C layout: the block u(k, j, i) (k along z fastest, as
! C's u[i][j][k]), faces as flat 1-based vectors with C's element order
! (x faces [j][k], y faces [i][k], z faces [i][j]).
program jacobi3d_f
  use, intrinsic :: iso_fortran_env, only: output_unit, error_unit
  use mpi
  use dchan
  implicit none

  integer, parameter :: dp = c_double
  integer, parameter :: XLO = 0, XHI = 1, YLO = 2, YHI = 3, ZLO = 4, ZHI = 5, NFACES = 6
  integer, parameter :: MODE_MSG = 0, MODE_DCHAN = 1, MODE_NONE = 2
  ! SENTINEL detection's out-of-band pattern, 0xfff4dc4a6e5e0bbb: a
  ! signalling NaN, which no arithmetic on finite values produces.
  integer(c_int64_t), parameter :: SENTINEL_OOB = -3135487483180101_c_int64_t
  ! A face that does not arrive within this time means a broken peer; so
  ! does a slot that is not handed back (no credit) within it.
  integer(c_int), parameter :: WAIT_TIMEOUT_MS = 120000
  ! The parallel and serial runs must agree bit for bit (see jacobi3d.c).
  real(dp), parameter :: VERIFY_TOL = 0.0_dp
  ! Slots per channel: a neighbour may put its face of iteration it+1
  ! while this rank still sweeps with its face of iteration it.
  integer(c_int), parameter :: DEPTH = 2

  type :: options_t
    integer :: grid(0:2) = [64, 64, 64]
    integer :: procs(0:2) = 0      ! 0: let MPI_Dims_create choose
    integer :: iters = 100
    integer :: mode = MODE_DCHAN
    logical :: verify = .false.
    integer :: detect = -1         ! -1: from DCHAN_DETECT (dchan_attr_init)
  end type options_t

  ! One rank's part of the grid.
  type :: block_t
    integer :: n(0:2), off(0:2), coord(0:2)
    integer :: nb(0:NFACES - 1)    ! neighbour across each face, -1 on the boundary
    integer :: fsize(0:NFACES - 1) ! doubles in each face
    ! The interior box [lo, hi): the cells that read no exchanged face
    ! (empty when lo == hi along an axis).
    integer :: lo(0:2), hi(0:2)
  end type block_t

  ! A face buffer. Pointers, so that c_loc and MPI see one fixed address and
  ! the compiler assumes that calls (MPI_Waitall, dchan_wait) may write it.
  type :: buf_t
    real(dp), pointer, contiguous :: a(:) => null()
  end type buf_t

  type(options_t) :: o
  type(block_t) :: b
  ! msg: buffers [face, parity] of outgoing and incoming faces (none: the
  ! zeros of recv(:, 0)); fixed boundary values where nb(f) < 0.
  type(buf_t) :: pack(0:NFACES - 1, 0:1), recv(0:NFACES - 1, 0:1), bface(0:NFACES - 1)
  integer :: rreq(0:NFACES - 1, 0:1), sreq(0:NFACES - 1, 0:1)
  ! dchan: per face, the receive handle, its DEPTH slots, the send handle
  ! and its send buffer (both buffers from dchan_alloc, which the shm
  ! provider maps into the neighbour), the arrivals so far (counted by the
  ! arrival callback through its arg); [rank, error] of the error callback.
  type(c_ptr) :: rh(0:NFACES - 1) = c_null_ptr, sh(0:NFACES - 1) = c_null_ptr
  type(c_ptr) :: slots(0:NFACES - 1) = c_null_ptr, sbuf(0:NFACES - 1) = c_null_ptr
  integer(c_int), target, volatile :: arrived(0:NFACES - 1) = 0
  integer(c_int), target, volatile :: err_state(0:1) = 0
  type(c_ptr) :: ctx = c_null_ptr
  ! Time spent in the exchange (all of an iteration but the sweeps) during
  ! the current pass, in seconds.
  real(dp) :: comm = 0

  real(dp), pointer, contiguous :: u(:, :, :), v(:, :, :)
  character(len=:), allocatable :: provider, verified, how, extra
  real(dp) :: elapsed = 0, res, slowest, sum_res, maxdiff, t0, share, sum_share
  integer :: my_rank, nranks, ierr, rc, f, p, pass, first, last, untimed, d
  logical :: failed, ok

  interface
    ! The callbacks: bind(C) external procedures (internal ones cannot be).
    subroutine jacobi3d_f_on_arrival(h, arg) bind(C)
      import :: c_ptr
      type(c_ptr), value :: h, arg
    end subroutine jacobi3d_f_on_arrival
    subroutine jacobi3d_f_on_error(h, rc, arg) bind(C)
      import :: c_ptr, c_int
      type(c_ptr), value :: h, arg
      integer(c_int), value :: rc
    end subroutine jacobi3d_f_on_error
    ! With more ranks than cores, the neighbour a wait loop waits for
    ! needs the core.
    function sched_yield() bind(C, name='sched_yield')
      import :: c_int
      integer(c_int) :: sched_yield
    end function sched_yield
  end interface

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, my_rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  err_state(0) = my_rank

  ! Every rank parses the same arguments and reaches the same verdict.
  rc = parse_args(o)
  if (rc == 0) rc = check_decomposition(o)
  if (rc /= 0) then
    call MPI_Finalize(ierr)
    if (rc > 0) stop
    stop 2, quiet=.true.
  end if

  call block_init(b, o%grid, o%procs, my_rank)
  do f = 0, NFACES - 1
    if (b%nb(f) < 0) then
      allocate (bface(f)%a(b%fsize(f)))
      call fill_boundary_face(b, o%grid, f, bface(f)%a)
    else if (o%mode == MODE_MSG) then
      do p = 0, 1
        allocate (pack(f, p)%a(b%fsize(f)), recv(f, p)%a(b%fsize(f)))
      end do
    else if (o%mode == MODE_NONE) then
      allocate (recv(f, 0)%a(b%fsize(f)))
      recv(f, 0)%a = 0
    end if
  end do
  rreq = MPI_REQUEST_NULL
  sreq = MPI_REQUEST_NULL
  allocate (u(0:b%n(2) - 1, 0:b%n(1) - 1, 0:b%n(0) - 1), v(0:b%n(2) - 1, 0:b%n(1) - 1, 0:b%n(0) - 1))
  u = 0
  v = 0

  provider = trim(merge('none', 'mpi ', o%mode == MODE_NONE))
  if (o%mode == MODE_DCHAN) call start_dchan()
  if (my_rank == 0) then
    how = ''
    if (o%mode == MODE_DCHAN) then
      d = -1
      do f = 0, NFACES - 1
        if (d < 0 .and. c_associated(rh(f))) d = dchan_handle_detect(rh(f))
      end do
      if (d >= 0) then
        how = ', provider ' // provider // ', detection ' // detect_name(d)
      else
        how = ', provider ' // provider // ', detection none (no neighbours)'
      end if
      how = how // ', faces packed'
    end if
    write (error_unit, '(a)') 'jacobi3d_f: grid ' // triple(o%grid) // ' on ' // itoa(nranks) // ' ranks (' &
      // triple(o%procs) // '), ' // itoa(o%iters) // ' iterations, mode ' // mode_name(o%mode) // how
    flush (error_unit)
  end if

  ! Iteration 0 is not timed when there are more: it pays for first
  ! contact (connections, first touch of buffers) in either mode.
  untimed = merge(1, 0, o%iters > 1)
  res = 0
  do pass = 1 - untimed, 1
    first = merge(untimed, 0, pass == 1)
    last = merge(o%iters, 1, pass == 1)
    if (pass == 1) call MPI_Barrier(MPI_COMM_WORLD, ierr)
    comm = 0
    t0 = MPI_Wtime()
    res = res + run(first, last, o%iters)
    elapsed = MPI_Wtime() - t0
  end do
  share = 0
  if (elapsed > 0) share = comm / elapsed
  call MPI_Reduce(elapsed, slowest, 1, MPI_DOUBLE_PRECISION, MPI_MAX, 0, MPI_COMM_WORLD, ierr)
  call MPI_Reduce(share, sum_share, 1, MPI_DOUBLE_PRECISION, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  call MPI_Allreduce(res, sum_res, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)

  verified = 'skipped'
  maxdiff = 0
  failed = .false.
  if (o%verify .and. o%mode == MODE_NONE) then
    if (my_rank == 0) then
      write (error_unit, '(a)') 'jacobi3d_f: --mode none exchanges no faces: not verified'
      flush (error_unit)
    end if
  else if (o%verify) then
    ok = verify_grid(maxdiff)
    verified = merge('yes', 'no ', ok)
    verified = trim(verified)
    failed = .not. ok
    if (my_rank == 0) then
      write (error_unit, '(a)') 'jacobi3d_f: largest difference from the serial run: ' // c_e(maxdiff, 3) // ' (' &
        // trim(merge('verified    ', 'NOT verified', ok)) // ')'
      flush (error_unit)
    end if
  end if
  if (my_rank == 0) then
    extra = ''
    if (o%mode == MODE_DCHAN) extra = ' faces=pack'
    write (output_unit, '(a)') 'RESULT app=jacobi3d provider=' // provider // ' mode=' // mode_name(o%mode) // &
      ' ranks=' // itoa(nranks) // ' grid=' // triple(o%grid) // ' procs=' // triple(o%procs) // extra // &
      ' iters=' // itoa(o%iters) // ' iter_time_s=' // c_e(slowest / (o%iters - untimed), 6) // &
      ' comm_share=' // c_f3(sum_share / nranks) // ' residual=' // c_e(sqrt(sum_res), 6) // &
      ' verified=' // verified
    flush (output_unit)
  end if

  if (c_associated(ctx)) then
    call teardown_channels()
    rc = dchan_finalize(ctx)
    if (rc /= DCHAN_SUCCESS) then
      write (error_unit, '(a)') 'jacobi3d_f: rank ' // itoa(my_rank) // ': dchan_finalize: ' // dchan_strerror_f(rc)
      flush (error_unit)
    end if
  end if
  ! Variables of the main program are never released automatically: free
  ! them, so that a leak checker sees a clean exit.
  do f = 0, NFACES - 1
    do p = 0, 1
      if (associated(pack(f, p)%a)) deallocate (pack(f, p)%a)
      if (associated(recv(f, p)%a)) deallocate (recv(f, p)%a)
    end do
    if (associated(bface(f)%a)) deallocate (bface(f)%a)
  end do
  deallocate (u, v)
  if (allocated(provider)) deallocate (provider)
  if (allocated(verified)) deallocate (verified)
  if (allocated(how)) deallocate (how)
  if (allocated(extra)) deallocate (extra)
  call MPI_Finalize(ierr)
  if (failed) stop 1, quiet=.true.

contains

  ! ---- helpers -----------------------------------------------------------

  ! Fatal error after the ranks went their own ways: stop the whole job.
  subroutine die(msg)
    character(len=*), intent(in) :: msg

    write (error_unit, '(a)') 'jacobi3d_f: rank ' // itoa(my_rank) // ': ' // msg
    flush (error_unit)
    call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    stop 1, quiet=.true. ! not reached
  end subroutine die

  subroutine die_dchan(what, code)
    character(len=*), intent(in) :: what
    integer(c_int), intent(in) :: code

    call die(what // ': ' // dchan_strerror_f(code))
  end subroutine die_dchan

  function itoa(i)
    integer, intent(in) :: i
    character(len=:), allocatable :: itoa
    character(len=16) :: s

    write (s, '(i0)') i
    itoa = trim(s)
  end function itoa

  function triple(t)
    integer, intent(in) :: t(0:2)
    character(len=:), allocatable :: triple

    triple = itoa(t(0)) // ',' // itoa(t(1)) // ',' // itoa(t(2))
  end function triple

  ! x as C's printf("%.<digits>e") writes it: lower-case e, a sign and at
  ! least two digits in the exponent, nan and inf. Fortran's ES editing
  ! rounds as printf does (to nearest), so the digits are the same.
  function c_e(x, digits)
    use, intrinsic :: ieee_arithmetic, only: ieee_is_nan, ieee_is_finite
    real(dp), intent(in) :: x
    integer, intent(in) :: digits
    character(len=:), allocatable :: c_e
    character(len=48) :: s, out, fmt
    integer :: at, e

    if (ieee_is_nan(x)) then
      c_e = merge('-nan', 'nan ', sign(1.0_dp, x) < 0)
      c_e = trim(c_e)
      return
    end if
    if (.not. ieee_is_finite(x)) then
      c_e = merge('-inf', 'inf ', x < 0)
      c_e = trim(c_e)
      return
    end if
    write (fmt, '(a, i0, a, i0, a)') '(es', digits + 12, '.', digits, 'e4)'
    write (s, fmt) x
    s = adjustl(s)
    at = index(s, 'E')
    read (s(at + 1:), *) e
    write (fmt, '(a)') '(a, a, a, i2.2)'
    if (abs(e) >= 100) fmt = '(a, a, a, i0)'
    write (out, fmt) s(1:at - 1), 'e', merge('-', '+', e < 0), abs(e)
    c_e = trim(out)
  end function c_e

  function mode_name(m)
    integer, intent(in) :: m
    character(len=:), allocatable :: mode_name

    select case (m)
    case (MODE_MSG)
      mode_name = 'msg'
    case (MODE_NONE)
      mode_name = 'none'
    case default
      mode_name = 'dchan'
    end select
  end function mode_name

  ! x in [0, 1] as C's printf("%.3f") writes it (Fortran's F0.3 drops the
  ! leading zero).
  function c_f3(x)
    real(dp), intent(in) :: x
    character(len=:), allocatable :: c_f3
    character(len=32) :: s

    write (s, '(f0.3)') x
    c_f3 = trim(adjustl(s))
    if (c_f3(1:1) == '.') c_f3 = '0' // c_f3
  end function c_f3

  function detect_name(dd)
    integer, intent(in) :: dd
    character(len=:), allocatable :: detect_name

    select case (dd)
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

  ! ---- problem definition ------------------------------------------------

  ! Fixed value on the boundary layer; global indices run from -1 to N.
  ! Parenthesised as C evaluates it, left to right.
  function boundary_value(grid, gi, gj, gk)
    integer, intent(in) :: grid(0:2), gi, gj, gk
    real(dp) :: boundary_value, x, y, z

    x = (real(gi, dp) + 1.0_dp) / (real(grid(0), dp) + 1.0_dp)
    y = (real(gj, dp) + 1.0_dp) / (real(grid(1), dp) + 1.0_dp)
    z = (real(gk, dp) + 1.0_dp) / (real(grid(2), dp) + 1.0_dp)
    boundary_value = ((1.0_dp + x * (1.0_dp - y)) + z * z) + 0.5_dp * sin((3.0_dp * x) * z)
  end function boundary_value

  ! Part c of n items split into p parts, the first mod(n, p) one larger.
  subroutine split(n, np, c, len, off)
    integer, intent(in) :: n, np, c
    integer, intent(out) :: len, off

    len = n / np + merge(1, 0, c < mod(n, np))
    off = c * (n / np) + min(c, mod(n, np))
  end subroutine split

  function rank_of(procs, cx, cy, cz)
    integer, intent(in) :: procs(0:2), cx, cy, cz
    integer :: rank_of

    rank_of = (cx * procs(1) + cy) * procs(2) + cz
  end function rank_of

  subroutine block_init(bl, grid, procs, rank)
    type(block_t), intent(out) :: bl
    integer, intent(in) :: grid(0:2), procs(0:2), rank
    integer :: dd, c(0:2)

    bl%coord(2) = mod(rank, procs(2))
    bl%coord(1) = mod(rank / procs(2), procs(1))
    bl%coord(0) = rank / procs(2) / procs(1)
    do dd = 0, 2
      call split(grid(dd), procs(dd), bl%coord(dd), bl%n(dd), bl%off(dd))
      c = bl%coord
      c(dd) = bl%coord(dd) - 1
      bl%nb(2 * dd) = merge(rank_of(procs, c(0), c(1), c(2)), -1, c(dd) >= 0)
      c(dd) = bl%coord(dd) + 1
      bl%nb(2 * dd + 1) = merge(rank_of(procs, c(0), c(1), c(2)), -1, c(dd) < procs(dd))
    end do
    bl%fsize(XLO:XHI) = bl%n(1) * bl%n(2)
    bl%fsize(YLO:YHI) = bl%n(0) * bl%n(2)
    bl%fsize(ZLO:ZHI) = bl%n(0) * bl%n(1)
    ! Cells next to an exchanged face wait for it; those next to the fixed
    ! boundary do not.
    do dd = 0, 2
      bl%lo(dd) = merge(1, 0, bl%nb(2 * dd) >= 0)
      bl%hi(dd) = max(bl%lo(dd), bl%n(dd) - merge(1, 0, bl%nb(2 * dd + 1) >= 0))
    end do
  end subroutine block_init

  subroutine fill_boundary_face(bl, grid, ff, face)
    type(block_t), intent(in) :: bl
    integer, intent(in) :: grid(0:2), ff
    real(dp), intent(out) :: face(:)
    integer :: i, j, k, nx, ny, nz, g

    nx = bl%n(0)
    ny = bl%n(1)
    nz = bl%n(2)
    select case (ff)
    case (XLO, XHI)
      g = merge(-1, grid(0), ff == XLO)
      do j = 0, ny - 1
        do k = 0, nz - 1
          face(j * nz + k + 1) = boundary_value(grid, g, bl%off(1) + j, bl%off(2) + k)
        end do
      end do
    case (YLO, YHI)
      g = merge(-1, grid(1), ff == YLO)
      do i = 0, nx - 1
        do k = 0, nz - 1
          face(i * nz + k + 1) = boundary_value(grid, bl%off(0) + i, g, bl%off(2) + k)
        end do
      end do
    case default
      g = merge(-1, grid(2), ff == ZLO)
      do i = 0, nx - 1
        do j = 0, ny - 1
          face(i * ny + j + 1) = boundary_value(grid, bl%off(0) + i, bl%off(1) + j, g)
        end do
      end do
    end select
  end subroutine fill_boundary_face

  ! The block's plane next to face ff, in the layout of the neighbour's
  ! opposite face.
  subroutine pack_face(bl, uu, ff, out)
    type(block_t), intent(in) :: bl
    real(dp), intent(in) :: uu(0:, 0:, 0:)
    integer, intent(in) :: ff
    real(dp), intent(out) :: out(:)
    integer :: i, j, k, nx, ny, nz

    nx = bl%n(0)
    ny = bl%n(1)
    nz = bl%n(2)
    select case (ff)
    case (XLO, XHI)
      i = merge(0, nx - 1, ff == XLO)
      out = reshape(uu(:, :, i), [ny * nz])
    case (YLO, YHI)
      j = merge(0, ny - 1, ff == YLO)
      do i = 0, nx - 1
        out(i * nz + 1:(i + 1) * nz) = uu(:, j, i)
      end do
    case default
      k = merge(0, nz - 1, ff == ZLO)
      do i = 0, nx - 1
        do j = 0, ny - 1
          out(i * ny + j + 1) = uu(k, j, i)
        end do
      end do
    end select
  end subroutine pack_face

  ! One Jacobi update, vv = mean of the six neighbours of uu, on the cells
  ! [lo, hi) of the block. Values outside the block come from face(:) (a
  ! neighbour's face as received, or the fixed boundary); a face is read
  ! only by the cells next to it, so the interior box may leave the faces
  ! still in flight unassociated. Every cell gets the same expression in any
  ! box, so a sweep split into boxes equals one sweep of the whole block,
  ! and the serial reference (the whole grid as one box) equals both: the
  ! same additions in the same order as jacobi3d.c's sweep_box().
  !
  ! Where out(f) is associated, the new values of the plane next to face f
  ! are also stored there, in pack_face's layout, as each row is computed:
  ! the pack of the next iteration's face, fused into the sweep.
  subroutine sweep_box(bl, uu, vv, face, out, lo, hi)
    type(block_t), intent(in) :: bl
    real(dp), intent(in), target, contiguous :: uu(0:, 0:, 0:)
    real(dp), intent(inout), contiguous :: vv(0:, 0:, 0:)
    type(buf_t), intent(in) :: face(0:NFACES - 1), out(0:NFACES - 1)
    integer, intent(in) :: lo(0:2), hi(0:2)
    real(dp), pointer, contiguous :: xm(:), xp(:), ym(:), yp(:)
    real(dp) :: zm, zp
    integer :: i, j, k0, k1, nx, ny, nz

    nx = bl%n(0)
    ny = bl%n(1)
    nz = bl%n(2)
    k0 = lo(2)
    k1 = hi(2)
    if (k0 >= k1) return
    do i = lo(0), hi(0) - 1
      do j = lo(1), hi(1) - 1
        if (i > 0) then
          xm => uu(:, j, i - 1)
        else
          xm => face(XLO)%a(j * nz + 1:(j + 1) * nz)
        end if
        if (i < nx - 1) then
          xp => uu(:, j, i + 1)
        else
          xp => face(XHI)%a(j * nz + 1:(j + 1) * nz)
        end if
        if (j > 0) then
          ym => uu(:, j - 1, i)
        else
          ym => face(YLO)%a(i * nz + 1:(i + 1) * nz)
        end if
        if (j < ny - 1) then
          yp => uu(:, j + 1, i)
        else
          yp => face(YHI)%a(i * nz + 1:(i + 1) * nz)
        end if
        ! The z faces only where the row's ends are in the box.
        zm = 0
        zp = 0
        if (k0 == 0) zm = face(ZLO)%a(i * ny + j + 1)
        if (k1 == nz) zp = face(ZHI)%a(i * ny + j + 1)
        call sweep_row(nz, k0, k1, xm, xp, ym, yp, zm, zp, uu(:, j, i), vv(:, j, i))
        if (i == 0 .and. associated(out(XLO)%a)) &
          out(XLO)%a(j * nz + k0 + 1:j * nz + k1) = vv(k0:k1 - 1, j, i)
        if (i == nx - 1 .and. associated(out(XHI)%a)) &
          out(XHI)%a(j * nz + k0 + 1:j * nz + k1) = vv(k0:k1 - 1, j, i)
        if (j == 0 .and. associated(out(YLO)%a)) &
          out(YLO)%a(i * nz + k0 + 1:i * nz + k1) = vv(k0:k1 - 1, j, i)
        if (j == ny - 1 .and. associated(out(YHI)%a)) &
          out(YHI)%a(i * nz + k0 + 1:i * nz + k1) = vv(k0:k1 - 1, j, i)
        if (k0 == 0 .and. associated(out(ZLO)%a)) out(ZLO)%a(i * ny + j + 1) = vv(0, j, i)
        if (k1 == nz .and. associated(out(ZHI)%a)) out(ZHI)%a(i * ny + j + 1) = vv(nz - 1, j, i)
      end do
    end do
  end subroutine sweep_box

  ! Cells [k0, k1) of one row along z: the two ends read the z faces (zm,
  ! zp), the middle is a branch-free loop the compiler can vectorise.
  subroutine sweep_row(nz, k0, k1, xm, xp, ym, yp, zm, zp, c, out)
    integer, intent(in) :: nz, k0, k1
    real(dp), intent(in) :: xm(0:nz - 1), xp(0:nz - 1), ym(0:nz - 1), yp(0:nz - 1), c(0:nz - 1)
    real(dp), intent(in) :: zm, zp
    real(dp), intent(inout) :: out(0:nz - 1)
    real(dp), parameter :: sixth = 1.0_dp / 6.0_dp
    real(dp) :: zr
    integer :: k, kfirst

    kfirst = k0
    if (k0 == 0) then
      zr = zp
      if (nz > 1) zr = c(1)
      out(0) = (((xm(0) + xp(0)) + (ym(0) + yp(0))) + (zm + zr)) * sixth
      kfirst = 1
    end if
    do k = kfirst, min(k1, nz - 1) - 1
      out(k) = (((xm(k) + xp(k)) + (ym(k) + yp(k))) + (c(k - 1) + c(k + 1))) * sixth
    end do
    if (k1 == nz .and. nz > 1) &
      out(nz - 1) = (((xm(nz - 1) + xp(nz - 1)) + (ym(nz - 1) + yp(nz - 1))) + (c(nz - 2) + zp)) * sixth
  end subroutine sweep_row

  ! Everything outside the interior box, as up to six disjoint boxes: the x
  ! slabs, then the y slabs between them, then the z ends of the rows left;
  ! packing the next faces into out.
  subroutine sweep_boundary(face, out)
    type(buf_t), intent(in) :: face(0:NFACES - 1), out(0:NFACES - 1)
    integer :: dd, e, lo(0:2), hi(0:2)

    do dd = 0, 2
      do e = 0, 2
        lo(e) = merge(b%lo(e), 0, e < dd)
        hi(e) = merge(b%hi(e), b%n(e), e < dd)
      end do
      hi(dd) = b%lo(dd)
      call sweep_box(b, u, v, face, out, lo, hi)
      lo(dd) = b%hi(dd)
      hi(dd) = b%n(dd)
      call sweep_box(b, u, v, face, out, lo, hi)
    end do
  end subroutine sweep_boundary

  ! Sum of the squared updates v - u over the block, in memory order, as
  ! jacobi3d.c's residual().
  function residual() result(r)
    real(dp) :: r
    integer :: i, j, k

    r = 0
    do i = 0, b%n(0) - 1
      do j = 0, b%n(1) - 1
        do k = 0, b%n(2) - 1
          r = r + (v(k, j, i) - u(k, j, i)) * (v(k, j, i) - u(k, j, i))
        end do
      end do
    end do
  end function residual

  ! ---- communication -------------------------------------------------------

  subroutine swap_uv()
    real(dp), pointer, contiguous :: t(:, :, :)

    t => u
    u => v
    v => t
  end subroutine swap_uv

  ! Dies on an error from dchan_progress/dchan_wait or one reported on a
  ! channel (jacobi3d_f_on_error).
  subroutine check_progress(code, what)
    integer(c_int), intent(in) :: code
    character(len=*), intent(in) :: what

    if (code < 0) call die_dchan(what, code)
    if (err_state(1) /= 0) call die_dchan('channel', err_state(1))
  end subroutine check_progress

  ! One more round of a wait loop on a neighbour (credit, a put's local
  ! completion): progress, and after a while give the core away, until the
  ! timeout. spins and deadline start at 0.
  subroutine wait_round(spins, deadline, what)
    integer, intent(inout) :: spins
    real(dp), intent(inout) :: deadline
    character(len=*), intent(in) :: what
    integer(c_int) :: code

    call check_progress(dchan_progress(ctx), what)
    spins = spins + 1
    if (spins < 64) return
    if (spins == 64) then
      deadline = MPI_Wtime() + WAIT_TIMEOUT_MS / 1000.0_dp
    else if (MPI_Wtime() > deadline) then
      call die(what)
    end if
    code = sched_yield()
  end subroutine wait_round

  ! msg: posts the receives of iteration it into recv(:, parity), last
  ! read by the sweep of iteration it-2. Tag = the sender's face; MPI's
  ! non-overtaking rule keeps consecutive iterations in order.
  subroutine msg_post(it)
    integer, intent(in) :: it
    integer :: ff, pp

    pp = iand(it, 1)
    do ff = 0, NFACES - 1
      if (b%nb(ff) >= 0) call MPI_Irecv(recv(ff, pp)%a, b%fsize(ff), MPI_DOUBLE_PRECISION, b%nb(ff), &
                                        ieor(ff, 1), MPI_COMM_WORLD, rreq(ff, pp), ierr)
    end do
  end subroutine msg_post

  ! dchan: where to pack the next face on send handle h (fsize doubles):
  ! the neighbour's slot itself where it is mapped here (shm with slots
  ! from dchan_alloc; never under SENTINEL detection, whose tail written in
  ! place would announce the face early), else h's send buffer, which
  ! dchan_put copies into the slot. Without credit (the neighbour has not
  ! handed the slot back yet) this drives progress until the credit comes;
  ! see run's comment.
  function face_target(h, fsize) result(p)
    type(c_ptr), intent(in) :: h
    integer, intent(in) :: fsize
    real(dp), pointer, contiguous :: p(:)
    type(c_ptr) :: at
    integer(c_int) :: code
    integer :: spins
    real(dp) :: deadline

    spins = 0
    deadline = 0
    do
      code = dchan_put_ptr(h, at)
      if (code /= DCHAN_ERR_AGAIN) exit
      call wait_round(spins, deadline, 'waiting for credit: a neighbour did not hand back its slot')
    end do
    if (code /= DCHAN_SUCCESS) call die_dchan('dchan_put_ptr', code)
    call c_f_pointer(at, p, [fsize])
  end function face_target

  ! Where the faces of iteration it are packed (those with a neighbour):
  ! msg's pack(:, parity), once the sends of iteration it-2 from there are
  ! done; dchan's face_target.
  subroutine pack_targets(it, out)
    integer, intent(in) :: it
    type(buf_t), intent(out) :: out(0:NFACES - 1)
    integer :: ff, pp

    pp = iand(it, 1)
    if (o%mode == MODE_MSG) call MPI_Waitall(NFACES, sreq(:, pp), MPI_STATUSES_IGNORE, ierr)
    do ff = 0, NFACES - 1
      if (b%nb(ff) < 0) cycle
      if (o%mode == MODE_MSG) then
        out(ff)%a => pack(ff, pp)%a
      else
        out(ff)%a => face_target(sh(ff), b%fsize(ff))
      end if
    end do
  end subroutine pack_targets

  ! Sends the faces of iteration it, packed where pack_targets said.
  subroutine send_faces(it)
    integer, intent(in) :: it
    integer :: ff, pp, spins
    integer(c_int) :: code
    real(dp) :: deadline

    pp = iand(it, 1)
    do ff = 0, NFACES - 1
      if (b%nb(ff) < 0) cycle
      if (o%mode == MODE_MSG) then
        call MPI_Isend(pack(ff, pp)%a, b%fsize(ff), MPI_DOUBLE_PRECISION, b%nb(ff), ff, &
                       MPI_COMM_WORLD, sreq(ff, pp), ierr)
        cycle
      end if
      ! face_target took the credit; the loop is for a put without one.
      spins = 0
      deadline = 0
      do
        code = dchan_put(sh(ff))
        if (code /= DCHAN_ERR_AGAIN) exit
        call wait_round(spins, deadline, 'waiting for credit: a neighbour did not hand back its slot')
      end do
      if (code /= DCHAN_SUCCESS) call die_dchan('dchan_put', code)
    end do
  end subroutine send_faces

  ! Whether a face of iteration it (counted from 0 since the channels were
  ! created) is still missing.
  logical function faces_missing(it)
    integer, intent(in) :: it
    integer :: ff

    faces_missing = .false.
    do ff = 0, NFACES - 1
      if (c_associated(rh(ff)) .and. arrived(ff) <= it) faces_missing = .true.
    end do
  end function faces_missing

  ! Waits for the faces of iteration it and says where they are.
  subroutine wait_faces(it, face)
    integer, intent(in) :: it
    type(buf_t), intent(out) :: face(0:NFACES - 1)
    integer :: ff, pp
    integer(c_int) :: code
    type(c_ptr) :: at

    pp = iand(it, 1)
    if (o%mode == MODE_MSG) call MPI_Waitall(NFACES, rreq(:, pp), MPI_STATUSES_IGNORE, ierr)
    ! Callbacks (jacobi3d_f_on_arrival) run only inside our dchan_wait and
    ! dchan_progress calls.
    if (o%mode == MODE_DCHAN) then
      do while (faces_missing(it))
        call check_progress(dchan_wait(ctx, WAIT_TIMEOUT_MS), 'waiting for neighbour faces')
      end do
    end if
    do ff = 0, NFACES - 1
      if (b%nb(ff) < 0) then
        face(ff)%a => bface(ff)%a
      else if (o%mode == MODE_MSG) then
        face(ff)%a => recv(ff, pp)%a
      else if (o%mode == MODE_NONE) then
        face(ff)%a => recv(ff, 0)%a
      else
        code = dchan_slot(rh(ff), at)
        if (code /= DCHAN_SUCCESS) call die_dchan('dchan_slot', code)
        call c_f_pointer(at, face(ff)%a, [b%fsize(ff)])
      end if
    end do
  end subroutine wait_faces

  ! dchan: done with the slots of this iteration: hand them back.
  subroutine release_faces()
    integer :: ff
    integer(c_int) :: code

    do ff = 0, NFACES - 1
      if (.not. c_associated(rh(ff))) cycle
      code = dchan_ready(rh(ff))
      if (code /= DCHAN_SUCCESS) call die_dchan('dchan_ready', code)
    end do
  end subroutine release_faces

  ! Iterations [first, last) of iters; returns the squared update of the
  ! last iteration (0 when it is not among these) and adds the time spent
  ! in the exchange to comm. As jacobi3d.c's run() for one block:
  !   - (msg) posts the receives of iteration it+1;
  !   - sweeps the interior, which reads no exchanged face, while the faces
  !     of iteration it are in flight;
  !   - waits for the faces of iteration it and finds where to pack those
  !     of iteration it+1 (msg's pack buffer of that parity; dchan_put_ptr's
  !     target);
  !   - sweeps the boundary layer, packing as it goes (the planes sent are
  !     all next to an exchanged face, so in the boundary layer);
  !   - (dchan) hands the slots back (dchan_ready), then sends: MPI_Isend or
  !     dchan_put.
  ! Only iteration 0 packs apart (the initial values).
  !
  ! dchan: the n-th put on a face lands in slot n mod 2, and the sender may
  ! put only into a slot the receiver handed back: the library enforces the
  ! credit, so a put never overwrites a slot this rank still reads. It
  ! almost never makes a rank wait: the face of iteration it+1 goes into
  ! the slot that held iteration it-1's, which the neighbour handed back
  ! before it put its face of iteration it, which this rank waited for just
  ! before. (Without credit and depth, a neighbour could put its face of
  ! it+1 as soon as it has this rank's face of it, while this rank still
  ! sweeps with the neighbour's face of it: the first version of this
  ! program used two channels per face, on alternate iterations.)
  function run(first, last, iters) result(r)
    integer, intent(in) :: first, last, iters
    real(dp) :: r
    type(buf_t) :: face(0:NFACES - 1), out(0:NFACES - 1), nowhere(0:NFACES - 1)
    integer :: it, ff
    logical :: more, exchange
    real(dp) :: t

    r = 0
    exchange = o%mode /= MODE_NONE
    do it = first, last - 1
      more = it + 1 < iters ! is there a next iteration to send for
      t = MPI_Wtime()
      if (o%mode == MODE_MSG) then
        if (it == 0) call msg_post(0)
        if (more) call msg_post(it + 1)
      end if
      if (it == 0 .and. exchange) then
        call pack_targets(0, out)
        do ff = 0, NFACES - 1
          if (associated(out(ff)%a)) call pack_face(b, u, ff, out(ff)%a)
        end do
        call send_faces(0)
      end if
      if (exchange) comm = comm + (MPI_Wtime() - t)
      ! The interior: the fixed faces, none of those in flight.
      do ff = 0, NFACES - 1
        face(ff)%a => bface(ff)%a
      end do
      call sweep_box(b, u, v, face, nowhere, b%lo, b%hi)
      t = MPI_Wtime()
      call wait_faces(it, face)
      if (more .and. exchange) then
        call pack_targets(it + 1, out)
      else
        out = nowhere
      end if
      if (exchange) comm = comm + (MPI_Wtime() - t)
      call sweep_boundary(face, out)
      t = MPI_Wtime()
      if (o%mode == MODE_DCHAN) call release_faces()
      if (more .and. exchange) call send_faces(it + 1)
      if (exchange) comm = comm + (MPI_Wtime() - t)
      if (it == iters - 1) r = residual()
      call swap_uv()
    end do
    if (last == iters .and. o%mode == MODE_MSG) then
      call MPI_Waitall(NFACES, sreq(:, 0), MPI_STATUSES_IGNORE, ierr)
      call MPI_Waitall(NFACES, sreq(:, 1), MPI_STATUSES_IGNORE, ierr)
    end if
  end function run

  ! dchan_init with the options' detection and the error callback, then one
  ! credited channel of depth DEPTH per face; wires travel by MPI, once.
  subroutine start_dchan()
    type(dchan_attr_t) :: attr
    type(dchan_handle_attr_t) :: hattr
    type(dchan_wire_t), target :: mine(0:NFACES - 1), theirs(0:NFACES - 1)
    integer :: req(2 * NFACES), nreq, ff
    integer(c_int) :: code
    integer(c_size_t) :: bytes

    call dchan_attr_init(attr)
    if (o%detect >= 0) attr%detect = o%detect
    ! The job's communicator as MPI's Fortran bindings name it (dchan
    ! converts it with MPI_Comm_f2c); MPI_COMM_WORLD is also the default.
    attr%mpi_fcomm = MPI_COMM_WORLD
    attr%error_fn = c_funloc(jacobi3d_f_on_error)
    attr%error_arg = c_loc(err_state)
    code = dchan_init(attr, ctx)
    if (code /= DCHAN_SUCCESS) then
      if (code == DCHAN_ERR_UNSUPPORTED) then
        write (error_unit, '(a)') 'jacobi3d_f: rank ' // itoa(my_rank) // ': dchan_init: ' // dchan_strerror_f(code) &
          // ' (is the detection mode offered by the provider? see dchan_info)'
      else
        write (error_unit, '(a)') 'jacobi3d_f: rank ' // itoa(my_rank) // ': dchan_init: ' // dchan_strerror_f(code)
      end if
      flush (error_unit)
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    end if
    provider = dchan_provider_name_f(ctx)

    call dchan_handle_attr_init(hattr)
    hattr%credit = 1
    hattr%depth = DEPTH
    nreq = 0
    do ff = 0, NFACES - 1
      if (b%nb(ff) < 0) cycle
      bytes = 8_c_size_t * b%fsize(ff)
      code = dchan_alloc(ctx, bytes, sbuf(ff))
      if (code == DCHAN_SUCCESS) code = dchan_alloc(ctx, DEPTH * bytes, slots(ff))
      if (code /= DCHAN_SUCCESS) call die_dchan('dchan_alloc', code)
      code = dchan_create_handle_attr(ctx, b%nb(ff), slots(ff), bytes, SENTINEL_OOB, &
                                      c_funloc(jacobi3d_f_on_arrival), c_loc(arrived(ff)), hattr, rh(ff))
      if (code == DCHAN_ERR_UNSUPPORTED) &
        call die('dchan_create_handle_attr: the provider serving a neighbour offers no credited channels, ' &
                 // 'which dchan mode needs')
      if (code == DCHAN_SUCCESS) code = dchan_handle_export(rh(ff), mine(ff))
      if (code /= DCHAN_SUCCESS) call die_dchan('dchan_create_handle_attr', code)
      nreq = nreq + 1
      call MPI_Isend(mine(ff)%bytes, DCHAN_WIRE_SIZE, MPI_BYTE, b%nb(ff), ff, MPI_COMM_WORLD, req(nreq), ierr)
      ! The wire of the neighbour's channel for the opposite face: this
      ! rank's face ff goes there.
      nreq = nreq + 1
      call MPI_Irecv(theirs(ff)%bytes, DCHAN_WIRE_SIZE, MPI_BYTE, b%nb(ff), ieor(ff, 1), MPI_COMM_WORLD, &
                     req(nreq), ierr)
    end do
    call MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE, ierr)
    do ff = 0, NFACES - 1
      if (b%nb(ff) < 0) cycle
      code = dchan_assoc_local(ctx, theirs(ff), sbuf(ff), 8_c_size_t * b%fsize(ff), sh(ff))
      if (code /= DCHAN_SUCCESS) call die_dchan('dchan_assoc_local', code)
    end do
  end subroutine start_dchan

  ! Waits until the last put from a send buffer no longer reads it.
  subroutine wait_put_done(h)
    type(c_ptr), intent(in) :: h
    integer(c_int) :: code

    do
      code = dchan_put_test(h)
      if (code /= 0) exit
    end do
    if (code < 0) call die_dchan('dchan_put_test', code)
  end subroutine wait_put_done

  subroutine teardown_channels()
    integer :: ff
    integer(c_int) :: code

    ! Every put has arrived, but the senders' local completion may lag; no
    ! handle or buffer may go while a neighbour could still touch it.
    ! dchan_barrier drives progress while it waits, which the credit
    ! returned by the last dchan_ready may need.
    do ff = 0, NFACES - 1
      if (c_associated(sh(ff))) call wait_put_done(sh(ff))
    end do
    code = dchan_barrier(ctx)
    if (code /= DCHAN_SUCCESS) call die_dchan('dchan_barrier', code)
    do ff = 0, NFACES - 1
      if (c_associated(sh(ff))) code = dchan_handle_destroy(sh(ff))
      if (c_associated(rh(ff))) code = dchan_handle_destroy(rh(ff))
      if (c_associated(slots(ff))) code = dchan_free(ctx, slots(ff))
      if (c_associated(sbuf(ff))) code = dchan_free(ctx, sbuf(ff))
    end do
  end subroutine teardown_channels

  ! ---- verification --------------------------------------------------------

  ! Gathers the blocks on rank 0 and compares them with a serial run of the
  ! same problem (one block covering the grid, the same sweep). True if
  ! verified, on every rank.
  function verify_grid(maxd) result(good)
    real(dp), intent(out) :: maxd
    logical :: good
    integer, allocatable :: counts(:), displs(:)
    real(dp), allocatable :: all(:)
    real(dp), pointer, contiguous :: s(:, :, :), t(:, :, :), x(:, :, :)
    type(buf_t) :: face(0:NFACES - 1), noout(0:NFACES - 1)
    type(block_t) :: g, rb
    integer :: r, at, i, j, k, it, ff, okint
    real(dp) :: diff

    maxd = 0
    okint = 0
    if (my_rank == 0) then
      allocate (counts(0:nranks - 1), displs(0:nranks - 1))
      at = 0
      do r = 0, nranks - 1
        call block_init(rb, o%grid, o%procs, r)
        counts(r) = rb%n(0) * rb%n(1) * rb%n(2)
        displs(r) = at
        at = at + counts(r)
      end do
      allocate (all(at))
    else
      allocate (counts(1), displs(1), all(1))
    end if
    call MPI_Gatherv(u, size(u), MPI_DOUBLE_PRECISION, all, counts, displs, MPI_DOUBLE_PRECISION, 0, &
                     MPI_COMM_WORLD, ierr)

    if (my_rank == 0) then
      call block_init(g, o%grid, [1, 1, 1], 0)
      do ff = 0, NFACES - 1
        allocate (face(ff)%a(g%fsize(ff)))
        call fill_boundary_face(g, o%grid, ff, face(ff)%a)
      end do
      allocate (s(0:g%n(2) - 1, 0:g%n(1) - 1, 0:g%n(0) - 1), t(0:g%n(2) - 1, 0:g%n(1) - 1, 0:g%n(0) - 1))
      s = 0
      do it = 0, o%iters - 1
        call sweep_box(g, s, t, face, noout, [0, 0, 0], g%n)
        x => s
        s => t
        t => x
      end do
      do r = 0, nranks - 1
        call block_init(rb, o%grid, o%procs, r)
        do i = 0, rb%n(0) - 1
          do j = 0, rb%n(1) - 1
            do k = 0, rb%n(2) - 1
              diff = abs(all(displs(r) + (i * rb%n(1) + j) * rb%n(2) + k + 1) &
                         - s(rb%off(2) + k, rb%off(1) + j, rb%off(0) + i))
              ! .not. (diff <= maxd) also catches NaN
              if (.not. (diff <= maxd)) maxd = diff
            end do
          end do
        end do
      end do
      okint = merge(1, 0, maxd <= VERIFY_TOL)
      do ff = 0, NFACES - 1
        deallocate (face(ff)%a)
      end do
      deallocate (s, t)
    end if
    call MPI_Bcast(okint, 1, MPI_INTEGER, 0, MPI_COMM_WORLD, ierr)
    call MPI_Bcast(maxd, 1, MPI_DOUBLE_PRECISION, 0, MPI_COMM_WORLD, ierr)
    good = okint == 1
  end function verify_grid

  ! ---- command line ----------------------------------------------------------

  subroutine usage()
    write (output_unit, '(a)') &
      'usage: mpirun -np P jacobi3d_f [options]', &
      '  --grid NX,NY,NZ     unknowns along x, y, z (default 64,64,64)', &
      '  --procs PX,PY,PZ    process grid, PX*PY*PZ = P (default: MPI_Dims_create)', &
      '  --iters N           Jacobi iterations (default 100)', &
      '  --mode msg|dchan|none', &
      '                      face exchange: MPI_Isend/MPI_Irecv, dchan channels, or', &
      '                      none at all (the compute floor; not verified) (default dchan)', &
      '  --faces pack        dchan mode: one credited channel of depth 2 per face; the', &
      '                      sweep packs each face straight into the neighbour''s slot', &
      '                      where the provider maps it (dchan_put_ptr), else into the', &
      '                      send buffer (the only scheme here, and the default)', &
      '  --verify            compare with a serial run on rank 0 (gathered grid); the', &
      '                      results must agree exactly; exit 1 if they do not', &
      '  --detect auto|sentinel|flag|event', &
      '                      dchan arrival detection (default: DCHAN_DETECT, else auto)', &
      '  --help              this text', &
      'Solves the Laplace equation with fixed boundary values by Jacobi sweeps,', &
      'starting from zero; the interior of the block is swept while its faces are in', &
      'flight. The last line on stdout is a RESULT line: iter_time_s is the mean', &
      'time of one iteration on the slowest rank (the first iteration, which pays', &
      'for first contact, is not timed); comm_share is the part of the iteration', &
      'spent in the exchange (all but the sweeps), averaged over the ranks;', &
      'residual is the 2-norm of the last iteration''s update over the whole grid,', &
      'sqrt(sum (u_new - u_old)^2).', &
      'The Fortran version of jacobi3d (module dchan): the same flags (but --blocks,', &
      '--modes, --rounds and --faces subarray), output and arithmetic.'
    flush (output_unit)
  end subroutine usage

  ! A positive integer up to huge(0), all digits; -1 otherwise.
  function parse_int(str) result(val)
    character(len=*), intent(in) :: str
    integer :: val, k
    integer(c_int64_t) :: acc

    val = -1
    if (len(str) == 0 .or. len(str) > 10 .or. verify(str, '0123456789') /= 0) return
    acc = 0
    do k = 1, len(str)
      acc = acc * 10 + (iachar(str(k:k)) - iachar('0'))
    end do
    if (acc >= 1 .and. acc <= huge(0)) val = int(acc)
  end function parse_int

  ! "A,B,C" with three positive integers; 0 on success.
  function parse_triple(str, out) result(bad)
    character(len=*), intent(in) :: str
    integer, intent(inout) :: out(0:2)
    integer :: bad, c1, c2, t(0:2)

    bad = -1
    c1 = index(str, ',')
    if (c1 == 0) return
    c2 = index(str(c1 + 1:), ',') + c1
    if (c2 == c1) return
    t(0) = parse_int(str(1:c1 - 1))
    t(1) = parse_int(str(c1 + 1:c2 - 1))
    t(2) = parse_int(str(c2 + 1:))
    if (any(t < 1)) return
    out = t
    bad = 0
  end function parse_triple

  ! Long options as getopt_long takes them: --name value, --name=value, and
  ! unambiguous abbreviations. 0 to run, 1 for --help, -1 for an error
  ! (printed on rank 0).
  function parse_args(opt) result(rc_)
    type(options_t), intent(inout) :: opt
    integer :: rc_
    character(len=*), parameter :: names(8) = [character(len=6) :: 'grid', 'procs', 'iters', 'mode', &
                                                'verify', 'detect', 'faces', 'help']
    logical, parameter :: has_arg(8) = [.true., .true., .true., .true., .false., .true., .true., .false.]
    character(len=:), allocatable :: arg, name, val, bad
    integer :: k, nargs, alen, eq, m, hit, nhit
    logical :: have_val

    rc_ = 0
    name = ''
    val = ''
    nargs = command_argument_count()
    k = 1
    do while (k <= nargs)
      arg = get_arg(k)
      if (arg == '--') then
        ! The end of the options: anything after it is unexpected.
        if (k < nargs) then
          call arg_error('unexpected argument ''' // get_arg(k + 1) // ''' (see --help)')
          rc_ = -1
        end if
        return
      end if
      if (len(arg) < 2 .or. arg(1:1) /= '-' .or. arg == '-') then
        call arg_error('unexpected argument ''' // arg // ''' (see --help)')
        rc_ = -1
        return
      end if
      if (arg(2:2) /= '-') then
        call arg_error(arg // ': unknown option or missing argument (see --help)')
        rc_ = -1
        return
      end if
      eq = index(arg, '=')
      have_val = eq > 0
      if (have_val) then
        name = arg(3:eq - 1)
        val = arg(eq + 1:)
      else
        name = arg(3:)
        val = ''
      end if
      ! An exact name wins; else an abbreviation of exactly one.
      hit = 0
      nhit = 0
      alen = len(name)
      do m = 1, size(names)
        if (alen == 0) exit
        if (trim(names(m)) == name) then
          hit = m
          nhit = 1
          exit
        end if
        if (alen <= len_trim(names(m))) then
          if (names(m)(1:alen) == name) then
            hit = m
            nhit = nhit + 1
          end if
        end if
      end do
      if (nhit /= 1 .or. (has_arg(max(hit, 1)) .and. .not. have_val .and. k == nargs) &
          .or. (hit > 0 .and. .not. has_arg(max(hit, 1)) .and. have_val)) then
        call arg_error(arg // ': unknown option or missing argument (see --help)')
        rc_ = -1
        return
      end if
      if (has_arg(hit) .and. .not. have_val) then
        k = k + 1
        val = get_arg(k)
      end if
      bad = ''
      select case (trim(names(hit)))
      case ('grid')
        if (parse_triple(val, opt%grid) /= 0) bad = '--grid wants NX,NY,NZ, three positive integers'
      case ('procs')
        if (parse_triple(val, opt%procs) /= 0) bad = '--procs wants PX,PY,PZ, three positive integers'
      case ('iters')
        if (parse_int(val) < 1) then
          bad = '--iters wants a positive integer'
        else
          opt%iters = parse_int(val)
        end if
      case ('mode')
        if (val == 'msg') then
          opt%mode = MODE_MSG
        else if (val == 'dchan') then
          opt%mode = MODE_DCHAN
        else if (val == 'none') then
          opt%mode = MODE_NONE
        else
          bad = '--mode wants msg, dchan or none'
        end if
      case ('faces')
        ! Accepted so that a run of jacobi3d with --faces pack runs here
        ! unchanged; subarray is the C program's alone.
        if (val == 'subarray') then
          bad = '--faces subarray is not in the Fortran driver (its dchan mode packs); use jacobi3d'
        else if (val /= 'pack') then
          bad = '--faces wants pack'
        end if
      case ('verify')
        opt%verify = .true.
      case ('detect')
        select case (val)
        case ('auto')
          opt%detect = DCHAN_DETECT_AUTO
        case ('sentinel')
          opt%detect = DCHAN_DETECT_SENTINEL
        case ('flag')
          opt%detect = DCHAN_DETECT_FLAG
        case ('event')
          opt%detect = DCHAN_DETECT_EVENT
        case default
          bad = '--detect wants auto, sentinel, flag or event'
        end select
      case ('help')
        if (my_rank == 0) call usage()
        rc_ = 1
        return
      end select
      if (len(bad) > 0) then
        call arg_error(bad)
        rc_ = -1
        return
      end if
      k = k + 1
    end do
  end function parse_args

  function get_arg(k)
    integer, intent(in) :: k
    character(len=:), allocatable :: get_arg
    integer :: n

    call get_command_argument(k, length=n)
    allocate (character(len=n) :: get_arg)
    if (n > 0) call get_command_argument(k, get_arg)
  end function get_arg

  subroutine arg_error(msg)
    character(len=*), intent(in) :: msg

    if (my_rank == 0) then
      write (error_unit, '(a)') 'jacobi3d_f: ' // msg
      flush (error_unit)
    end if
  end subroutine arg_error

  function check_decomposition(opt) result(rc_)
    type(options_t), intent(inout) :: opt
    integer :: rc_, dd
    character(len=1), parameter :: axis(0:2) = ['x', 'y', 'z']

    rc_ = -1
    if (opt%procs(0) == 0) call MPI_Dims_create(nranks, 3, opt%procs, ierr)
    if (int(opt%procs(0), c_int64_t) * opt%procs(1) * opt%procs(2) /= nranks) then
      if (my_rank == 0) write (error_unit, '(a, i0, a)') 'jacobi3d_f: --procs ' // triple(opt%procs) // ' needs ', &
        int(opt%procs(0), c_int64_t) * opt%procs(1) * opt%procs(2), ' ranks, but the job has ' // itoa(nranks)
      return
    end if
    do dd = 0, 2
      if (opt%grid(dd) < opt%procs(dd)) then
        if (my_rank == 0) write (error_unit, '(a)') 'jacobi3d_f: grid ' // itoa(opt%grid(dd)) // ' along ' // axis(dd) &
          // ' cannot be split over ' // itoa(opt%procs(dd)) // ' ranks'
        return
      end if
    end do
    if (opt%verify .and. real(opt%grid(0), dp) * opt%grid(1) * opt%grid(2) > huge(0)) then
      if (my_rank == 0) write (error_unit, '(a)') 'jacobi3d_f: --verify gathers the grid on rank 0; ' &
        // triple(opt%grid) // ' is too large'
      return
    end if
    rc_ = 0
  end function check_decomposition
end program jacobi3d_f

! Counts the faces of one parity that have arrived (arg: that counter).
subroutine jacobi3d_f_on_arrival(h, arg) bind(C)
  use dchan
  implicit none
  type(c_ptr), value :: h, arg
  integer(c_int), pointer :: arrived

  call c_f_pointer(arg, arrived)
  arrived = arrived + 1
end subroutine jacobi3d_f_on_arrival

! An asynchronous channel error (arg: [rank, error]); the iteration loop
! sees it and stops the job.
subroutine jacobi3d_f_on_error(h, rc, arg) bind(C)
  use, intrinsic :: iso_fortran_env, only: error_unit
  use dchan
  implicit none
  type(c_ptr), value :: h, arg
  integer(c_int), value :: rc
  integer(c_int), pointer :: state(:)
  character(len=16) :: rank

  call c_f_pointer(arg, state, [2])
  write (rank, '(i0)') state(1)
  write (error_unit, '(a)') 'jacobi3d_f: rank ' // trim(rank) // ': channel error: ' // dchan_strerror_f(rc)
  flush (error_unit)
  state(2) = rc
end subroutine jacobi3d_f_on_error
