/* SPDX-License-Identifier: BSD-3-Clause */
/* DCHAN_* parameters: the parser, the table, dchan_params_load,
 * dchan_attr_init and how dchan_init treats malformed settings. */
#include "config.h"

#include <limits.h>
#include <stdio.h>

#include "unit.h"

#include "core.h"

static int reset_env(void **state)
{
    unit_clean_env();
    return 0;
}

/* ---- dchan_param_parse ------------------------------------------------------------------ */

static void expect_word(enum dchan_param_type t, const char *s, int want)
{
    int v = -12345;
    assert_int_equal(dchan_param_parse(t, s, &v), DCHAN_SUCCESS);
    assert_int_equal(v, want);
}

static void expect_bad_word(enum dchan_param_type t, const char *s)
{
    int v = -12345;
    assert_int_equal(dchan_param_parse(t, s, &v), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(v, -12345); /* untouched */
}

static void test_parse_enums(void **state)
{
    expect_word(DCHAN_PT_DETECT, "auto", DCHAN_DETECT_AUTO);
    expect_word(DCHAN_PT_DETECT, "sentinel", DCHAN_DETECT_SENTINEL);
    expect_word(DCHAN_PT_DETECT, "SENTINEL", DCHAN_DETECT_SENTINEL);
    expect_word(DCHAN_PT_DETECT, "Flag", DCHAN_DETECT_FLAG);
    expect_word(DCHAN_PT_DETECT, "eVeNt", DCHAN_DETECT_EVENT);
    expect_word(DCHAN_PT_BOOT, "auto", DCHAN_BOOT_AUTO);
    expect_word(DCHAN_PT_BOOT, "MPI", DCHAN_BOOT_MPI);
    expect_word(DCHAN_PT_BOOT, "pmix", DCHAN_BOOT_PMIX);
    expect_word(DCHAN_PT_BOOT, "External", DCHAN_BOOT_EXTERNAL);
    expect_word(DCHAN_PT_BOOT, "singleton", DCHAN_BOOT_SINGLETON);
    expect_word(DCHAN_PT_LOG, "none", DCHAN_LOG_NONE);
    expect_word(DCHAN_PT_LOG, "ERROR", DCHAN_LOG_ERROR);
    expect_word(DCHAN_PT_LOG, "warn", DCHAN_LOG_WARN);
    expect_word(DCHAN_PT_LOG, "Info", DCHAN_LOG_INFO);
    expect_word(DCHAN_PT_LOG, "debug", DCHAN_LOG_DEBUG);

    const char *bad[] = {"", " ", "flag ", " flag", "fla", "flags", "1", "0", "-1",
                         "sentinel,flag", "none\n", "auto\t"};
    enum dchan_param_type types[] = {DCHAN_PT_DETECT, DCHAN_PT_BOOT, DCHAN_PT_LOG};
    for (size_t t = 0; t < 3; t++)
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
            expect_bad_word(types[t], bad[i]);
    /* A word of one type is not a word of another. */
    expect_bad_word(DCHAN_PT_DETECT, "mpi");
    expect_bad_word(DCHAN_PT_BOOT, "flag");
    expect_bad_word(DCHAN_PT_LOG, "event");
    expect_bad_word(DCHAN_PT_DETECT, NULL);
    int v;
    assert_int_equal(dchan_param_parse(DCHAN_PT_DETECT, "flag", NULL), DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_param_parse((enum dchan_param_type)99, "flag", &v),
                     DCHAN_ERR_INVALID_ARG);
}

static void test_parse_uint(void **state)
{
    struct {
        const char *s;
        unsigned long v;
    } good[] = {{"0", 0}, {"1", 1}, {"42", 42}, {"007", 7}, {"4294967295", 4294967295ul}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        unsigned long v = 99;
        assert_int_equal(dchan_param_parse(DCHAN_PT_UINT, good[i].s, &v), DCHAN_SUCCESS);
        assert_true(v == good[i].v);
    }
    const char *bad[] = {"",   "-1",    "12x",        "x12", " 12", "12 ", "+12", "1.5",
                         "0x10", "1e3", "4294967296", "18446744073709551615",
                         "18446744073709551616", "99999999999999999999999999", "-0", "--1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned long v = 99;
        assert_int_equal(dchan_param_parse(DCHAN_PT_UINT, bad[i], &v), DCHAN_ERR_INVALID_ARG);
        assert_true(v == 99);
    }
}

static void test_parse_string(void **state)
{
    const char *v = NULL, *s = "verbs,ofi";
    assert_int_equal(dchan_param_parse(DCHAN_PT_STRING, s, &v), DCHAN_SUCCESS);
    assert_ptr_equal(v, s);
    assert_int_equal(dchan_param_parse(DCHAN_PT_STRING, "", &v), DCHAN_SUCCESS);
    assert_string_equal(v, "");
    assert_int_equal(dchan_param_parse(DCHAN_PT_STRING, NULL, &v), DCHAN_ERR_INVALID_ARG);
}

/* ---- the table -------------------------------------------------------------------------- */

static void test_table(void **state)
{
    assert_true(dchan_param_count >= 8);
    for (size_t i = 0; i < dchan_param_count; i++) {
        const struct dchan_param_desc *d = &dchan_param_table[i];
        union {
            unsigned long u;
            int i;
            const char *s;
        } out;
        assert_non_null(d->name);
        assert_true(d->name[0] != '\0');
        assert_non_null(d->help);
        assert_true(strlen(d->help) > 10);
        assert_non_null(d->def);
        if (d->type == DCHAN_PT_WORD) {
            /* A word parameter: its default is one of its words. */
            assert_non_null(d->choices);
            assert_int_equal(dchan_param_parse_word(d->choices, d->def, &out.s), DCHAN_SUCCESS);
            assert_int_equal(dchan_param_parse(d->type, d->def, &out), DCHAN_ERR_INVALID_ARG);
        } else {
            assert_null(d->choices);
            assert_int_equal(dchan_param_parse(d->type, d->def, &out), DCHAN_SUCCESS);
        }
        assert_non_null(dchan_param_choices(d->type));
        for (const char *p = d->name; *p; p++)
            assert_true((*p >= 'A' && *p <= 'Z') || *p == '_' || (*p >= '0' && *p <= '9'));
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(d->name, dchan_param_table[j].name);
    }
}

/* Word parameters: each word of the list, in any case; nothing else. */
static void test_parse_word(void **state)
{
    const char *out = NULL;
    assert_int_equal(dchan_param_parse_word("auto|fence|completion", "fence", &out), DCHAN_SUCCESS);
    assert_string_equal(out, "fence");
    assert_int_equal(dchan_param_parse_word("auto|fence|completion", "AUTO", &out), DCHAN_SUCCESS);
    assert_int_equal(dchan_param_parse_word("auto|fence|completion", "completion", &out),
                     DCHAN_SUCCESS);
    const char *bad[] = {"", "fenc", "fences", "auto|fence", "|", "uto", " auto"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(dchan_param_parse_word("auto|fence|completion", bad[i], &out),
                         DCHAN_ERR_INVALID_ARG);
    assert_int_equal(dchan_param_parse_word("auto|fence", NULL, &out), DCHAN_ERR_INVALID_ARG);
}

/* Every word of the choices list parses, and names its value back. */
static void test_choices_roundtrip(void **state)
{
    enum dchan_param_type types[] = {DCHAN_PT_DETECT, DCHAN_PT_BOOT, DCHAN_PT_LOG};
    for (size_t t = 0; t < 3; t++) {
        char list[128];
        int n = 0;
        snprintf(list, sizeof list, "%s", dchan_param_choices(types[t]));
        for (char *w = strtok(list, "|"); w; w = strtok(NULL, "|"), n++) {
            int v = -1;
            assert_int_equal(dchan_param_parse(types[t], w, &v), DCHAN_SUCCESS);
            assert_string_equal(dchan_enum_word(types[t], v), w);
        }
        assert_true(n >= 4);
        assert_string_equal(dchan_enum_word(types[t], 1000), "?");
        assert_string_equal(dchan_enum_word(types[t], -1), "?");
    }
}

/* ---- dchan_params_load ------------------------------------------------------------------ */

static void test_load_defaults(void **state)
{
    struct dchan_params p;
    char err[256] = "";
    memset(&p, 0xa5, sizeof p);
    assert_int_equal(dchan_params_load(&p, err, sizeof err), DCHAN_SUCCESS);
    assert_string_equal(p.PROVIDER, "");
    assert_int_equal(p.DETECT, DCHAN_DETECT_AUTO);
    assert_int_equal(p.BOOTSTRAP, DCHAN_BOOT_AUTO);
    assert_int_equal(p.LOG, DCHAN_LOG_WARN);
    assert_true(p.SPIN == 200);
    assert_true(p.DRAIN_TIMEOUT_MS == 10000);
    assert_true(p.QUARANTINE == 16384);
    assert_true(p.MAX_HANDLES == 1048576);
}

static void test_load_values(void **state)
{
    struct dchan_params p;
    char err[256] = "";
    setenv("DCHAN_PROVIDER", "self", 1);
    setenv("DCHAN_DETECT", "FLAG", 1);
    setenv("DCHAN_BOOTSTRAP", "singleton", 1);
    setenv("DCHAN_LOG", "none", 1);
    setenv("DCHAN_SPIN", "0", 1);
    setenv("DCHAN_DRAIN_TIMEOUT_MS", "5", 1);
    setenv("DCHAN_QUARANTINE", "100", 1);
    setenv("DCHAN_MAX_HANDLES", "77", 1);
    assert_int_equal(dchan_params_load(&p, err, sizeof err), DCHAN_SUCCESS);
    assert_string_equal(p.PROVIDER, "self");
    assert_int_equal(p.DETECT, DCHAN_DETECT_FLAG);
    assert_int_equal(p.BOOTSTRAP, DCHAN_BOOT_SINGLETON);
    assert_int_equal(p.LOG, DCHAN_LOG_NONE);
    assert_true(p.SPIN == 0);
    assert_true(p.DRAIN_TIMEOUT_MS == 5);
    assert_true(p.QUARANTINE == 100);
    assert_true(p.MAX_HANDLES == 77);
    assert_string_equal(dchan_param_env("SPIN"), "0");
    unit_clean_env();
    assert_null(dchan_param_env("SPIN"));
}

static void test_load_malformed(void **state)
{
    for (size_t i = 0; i < dchan_param_count; i++) {
        const struct dchan_param_desc *d = &dchan_param_table[i];
        if (d->type == DCHAN_PT_STRING)
            continue; /* any text is a string; providers are checked by dchan_init */
        const char *bad[] = {"", "bogus", "-1", "12x"};
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            struct dchan_params p;
            char err[256] = "", var[64], named[80];
            snprintf(var, sizeof var, "DCHAN_%s", d->name);
            unit_clean_env();
            setenv(var, bad[b], 1);
            assert_int_equal(dchan_params_load(&p, err, sizeof err), DCHAN_ERR_INVALID_ARG);
            /* The message names the variable (not a longer one) and its value. */
            snprintf(named, sizeof named, "%s='%s'", var, bad[b]);
            if (!strstr(err, named))
                fail_msg("message '%s' does not name %s", err, named);
            assert_non_null(strstr(err, d->choices ? d->choices : dchan_param_choices(d->type)));

            /* dchan_attr_init records it, dchan_init refuses. */
            dchan_attr_t a;
            dchan_ctx_t *ctx = NULL;
            dchan_attr_init(&a);
            assert_int_not_equal(a.config_error, 0);
            a.bootstrap = DCHAN_BOOT_SINGLETON;
            a.log_level = DCHAN_LOG_NONE;
            assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_INVALID_ARG);
            assert_null(ctx);
            /* ... even when the attr was made before the variable was set. */
            unit_clean_env();
            dchan_attr_init(&a);
            assert_int_equal(a.config_error, 0);
            a.bootstrap = DCHAN_BOOT_SINGLETON;
            a.log_level = DCHAN_LOG_NONE;
            setenv(var, bad[b], 1);
            assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_INVALID_ARG);
            assert_null(ctx);
            assert_int_equal(dchan_init(NULL, &ctx), DCHAN_ERR_INVALID_ARG);
            assert_null(ctx);
            unit_clean_env();
        }
    }
}

