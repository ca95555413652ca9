/* SPDX-License-Identifier: BSD-3-Clause */
/* DCHAN_* parameters: table, parser, and dchan_attr_init. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core.h"

const struct dchan_param_desc dchan_param_table[] = {
#define DCHAN_PARAM(name, type, def, help) {#name, DCHAN_PT_##type, def, help, NULL},
#define DCHAN_PARAM_WORD(name, choices, def, help) {#name, DCHAN_PT_WORD, def, help, choices},
#include "params.def"
#undef DCHAN_PARAM
#undef DCHAN_PARAM_WORD
};
const size_t dchan_param_count = sizeof(dchan_param_table) / sizeof(dchan_param_table[0]);

struct choice {
    const char *word;
    int value;
};

static const struct choice detect_choices[] = {{"auto", DCHAN_DETECT_AUTO},
                                               {"sentinel", DCHAN_DETECT_SENTINEL},
                                               {"flag", DCHAN_DETECT_FLAG},
                                               {"event", DCHAN_DETECT_EVENT},
                                               {NULL, 0}};
static const struct choice boot_choices[] = {{"auto", DCHAN_BOOT_AUTO},
                                             {"mpi", DCHAN_BOOT_MPI},
                                             {"pmix", DCHAN_BOOT_PMIX},
                                             {"external", DCHAN_BOOT_EXTERNAL},
                                             {"singleton", DCHAN_BOOT_SINGLETON},
                                             {NULL, 0}};
static const struct choice log_choices[] = {{"none", DCHAN_LOG_NONE},   {"error", DCHAN_LOG_ERROR},
                                            {"warn", DCHAN_LOG_WARN},   {"info", DCHAN_LOG_INFO},
                                            {"debug", DCHAN_LOG_DEBUG}, {NULL, 0}};

static const struct choice *choices_of(enum dchan_param_type t)
{
    switch (t) {
    case DCHAN_PT_DETECT:
        return detect_choices;
    case DCHAN_PT_BOOT:
        return boot_choices;
    case DCHAN_PT_LOG:
        return log_choices;
    default:
        return NULL;
    }
}

const char *dchan_param_choices(enum dchan_param_type t)
{
    switch (t) {
    case DCHAN_PT_DETECT:
        return "auto|sentinel|flag|event";
    case DCHAN_PT_BOOT:
        return "auto|mpi|pmix|external|singleton";
    case DCHAN_PT_LOG:
        return "none|error|warn|info|debug";
    case DCHAN_PT_UINT:
        return "an unsigned integer";
    default:
        return "a string";
    }
}

/* Name of an enumerated value, for logs: "flag". */
const char *dchan_enum_word(enum dchan_param_type t, int value)
{
    const struct choice *c = choices_of(t);
    for (; c && c->word; c++)
        if (c->value == value)
            return c->word;
    return "?";
}

int dchan_param_parse_word(const char *choices, const char *s, const char **out)
{
    size_t n = s ? strlen(s) : 0;
    for (const char *c = choices; s && c && *c;) {
        size_t len = strcspn(c, "|");
        if (len == n && n > 0 && strncasecmp(c, s, n) == 0) {
            *out = s;
            return DCHAN_SUCCESS;
        }
        c += len + (c[len] == '|');
    }
    return DCHAN_ERR_INVALID_ARG;
}

int dchan_param_parse(enum dchan_param_type t, const char *s, void *out)
{
    if (!s || !out || t == DCHAN_PT_WORD) /* words need their choices */
        return DCHAN_ERR_INVALID_ARG;
    if (t == DCHAN_PT_STRING) {
        *(const char **)out = s;
        return DCHAN_SUCCESS;
    }
    if (t == DCHAN_PT_UINT) {
        char *end;
        if (!isdigit((unsigned char)s[0]))
            return DCHAN_ERR_INVALID_ARG;
        errno = 0;
        unsigned long v = strtoul(s, &end, 10);
        if (errno || *end != '\0' || v > UINT_MAX)
            return DCHAN_ERR_INVALID_ARG;
        *(unsigned long *)out = v;
        return DCHAN_SUCCESS;
    }
    for (const struct choice *c = choices_of(t); c && c->word; c++) {
        if (strcasecmp(s, c->word) == 0) {
            *(int *)out = c->value;
            return DCHAN_SUCCESS;
        }
    }
    return DCHAN_ERR_INVALID_ARG;
}

