#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Builds the results part of bench/README.md from the RESULT logs.

Reads RESULTS/pingpong.txt, bw.txt, pollcost.txt and machine.txt (written by
bench/run-all), replaces the text between each pair of markers
    <!-- BEGIN GENERATED name -->  ...  <!-- END GENERATED name -->
in the README, and draws RESULTS/pingpong.png, bw.png and pollcost.png with
gnuplot. Every number in the README comes from here; none is typed by hand.
Only the Python standard library is used.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

PEERS = ["mpi-sendrecv", "mpi-put-pscw", "mpi-put-lock", "ucx-put", "fi-rma shm"]


def parse(path):
    """RESULT and SKIP lines as dicts (with 'kind' set)."""
    rows = []
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            words = line.split()
            if not words or words[0] not in ("RESULT", "SKIP", "FAIL"):
                continue
            row = {"kind": words[0]}
            for w in words[1:]:
                k, _, v = w.partition("=")
                row[k] = v
            rows.append(row)
    return rows


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def label(r):
    if r.get("impl", "dchan") == "dchan":
        return "dchan %s/%s" % (r["provider"], r["detect"])
    # A raw-transport baseline names its transport: fi-rma shm, fi-rma tcp;ofi_rxm.
    if r.get("provider", "-") != "-":
        return "%s %s" % (r["impl"], r["provider"])
    return r["impl"]