/* ---- dchan_attr_init and dchan_init --------------------------------------------------- */

static void test_attr_init_env(void **state)
{
    dchan_attr_t a;
    setenv("DCHAN_DETECT", "sentinel", 1);
    setenv("DCHAN_BOOTSTRAP", "SINGLETON", 1);
    setenv("DCHAN_LOG", "error", 1);
    setenv("DCHAN_PROVIDER", "self", 1);
    dchan_attr_init(&a);
    assert_int_equal(a.config_error, 0);
    assert_int_equal(a.detect, DCHAN_DETECT_SENTINEL);
    assert_int_equal(a.bootstrap, DCHAN_BOOT_SINGLETON);
    assert_int_equal(a.log_level, DCHAN_LOG_ERROR);
    assert_non_null(a.provider);
    assert_string_equal(a.provider, "self");

    /* And dchan_init acts on them. */
    dchan_ctx_t *ctx = NULL;
    a.log_level = DCHAN_LOG_NONE;
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
    assert_string_equal(dchan_provider_name(ctx), "self");
    struct unit_chan c;
    unit_chan_open(&c, ctx, 64);
    assert_int_equal(dchan_handle_detect(c.rh), DCHAN_DETECT_SENTINEL);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);

    /* dchan_init(NULL) reads the environment itself. */
    setenv("DCHAN_DETECT", "flag", 1);
    setenv("DCHAN_LOG", "none", 1);
    assert_int_equal(dchan_init(NULL, &ctx), DCHAN_SUCCESS);
    unit_chan_open(&c, ctx, 64);
    assert_int_equal(dchan_handle_detect(c.rh), DCHAN_DETECT_FLAG);
    unit_cycle(&c, 1);
    unit_chan_close(&c);
    assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);

    /* Unset: the defaults. */
    unit_clean_env();
    dchan_attr_init(&a);
    assert_null(a.provider);
    assert_int_equal(a.detect, DCHAN_DETECT_AUTO);
    assert_int_equal(a.bootstrap, DCHAN_BOOT_AUTO);
    assert_int_equal(a.log_level, DCHAN_LOG_WARN);
}

