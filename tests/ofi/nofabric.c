/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Built as a libfabric.so.1 that has none of libfabric's functions, for
 * test_ofi_unloadable: a library by that name that cannot serve dchan.
 */
int dchan_test_nofabric = 1;
