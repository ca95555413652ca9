#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Builds the "Credited channels" tables of bench/README.md from the RESULT
logs of dchan_credit, dchan_stream and dchan_direct (bench/run-credit):

    <!-- BEGIN GENERATED name -->  ...  <!-- END GENERATED name -->

for name in credit-machine, credit, stream, direct, credit-targets and
credit-skipped. Every number comes from RESULTS/*.txt; none is typed by hand.
Python 3 standard library only.
"""
import argparse
import os
import re
import sys

CREDIT_MAX = 1.05        # credited / plain one-way latency at 8 B
STREAM_RATE_MIN = 1.3    # dchan / best MPI window, 8 B .. 4 KiB (message rate)
STREAM_BW_MIN = 1.0      # dchan / best MPI window, from 64 KiB (bandwidth)
DIRECT_MAX = 0.6         # direct store / fill-then-put, 1 MiB on shm


def parse(path):
    """RESULT and SKIP/FAIL lines of a log as (kind, dict) tuples."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w or w[0] not in ("RESULT", "SKIP", "FAIL"):
                continue
            d = dict(x.split("=", 1) for x in w[1:] if "=" in x)
            out.append((w[0], d))
    return out


def size_label(n):
    n = int(n)
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d %s" % (n >> shift, unit)
    return "%d B" % n


def table(head, rows, align=None):
    align = align or ["---:"] * len(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def label(d):
    return "%s/%s" % (d["provider"], d["detect"])


def met(ok):
    return "**met**" if ok else "**missed**"


def credit_section(res):
    rows = []
    for kind, d in res:
        if kind != "RESULT":
            continue
        rows.append([label(d), size_label(d["size"]),
                     "%s [%s–%s]" % (d["plain_us"], d["plain_min_us"], d["plain_max_us"]),
                     "%s [%s–%s]" % (d["credit_us"], d["credit_min_us"], d["credit_max_us"]),
                     "**%s**" % d["ratio"], d["stalls_per_put"]])
    if not rows:
        return "No result."
    return table(["dchan", "size", "plain µs", "credited µs", "credited / plain",
                  "credit refusals per put"], rows, ["---"] + ["---:"] * 5)


def stream_section(res):
    by = {}
    for kind, d in res:
        if kind == "RESULT":
            by.setdefault(label(d), []).append(d)
    if not by:
        return "No result."
    parts = []
    for lab, ds in by.items():
        rows = []
        for d in sorted(ds, key=lambda d: int(d["size"])):
            small = int(d["size"]) <= 4096

            def rate(key):
                v = d[key + ("_mmsgs" if small else "_mbps")]
                return v if v == "-" else ("%.3f" % float(v) if small else "%.0f" % float(v))
            rows.append([size_label(d["size"]), "Mmsg/s" if small else "MB/s", rate("dchan"),
                         rate("mpi_window"), rate("mpi_stream"), d["ratio_window"],
                         d["ratio_stream"], "**%s**" % d["ratio_best"], d["stalls_per_put"]])
        d0 = ds[0]
        parts.append("**dchan %s**, depth %s, MPI window %s:\n\n" % (lab, d0["depth"], d0["window"])
                     + table(["size", "unit", "dchan", "mpi-window", "mpi-stream",
                              "/ mpi-window", "/ mpi-stream", "/ best MPI",
                              "credit refusals per put"],
                             rows, ["---:", "---"] + ["---:"] * 7))
    return "\n\n".join(parts)


def direct_section(res):
    rows = []
    for kind, d in res:
        if kind != "RESULT":
            continue
        rows.append([label(d), d["depth"], size_label(d["size"]), d["direct_us"], d["copy_us"],
                     d["fill_us"], "**%s**" % d["ratio"], "yes" if d["mapped"] == "1.00" else
                     ("no" if d["mapped"] == "0.00" else d["mapped"]), d["copied_direct"],
                     d["copied_copy"]])
    if not rows:
        return "No result."
    return table(["dchan", "depth", "size", "direct µs", "copy µs", "fill µs",
                  "direct / copy", "slot mapped", "copied per put (direct)",
                  "copied per put (copy)"], rows, ["---"] + ["---:"] * 9)


def targets_section(cr, st, di):
    out = []
    for kind, d in cr:
        if kind == "RESULT" and int(d["size"]) == 8:
            r = float(d["ratio"])
            out.append("- credit cost `%s`, 8 B: credited / plain ≤ %.2f: %s (%.3f)"
                       % (label(d), CREDIT_MAX, met(r <= CREDIT_MAX), r))
    for kind, d in st:
        if kind != "RESULT" or d["provider"] != "shm" or d["ratio_best"] == "-":
            continue
        s, r = int(d["size"]), float(d["ratio_best"])
        if s <= 4096:
            out.append("- depth streaming `%s`, %s: message rate ≥ %.1f × the better MPI "
                       "window: %s (%.3f)" % (label(d), size_label(s), STREAM_RATE_MIN,
                                              met(r >= STREAM_RATE_MIN), r))
        elif s >= 65536:
            out.append("- depth streaming `%s`, %s: bandwidth ≥ %.1f × the better MPI window: "
                       "%s (%.3f)" % (label(d), size_label(s), STREAM_BW_MIN,
                                      met(r >= STREAM_BW_MIN), r))
    for kind, d in di:
        if (kind != "RESULT" or d["provider"] != "shm" or int(d["size"]) != 1 << 20
                or d["mapped"] != "1.00"):
            continue
        r = float(d["ratio"])
        out.append("- direct store `%s`, depth %s, 1 MiB: time ≤ %.1f × fill-then-put: %s (%.3f)"
                   % (label(d), d["depth"], DIRECT_MAX, met(r <= DIRECT_MAX), r))
    return "\n".join(out) if out else "No result."


def skipped_section(logs):
    why = {}
    for bench, res in logs:
        for kind, d in res:
            if kind == "RESULT":
                continue
            where = "dchan_init" if "size" not in d else "the channel"
            key = "%s %s (%s, %s)" % (kind, d.get("reason", "?"), bench, where)
            what = "`%s/%s`" % (d.get("provider", "?"), d.get("detect", "?"))
            lst = why.setdefault(key, [])
            if what not in lst:
                lst.append(what)
    if not why:
        return "Nothing."
    return "\n".join("- %s: %s" % (k, ", ".join(v)) for k, v in why.items())


def machine_section(path):
    if not os.path.exists(path):
        return "No run yet."
    rows = []
    with open(path) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition(": ")
            rows.append(["**%s**" % k, v])
    return table(["", ""], rows, ["---", "---"])


def replace(text, name, body):
    pat = re.compile(r"(<!-- BEGIN GENERATED %s -->\n).*?(<!-- END GENERATED %s -->)"
                     % (re.escape(name), re.escape(name)), re.S)
    if not pat.search(text):
        sys.exit("mkcredit: no GENERATED %s markers in the README" % name)
    return pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="folder of the RESULT logs")
    ap.add_argument("--readme", required=True, help="README to update between markers")
    a = ap.parse_args()
    cr = parse(os.path.join(a.results, "credit.txt"))
    st = parse(os.path.join(a.results, "stream.txt"))
    di = parse(os.path.join(a.results, "direct.txt"))
    with open(a.readme) as f:
        text = f.read()
    text = replace(text, "credit-machine",
                   machine_section(os.path.join(a.results, "credit-machine.txt")))
    text = replace(text, "credit", credit_section(cr))
    text = replace(text, "stream", stream_section(st))
    text = replace(text, "direct", direct_section(di))
    text = replace(text, "credit-targets", targets_section(cr, st, di))
    text = replace(text, "credit-skipped",
                   skipped_section([("credit", cr), ("stream", st), ("direct", di)]))
    with open(a.readme, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