static void test_attr_init_malformed_each(void **state)
{
    const char *vars[] = {"DCHAN_DETECT", "DCHAN_BOOTSTRAP", "DCHAN_LOG"};
    for (size_t i = 0; i < 3; i++) {
        dchan_attr_t a;
        dchan_ctx_t *ctx = NULL;
        unit_clean_env();
        setenv(vars[i], "sometimes", 1);
        dchan_attr_init(&a);
        assert_int_not_equal(a.config_error, 0);
        /* Safe defaults kept. */
        assert_int_equal(a.detect, DCHAN_DETECT_AUTO);
        assert_int_equal(a.bootstrap, DCHAN_BOOT_AUTO);
        assert_int_equal(a.log_level, DCHAN_LOG_WARN);
        assert_int_equal(a.struct_size, sizeof a);
        /* config_error alone makes dchan_init fail, whatever the env says now. */
        unit_clean_env();
        a.bootstrap = DCHAN_BOOT_SINGLETON;
        a.log_level = DCHAN_LOG_NONE;
        assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_INVALID_ARG);
        assert_null(ctx);
    }
}

static void expect_provider_env(const char *value, int want)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;
    unit_clean_env();
    setenv("DCHAN_PROVIDER", value, 1);
    dchan_attr_init(&a);
    a.bootstrap = DCHAN_BOOT_SINGLETON;
    a.log_level = DCHAN_LOG_NONE;
    int rc = dchan_init(&a, &ctx);
    if (rc != want)
        fail_msg("DCHAN_PROVIDER=%s: dchan_init gave %d (%s), expected %d", value, rc,
                 dchan_strerror(rc), want);
    if (rc == DCHAN_SUCCESS)
        assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
    else
        assert_null(ctx);
    unit_clean_env();
}

