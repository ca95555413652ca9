/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dchan_info: the version, the providers built and usable here with their
 * detection modes, the bootstrap methods, and every DCHAN_* parameter.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "boot.h"
#include "params.h"
#include "provider.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dchan_info [-p] [-e] [-v] [-h]\n"
               "  -p  providers only\n"
               "  -e  environment parameters only\n"
               "  -v  version only\n"
               "  -h  this help\n");
}

static void print_modes(unsigned modes, int def)
{
    static const int all[] = {DCHAN_DETECT_SENTINEL, DCHAN_DETECT_FLAG, DCHAN_DETECT_EVENT};
    const char *sep = "";
    printf("    detection:");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (modes & DCHAN_MODE_BIT(all[i])) {
            printf("%s %s%s", sep, dchan_enum_word(DCHAN_PT_DETECT, all[i]),
                   all[i] == def ? " (auto)" : "");
            sep = ",";
        }
    }
    if (!*sep)
        printf(" none");
    printf("\n");
}

/* How the provider serves dchan_wakeup_fd: whether a sleeping process
 * really sleeps (DESIGN §7). */
static void print_sleeps(const struct dchan_provider_ops *ops)
{
    const struct dchan_params *pv = dchan_probe_params();
    unsigned long lo = pv ? pv->WAKE_TIMER_MIN_US : 0, hi = pv ? pv->WAKE_TIMER_MAX_US : 0;
    switch (ops->sleeps) {
    case DCHAN_SLEEPS_EVENT:
        printf("    wake-up: sleeps for real (woken by the event itself)\n");
        break;
    case DCHAN_SLEEPS_FABRIC:
        printf("    wake-up: sleeps for real where the fabric has a wait fd (tcp;ofi_rxm); "
               "else a timer looks, every %lu us doubling to %lu us\n", lo, hi);
        break;
    default:
        printf("    wake-up: does not sleep for real: a timer looks, every %lu us after "
               "activity doubling to %lu us (DCHAN_WAKE_TIMER_MIN_US, _MAX_US)\n", lo, hi);
    }
}

static void print_providers(void)
{
    printf("providers (automatic order for other ranks):\n");
    for (size_t i = 0; i < dchan_num_providers; i++) {
        const struct dchan_provider_ops *ops = dchan_providers[i];
        struct dchan_probe pr;
        memset(&pr, 0, sizeof pr);
        int rc = ops->probe(&pr);
        printf("  %-6s %s: %s\n", ops->name, rc == DCHAN_SUCCESS ? "usable" : "not usable",
               pr.desc[0] ? pr.desc : dchan_strerror(rc));
        if (rc == DCHAN_SUCCESS) {
            print_modes(pr.modes, pr.default_detect);
            print_sleeps(ops);
        }
    }
    printf("bootstrap methods:");
    for (int m = DCHAN_BOOT_MPI; m <= DCHAN_BOOT_SINGLETON; m++) {
        int built = m == DCHAN_BOOT_EXTERNAL || m == DCHAN_BOOT_SINGLETON;
#ifdef HAVE_MPI
        built |= m == DCHAN_BOOT_MPI;
#endif
#ifdef HAVE_PMIX
        built |= m == DCHAN_BOOT_PMIX;
#endif
        if (built)
            printf(" %s", dchan_boot_name(m));
    }
    printf("\n");
}

static void print_params(void)
{
    printf("parameters (environment):\n");
    for (size_t i = 0; i < dchan_param_count; i++) {
        const struct dchan_param_desc *d = &dchan_param_table[i];
        const char *now = dchan_param_env(d->name);
        printf("  DCHAN_%s = %s%s%s  [%s; default \"%s\"]\n", d->name, now ? "\"" : "(unset)",
               now ? now : "", now ? "\"" : "",
               d->choices ? d->choices : dchan_param_choices(d->type), d->def);
        /* Help text wrapped at about 76 columns, indented. */
        const char *h = d->help;
        while (*h) {
            size_t n = strlen(h);
            if (n > 72) {
                n = 72;
                while (n > 0 && h[n] != ' ')
                    n--;
                if (n == 0)
                    n = 72;
            }
            printf("      %.*s\n", (int)n, h);
            h += n;
            while (*h == ' ')
                h++;
        }
    }
}

int main(int argc, char **argv)
{
    int only_p = 0, only_e = 0, only_v = 0, c;

    while ((c = getopt(argc, argv, "pevh")) != -1) {
        switch (c) {
        case 'p':
            only_p = 1;
            break;
        case 'e':
            only_e = 1;
            break;
        case 'v':
            only_v = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    int all = !only_p && !only_e && !only_v;
    if (all || only_v) {
        unsigned v = dchan_version();
        printf("dchan %s (library %u.%u.%u)\n", DCHAN_VERSION_STRING, v >> 16, (v >> 8) & 0xff,
               v & 0xff);
    }
    if (all || only_p)
        print_providers();
    if (all || only_e)
        print_params();
    return 0;
}