const char *dchan_param_env(const char *name)
{
    char var[64];
    snprintf(var, sizeof var, "DCHAN_%s", name);
    return getenv(var);
}

int dchan_params_check_providers(const char *list, char *err, size_t errlen)
{
    char word[32];
    const char *p = list;
    int built = 0;
    while (p && *p) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof word) {
            snprintf(err, errlen, "malformed provider list '%s'", list);
            return DCHAN_ERR_INVALID_ARG;
        }
        memcpy(word, p, n);
        word[n] = '\0';
        if (dchan_provider_lookup(word)) {
            built++;
        } else {
            static const char *const known[] = {"verbs", "ofi", "mpi", "self", "shm"};
            int is_known = 0;
            for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
                is_known |= strcmp(word, known[i]) == 0;
            if (!is_known) {
                snprintf(err, errlen, "provider '%s' is unknown (providers: %s)", word,
                         "verbs, ofi, mpi, self, shm");
                return DCHAN_ERR_INVALID_ARG;
            }
        }
        p += n;
        if (*p == ',')
            p++;
    }
    /* Names known but not built are skipped at init; none left is an error. */
    if (list && *list && built == 0) {
        snprintf(err, errlen, "none of the providers '%s' is built into this library "
                              "(see dchan_info)", list);
        return DCHAN_ERR_UNSUPPORTED;
    }
    return DCHAN_SUCCESS;
}

int dchan_params_load(struct dchan_params *pv, char *err, size_t errlen)
{
    const struct dchan_param_desc *d = dchan_param_table;
    int rc;

#define DCHAN_PARAM_CHECK(NAME, PARSE_DEF, PARSE_ENV)                                      \
    do {                                                                                   \
        const char *env = dchan_param_env(#NAME);                                          \
        rc = PARSE_DEF;                                                                    \
        if (rc == DCHAN_SUCCESS && env)                                                    \
            rc = PARSE_ENV;                                                                \
        if (rc != DCHAN_SUCCESS) {                                                         \
            snprintf(err, errlen, "DCHAN_%s='%s' is not valid: expected %s", #NAME,        \
                     env ? env : "", d->choices ? d->choices : dchan_param_choices(d->type)); \
            return DCHAN_ERR_INVALID_ARG;                                                  \
        }                                                                                  \
        d++;                                                                               \
    } while (0);
#define DCHAN_PARAM(NAME, TYPE_, DEF_, HELP_)                                              \
    DCHAN_PARAM_CHECK(NAME, dchan_param_parse(d->type, d->def, &pv->NAME),                 \
                      dchan_param_parse(d->type, env, &pv->NAME))
#define DCHAN_PARAM_WORD(NAME, CHOICES_, DEF_, HELP_)                                      \
    DCHAN_PARAM_CHECK(NAME, dchan_param_parse_word(d->choices, d->def, &pv->NAME),         \
                      dchan_param_parse_word(d->choices, env, &pv->NAME))
#include "params.def"
#undef DCHAN_PARAM
#undef DCHAN_PARAM_WORD
#undef DCHAN_PARAM_CHECK
    return DCHAN_SUCCESS;
}

const struct dchan_params *dchan_probe_params(void)
{
    static struct dchan_params pv; /* probes run from dchan_info, one thread */
    char err[256];
    return dchan_params_load(&pv, err, sizeof err) == DCHAN_SUCCESS ? &pv : NULL;
}

DCHAN_API void dchan_attr_init(dchan_attr_t *attr)
{
    struct dchan_params p;
    char err[256];

    if (!attr)
        return;
    memset(attr, 0, sizeof *attr);
    attr->struct_size = sizeof *attr;
    attr->mpi_fcomm = -1;
    attr->ext_rank = -1;
    attr->ext_size = 0;
    attr->thread_level = DCHAN_THREAD_SINGLE;
    if (dchan_params_load(&p, err, sizeof err) != DCHAN_SUCCESS) {
        /* dchan_init reports the variable and refuses; keep safe defaults. */
        attr->config_error = 1;
        attr->detect = DCHAN_DETECT_AUTO;
        attr->bootstrap = DCHAN_BOOT_AUTO;
        attr->log_level = DCHAN_LOG_WARN;
        return;
    }
    attr->provider = p.PROVIDER[0] ? p.PROVIDER : NULL;
    attr->detect = p.DETECT;
    attr->bootstrap = p.BOOTSTRAP;
    attr->log_level = p.LOG;
}