def human(size):
    size = int(size)
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= div and size % div == 0:
            return "%d %s" % (size // div, unit)
    return "%d B" % size


def fmt(x):
    if x is None:
        return "—"
    if x >= 1000:
        return "%.0f" % x
    if x >= 100:
        return "%.1f" % x
    if x >= 1:
        return "%.2f" % x
    return "%.3f" % x


def table(head, rows, align=None):
    align = align or ["---:"] * len(head)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def order_labels(labels):
    dchan = sorted(l for l in labels if l.startswith("dchan "))
    rest = [p for p in PEERS if p in labels]
    other = sorted(l for l in labels if l not in dchan and l not in rest)
    return dchan + rest + other


# ---- sections ------------------------------------------------------------------------


def sec_machine(res):
    path = os.path.join(res, "machine.txt")
    if not os.path.exists(path):
        return "_No machine description: run bench/run-all._"
    rows = []
    with open(path) as f:
        for line in f:
            k, sep, v = line.rstrip("\n").partition(": ")
            if sep:
                rows.append(["**%s**" % k, v.replace("|", "\\|")])
    return table(["", ""], rows, ["---", "---"])


def pingpong(res):
    rows = [r for r in parse(os.path.join(res, "pingpong.txt")) if r["kind"] == "RESULT"]
    data = {}
    for r in rows:
        if r.get("impl", "").startswith("cacheline"):
            continue
        data.setdefault(label(r), {})[int(r["size"])] = (
            num(r["oneway_us"]), num(r["min_us"]), num(r["max_us"]))
    cl = [r for r in rows if r.get("impl") == "cacheline"]
    floors = [r for r in rows if r.get("impl") in ("cacheline-pair", "cacheline-rearm")]
    return data, cl, floors


def sec_pingpong(res):
    data, cl, floors = pingpong(res)
    if not data:
        return "_No pingpong results._"
    labels = order_labels(data)
    sizes = sorted({s for d in data.values() for s in d})
    out = []
    for s in sizes:
        cells = [human(s)]
        for l in labels:
            v = data[l].get(s)
            cells.append("%s [%s–%s]" % (fmt(v[0]), fmt(v[1]), fmt(v[2])) if v else "—")
        out.append(cells)
    text = table(["size"] + labels, out, ["---:"] * (len(labels) + 1))
    if cl:
        c = cl[0]
        text += ("\n\nCore-to-core cache-line handoff in the same run (`impl=cacheline`): "
                 "**%.1f ns** one way [%.1f–%.1f]." % (
                     1000 * num(c["oneway_us"]), 1000 * num(c["min_us"]), 1000 * num(c["max_us"])))
    if floors:
        text += (" Floors of a pingpong with a word per direction, no library: " +
                 "; ".join("`%s` **%.1f ns** [%.1f–%.1f]" % (
                     f["impl"], 1000 * num(f["oneway_us"]), 1000 * num(f["min_us"]),
                     1000 * num(f["max_us"])) for f in floors) + ".")
    return text


def sec_ratios(res):
    """One column per dchan row; each cell: the ratio to each peer, in order."""
    data, _, _ = pingpong(res)
    dl = [l for l in order_labels(data) if l.startswith("dchan ")]
    pl = [p for p in PEERS if p in data]
    if not dl or not pl:
        return "_No dchan and peer results to compare._"
    sizes = sorted({s for d in data.values() for s in d})
    out = []
    for s in sizes:
        cells = [human(s)]
        for d in dl:
            r = []
            for p in pl:
                a, b = data[d].get(s), data[p].get(s)
                r.append("%.2f" % (a[0] / b[0]) if a and b and b[0] else "—")
            cells.append(" / ".join(r))
        out.append(cells)
    note = "Each cell: dchan ÷ %s.\n\n" % " / ".join("`%s`" % p for p in pl)
    return note + table(["size"] + [d.replace("dchan ", "") for d in dl], out,
                        ["---:"] * (len(dl) + 1))


def bw(res):
    rows = [r for r in parse(os.path.join(res, "bw.txt")) if r["kind"] == "RESULT"]
    data, win = {}, {}
    for r in rows:
        data.setdefault(label(r), {})[int(r["size"])] = num(r["mbps"])
        win[int(r["size"])] = r["window"]
    return data, win


def sec_bw(res):
    data, win = bw(res)
    if not data:
        return "_No bandwidth results._"
    labels = order_labels(data)
    sizes = sorted(win)
    out = [[human(s), win[s]] + [fmt(data[l].get(s)) for l in labels] for s in sizes]
    return table(["size", "window"] + labels, out, ["---:"] * (len(labels) + 2))


def ratio_cell(mine, peers, s):
    """mine's value at size s divided by each peer's, joined by ' / '; n/a
    where a value is missing. A peer is a {size: value} dict (values may be
    (median, min, max) tuples), a plain number (one value for every size),
    or None (not in the logs)."""
    def at(d):
        if d is None or isinstance(d, float):
            return d
        v = d.get(s)
        return v[0] if isinstance(v, tuple) else v
    a = at(mine)
    return " / ".join("%.2f" % (a / at(p)) if a is not None and at(p) else "n/a"
                      for p in peers)


def sec_shm(res):
    """The ratios the shm provider is judged by, from the RESULT lines of the
    run-all run (the shm rows, their peers and cacheline come from one
    launch of each program). Never typed: n/a where a needed impl or size is
    absent from the logs."""
    pp, cl, _ = pingpong(res)
    bwd, _ = bw(res)
    out = []
    modes = ("sentinel", "flag", "event")

    def cols(prefix, data):
        return [m for m in modes if "dchan %s/%s" % (prefix, m) in data]

    # Small messages: shm (dchan_alloc buffers, a memcpy per put).
    cache = num(cl[0]["oneway_us"]) if cl else None
    ms = cols("shm", pp)
    small = sorted({s for d in pp.values() for s in d if 8 <= s <= 1024})
    out.append("**Small messages, `shm` (buffers from `dchan_alloc`)**: one-way latency "
               "÷ `ucx-put` / ÷ `mpi-sendrecv` / ÷ `cacheline` (its one size=8 result, "
               "against every size); below 1: dchan is faster.\n")
    if not ms or not small:
        out.append("n/a (no shm pingpong results at 8 B .. 1 KiB)")
    else:
        peers = [pp.get("ucx-put"), pp.get("mpi-sendrecv"), cache]
        rows = [[human(s)] + [ratio_cell(pp["dchan shm/%s" % m], peers, s) for m in ms]
                for s in small]
        out.append(table(["size"] + ["shm/%s" % m for m in ms], rows,
                         ["---:"] * (len(ms) + 1)))
    # Large puts: shm against a plain copy and against MPI two-sided.
    ms = cols("shm", bwd)
    large = sorted({s for d in bwd.values() for s in d if (1 << 20) <= s <= (64 << 20)})
    out.append("\n**Bandwidth, `shm` (buffers from `dchan_alloc`)**: MB/s ÷ `memcpy` / "
               "÷ `mpi-sendrecv`; above 1: dchan is faster.\n")
    if not ms or not large:
        out.append("n/a (no shm bandwidth results at 1 MiB .. 64 MiB)")
    else:
        peers = [bwd.get("memcpy"), bwd.get("mpi-sendrecv")]
        rows = [[human(s)] + [ratio_cell(bwd["dchan shm/%s" % m], peers, s) for m in ms]
                for s in large]
        out.append(table(["size"] + ["shm/%s" % m for m in ms], rows, ["---:"] * (len(ms) + 1)))
    # Heap buffers (Cross Memory Attach) against MPI two-sided, 64 KiB up.
    mp, mb = cols("shm-heap", pp), cols("shm-heap", bwd)
    big = sorted({s for d in list(pp.values()) + list(bwd.values()) for s in d if s >= 65536})
    out.append("\n**`shm-heap` (heap buffers, written with `process_vm_writev`) ÷ "
               "`mpi-sendrecv`, 64 KiB up**: one-way latency ratio (below 1: dchan is faster) "
               "/ bandwidth ratio (above 1: dchan is faster).\n")
    ms = [m for m in modes if m in mp or m in mb]
    if not ms or not big:
        out.append("n/a (no shm-heap results from 64 KiB up)")
    else:
        rows = []
        for s in big:
            cells = [human(s)]
            for m in ms:
                key = "dchan shm-heap/%s" % m
                cells.append("%s / %s" % (ratio_cell(pp.get(key), [pp.get("mpi-sendrecv")], s),
                                          ratio_cell(bwd.get(key), [bwd.get("mpi-sendrecv")], s)))
            rows.append(cells)
        out.append(table(["size"] + ["shm-heap/%s" % m for m in ms], rows,
                         ["---:"] * (len(ms) + 1)))
    return "\n".join(out)


def pollcost(res):
    rows = parse(os.path.join(res, "pollcost.txt"))
    pc = {}
    for r in rows:
        if r["kind"] == "RESULT" and r.get("bench") == "pollcost":
            key = "%s/%s" % (r["provider"], r["detect"])
            pc.setdefault(key, {})[int(r["armed"])] = (num(r["progress_ns"]), num(r["detect_ns"]))
    al = {"%s/%s" % (r["provider"], r["detect"]): r for r in rows
          if r["kind"] == "RESULT" and r.get("bench") == "alloc"}
    return pc, al


def sec_pollcost(res):
    pc, _ = pollcost(res)
    if not pc:
        return "_No poll-cost results._"
    armed = sorted({n for d in pc.values() for n in d})
    keys = sorted(pc)
    out = []
    for k in keys:
        out.append([k, "progress"] + [fmt(pc[k].get(n, (None, None))[0]) for n in armed])
        out.append(["", "detect"] + [fmt(pc[k].get(n, (None, None))[1]) for n in armed])
    return table(["provider/detect", "ns per"] + ["%d armed" % n for n in armed], out,
                 ["---", "---"] + ["---:"] * len(armed))


def sec_alloc(res):
    _, al = pollcost(res)
    if not al:
        return "_No allocation counts._"
    out = [[k, al[k]["allocs_per_put"], al[k]["allocs_per_progress"]] for k in sorted(al)]
    return table(["provider/detect", "allocations per put", "allocations per progress"], out,
                 ["---", "---:", "---:"])


def sec_skipped(res):
    """Grouped: one line per reason and set of benchmarks."""
    seen = {}
    for name in ("pingpong", "bw", "pollcost"):
        for r in parse(os.path.join(res, name + ".txt")):
            if r["kind"] not in ("SKIP", "FAIL"):
                continue
            what = "%s/%s" % (r.get("provider"), r.get("detect"))
            if "size" in r:
                what += " at %s" % human(r["size"])
            reason = ("FAILED: " if r["kind"] == "FAIL" else "") + r.get("reason", "?")
            seen.setdefault((what, reason), []).append(name)
    groups = {}
    for (what, reason), benches in seen.items():
        groups.setdefault((reason, ", ".join(benches)), []).append(what)
    out = ["- %s (%s): %s" % (reason, benches, ", ".join("`%s`" % w for w in whats))
           for (reason, benches), whats in groups.items()]
    return "\n".join(out) if out else "_Nothing was skipped._"


def some(sizes, most=6):
    """A list of sizes, cut short."""
    if len(sizes) <= most:
        return ", ".join(sizes)
    return "%s and %d more" % (", ".join(sizes[:most]), len(sizes) - most)


def sec_targets(res):
    data, _, _ = pingpong(res)
    pc, al = pollcost(res)
    out = []

    def verdict(ok):
        return "**met**" if ok else "**missed**"

    # 1. dchan over mpi within 1.25x of MPI two-sided.
    for d in [l for l in data if l.startswith("dchan mpi/")]:
        if "mpi-sendrecv" not in data:
            break
        ratios = [(s, data[d][s][0] / data["mpi-sendrecv"][s][0])
                  for s in sorted(data[d]) if s in data["mpi-sendrecv"]]
        if not ratios:
            continue
        worst = max(ratios, key=lambda x: x[1])
        over = [human(s) for s, r in ratios if r > 1.25]
        out.append("- `%s` ≤ 1.25 × `mpi-sendrecv` at every size: %s (worst %.2f× at %s%s)." % (
            d.replace("dchan ", "dchan "), verdict(not over), worst[1], human(worst[0]),
            "; above 1.25× at " + some(over) if over else ""))
    # 1b. shm's 8-byte one-way against the floors of its mechanism, same run.
    floor = {f["impl"]: 1000 * num(f["oneway_us"]) for f in
             [r for r in parse(os.path.join(res, "pingpong.txt"))
              if r["kind"] == "RESULT" and int(r.get("size", 0) or 0) == 8]}
    for mode, fl, slack in (("sentinel", "cacheline-rearm", 20), ("flag", "cacheline-rearm", 20),
                            ("event", "ring", 25)):
        d = "dchan shm/" + mode
        if d in data and 8 in data[d] and fl in floor:
            ns = 1000 * data[d][8][0]
            out.append("- `%s` 8 B ≤ `%s` + %d ns: %s (%.1f ns against %.1f ns: +%.1f)." % (
                d, fl, slack, verdict(ns <= floor[fl] + slack), ns, floor[fl], ns - floor[fl]))
    for d in [l for l in data if l.startswith("dchan shm/")]:
        if "ucx-put" not in data:
            break
        ratios = [(sz, data[d][sz][0] / data["ucx-put"][sz][0])
                  for sz in sorted(data[d]) if sz in data["ucx-put"]]
        if ratios:
            over = [human(sz) for sz, r in ratios if r > 1]
            worst = max(ratios, key=lambda x: x[1])
            out.append("- `%s` ≤ `ucx-put` at every size: %s (worst %.2f× at %s%s)." % (
                d, verdict(not over), worst[1], human(worst[0]),
                "; above at " + some(over) if over else ""))
    # 2. dchan over ofi/shm below both MPI one-sided peers.
    ofi = [l for l in data if l.startswith("dchan ofi") and "tcp" not in l]
    if not ofi:
        out.append("- dchan over ofi/shm below `mpi-put-pscw` and `mpi-put-lock`: "
                   "not measured (no ofi results).")
    for d in ofi:
        for p in ("mpi-put-pscw", "mpi-put-lock"):
            if p not in data:
                continue
            ratios = [(s, data[d][s][0] / data[p][s][0]) for s in sorted(data[d]) if s in data[p]]
            if not ratios:
                continue
            over = [human(s) for s, r in ratios if r >= 1]
            worst = max(ratios, key=lambda x: x[1])
            out.append("- `%s` below `%s` at every size: %s (worst %.2f× at %s%s)." % (
                d, p, verdict(not over), worst[1], human(worst[0]),
                "; not below at " + some(over) if over else ""))
    # 3. progress cost against armed channels.
    for k in sorted(pc):
        prov, mode = k.split("/")
        ns = sorted(n for n in pc[k] if pc[k][n][0] is not None)
        if not ns:
            continue
        top = ns[-1]
        if mode == "event" and 1 in pc[k] and top > 1:
            r = pc[k][top][0] / pc[k][1][0]
            out.append("- EVENT `%s`: progress with %d armed ≤ 1.2 × with 1: %s (%.1f ns vs "
                       "%.1f ns, %.2f×)." % (k, top, verdict(r <= 1.2), pc[k][top][0],
                                             pc[k][1][0], r))
        if mode == "flag" and top > 0:
            base = pc[k].get(0, pc[k][ns[0]])[0]
            per = (pc[k][top][0] - base) / top
            out.append("- FLAG `%s`: ≤ 1 ns per armed channel: %s (%.2f ns per channel from 0 "
                       "to %d armed)." % (k, verdict(per <= 1), per, top))
    # 4. allocations.
    for k in sorted(al):
        a, b = al[k]["allocs_per_put"], al[k]["allocs_per_progress"]
        if a == "-" or b == "-":
            out.append("- `%s`: allocations not counted in this build." % k)
            continue
        ok = float(a) == 0 and float(b) == 0
        out.append("- `%s`: zero heap allocations per put and per progress: %s (%s, %s)." % (
            k, verdict(ok), a, b))
    return "\n".join(out) if out else "_No results to check._"


# ---- plots ---------------------------------------------------------------------------


def gnuplot(script, res):
    gp = shutil.which("gnuplot")
    if not gp:
        print("mkreport: gnuplot not found: plots not drawn", file=sys.stderr)
        return False
    subprocess.run([gp], input=script, text=True, check=True, cwd=res)
    return True


def terminal():
    """pngcairo where gnuplot has it (smoother), else libgd's png."""
    try:
        p = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    except OSError:
        return "png noenhanced"
    return ("pngcairo" if "pngcairo" in p.stdout + p.stderr else "png") + " noenhanced"


# Distinct colours: gnuplot's default set repeats after eight series.
COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8"]


def style(i, name):
    """Colour and point type by position; MPI peers solid black-ish, tcp dashed."""
    dash = "dt 2" if "tcp" in name else "dt 1"
    return "lc rgb '%s' pt %d %s" % (COLOURS[i % len(COLOURS)], 1 + i % 13, dash)


def block(name, pts):
    return "$%s << EOD\n%s\nEOD\n" % (name, "\n".join("%s %s" % p for p in pts))


def plot_series(res, png, title, xlabel, ylabel, series, logy=True, hline=None):
    term = terminal()
    s = "set terminal %s size 1100,700\n" % term
    s += "set output '%s'\nset title \"%s\"\nset xlabel '%s'\nset ylabel '%s'\n" % (
        png, title, xlabel, ylabel)
    s += ("set logscale x 2\nset xtics 1,4\nset grid\nset key outside right top\n"
          "set format x '%.0b %BB'\n")
    if logy:
        s += "set logscale y 10\n"
    plots = []
    for i, (name, pts) in enumerate(series):
        if not pts:
            continue
        s += block("d%d" % i, pts)
        plots.append("$d%d using 1:2 with linespoints lw 2 %s title '%s'" % (i, style(i, name),
                                                                            name))
    if hline is not None:
        plots.append("%g with lines dt 2 lc rgb 'gray40' title 'cacheline (physical floor)'"
                     % hline)
    if not plots:
        return
    s += "plot " + ", \\\n     ".join(plots) + "\n"
    gnuplot(s, res)


def plots(res):
    data, cl, _ = pingpong(res)
    if data:
        series = [(l, [(s, data[l][s][0]) for s in sorted(data[l])]) for l in order_labels(data)]
        plot_series(res, "pingpong.png", "One-way latency (median), 2 ranks on one node",
                    "message size", "one-way latency (us)", series,
                    hline=num(cl[0]["oneway_us"]) if cl else None)
    rows = [r for r in parse(os.path.join(res, "bw.txt")) if r["kind"] == "RESULT"]
    if rows:
        bw = {}
        for r in rows:
            bw.setdefault(label(r), []).append((int(r["size"]), num(r["mbps"])))
        plot_series(res, "bw.png", "Put bandwidth with a window of channels in flight",
                    "message size", "MB/s (10^6 B/s)",
                    [(l, sorted(bw[l])) for l in order_labels(bw)], logy=False)
    pc, _ = pollcost(res)
    if pc:
        term = terminal()
        s = "set terminal %s size 1100,700\nset output 'pollcost.png'\n" % term
        s += ("set title 'Cost of one dchan_progress call against armed idle channels'\n"
              "set xlabel 'armed channels'\nset ylabel 'ns per call'\n"
              "set logscale xy 10\nset grid\nset key outside right top\n")
        plotv = []
        for i, k in enumerate(sorted(pc)):
            pts = [(n, pc[k][n][0]) for n in sorted(pc[k]) if n > 0 and pc[k][n][0]]
            if pts:
                s += block("p%d" % i, pts)
                plotv.append("$p%d using 1:2 with linespoints lw 2 %s title '%s'" % (
                    i, style(i, k), k))
        if plotv:
            s += "plot " + ", \\\n     ".join(plotv) + "\n"
            gnuplot(s, res)


# ---- README ----------------------------------------------------------------------------

SECTIONS = {
    "machine": sec_machine,
    "pingpong": sec_pingpong,
    "ratios": sec_ratios,
    "bw": sec_bw,
    "shm": sec_shm,
    "pollcost": sec_pollcost,
    "alloc": sec_alloc,
    "targets": sec_targets,
    "skipped": sec_skipped,
}


def update_readme(path, res):
    with open(path) as f:
        text = f.read()
    for name, fn in SECTIONS.items():
        pat = re.compile(r"(<!-- BEGIN GENERATED %s -->\n).*?(<!-- END GENERATED %s -->)"
                         % (name, name), re.S)
        if not pat.search(text):
            print("mkreport: no markers for '%s' in %s" % (name, path), file=sys.stderr)
            continue
        body = fn(res)
        text = pat.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="folder of the RESULT logs")
    ap.add_argument("--readme", required=True, help="README to update between markers")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    if not a.no_plots:
        plots(a.results)
    update_readme(a.readme, a.results)


if __name__ == "__main__":
    main()