static void test_provider_env(void **state)
{
    expect_provider_env("foo", DCHAN_ERR_INVALID_ARG);
    expect_provider_env("self,foo", DCHAN_ERR_INVALID_ARG);
    expect_provider_env(",", DCHAN_ERR_INVALID_ARG);
    expect_provider_env("SELF", DCHAN_ERR_INVALID_ARG); /* names are exact */
    expect_provider_env("self", DCHAN_SUCCESS);
    expect_provider_env("self,", DCHAN_SUCCESS);
    const char *net[] = {"verbs", "ofi", "shm"};
    for (size_t i = 0; i < 3; i++) {
        if (dchan_provider_lookup(net[i]))
            continue; /* built here: not this case */
        expect_provider_env(net[i], DCHAN_ERR_UNSUPPORTED);
        char list[32];
        snprintf(list, sizeof list, "%s,%s", net[i], net[(i + 1) % 3]);
        if (!dchan_provider_lookup(net[(i + 1) % 3]))
            expect_provider_env(list, DCHAN_ERR_UNSUPPORTED);
        /* A name known but not built is skipped: the next one serves. */
        snprintf(list, sizeof list, "%s,self", net[i]);
        expect_provider_env(list, DCHAN_SUCCESS);
    }
    /* The provider list check by itself. */
    char err[256];
    assert_int_equal(dchan_params_check_providers("self", err, sizeof err), DCHAN_SUCCESS);
    assert_int_equal(dchan_params_check_providers("nope", err, sizeof err),
                     DCHAN_ERR_INVALID_ARG);
    assert_non_null(strstr(err, "nope"));
    if (!dchan_provider_lookup("verbs")) {
        assert_int_equal(dchan_params_check_providers("verbs", err, sizeof err),
                         DCHAN_ERR_UNSUPPORTED);
        assert_non_null(strstr(err, "verbs"));
    }
    assert_non_null(dchan_provider_lookup("self"));
    assert_null(dchan_provider_lookup("foo"));
    assert_null(dchan_provider_lookup(NULL));
}

