# SPDX-License-Identifier: BSD-3-Clause
#
# gen-fortran.awk: the Fortran binding of dchan, generated from the C API.
#
# include/dchan.h is the one API list (STYLE.md point 14): this script reads
# it (and the configured include/dchan_version.h) and writes
#
#   mode=module   lib/fortran/dchan.f90: the template (-v template=FILE)
#                 with its !@CONSTANTS@, !@TYPES@, !@INTERFACES@ and
#                 !@HELPERS@ lines replaced by the named parameters, the
#                 bind(C) derived types, the abstract interfaces of the
#                 callback types, a bind(C) interface per call and, per call
#                 returning a C string, a helper returning a Fortran string;
#   mode=symbols  a test program that takes c_funloc of every bind(C)
#                 interface, so that a name that the library does not
#                 export fails to link;
#   mode=layout, mode=layout-c
#                 a test program and its C half that compare the size,
#                 every field's offset and size of each derived type, and
#                 every constant, with what the C compiler makes of dchan.h;
#   mode=man      the Fortran part of a SYNOPSIS (-v names="a b c": calls,
#                 callback types and structures, in that order), which
#                 lib/fortran/man-fortran.sh checks against man/*.3.
#
# The module is generated at every build rather than committed, so that
# it cannot fall behind the header: a call, field or constant added to
# dchan.h appears in Fortran at the next make, and a C type that has no
# rule below stops the build with the declaration that needs one. Plain
# POSIX awk, no gawk extension (Debian's default is mawk), so that building
# needs nothing more.
#
#   awk -f gen-fortran.awk -v mode=module -v template=dchan.f90.tmpl \
#       include/dchan.h include/dchan_version.h > dchan.f90

BEGIN {
    if (mode !~ /^(module|symbols|layout|layout-c|man)$/)
        fatal("usage: awk -f gen-fortran.awk -v mode=module|symbols|layout|layout-c|man ... dchan.h [dchan_version.h]")
    if (mode == "module" && template == "")
        fatal("mode=module needs -v template=FILE")
    # Macros that are not constants: include guards and the export attribute.
    notconst["DCHAN_H"] = notconst["DCHAN_VERSION_H"] = notconst["DCHAN_API"] = 1
    # Fortran names are case-insensitive, so the constant DCHAN_VERSION and
    # the call dchan_version() would be one name: the constant is renamed.
    rename["DCHAN_VERSION"] = "DCHAN_VERSION_NUMBER"
    # Pointer parameters that C reads as arrays (dimension(*) in Fortran).
    arrayarg["dchan_assoc_local_iov", "iov"] = 1
    text = ""
    nconst = 0
    ifdepth = 0
    skipdepth = 0
}

function fatal(msg) {
    printf "gen-fortran.awk: %s\n", msg > "/dev/stderr"
    failed = 1
    exit 1
}

function trim(s) {
    gsub(/^[ \t]+|[ \t]+$/, "", s)
    return s
}

# Removes /* */ comments from s (which holds whole comments only).
function uncomment(s,   i, j, rest) {
    while ((i = index(s, "/*")) > 0) {
        rest = substr(s, i + 2)
        j = index(rest, "*/")
        if (j == 0)
            fatal("unterminated comment in " FILENAME)
        s = substr(s, 1, i - 1) " " substr(rest, j + 2)
    }
    return s
}

{
    line = $0
    while (line ~ /\\$/) {                      # continuation lines
        sub(/\\$/, "", line)
        if ((getline more) <= 0)
            break
        line = line " " more
    }
    if (line ~ /^[ \t]*#/) {
        # A comment opened on a directive line may close further down.
        while (index(line, "/*") > 0 && index(substr(line, index(line, "/*")), "*/") == 0) {
            if ((getline more) <= 0)
                break
            line = line " " more
        }
        directive(uncomment(line))
        next
    }
    if (!skipdepth)
        text = text " " line
}

