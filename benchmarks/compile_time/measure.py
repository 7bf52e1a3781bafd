#!/usr/bin/env python3
"""Compile-time benchmark: build generated graphs (gen.py) with g++ and clang++, measure wall
time, CPU time and peak memory with /usr/bin/time -v, and write results.md.

usage: measure.py [--sizes 10,100,300,1000] [--kinds chain,dag] [--compilers g++,clang++]
                  [--timeout 300] [--mem-gib 12] [--workdir DIR] [--out results.md]
                  [--tests] [--tests-jobs 2] [--skip-graphs]
       measure.py --trace FILE.json [--top 25]     summarise a clang -ftime-trace file

Each graph is compiled once per compiler with `-std=c++20 -O2 -march=native -I include -c`,
under `timeout` (default 300 s) and an address-space cap (`ulimit -v`, default 12 GiB) so that
a blow-up ends as a recorded failure instead of taking the machine down. A failure is written to
the table as what it was (timeout, out of memory, compiler error), never dropped. Objects built
by g++ are then linked and run once: the program exits non-zero if the value or the gradient is
not finite. --tests also times a clean `cmake --build` of target typegrad_tests (Release) in a
fresh build directory per compiler. Standard library only (plus /usr/bin/time: apt-get install
time).
"""
import argparse
import collections
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import gen  # noqa: E402

FLAGS = ["-std=c++20", "-O2", "-march=native", "-I", os.path.join(ROOT, "include")]
TARGET_100_S, TARGET_1000_S, TARGET_1000_GIB = 5.0, 30.0, 2.0


def parse_time_v(text):
    """Wall seconds, CPU seconds, max RSS (MiB) and exit status from /usr/bin/time -v output."""
    def field(name):
        m = re.search(re.escape(name) + r":\s*(\S+)", text)
        return m.group(1) if m else None
    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)")
    secs = None
    if wall:
        parts = [float(p) for p in wall.split(":")]
        secs = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    user, sys_ = field("User time (seconds)"), field("System time (seconds)")
    cpu = float(user) + float(sys_) if user and sys_ else None
    rss = field("Maximum resident set size (kbytes)")
    status = field("Exit status")
    return secs, cpu, (int(rss) / 1024 if rss else None), (int(status) if status else None)


