#!/usr/bin/env python3
"""Turn Google Benchmark JSON from typegrad_bench into markdown tables and an expmul plot.

usage: make_table.py [--metric cpu_time|real_time] [results.json] [table.md]
       (defaults: cpu_time, results/latest.json and results/table.md next to this script)

Benchmark names are <workload>/<impl>/<type>/<size>. Each cell is the median time in ns and, in
parentheses, the ratio to hand_xsimd for the same workload/type/size (1.00x = physical limit).
When typegrad results are present, a last section checks them against the targets listed in
benchmarks/README.md (ratios to hand_xsimd and LibTorch, and bandwidth against copy/memcpy).
The default metric is the CPU time of the benchmark thread: every implementation runs on that one
thread, and on a shared machine wall time also counts the time other tenants hold the core.
The expmul plot (results/expmul.png) needs gnuplot; without it the plot is skipped with a message.
Standard library only.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
# Known implementations first, in this order; anything else (later peers) follows alphabetically.
IMPL_ORDER = ["hand_xsimd", "hand_scalar", "typegrad", "libtorch", "sacado"]
TYPE_ORDER = ["float", "double"]
WORKLOAD_ORDER = ["expmul", "sum", "prod", "log_sum_exp", "normal_log_pdf", "matrix_product",
                  "regression", "stochastic_volatility", "mlp_layer"]
SIZE_MEANING = {
    "matrix_product": "K (K x K matrices)",
    "regression": "p (X is 1000 x p)",
    "stochastic_volatility": "T (time steps)",
    "mlp_layer": "d (256 x d input, d x d weights)",
}
TO_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def order_key(order, name):
    return (order.index(name), "") if name in order else (len(order), name)


def load(path, metric):
    """Returns ({(workload, impl, type, size): median_ns or error string}, context)."""
    with open(path) as f:
        data = json.load(f)
    samples = defaultdict(list)  # fallback when the run has no aggregates
    medians, errors, reps = {}, {}, set()
    for b in data.get("benchmarks", []):
        parts = b.get("run_name", b["name"]).split("/")
        while len(parts) > 4 and not parts[-1].isdigit():  # e.g. a "/process_time" suffix
            parts.pop()
        if len(parts) != 4 or not parts[3].isdigit():
            continue
        key = (parts[0], parts[1], parts[2], int(parts[3]))
        if b.get("error_occurred"):
            errors[key] = b.get("error_message", "error")
            continue
        ns = b[metric] * TO_NS[b.get("time_unit", "ns")]
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[key] = ns
                reps.add(b.get("repetitions"))
        else:
            samples[key].append(ns)
    results = {k: statistics.median(v) for k, v in samples.items()}
    results.update(medians)
    for k, msg in errors.items():
        results.setdefault(k, "ERROR: " + msg)
    context = dict(data.get("context", {}))
    context["repetitions"] = "/".join(str(r) for r in sorted(reps - {None})) or "1"
    context["metric"] = {"cpu_time": "CPU time", "real_time": "real time"}[metric]
    return results, context


def fmt_ns(ns):
    return f"{ns:.1f}" if ns < 100 else f"{ns:,.0f}"


def markdown(results, context):
    by_workload = defaultdict(dict)
    for (w, impl, t, n), v in results.items():
        by_workload[w][(impl, t, n)] = v
    out = ["# typegrad runtime benchmarks", ""]
    ctx = [("date", context.get("date")), ("host", context.get("host_name")),
           ("cpus", context.get("num_cpus") and
            f'{context["num_cpus"]} x {context.get("mhz_per_cpu")} MHz'),
           ("compiler", context.get("compiler")), ("flags", context.get("cxx_flags")),
           ("xsimd arch", context.get("xsimd_arch")),
           ("libtorch", context.get("libtorch_version", context.get("libtorch"))),
           ("sacado", context.get("sacado")),
           ("load average at start", " ".join(f"{x:.2f}" for x in context.get("load_avg", [])))]
    out += [f"- {k}: {v}" for k, v in ctx if v]
    out += summary(results)
    out += ["", f"Median over {context['repetitions']} repetitions of the {context['metric']} in ns; in "
            "parentheses the ratio to `hand_xsimd` (lower is better). `-` = not run for that size.",
            ""]
    for w in sorted(by_workload, key=lambda w: order_key(WORKLOAD_ORDER, w)):
        cells = by_workload[w]
        impls = sorted({k[0] for k in cells}, key=lambda i: order_key(IMPL_ORDER, i))
        rows = sorted({(k[1], k[2]) for k in cells},
                      key=lambda r: (order_key(TYPE_ORDER, r[0]), r[1]))
        out += [f"## {w}", "", f"size = {SIZE_MEANING.get(w, 'N (elements)')}", ""]
        out.append("| type | size | " + " | ".join(impls) + " |")
        out.append("|---|---:|" + "---:|" * len(impls))
        for t, n in rows:
            base = cells.get(("hand_xsimd", t, n))
            row = [t, str(n)]
            for impl in impls:
                v = cells.get((impl, t, n))
                if v is None:
                    row.append("-")
                elif isinstance(v, str):
                    row.append(v.split(":")[0])
                elif isinstance(base, float):
                    row.append(f"{fmt_ns(v)} ({v / base:.2f}x)")
                else:
                    row.append(fmt_ns(v))
            out.append("| " + " | ".join(row) + " |")
        errs = [(k, v) for k, v in sorted(cells.items()) if isinstance(v, str)]
        if errs:
            out += [""] + [f"- {w}/{k[0]}/{k[1]}/{k[2]}: {v}" for k, v in errs]
        out.append("")
    out += targets(results)
    return "\n".join(out)


# Sizes quoted in the summary: the target sizes for vectors, the largest size otherwise.
SUMMARY_SIZES = {"matrix_product": [64, 181], "regression": [10, 150], "stochastic_volatility": [8192],
                 "mlp_layer": [64, 512]}


def summary(results):
    """Markdown: typegrad against every baseline at a few sizes per workload (ratios = time / typegrad)."""
    if not any(k[1] == "typegrad" for k in results):
        return []
    def get(w, impl, t, n):
        v = results.get((w, impl, t, n))
        return v if isinstance(v, float) else None
    out = ["", "## Summary: typegrad against the baselines", "",
           "Median ns of typegrad; then each baseline's time divided by typegrad's (above 1: typegrad is "
           "faster; for hand_xsimd, the physical limit, typegrad / hand_xsimd is the slowdown, shown as "
           "`tg/hand`).", "",
           "| workload | type | size | typegrad ns | tg/hand_xsimd | libtorch/tg | sacado/tg | hand_scalar/tg |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    workloads = sorted({k[0] for k in results if k[1] == "typegrad"}, key=lambda w: order_key(WORKLOAD_ORDER, w))
    for w in workloads:
        for t in TYPE_ORDER:
            for n in SUMMARY_SIZES.get(w, [16384, 1000000]):
                tg = get(w, "typegrad", t, n)
                if tg is None:
                    continue
                def ratio(impl, inverse=False):
                    v = get(w, impl, t, n)
                    if v is None:
                        return "-"
                    return f"{tg / v:.2f}x" if inverse else f"{v / tg:.2f}x"
                out.append(f"| {w} | {t} | {n} | {fmt_ns(tg)} | {ratio('hand_xsimd', True)} | "
                           f"{ratio('libtorch')} | {ratio('sacado')} | {ratio('hand_scalar')} |")
    return out


# Targets for typegrad (benchmarks/README.md, "Targets"). Compulsory traffic = arrays read or
# written once per call (inputs and gradients), the least any implementation moves.
ELEMENTWISE = ["expmul", "sum", "prod", "log_sum_exp", "normal_log_pdf"]
TRAFFIC_ARRAYS = {"expmul": 4, "sum": 2, "prod": 2, "log_sum_exp": 2, "normal_log_pdf": 2}
MATMUL = ["matrix_product", "mlp_layer", "regression"]
TARGET_SIZES = [16384, 1000000]
ELEMENT_BYTES = {"float": 4, "double": 8}


def targets(results):
    """Markdown: each typegrad target with the measured numbers, met or missed per row."""
    def get(w, impl, t, n):
        v = results.get((w, impl, t, n))
        return v if isinstance(v, float) else None

    def verdict(ok):
        return "met" if ok else "**missed**"

    if not any(k[1] == "typegrad" for k in results):
        return []
    out = ["## typegrad against its targets", "",
           "### 1. Fused elementwise workloads <= 1.10x hand_xsimd at N = 2^14 and 1e6", "",
           "| workload | type | N | typegrad | hand_xsimd | ratio | target |", "|---|---|---:|---:|---:|---:|---|"]
    for w in ELEMENTWISE:
        for t in TYPE_ORDER:
            for n in TARGET_SIZES:
                tg, hx = get(w, "typegrad", t, n), get(w, "hand_xsimd", t, n)
                if tg is None or hx is None:
                    continue
                out.append(f"| {w} | {t} | {n} | {fmt_ns(tg)} | {fmt_ns(hx)} | {tg / hx:.2f}x | "
                           f"{verdict(tg / hx <= 1.10)} |")
    out += ["", "### 2. >= 3x faster than LibTorch eager on the elementwise workloads (every N)", "",
            "Speed-up = libtorch time / typegrad time; the smallest over the seven sizes, and at the "
            "two target sizes.", "",
            "| workload | type | min speed-up (at N) | at 2^14 | at 1e6 | target |",
            "|---|---|---:|---:|---:|---|"]
    for w in ELEMENTWISE:
        for t in TYPE_ORDER:
            ups = {}
            for (ww, impl, tt, n) in results:
                if ww == w and impl == "typegrad" and tt == t:
                    tg, lt = get(w, "typegrad", t, n), get(w, "libtorch", t, n)
                    if tg and lt:
                        ups[n] = lt / tg
            if not ups:
                continue
            n_min = min(ups, key=ups.get)
            at = [f"{ups[n]:.1f}x" if n in ups else "-" for n in TARGET_SIZES]
            out.append(f"| {w} | {t} | {ups[n_min]:.1f}x ({n_min}) | {at[0]} | {at[1]} | "
                       f"{verdict(ups[n_min] >= 3)} |")
    out += ["", "### 3. matmul workloads >= 1.0x LibTorch (every size)", "",
            "| workload | type | size | typegrad | libtorch | speed-up | target |",
            "|---|---|---:|---:|---:|---:|---|"]
    for w in MATMUL:
        for t in TYPE_ORDER:
            for n in sorted({k[3] for k in results if k[0] == w and k[1] == "typegrad" and k[2] == t}):
                tg, lt = get(w, "typegrad", t, n), get(w, "libtorch", t, n)
                if tg and lt:
                    out.append(f"| {w} | {t} | {n} | {fmt_ns(tg)} | {fmt_ns(lt)} | {lt / tg:.2f}x | "
                               f"{verdict(lt / tg >= 1.0)} |")
    out += ["", "### 4. Memory-bound cases >= 80% of the measured copy bandwidth", "",
            "Bandwidth = compulsory traffic (inputs read once, gradients written once: 4 arrays for "
            "expmul, 2 for the others) / time; copy = `copy/memcpy` at the same N (2 arrays: read + "
            "write). A case counts as memory-bound when hand_xsimd, the physical limit, itself reaches at "
            "least 80% of the copy bandwidth on it; the others are bound by arithmetic (exp, log, "
            "division) and are listed for reference.", "",
            "| workload | type | N | copy GB/s | hand_xsimd GB/s | typegrad GB/s | typegrad / copy | "
            "memory-bound | target |", "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for w in ELEMENTWISE:
        for t in TYPE_ORDER:
            for n in TARGET_SIZES:
                tg, hx, cp = get(w, "typegrad", t, n), get(w, "hand_xsimd", t, n), get("copy", "memcpy", t, n)
                if not (tg and hx and cp):
                    continue
                nbytes = TRAFFIC_ARRAYS[w] * n * ELEMENT_BYTES[t]
                bw_cp = 2 * n * ELEMENT_BYTES[t] / cp  # bytes per ns = GB/s
                bw_tg, bw_hx = nbytes / tg, nbytes / hx
                bound = bw_hx >= 0.8 * bw_cp
                out.append(f"| {w} | {t} | {n} | {bw_cp:.0f} | {bw_hx:.0f} | {bw_tg:.0f} | "
                           f"{bw_tg / bw_cp:.0%} | {'yes' if bound else 'no'} | "
                           f"{verdict(bw_tg >= 0.8 * bw_cp) if bound else '(n/a)'} |")
    out.append("")
    return out


def plot_expmul(results, png, ylabel):
    gnuplot = shutil.which("gnuplot")
    if not gnuplot:
        print("make_table.py: gnuplot not found (apt-get install -y gnuplot-nox), skipping plot")
        return
    series = defaultdict(list)
    for (w, impl, t, n), v in results.items():
        if w == "expmul" and isinstance(v, float):
            series[(t, impl)].append((n, v))
    if not series:
        print("make_table.py: no expmul results, skipping plot")
        return
    base = os.path.splitext(png)[0]
    panels = []
    for t in TYPE_ORDER:
        plots = []
        for impl in sorted({i for tt, i in series if tt == t},
                           key=lambda i: order_key(IMPL_ORDER, i)):
            dat = f"{base}_{t}_{impl}.dat"
            with open(dat, "w") as f:
                f.writelines(f"{n} {v}\n" for n, v in sorted(series[(t, impl)]))
            plots.append(f"'{dat}' using 1:2 with linespoints title '{impl}'")
        if plots:
            panels.append(f"set title 'expmul, {t}'\nplot " + ", ".join(plots))
    script = "\n".join([
        "set terminal pngcairo noenhanced size 1200,500 font ',10'",
        f"set output '{png}'",
        "set logscale xy", "set format xy '%g'", "set grid", "set key top left",
        "set xlabel 'N (elements)'", f"set ylabel 'median {ylabel} (ns)'",
        f"set multiplot layout 1,{len(panels)}"] + panels + ["unset multiplot"])
    try:
        subprocess.run([gnuplot], input=script, text=True, check=True)
        print(f"make_table.py: wrote {png}")
    finally:
        for t, impl in series:
            try:
                os.remove(f"{base}_{t}_{impl}.dat")
            except OSError:
                pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metric", choices=["cpu_time", "real_time"], default="cpu_time")
    ap.add_argument("src", nargs="?", default=os.path.join(HERE, "results", "latest.json"))
    ap.add_argument("dst", nargs="?", default=os.path.join(HERE, "results", "table.md"))
    args = ap.parse_args()
    results, context = load(args.src, args.metric)
    with open(args.dst, "w") as f:
        f.write(markdown(results, context))
    print(f"make_table.py: wrote {args.dst}")
    plot_expmul(results, os.path.join(os.path.dirname(os.path.abspath(args.dst)), "expmul.png"),
                context["metric"])


if __name__ == "__main__":
    main()
