dnl SPDX-License-Identifier: BSD-3-Clause
dnl The demo applications' configure fragment. matmul3d needs a CBLAS
dnl dgemm; OpenBLAS (Debian: libopenblas-dev) is looked up through
dnl pkg-config, falling back to -lopenblas. --with-blas=DIR points elsewhere.
DCHAN_CHECK_PKG([blas], [openblas], [cblas.h], [cblas_dgemm], [openblas],
                [BLAS (OpenBLAS) for matmul3d])
dnl OpenBLAS starts one thread per core in every rank unless told otherwise;
dnl matmul3d caps it at one thread per rank when the call exists.
AS_IF([test "x$have_blas" = xyes], [
  dchan_save_LIBS=$LIBS; dchan_save_LDFLAGS=$LDFLAGS
  LIBS="$BLAS_LIBS $LIBS"; LDFLAGS="$LDFLAGS $BLAS_LDFLAGS"
  AC_CHECK_FUNCS([openblas_set_num_threads])
  LIBS=$dchan_save_LIBS; LDFLAGS=$dchan_save_LDFLAGS])
