/* SPDX-License-Identifier: BSD-3-Clause */
/* DCHAN_* parameters: the table generated from lib/params.def and its parser. */
#ifndef DCHAN_PARAMS_H
#define DCHAN_PARAMS_H

#include <stddef.h>

enum dchan_param_type {
    DCHAN_PT_STRING,
    DCHAN_PT_UINT,
    DCHAN_PT_DETECT,
    DCHAN_PT_BOOT,
    DCHAN_PT_LOG,
    DCHAN_PT_WORD /* one of a fixed set of words, given in the table */
};

struct dchan_param_desc {
    const char *name; /* without the DCHAN_ prefix */
    enum dchan_param_type type;
    const char *def;
    const char *help;
    const char *choices; /* DCHAN_PT_WORD: "a|b|c" */
};

extern const struct dchan_param_desc dchan_param_table[];
extern const size_t dchan_param_count;

/* Values of every parameter after defaults and environment. */
struct dchan_params {
#define DCHAN_PARAM(name, type, def, help) DCHAN_PFIELD_##type(name)
#define DCHAN_PARAM_WORD(name, choices, def, help) const char *name;
#define DCHAN_PFIELD_STRING(name) const char *name;
#define DCHAN_PFIELD_UINT(name) unsigned long name;
#define DCHAN_PFIELD_DETECT(name) int name;
#define DCHAN_PFIELD_BOOT(name) int name;
#define DCHAN_PFIELD_LOG(name) int name;
#include "params.def"
#undef DCHAN_PARAM
#undef DCHAN_PARAM_WORD
};

/* Choices of an enumerated type, "a|b|c", for messages and dchan_info. */
const char *dchan_param_choices(enum dchan_param_type type);
/* Word for an enumerated value ("flag"), "?" when out of range. */
const char *dchan_enum_word(enum dchan_param_type type, int value);
/* Parse one value of a type; DCHAN_ERR_INVALID_ARG when malformed. */
int dchan_param_parse(enum dchan_param_type type, const char *s, void *out);
/* Parse a value of a DCHAN_PT_WORD parameter: one of choices ("a|b|c"),
 * case-insensitive; *out points into choices-independent storage (s). */
int dchan_param_parse_word(const char *choices, const char *s, const char **out);
/* Defaults, then the environment. On a malformed variable, returns
 * DCHAN_ERR_INVALID_ARG and a message naming it and its allowed values. */
int dchan_params_load(struct dchan_params *p, char *err, size_t errlen);
/* The parameters of the environment, for a provider's probe (which has no
 * context); NULL when a DCHAN_* variable is malformed. */
const struct dchan_params *dchan_probe_params(void);
/* Check a provider list against the providers known to this build. */
int dchan_params_check_providers(const char *list, char *err, size_t errlen);
/* Value of a name like "DETECT" as text, for dchan_info. */
const char *dchan_param_env(const char *name);

#endif