# Preprocessor lines: C++ guards are skipped, DCHAN_* macros with a value
# become constants (in the order seen: dchan.h, then dchan_version.h).
function directive(line,   name, value) {
    sub(/^[ \t]*#[ \t]*/, "", line)
    if (line ~ /^if/) {
        ifdepth++
        if (!skipdepth && line ~ /__cplusplus/)
            skipdepth = ifdepth
    } else if (line ~ /^endif/) {
        if (skipdepth == ifdepth)
            skipdepth = 0
        ifdepth--
    } else if (!skipdepth && line ~ /^define[ \t]/) {
        sub(/^define[ \t]+/, "", line)
        name = line
        sub(/[ \t(].*/, "", name)
        value = trim(substr(line, length(name) + 1))
        if (name !~ /^DCHAN_/ || (name in notconst) || value == "")
            return
        if (substr(value, 1, 1) == "(" && substr(line, length(name) + 1, 1) == "(")
            fatal("function-like macro " name " has no Fortran form")
        add_const(name, value, FILENAME)
    }
}

function add_const(name, value, where,   v) {
    if (value ~ /^"[^"\\]*"$/) {
        ckind[++nconst] = "str"
        cval[nconst] = substr(value, 2, length(value) - 2)
    } else {
        v = eval(value, name)
        ival[name] = v
        ckind[++nconst] = "int"
        cval[nconst] = v
    }
    cname[nconst] = name
    cfrom[nconst] = where
}

# ---- C integer constant expressions ----------------------------------------
# Literals, earlier constants, ( ), unary - + ~, * / % + - << >> & ^ |, on
# values that double-precision awk holds exactly (|v| < 2^53).

function eval(s, what,   v) {
    ev_s = s
    ev_i = 1
    ev_err = ""
    v = ev_or()
    if (ev_err == "" && ev_peek(1) != "")
        ev_err = "unexpected '" ev_peek(1) "'"
    if (ev_err != "")
        fatal(what " = " s ": not a constant expression (" ev_err ")")
    return v
}

function ev_peek(n) {
    while (substr(ev_s, ev_i, 1) ~ /[ \t]/)
        ev_i++
    return substr(ev_s, ev_i, n)
}

function ev_primary(   c, rest, tok, v, k) {
    c = ev_peek(1)
    rest = substr(ev_s, ev_i)
    if (c == "(") {
        ev_i++
        v = ev_or()
        if (ev_peek(1) != ")")
            ev_err = "missing )"
        ev_i++
        return v
    }
    if (c == "-") { ev_i++; return -ev_primary() }
    if (c == "+") { ev_i++; return ev_primary() }
    if (c == "~") { ev_i++; return -ev_primary() - 1 }
    if (match(rest, /^0[xX][0-9a-fA-F]+[uUlL]*/)) {
        tok = toupper(substr(rest, 3, RLENGTH - 2))
        sub(/[UL]+$/, "", tok)
        ev_i += RLENGTH
        v = 0
        for (k = 1; k <= length(tok); k++)
            v = v * 16 + index("0123456789ABCDEF", substr(tok, k, 1)) - 1
        return v
    }
    if (match(rest, /^[0-9]+[uUlL]*/)) {
        tok = substr(rest, 1, RLENGTH)
        sub(/[uUlL]+$/, "", tok)
        ev_i += RLENGTH
        if (tok ~ /^0[0-7]/)
            ev_err = "octal literal"
        return tok + 0
    }
    if (match(rest, /^[A-Za-z_][A-Za-z0-9_]*/)) {
        tok = substr(rest, 1, RLENGTH)
        ev_i += RLENGTH
        if (!(tok in ival))
            ev_err = "unknown name " tok
        return ival[tok]
    }
    ev_err = c == "" ? "missing operand" : "unexpected '" c "'"
    return 0
}

function ev_mul(   v, op, r) {
    v = ev_primary()
    while ((op = ev_peek(1)) == "*" || op == "/" || op == "%") {
        ev_i++
        r = ev_primary()
        if (op != "*" && r == 0) {
            ev_err = "division by zero"
            return 0
        }
        v = op == "*" ? v * r : op == "/" ? int(v / r) : v - r * int(v / r)
    }
    return v
}

function ev_add(   v, op) {
    v = ev_mul()
    while ((op = ev_peek(1)) == "+" || op == "-") {
        ev_i++
        v = op == "+" ? v + ev_mul() : v - ev_mul()
    }
    return v
}

function ev_shift(   v, op, r) {
    v = ev_add()
    while ((op = ev_peek(2)) == "<<" || op == ">>") {
        ev_i += 2
        r = ev_add()
        if (v < 0 || r < 0)
            ev_err = "shift of or by a negative value"
        v = op == "<<" ? v * 2 ^ r : int(v / 2 ^ r)
    }
    return v
}

function ev_bits(a, b, op,   r, p, x, y) {
    if (a < 0 || b < 0)
        ev_err = "bitwise operation on a negative value"
    r = 0
    p = 1
    while (a > 0 || b > 0) {
        x = a % 2
        y = b % 2
        if (op == "&" ? x && y : op == "|" ? x || y : x != y)
            r += p
        a = int(a / 2)
        b = int(b / 2)
        p *= 2
    }
    return r
}

function ev_and(   v) {
    v = ev_shift()
    while (ev_peek(1) == "&" && ev_peek(2) != "&&") {
        ev_i++
        v = ev_bits(v, ev_shift(), "&")
    }
    return v
}

function ev_xor(   v) {
    v = ev_and()
    while (ev_peek(1) == "^") {
        ev_i++
        v = ev_bits(v, ev_and(), "^")
    }
    return v
}

function ev_or(   v) {
    v = ev_xor()
    while (ev_peek(1) == "|" && ev_peek(2) != "||") {
        ev_i++
        v = ev_bits(v, ev_xor(), "|")
    }
    return v
}

# ---- declarations ------------------------------------------------------------

# Spaces around punctuation, single spaces, no leading or trailing space.
function tokens(s) {
    gsub(/[*(),\[\]{};=]/, " & ", s)
    gsub(/[ \t]+/, " ", s)
    return trim(s)
}

# One parameter or member "const char * name [ 6 ]": sets p_name, p_base
# (type without const and *), p_ptr (number of *), p_const, p_dim.
function parse_var(s, what,   t, n, k, base) {
    n = split(tokens(s), t, " ")
    p_dim = ""
    if (n >= 4 && t[n] == "]" && t[n - 2] == "[") {
        p_dim = t[n - 1]
        n -= 3
    } else if (n >= 3 && t[n] == "]" && t[n - 1] == "[") {
        p_dim = "*" # a parameter "const size_t sizes[]": an array of any length
        n -= 2
    }
    if (n < 2)
        fatal(what ": cannot parse '" s "' (every parameter needs a name)")
    p_name = t[n]
    if (p_name !~ /^[A-Za-z_][A-Za-z0-9_]*$/)
        fatal(what ": cannot parse '" s "'")
    p_ptr = 0
    p_const = 0
    base = ""
    for (k = 1; k < n; k++) {
        if (t[k] == "*")
            p_ptr++
        else if (t[k] == "const")
            p_const = 1
        else
            base = base == "" ? t[k] : base " " t[k]
    }
    p_base = base
}

# Fortran declaration of a dummy argument (without ":: name"), "" if the C
# type has no rule. Uses the sets opaque[], struct[], fnptr[].
function arg_type(base, ptr, isconst) {
    if (ptr == 0) {
        if (base == "int" || base == "unsigned" || base == "unsigned int")
            return "integer(c_int), value"
        if (base == "size_t")
            return "integer(c_size_t), value"
        if (base == "uint64_t" || base == "int64_t")
            return "integer(c_int64_t), value"
        if (base == "double")
            return "real(c_double), value"
        if (base in fnptr)
            return "type(c_funptr), value"
    } else if (ptr == 1) {
        # Buffers, callback arguments and the opaque objects.
        if (base == "void" || (base in opaque))
            return "type(c_ptr), value"
        # Structures by reference: read (const) or filled in by the call
        # (after it read struct_size, where there is one).
        if (base in struct)
            return "type(" base "), " (isconst ? "intent(in)" : (base in sized) ? "intent(inout)" : "intent(out)")
        # Arrays of sizes the call reads (dchan_assoc_local_subarray).
        if (base == "size_t" && isconst)
            return "integer(c_size_t), intent(in)"
        # An int the call fills in (dchan_wakeup_fd's descriptor); inout,
        # since a failing call leaves it as it was.
        if (base == "int" && !isconst)
            return "integer(c_int), intent(inout)"
    } else if (ptr == 2 && (base == "void" || (base in opaque)) && !isconst) {
        # The call creates the object (or memory) and stores its pointer.
        return "type(c_ptr), intent(out)"
    }
    return ""
}

function member_type(base, ptr) {
    if (ptr >= 1)
        return "type(c_ptr)"
    if (base == "int" || base == "unsigned" || base == "unsigned int")
        return "integer(c_int)"
    if (base == "size_t")
        return "integer(c_size_t)"
    if (base == "uint64_t" || base == "int64_t")
        return "integer(c_int64_t)"
    if (base == "double")
        return "real(c_double)"
    if (base == "unsigned char" || base == "signed char" || base == "char")
        return "integer(c_signed_char)"
    if (base in fnptr)
        return "type(c_funptr)"
    return ""
}

# Fortran type of a function result: "" for void (a subroutine), "?" if
# there is no rule. C strings come back as type(c_ptr) (see the helpers).
function result_type(base, ptr, isconst) {
    if (ptr == 0 && base == "void")
        return ""
    if (ptr == 0 && (base == "int" || base == "unsigned" || base == "unsigned int"))
        return "integer(c_int)"
    if (ptr == 1 && base == "char" && isconst)
        return "type(c_ptr)"
    return "?"
}

# The kind or type name a declaration needs from iso_c_binding or the host.
function needs(decl) {
    if (match(decl, /^type\([A-Za-z0-9_]+\)/))
        return substr(decl, 6, RLENGTH - 6)
    if (match(decl, /\(c_[a-z0-9_]+\)/))
        return substr(decl, RSTART + 1, RLENGTH - 2)
    return ""
}

# "ret name(params)" of a call or callback type: fills proc tables.
function add_proc(kind, name, ret, params, what,   n, t, k, r) {
    nproc++
    pkind[nproc] = kind
    pname[nproc] = name
    parse_var(ret " " name, what)
    r = result_type(p_base, p_ptr, p_const)
    if (r == "?")
        fatal(what ": no Fortran rule for the result type '" trim(ret) "'")
    pret[nproc] = r
    pcstr[nproc] = r == "type(c_ptr)"
    params = trim(params)
    n = 0
    if (params != "void" && params != "") {
        n = split(params, t, ",")
        for (k = 1; k <= n; k++)
            parg_src[nproc, k] = t[k]
    }
    pnargs[nproc] = n
}

# Second pass: argument types, once every type name is known.
function resolve_proc(i,   k, d, what) {
    what = pname[i]
    for (k = 1; k <= pnargs[i]; k++) {
        parse_var(parg_src[i, k], what)
        if (p_dim != "" && (p_dim != "*" || p_ptr))
            fatal(what ": array parameter '" trim(parg_src[i, k]) "'")
        # T name[] is T *name, passed as an array.
        d = arg_type(p_base, p_dim == "*" ? 1 : p_ptr, p_const)
        if (d != "" && (p_dim == "*" || ((what, p_name) in arrayarg)))
            d = d ", dimension(*)"
        if (d == "")
            fatal(what ": no Fortran rule for the parameter '" trim(parg_src[i, k]) "' (add one to gen-fortran.awk)")
        parg[i, k] = p_name
        pdecl[i, k] = d
    }
}

function parse_decl(d,   t, n, k, name, body, m, ret, params, rest, i, j, v) {
    d = trim(d)
    if (d == "")
        return
    if (d ~ /^enum[ {]/) {
        i = index(d, "{")
        j = index(d, "}")
        if (!i || !j)
            fatal("cannot parse '" d "'")
        body = substr(d, i + 1, j - i - 1)
        n = split(body, t, ",")
        nenum++
        v = -1
        for (k = 1; k <= n; k++) {
            m = trim(t[k])
            if (m == "")
                continue
            if (index(m, "=")) {
                name = trim(substr(m, 1, index(m, "=") - 1))
                v = eval(substr(m, index(m, "=") + 1), name)
            } else {
                name = m
                v++
            }
            if (name !~ /^DCHAN_[A-Z0-9_]+$/)
                fatal("enumerator '" name "' is not a DCHAN_ name")
            ival[name] = v
            ckind[++nconst] = "int"
            cval[nconst] = v
            cname[nconst] = name
            cfrom[nconst] = "enum " nenum
        }
        return
    }
    if (d ~ /^typedef struct [A-Za-z_0-9]+ [A-Za-z_0-9]+$/) {
        n = split(d, t, " ")
        opaque[t[4]] = 1
        return
    }
    if (d ~ /^typedef struct( [A-Za-z_0-9]+)? *\{/) {
        i = index(d, "{")
        j = length(d)
        while (j > i && substr(d, j, 1) != "}")
            j--
        name = trim(substr(d, j + 1))
        if (name !~ /^[A-Za-z_][A-Za-z_0-9]*$/)
            fatal("cannot parse the name of '" d "'")
        struct[name] = 1
        sorder[++nstruct] = name
        body = substr(d, i + 1, j - i - 1)
        n = split(body, t, ";")
        m = 0
        for (k = 1; k <= n; k++) {
            if (trim(t[k]) == "")
                continue
            smem_src[name, ++m] = t[k]
        }
        snmem[name] = m
        # A structure that starts with struct_size tells the call how much
        # of it the caller has: the call reads it, so it is never intent(out).
        if (m && trim(t[1]) ~ /^size_t +struct_size$/)
            sized[name] = 1
        return
    }
    if (d ~ /^typedef .*\( *\* *[A-Za-z_0-9]+ *\) *\(.*\)$/) {
        d = tokens(d)
        i = index(d, "( * ")
        ret = substr(d, 9, i - 9)
        rest = substr(d, i + 4)
        name = substr(rest, 1, index(rest, " ") - 1)
        params = substr(rest, index(rest, "(") + 1)
        sub(/\)$/, "", params)
        fnptr[name] = 1
        add_proc("callback", name, ret, params, name)
        return
    }
    if (d ~ /^DCHAN_API /) {
        d = tokens(substr(d, 11))
        i = index(d, "(")
        n = split(trim(substr(d, 1, i - 1)), t, " ")
        name = t[n]
        ret = trim(substr(d, 1, i - 1))
        ret = substr(ret, 1, length(ret) - length(name))
        params = substr(d, i + 1)
        sub(/\) *$/, "", params)
        if (index(params, "(") || index(params, ")"))
            fatal(name ": a parameter of function-pointer type needs a typedef")
        add_proc("call", name, ret, params, name)
        return
    }
    fatal("no rule for the declaration '" d "'")
}

function resolve_struct(name,   k, decl) {
    for (k = 1; k <= snmem[name]; k++) {
        parse_var(smem_src[name, k], name)
        decl = member_type(p_base, p_ptr)
        if (decl == "")
            fatal(name ": no Fortran rule for the field '" trim(smem_src[name, k]) "'")
        smem[name, k] = p_name
        sdecl[name, k] = decl
        sdim[name, k] = p_dim
    }
}

# ---- output ------------------------------------------------------------------

function fname(name) {
    return (name in rename) ? rename[name] : name
}

# "name(a, b, c)", wrapped with & when longer than the width.
function call_line(lead, name, i, tail, width,   k, line, out, piece) {
    line = lead name "("
    out = ""
    for (k = 1; k <= pnargs[i]; k++) {
        piece = parg[i, k] (k < pnargs[i] ? ", " : ")")
        if (length(line piece) > width && k > 1) {
            out = out line "&\n"
            # Continued under the call: the lead's indentation, not its keyword.
            match(lead, /^ */)
            line = substr(lead, 1, RLENGTH) "    "
        }
        line = line piece
    }
    if (pnargs[i] == 0)
        line = line ")"
    return out line tail
}

function imports(i,   k, seen, list, x) {
    list = ""
    for (k = 1; k <= pnargs[i] + 1; k++) {
        x = k <= pnargs[i] ? needs(pdecl[i, k]) : needs(pret[i])
        if (x != "" && !(x in seen)) {
            seen[x] = 1
            list = list (list == "" ? "" : ", ") x
        }
    }
    return list
}

function interface_body(i, ind, bind,   s, k, kw, head, last) {
    kw = pret[i] == "" ? "subroutine" : "function"
    head = call_line(ind kw " ", pname[i], i, "", 100)
    last = head
    sub(/.*\n/, "", last)
    if (length(last " " bind) <= 100)
        s = head " " bind "\n"
    else
        s = head " &\n" ind "    " bind "\n"
    if (imports(i) != "")
        s = s ind "  import :: " imports(i) "\n"
    for (k = 1; k <= pnargs[i]; k++)
        s = s ind "  " pdecl[i, k] " :: " parg[i, k] "\n"
    if (pret[i] != "")
        s = s ind "  " pret[i] " :: " pname[i] "\n"
    s = s ind "end " kw " " pname[i] "\n"
    return s
}

# The enums first, then the macros (dchan.h, dchan_version.h), a blank line
# between groups.
function emit_constants(   k, pass, w, prev) {
    w = 0
    for (k = 1; k <= nconst; k++)
        if (length(fname(cname[k])) > w)
            w = length(fname(cname[k]))
    prev = ""
    for (pass = 1; pass <= 2; pass++) {
        for (k = 1; k <= nconst; k++) {
            if ((pass == 1) != (cfrom[k] ~ /^enum /))
                continue
            if (prev != "" && cfrom[k] != prev)
                print ""
            prev = cfrom[k]
            emit_constant(k, w)
        }
    }
}

function emit_constant(k, w,   n) {
    n = sprintf("%-" w "s", fname(cname[k]))
    if (cname[k] in rename)
        printf "  ! %s in C: Fortran names ignore case, and dchan_version() is a call.\n", cname[k]
    if (ckind[k] == "str")
        printf "  character(len=*), parameter :: %s = '%s'\n", n, cval[k]
    else if (cval[k] >= -2147483648 && cval[k] <= 2147483647)
        printf "  integer(c_int), parameter :: %s = %d\n", n, cval[k]
    else
        printf "  integer(c_int64_t), parameter :: %s = %.0f_c_int64_t\n", n, cval[k]
}

function emit_types(   s, k, name, d) {
    for (s = 1; s <= nstruct; s++) {
        name = sorder[s]
        if (s > 1)
            print ""
        printf "  type, bind(C) :: %s\n", name
        for (k = 1; k <= snmem[name]; k++) {
            d = sdim[name, k] == "" ? "" : "(" sdim[name, k] ")"
            printf "    %s :: %s%s\n", sdecl[name, k], smem[name, k], d
        }
        printf "  end type %s\n", name
    }
}

function emit_interfaces(   i, first) {
    first = 1
    for (i = 1; i <= nproc; i++) {
        if (pkind[i] != "callback")
            continue
        if (first)
            print "  ! The C callback types: a procedure passed as c_funloc(p) must match."
        first = 0
        print "  abstract interface"
        printf "%s", interface_body(i, "    ", "bind(C)")
        print "  end interface"
        print ""
    }
    print "  ! The calls, with the C names and argument order."
    print "  interface"
    first = 1
    for (i = 1; i <= nproc; i++) {
        if (pkind[i] != "call")
            continue
        if (!first)
            print ""
        first = 0
        printf "%s", interface_body(i, "    ", "bind(C, name='" pname[i] "')")
    }
    print "  end interface"
}

function helper_decl(d) {
    sub(/, value$/, ", intent(in)", d)
    return d
}

function emit_helpers(   i, k) {
    for (i = 1; i <= nproc; i++) {
        if (pkind[i] != "call" || !pcstr[i])
            continue
        print ""
        printf "  ! %s as a Fortran string ('' for a null pointer).\n", pname[i]
        printf "%s\n", call_line("  function ", pname[i] "_f", i, "", 100)
        for (k = 1; k <= pnargs[i]; k++)
            printf "    %s :: %s\n", helper_decl(pdecl[i, k]), parg[i, k]
        printf "    character(len=:), allocatable :: %s_f\n\n", pname[i]
        printf "%s\n", call_line("    " pname[i] "_f = dchan_f_string(", pname[i], i, ")", 100)
        printf "  end function %s_f\n", pname[i]
    }
}

# Roff: alternating bold text and italic argument names.
function man_call(head, name, i, tail,   s, k, line, len) {
    if (pnargs[i] == 0)
        return ".B \"" head name "()" tail "\"\n"
    line = ".BI \"" head name "(\""
    len = length(head name "(")
    s = ""
    for (k = 1; k <= pnargs[i]; k++) {
        if (len + length(parg[i, k]) > 64 && k > 1) {
            s = s line " \", &\"\n"
            line = ".BI \"        \""
            len = 8
        } else if (k > 1) {
            line = line " \", \""
            len += 2
        }
        line = line " " parg[i, k]
        len += length(parg[i, k])
    }
    return s line " \")" tail "\"\n"
}

function man_decl(d, name) {
    return ".BI \"    " d " :: \" " name "\n"
}

function man_proc(i, helper,   s, k, kw, name) {
    kw = pret[i] == "" ? "subroutine " : pret[i] " function "
    name = pname[i]
    if (helper) {
        kw = "function "
        name = name "_f"
    }
    s = man_call(kw, name, i, pkind[i] == "callback" ? " bind(C)" : "")
    for (k = 1; k <= pnargs[i]; k++)
        s = s man_decl(helper ? helper_decl(pdecl[i, k]) : pdecl[i, k], parg[i, k])
    if (helper)
        s = s ".BI \"    character(len=:), allocatable :: \" " name "\n"
    if (pkind[i] == "callback")
        s = ".B abstract interface\n" s ".B end interface\n"
    return s
}

function man_struct(name,   s, k, d) {
    s = ".B type, bind(C) :: " name "\n"
    for (k = 1; k <= snmem[name]; k++) {
        d = sdim[name, k] == "" ? "" : "(" sdim[name, k] ")"
        s = s ".BI \"    " sdecl[name, k] " :: \" " smem[name, k] (d == "" ? "" : " \"" d "\"") "\n"
    }
    return s ".B end type\n"
}

function emit_man(   n, t, k, i, found) {
    print ".nf"
    print ".B use dchan"
    n = split(names, t, " ")
    for (k = 1; k <= n; k++) {
        print ".PP"
        found = 0
        for (i = 1; i <= nproc; i++) {
            if (pname[i] != t[k])
                continue
            found = 1
            printf "%s", man_proc(i, 0)
            if (pcstr[i])
                printf ".PP\n%s", man_proc(i, 1)
        }
        if (t[k] in struct) {
            found = 1
            printf "%s", man_struct(t[k])
        }
        if (!found)
            fatal("man: '" t[k] "' is not a call, callback type or structure of dchan.h")
    }
    print ".fi"
}

function emit_symbols(   i, n) {
    print "! SPDX-License-Identifier: BSD-3-Clause"
    print "! Generated by lib/fortran/gen-fortran.awk from include/dchan.h: do not edit."
    print "! Takes the address of every bind(C) interface of module dchan, so that a"
    print "! binding name the library does not export fails to link."
    print "program f_symbols"
    print "  use dchan"
    print "  implicit none"
    n = 0
    for (i = 1; i <= nproc; i++)
        if (pkind[i] == "call")
            n++
    printf "  type(c_funptr) :: p(%d)\n", n
    print "  integer :: i"
    print ""
    n = 0
    for (i = 1; i <= nproc; i++)
        if (pkind[i] == "call")
            printf "  p(%d) = c_funloc(%s)\n", ++n, pname[i]
    print "  do i = 1, size(p)"
    print "    if (.not. c_associated(p(i))) error stop 'f_symbols: a bind(C) interface has no address'"
    print "  end do"
    printf "  print '(a)', 'f_symbols: %d calls of dchan.h bound and linked'\n", n
    print "end program f_symbols"
}

# The layout test: structure s (header order), field f; f = 0 is the whole.
function emit_layout_c(   s, k, name) {
    print "/* SPDX-License-Identifier: BSD-3-Clause */"
    print "/* Generated by lib/fortran/gen-fortran.awk from include/dchan.h: do not edit."
    print " * The C half of f_layout: what the C compiler makes of the structures and"
    print " * constants of dchan.h, for the Fortran half to compare with. */"
    print "#include <stddef.h>"
    print ""
    print "#include <dchan.h>"
    print ""
    print "size_t f_layout_c(int s, int f, int want_size);"
    print "long long f_layout_const(int k);"
    print "const char *f_layout_str(int k);"
    print ""
    print "/* Offset (want_size 0) or size of field f of structure s; f = 0: the"
    print " * structure. (size_t)-1 when there is no such field. */"
    print "size_t f_layout_c(int s, int f, int want_size)"
    print "{"
    print "    switch (s * 1000 + f) {"
    for (s = 1; s <= nstruct; s++) {
        name = sorder[s]
        printf "    case %d:\n        return sizeof(%s);\n", s * 1000, name
        for (k = 1; k <= snmem[name]; k++)
            printf "    case %d:\n        return want_size ? sizeof(((%s *)0)->%s) : offsetof(%s, %s);\n", \
                s * 1000 + k, name, smem[name, k], name, smem[name, k]
    }
    print "    }"
    print "    return (size_t)-1;"
    print "}"
    print ""
    print "long long f_layout_const(int k)"
    print "{"
    print "    switch (k) {"
    for (k = 1; k <= nconst; k++)
        if (ckind[k] == "int")
            printf "    case %d:\n        return (long long)(%s);\n", k, cname[k]
    print "    }"
    print "    return -1;"
    print "}"
    print ""
    print "const char *f_layout_str(int k)"
    print "{"
    print "    switch (k) {"
    for (k = 1; k <= nconst; k++)
        if (ckind[k] == "str")
            printf "    case %d:\n        return %s;\n", k, cname[k]
    print "    }"
    print "    return \"\";"
    print "}"
}

function emit_layout_f(   s, k, name, nf) {
    print "! SPDX-License-Identifier: BSD-3-Clause"
    print "! Generated by lib/fortran/gen-fortran.awk from include/dchan.h: do not edit."
    print "! Checks that every derived type of module dchan has the size, and every"
    print "! component the offset (c_loc differences) and size, of the C structure and"
    print "! field, and every named constant the value of the C constant."
    print "program f_layout"
    print "  use dchan"
    print "  implicit none"
    print "  interface"
    print "    function f_layout_c(s, f, want_size) bind(C, name='f_layout_c')"
    print "      import :: c_int, c_size_t"
    print "      integer(c_int), value :: s, f, want_size"
    print "      integer(c_size_t) :: f_layout_c"
    print "    end function f_layout_c"
    print "    function f_layout_const(k) bind(C, name='f_layout_const')"
    print "      import :: c_int, c_long_long"
    print "      integer(c_int), value :: k"
    print "      integer(c_long_long) :: f_layout_const"
    print "    end function f_layout_const"
    print "    function f_layout_str(k) bind(C, name='f_layout_str')"
    print "      import :: c_int, c_ptr"
    print "      integer(c_int), value :: k"
    print "      type(c_ptr) :: f_layout_str"
    print "    end function f_layout_str"
    print "  end interface"
    for (s = 1; s <= nstruct; s++)
        printf "  type(%s), target :: s%d\n", sorder[s], s
    print "  integer :: nbad = 0, nchecked = 0"
    print ""
    nf = 0
    for (s = 1; s <= nstruct; s++) {
        name = sorder[s]
        printf "  call check('%s', c_sizeof(s%d), f_layout_c(%d, 0, 1))\n", name, s, s
        for (k = 1; k <= snmem[name]; k++) {
            nf++
            printf "  call check('%s%%%s offset', offset(c_loc(s%d), c_loc(s%d%%%s)), f_layout_c(%d, %d, 0))\n", \
                name, smem[name, k], s, s, smem[name, k], s, k
            printf "  call check('%s%%%s size', c_sizeof(s%d%%%s), f_layout_c(%d, %d, 1))\n", \
                name, smem[name, k], s, smem[name, k], s, k
        }
    }
    for (k = 1; k <= nconst; k++) {
        if (ckind[k] == "int")
            printf "  call check('%s', int(%s, c_size_t), int(f_layout_const(%d), c_size_t))\n", fname(cname[k]), fname(cname[k]), k
        else
            printf "  call check_str('%s', %s, dchan_f_string(f_layout_str(%d)))\n", fname(cname[k]), fname(cname[k]), k
    }
    print ""
    print "  if (nbad /= 0) then"
    print "    print '(a, i0, a, i0, a)', 'f_layout: ', nbad, ' of ', nchecked, ' checks FAILED'"
    print "    error stop 1"
    print "  end if"
    printf "  print '(a, i0, a)', 'f_layout: %d types, %d components, %d constants: ', nchecked, ' checks passed'\n", nstruct, nf, nconst
    print ""
    print "contains"
    print ""
    print "  function offset(base, field)"
    print "    type(c_ptr), intent(in) :: base, field"
    print "    integer(c_size_t) :: offset"
    print ""
    print "    offset = int(transfer(field, 0_c_intptr_t) - transfer(base, 0_c_intptr_t), c_size_t)"
    print "  end function offset"
    print ""
    print "  subroutine check(what, fortran, c)"
    print "    character(len=*), intent(in) :: what"
    print "    integer(c_size_t), intent(in) :: fortran, c"
    print ""
    print "    nchecked = nchecked + 1"
    print "    if (fortran /= c) then"
    print "      print '(a, a, a, i0, a, i0)', 'f_layout: ', what, ': Fortran ', fortran, ', C ', c"
    print "      nbad = nbad + 1"
    print "    end if"
    print "  end subroutine check"
    print ""
    print "  subroutine check_str(what, fortran, c)"
    print "    character(len=*), intent(in) :: what, fortran, c"
    print ""
    print "    nchecked = nchecked + 1"
    print "    if (fortran /= c .or. len(fortran) /= len(c)) then"
    print "      print '(a, a, a, a, a, a, a)', 'f_layout: ', what, ': Fortran \"', fortran, '\", C \"', c, '\"'"
    print "      nbad = nbad + 1"
    print "    end if"
    print "  end subroutine check_str"
    print "end program f_layout"
}

# Two names that Fortran cannot tell apart would not compile: say which.
function check_names(   k, i, seen, x) {
    for (k = 1; k <= nconst; k++)
        claim(fname(cname[k]), "constant " cname[k], seen)
    for (i = 1; i <= nproc; i++) {
        claim(pname[i], pname[i], seen)
        if (pcstr[i])
            claim(pname[i] "_f", "helper of " pname[i], seen)
    }
    for (k = 1; k <= nstruct; k++)
        claim(sorder[k], "type " sorder[k], seen)
    for (x in opaque)
        claim(x, "opaque type " x, seen)
}

function claim(name, what, seen,   l) {
    l = tolower(name)
    if (l in seen)
        fatal(what " and " seen[l] " are one name in Fortran: add a rename to gen-fortran.awk")
    seen[l] = what
}

END {
    if (failed)
        exit 1
    text = uncomment(text)
    gsub(/[ \t]+/, " ", text)
    # Top-level declarations end with ; outside braces.
    depth = 0
    start = 1
    for (k = 1; k <= length(text); k++) {
        c = substr(text, k, 1)
        if (c == "{")
            depth++
        else if (c == "}")
            depth--
        else if (c == ";" && depth == 0) {
            parse_decl(substr(text, start, k - start))
            start = k + 1
        }
    }
    if (trim(substr(text, start)) != "")
        fatal("text after the last declaration: '" trim(substr(text, start)) "'")
    for (k = 1; k <= nstruct; k++)
        resolve_struct(sorder[k])
    for (i = 1; i <= nproc; i++)
        resolve_proc(i)
    check_names()
    ncall = 0
    for (i = 1; i <= nproc; i++)
        ncall += pkind[i] == "call"
    if (ncall == 0)
        fatal("no DCHAN_API call found: is this dchan.h?")

    if (mode == "symbols") {
        emit_symbols()
        exit 0
    }
    if (mode == "man") {
        emit_man()
        exit 0
    }
    if (mode == "layout") {
        emit_layout_f()
        exit 0
    }
    if (mode == "layout-c") {
        emit_layout_c()
        exit 0
    }
    while ((r = (getline l < template)) > 0) {
        if (l == "!@CONSTANTS@")
            emit_constants()
        else if (l == "!@TYPES@")
            emit_types()
        else if (l == "!@INTERFACES@")
            emit_interfaces()
        else if (l == "!@HELPERS@")
            emit_helpers()
        else
            print l
    }
    if (r < 0)
        fatal("cannot read " template)
}