def timed(cmd, timeout_s, mem_gib, cwd=None, log=None):
    """Runs cmd under /usr/bin/time -v, timeout and ulimit -v; returns a result dict."""
    limit_kib = int(mem_gib * 1024 * 1024)
    inner = " ".join(shlex_quote(c) for c in cmd)
    script = f"ulimit -v {limit_kib}; exec /usr/bin/time -v timeout {timeout_s} {inner}"
    t0 = time.monotonic()
    p = subprocess.Popen(["bash", "-c", script], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    # /usr/bin/time cannot see a compiler that `timeout` kills (the driver never waits for it),
    # so the process tree is also sampled: peak RSS of any one process, and CPU time per pid.
    seen_rss, seen_cpu = 0.0, {}
    out_chunks = []
    reader = threading.Thread(target=lambda: out_chunks.append(p.communicate()))
    reader.start()
    while reader.is_alive():
        for pid in descendants(p.pid):
            st = proc_stat(pid)
            if st:
                seen_cpu[pid] = st[0]
                seen_rss = max(seen_rss, st[1])
        reader.join(0.25)
    stdout, stderr = out_chunks[0]
    elapsed = time.monotonic() - t0
    wall, cpu, rss, status = parse_time_v(stderr)
    if log:
        with open(log, "w") as f:
            f.write(stdout + stderr)
    err = stderr
    if status is None or status == 124:  # time -v saw only `timeout`: use the samples
        cpu = sum(seen_cpu.values()) or cpu
        rss = seen_rss or rss
    if status == 0:
        outcome = "ok"
    elif status == 124:
        outcome = f"timeout (> {timeout_s} s)"
    elif re.search(r"out of memory|virtual memory exhausted|std::bad_alloc|cannot allocate", err, re.I):
        outcome = f"out of memory (> {mem_gib:g} GiB address space)"
    elif status in (137, -9) or "Killed" in err or "signal 9" in err:
        outcome = "killed (signal 9, likely the OOM killer)"
    else:
        first = next((l for l in err.splitlines() if "error" in l), "").strip()
        outcome = f"failed (exit {status}): {first[:160]}"
    return {"wall": wall if wall is not None else elapsed, "cpu": cpu, "rss": rss, "status": status,
            "outcome": outcome}


def descendants(root):
    """Pids of every live descendant of root (from /proc)."""
    children = collections.defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children[ppid].append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def proc_stat(pid):
    """(CPU seconds, RSS MiB) of pid, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / tick
        rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        return cpu, rss
    except (OSError, ValueError, IndexError):
        return None


def shlex_quote(s):
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def compile_graph(kind, nodes, cxx, args, log_dir):
    src = os.path.join(args.workdir, f"{kind}_{nodes}.cpp")
    text, _ = gen.program(kind, nodes)
    with open(src, "w") as f:
        f.write(text)
    tag = os.path.basename(cxx).replace("+", "x")
    obj = os.path.join(args.workdir, f"{kind}_{nodes}.{tag}.o")
    res = timed([cxx] + FLAGS + ["-c", src, "-o", obj], args.timeout, args.mem_gib,
                log=os.path.join(log_dir, f"{kind}_{nodes}.{tag}.log"))
    res["obj_mib"] = os.path.getsize(obj) / 2**20 if res["outcome"] == "ok" and os.path.exists(obj) else None
    res["run"] = None
    if res["outcome"] == "ok" and "clang" not in cxx:
        exe = obj[:-2]
        link = subprocess.run([cxx, obj, "-o", exe], capture_output=True, text=True)
        if link.returncode == 0:
            run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
            res["run"] = ("finite" if run.returncode == 0 else "NOT FINITE") + ": " + run.stdout.strip()
        else:
            res["run"] = "link failed"
    return res


def fmt(v, unit=""):
    return "-" if v is None else (f"{v:.1f}{unit}" if v < 100 else f"{v:,.0f}{unit}")


def growth_exponent(t_small, t_big, n_small, n_big):
    if not t_small or not t_big or t_small <= 0 or t_big <= 0 or n_big == n_small:
        return None
    return math.log(t_big / t_small) / math.log(n_big / n_small)


def machine_line():
    load = os.getloadavg()
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} x {cpu}; load average at the start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def compiler_version(cxx):
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cxx


def measure_tests(cxx, args):
    """Clean Release build of typegrad_tests in a fresh directory; returns a result dict."""
    build = os.path.join(args.workdir, "tests-" + os.path.basename(cxx).replace("+", "x"))
    shutil.rmtree(build, ignore_errors=True)
    cfg = subprocess.run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                          f"-DCMAKE_CXX_COMPILER={cxx}", "-DTYPEGRAD_BUILD_TESTS=ON",
                          "-DTYPEGRAD_BUILD_EXAMPLES=OFF", "-DTYPEGRAD_BUILD_BENCHMARKS=OFF"],
                         capture_output=True, text=True)
    if cfg.returncode != 0:
        return {"outcome": "configure failed", "wall": None, "cpu": None, "rss": None}
    res = timed(["cmake", "--build", build, "--target", "typegrad_tests", "-j", str(args.tests_jobs)],
                3600, 64, log=os.path.join(args.workdir, f"tests-{os.path.basename(cxx)}.log"))
    tus = len([l for l in open(os.path.join(args.workdir, f"tests-{os.path.basename(cxx)}.log"))
               if "Building CXX object" in l])
    res["tus"] = tus
    # Per-TU times from ninja's log (ms start/end), to name the slowest files.
    per_tu = []
    try:
        with open(os.path.join(build, ".ninja_log")) as f:
            for line in f:
                p = line.rstrip("\n").split("\t")
                if len(p) >= 4 and p[3].endswith(".o"):
                    per_tu.append(((int(p[1]) - int(p[0])) / 1000, os.path.basename(p[3])))
    except OSError:
        pass
    res["slowest"] = sorted(per_tu, reverse=True)[:5]
    return res


def write_results(path, rows, baselines, tests, args, started):
    # Everything measured so far, this run's settings first.
    def union(first, more):
        return list(dict.fromkeys(list(first) + sorted(more)))
    kinds = union(args.kinds, {k for k, _, _ in rows})
    sizes = sorted(set(args.sizes) | {n for _, n, _ in rows})
    compilers = union(args.compilers, {c for _, _, c in rows} | set(baselines) | set(tests))
    out = ["# typegrad compile-time benchmark", "",
           f"Generated by `benchmarks/compile_time/measure.py` ({started}). Machine: {machine_line()}.",
           "Compilers: " + "; ".join(compiler_version(c) for c in compilers) + ".",
           f"Command: `<cxx> {' '.join(FLAGS[:3])} -I include -c graph.cpp` per graph, under "
           f"`timeout {args.timeout}` and `ulimit -v` {args.mem_gib:g} GiB; wall and CPU (user + sys) "
           "time and the peak resident set (`/usr/bin/time -v`, \"Maximum resident set size\").",
           "", "Graphs (`gen.py`): `chain` is a chain of unary ops ending in a sum; `dag` is a wide "
           "layered DAG over two leaves in which every node reads one or two nodes of the layer "
           "below (each node is read about twice). Nodes = distinct op nodes of the forward graph "
           "(the backward graph typegrad derives comes on top). Each program runs value_and_grad once; "
           "`baseline` is the same program around a one-node graph (`sum(x)`).", ""]
    if not rows:
        out.append("(graphs not measured in this run)")
    for cxx in compilers if rows else []:
        out += [f"## {os.path.basename(cxx)}", "",
                "| graph | nodes | wall (s) | CPU (s) | peak RSS (MiB) | object (MiB) | result |",
                "|---|---:|---:|---:|---:|---:|---|"]
        b = baselines.get(cxx)
        if b:
            out.append(f"| baseline | 1 | {fmt(b['wall'])} | {fmt(b['cpu'])} | {fmt(b['rss'])} | "
                       f"{fmt(b.get('obj_mib'))} | {b['outcome']} |")
        for kind in kinds:
            for n in sizes:
                r = rows.get((kind, n, cxx))
                if not r:
                    continue
                res = r["outcome"] + (f"; runs, {r['run']}" if r.get("run") else "")
                out.append(f"| {kind} | {n} | {fmt(r['wall'])} | {fmt(r['cpu'])} | {fmt(r['rss'])} | "
                           f"{fmt(r.get('obj_mib'))} | {res} |")
        out.append("")
    # Growth: CPU time (less sensitive to other tenants than wall time) above the baseline.
    if rows and len(sizes) >= 2:
        hi = sizes[-1]
        lo = 100 if 100 in sizes and 100 < hi else sizes[0]
        out += ["## Growth", "",
                f"CPU time and peak RSS above the baseline, from {lo} to {hi} nodes: the ratio, and "
                f"the exponent b of t ~ n^b (b = 1 is linear, 2 quadratic).", "",
                "| compiler | graph | CPU above baseline, "
                f"{lo} -> {hi} nodes (s) | ratio | b (time) | RSS above baseline (MiB) | b (memory) |",
                "|---|---|---|---:|---:|---|---:|"]
        for cxx in compilers:
            base = baselines.get(cxx) or {}
            for kind in kinds:
                a, z = rows.get((kind, lo, cxx)), rows.get((kind, hi, cxx))
                if not a or not z or a["outcome"] != "ok" or z["outcome"] != "ok":
                    out.append(f"| {os.path.basename(cxx)} | {kind} | (a build failed) | - | - | - | - |")
                    continue
                ta, tz = a["cpu"] - base.get("cpu", 0), z["cpu"] - base.get("cpu", 0)
                ma, mz = a["rss"] - base.get("rss", 0), z["rss"] - base.get("rss", 0)
                bt, bm = growth_exponent(ta, tz, lo, hi), growth_exponent(ma, mz, lo, hi)
                out.append(f"| {os.path.basename(cxx)} | {kind} | {ta:.1f} -> {tz:.1f} | "
                           f"{tz / ta if ta > 0 else float('nan'):.1f}x | {fmt(bt)} | {ma:.0f} -> {mz:.0f} | "
                           f"{fmt(bm)} |")
        out.append("")
        out += ["## Targets", ""]
        for cxx in compilers:
            name = os.path.basename(cxx)
            for kind in kinds:
                r100, r1000 = rows.get((kind, 100, cxx)), rows.get((kind, 1000, cxx))
                if r100:
                    ok = r100["outcome"] == "ok" and r100["wall"] <= TARGET_100_S
                    out.append(f"- {name}, {kind}, 100 nodes <= {TARGET_100_S:g} s: "
                               f"{'met' if ok else 'missed'} ({fmt(r100['wall'])} s wall, {r100['outcome']})")
                if r1000:
                    ok_t = r1000["outcome"] == "ok" and r1000["wall"] <= TARGET_1000_S
                    ok_m = r1000["outcome"] == "ok" and r1000["rss"] is not None and \
                        r1000["rss"] <= TARGET_1000_GIB * 1024
                    out.append(f"- {name}, {kind}, 1000 nodes <= {TARGET_1000_S:g} s and <= "
                               f"{TARGET_1000_GIB:g} GiB: time {'met' if ok_t else 'missed'}, memory "
                               f"{'met' if ok_m else 'missed'} ({fmt(r1000['wall'])} s wall, "
                               f"{fmt(r1000['rss'])} MiB, {r1000['outcome']})")
        out.append("")
    if tests:
        out += ["## Unit tests", "",
                f"Clean `cmake --build <fresh dir> --target typegrad_tests -j {args.tests_jobs}` "
                "(Release, Ninja; includes the Catch2 main and the link).", "",
                "| compiler | TUs | wall (s) | CPU (s) | peak RSS of one process (MiB) | slowest TUs (s) |",
                "|---|---:|---:|---:|---:|---|"]
        for cxx, r in tests.items():
            slow = ", ".join(f"{n} {t:.0f}" for t, n in r.get("slowest", []))
            out.append(f"| {os.path.basename(cxx)} | {r.get('tus', '-')} | {fmt(r['wall'])} | "
                       f"{fmt(r['cpu'])} | {fmt(r['rss'])} | {slow} ({r['outcome']}) |")
        out.append("")
    with open(path, "w") as f:
        f.write("\n".join(out))


def trace_summary(path, top):
    """Clang -ftime-trace: total time per event kind, and the templates that cost most."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    by_kind = collections.Counter()
    by_template = collections.Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        name, dur = e.get("name", ""), e.get("dur", 0) / 1e6
        if name.startswith("Total "):
            by_kind[name] += dur
        detail = e.get("args", {}).get("detail", "")
        if name in ("InstantiateClass", "InstantiateFunction") and detail:
            # The template's name without its arguments (they are graph types, megabytes long).
            by_template[(name, re.split(r"[<(]", detail, 1)[0])] += dur
    print("Total time by kind (s; nested events overlap):")
    for k, v in by_kind.most_common(top):
        print(f"  {v:9.2f}  {k}")
    print(f"Top {top} templates by inclusive instantiation time (s; nested instantiations overlap):")
    for (k, t), v in by_template.most_common(top):
        print(f"  {v:9.2f}  {k:20s} {t}")


def load_raw(path):
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return {}, {}, {}
    rows = {(k, n, c): v for k, n, c, v in raw.get("rows", [])}
    return rows, raw.get("baselines", {}), raw.get("tests", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10,100,300,1000")
    ap.add_argument("--kinds", default="chain,dag")
    ap.add_argument("--compilers", default="g++,clang++")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--mem-gib", type=float, default=12)
    ap.add_argument("--workdir", default=os.path.join(ROOT, "build", "compile_time"))
    ap.add_argument("--out", default=os.path.join(HERE, "results.md"))
    ap.add_argument("--tests", action="store_true", help="also time a clean build of typegrad_tests")
    ap.add_argument("--tests-jobs", type=int, default=2)
    ap.add_argument("--skip-graphs", action="store_true")
    ap.add_argument("--trace", help="summarise a clang -ftime-trace JSON file and exit")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    if args.trace:
        trace_summary(args.trace, args.top)
        return
    if not os.path.exists("/usr/bin/time"):
        sys.exit("measure.py: /usr/bin/time not found (apt-get install -y time)")
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.kinds = args.kinds.split(",")
    args.compilers = args.compilers.split(",")
    os.makedirs(args.workdir, exist_ok=True)
    log_dir = os.path.join(args.workdir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    # Raw results persist next to results.md, so that a partial run (--skip-graphs --tests, or
    # one compiler) updates the table instead of dropping what it did not measure.
    raw_path = os.path.splitext(args.out)[0] + ".json"
    rows, baselines, tests = load_raw(raw_path)

    def save():
        with open(raw_path, "w") as f:
            json.dump({"rows": [[k[0], k[1], k[2], v] for k, v in rows.items()],
                       "baselines": baselines, "tests": tests, "started": started}, f, indent=1)
        write_results(args.out, rows, baselines, tests, args, started)
    if not args.skip_graphs:
        for cxx in args.compilers:
            baselines[cxx] = compile_graph("baseline", 1, cxx, args, log_dir)
            print(f"{cxx:8s} baseline    {fmt(baselines[cxx]['wall'])} s", flush=True)
            for kind in args.kinds:
                for n in args.sizes:
                    r = compile_graph(kind, n, cxx, args, log_dir)
                    rows[(kind, n, cxx)] = r
                    print(f"{cxx:8s} {kind:5s} {n:5d} {fmt(r['wall'])} s wall {fmt(r['cpu'])} s cpu "
                          f"{fmt(r['rss'])} MiB  {r['outcome']}  {r['run'] or ''}", flush=True)
                    save()
    if args.tests:
        for cxx in args.compilers:
            tests[cxx] = measure_tests(cxx, args)
            print(f"{cxx:8s} typegrad_tests {fmt(tests[cxx]['wall'])} s  {tests[cxx]['outcome']}", flush=True)
    save()
    print(f"measure.py: wrote {args.out}")


if __name__ == "__main__":
    main()