/* dchan_init(3): every name of the list is checked (an unknown one fails
 * the list), and a known name not built here is skipped, in any position. */
static void test_provider_list_checked_whole(void **state)
{
    const char *net[] = {"verbs", "ofi", "shm"};
    for (size_t i = 0; i < 3; i++) {
        char list[32];
        if (dchan_provider_lookup(net[i]))
            continue;
        snprintf(list, sizeof list, "%s,self", net[i]);
        expect_provider_env(list, DCHAN_SUCCESS);
        snprintf(list, sizeof list, "self,%s", net[i]);
        expect_provider_env(list, DCHAN_SUCCESS);
        snprintf(list, sizeof list, "%s,self,bogus", net[i]);
        expect_provider_env(list, DCHAN_ERR_INVALID_ARG);
    }
}

static void test_max_handles(void **state)
{
    dchan_attr_t a;
    dchan_ctx_t *ctx = NULL;

    setenv("DCHAN_MAX_HANDLES", "0", 1);
    unit_attr(&a, DCHAN_DETECT_AUTO, DCHAN_THREAD_SINGLE);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_INVALID_ARG);
    setenv("DCHAN_MAX_HANDLES", "16777216", 1);
    assert_int_equal(dchan_init(&a, &ctx), DCHAN_ERR_INVALID_ARG);
    assert_null(ctx);

    for (int m = 0; m < UNIT_NMODES; m++) {
        setenv("DCHAN_MAX_HANDLES", "3", 1);
        unit_attr(&a, unit_modes[m], DCHAN_THREAD_SINGLE);
        assert_int_equal(dchan_init(&a, &ctx), DCHAN_SUCCESS);
        struct unit_chan c[3];
        for (int i = 0; i < 3; i++) {
            unit_chan_open(&c[i], ctx, 64);
            c[i].id = i;
        }
        uint64_t buf[8];
        dchan_handle_t *h = NULL;
        assert_int_equal(dchan_create_handle(ctx, 0, buf, sizeof buf, 1, unit_count_cb, &c[0],
                                             &h),
                         DCHAN_ERR_NO_MEMORY);
        assert_null(h);
        for (int i = 0; i < 3; i++)
            unit_cycle(&c[i], 1);
        /* A freed slot can be taken again. */
        unit_chan_close(&c[1]);
        unit_chan_open(&c[1], ctx, 64);
        unit_cycle(&c[1], 2);
        for (int i = 0; i < 3; i++)
            unit_chan_close(&c[i]);
        assert_int_equal(dchan_finalize(ctx), DCHAN_SUCCESS);
        unit_clean_env();
    }
}

int main(void)
{
    unit_clean_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_parse_enums, reset_env),
        cmocka_unit_test_setup(test_parse_uint, reset_env),
        cmocka_unit_test_setup(test_parse_string, reset_env),
        cmocka_unit_test_setup(test_table, reset_env),
        cmocka_unit_test_setup(test_parse_word, reset_env),
        cmocka_unit_test_setup(test_choices_roundtrip, reset_env),
        cmocka_unit_test_setup(test_load_defaults, reset_env),
        cmocka_unit_test_setup_teardown(test_load_values, reset_env, reset_env),
        cmocka_unit_test_setup_teardown(test_load_malformed, reset_env, reset_env),
        cmocka_unit_test_setup_teardown(test_attr_init_env, reset_env, reset_env),
        cmocka_unit_test_setup_teardown(test_attr_init_malformed_each, reset_env, reset_env),
        cmocka_unit_test_setup_teardown(test_provider_env, reset_env, reset_env),
        cmocka_unit_test_setup_teardown(test_provider_list_checked_whole, reset_env, reset_env),
        cmocka_unit_test_setup_teardown(test_max_handles, reset_env, reset_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
