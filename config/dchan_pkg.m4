dnl SPDX-License-Identifier: BSD-3-Clause
dnl DCHAN_CHECK_PKG(name, pkg-config module, header, function, library, what,
dnl                 [includes the header needs first])
dnl --with-<name>[=DIR] (yes|no|auto|DIR). Sets <NAME>_CPPFLAGS, _LDFLAGS,
dnl _LIBS, HAVE_<NAME> and the HAVE_<NAME> conditional, and have_<name>.
dnl A DIR is searched directly; otherwise pkg-config, then the default paths.
AC_DEFUN([DCHAN_CHECK_PKG], [
  m4_pushdef([NAME], m4_toupper([$1]))
  AC_ARG_WITH([$1],
    [AS_HELP_STRING([--with-$1@<:@=DIR@:>@], [$6 (default: when found)])],
    [], [with_$1=auto])
  have_$1=no
  AS_IF([test "x$with_$1" != xno], [
    AS_CASE(["$with_$1"],
      [yes|auto], [PKG_CHECK_MODULES(NAME, [$2],
                     [NAME[]_CPPFLAGS=$NAME[]_CFLAGS],
                     [NAME[]_CPPFLAGS=; NAME[]_LIBS=-l$5])],
      [NAME[]_CPPFLAGS="-I$with_$1/include"
       NAME[]_LDFLAGS="-L$with_$1/lib -L$with_$1/lib64 -Wl,-rpath,$with_$1/lib"
       NAME[]_LIBS=-l$5])
    dchan_save_CPPFLAGS=$CPPFLAGS; dchan_save_LDFLAGS=$LDFLAGS; dchan_save_LIBS=$LIBS
    CPPFLAGS="$CPPFLAGS $NAME[]_CPPFLAGS"; LDFLAGS="$LDFLAGS $NAME[]_LDFLAGS"; LIBS="$NAME[]_LIBS $LIBS"
    AC_CHECK_HEADER([$3], [
      AC_MSG_CHECKING([for $4 in $NAME[]_LIBS])
      AC_LINK_IFELSE([AC_LANG_CALL([], [$4])], [have_$1=yes], [have_$1=no])
      AC_MSG_RESULT([$have_$1])], [], [m4_default([$7], [AC_INCLUDES_DEFAULT])])
    CPPFLAGS=$dchan_save_CPPFLAGS; LDFLAGS=$dchan_save_LDFLAGS; LIBS=$dchan_save_LIBS
    AS_IF([test "x$have_$1" = xno && test "x$with_$1" != xauto],
          [AC_MSG_ERROR([--with-$1 was given but $3 / lib$5 were not found])])
  ])
  AS_IF([test "x$have_$1" = xyes],
        [AC_DEFINE([HAVE_]NAME, [1], [Define to 1 when $6 is built])],
        [NAME[]_CPPFLAGS=; NAME[]_LDFLAGS=; NAME[]_LIBS=])
  AC_SUBST(NAME[_CPPFLAGS])
  AC_SUBST(NAME[_LDFLAGS])
  AC_SUBST(NAME[_LIBS])
  AM_CONDITIONAL([HAVE_]NAME, [test "x$have_$1" = xyes])
  m4_popdef([NAME])
])
