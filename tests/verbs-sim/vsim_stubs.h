/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Macros for the generated stubs (gen-exports.sh). The stubs deliberately
 * do not include <infiniband/verbs.h>: each is declared as void(void), which
 * the linker does not care about, and is overridden by a real definition
 * wherever the simulation emulates the call.
 */
#ifndef DCHAN_VSIM_STUBS_H
#define DCHAN_VSIM_STUBS_H

__attribute__((noreturn, visibility("hidden")))
void vsim_not_emulated(const char *name);

/* Weak: a strong definition elsewhere in the library wins. */
#define VSIM_WEAK_STUB(sym)                                                   \
	void sym(void);                                                       \
	__attribute__((weak, visibility("default"))) void sym(void)           \
	{                                                                     \
		vsim_not_emulated(#sym);                                      \
	}

/* Accepted and ignored: a driver's registration from its constructor. */
#define VSIM_NOOP_STUB(sym)                                                   \
	void sym(void);                                                       \
	__attribute__((weak, visibility("default"))) void sym(void)           \
	{                                                                     \
	}

/* A data object of the library's ABI, zero-initialised. */
#define VSIM_DATA(sym, size)                                                  \
	__attribute__((weak, visibility("default"))) unsigned char sym[(size) ? (size) : 1];

/* A compat twin (name@NODE, not the default): old-ABI callers only. */
#define VSIM_COMPAT_STUB(sym, ver, n)                                         \
	void vsim_compat_##n(void);                                           \
	__attribute__((visibility("default"))) void vsim_compat_##n(void)     \
	{                                                                     \
		vsim_not_emulated(#sym "@" #ver);                             \
	}                                                                     \
	__asm__(".symver vsim_compat_" #n "," #sym "@" #ver);

#endif
