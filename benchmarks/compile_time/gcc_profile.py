#!/usr/bin/env python3
"""Where g++'s time goes on one program: sampled call stacks of cc1plus, classified.

usage: gcc_profile.py FILE.cpp [--include DIR] [--freq 40] [--keep-data] [--callers N]

Runs `perf record --call-graph dwarf` on the cc1plus that `g++ -std=c++20 -O2 -march=native -c`
starts for FILE.cpp, then counts the samples whose stack holds:
  - the mangler: an address inside mangle.cc (cc1plus is stripped; its dynamic symbols, exported
    for plugins, bound the file: from the lowest to the highest `mangle` symbol, plus the size
    of the last function, an approximation),
  - the collector's free-page walk: a sample whose innermost frame is `ggc_internal_alloc` (its
    hot loop is the search of the free-page list for a page of the requested size),
  - constant evaluation (`cxx_eval_*`), template instantiation (`instantiate_*`, `tsubst*`),
    the middle end (`execute_one_pass`), and `symbol_table::finalize_compilation_unit`.
The same sample can count in several rows (they are inclusive). --callers N lists, for the
free-page walk and for the mangler, the N most frequent named frames that led there (the first
dynamic symbols above the allocator or outside the mangler: who allocates, who asks for names). Needs perf (linux-perf) and
permission to profile (perf_event_paranoid <= 1, or root). benchmarks/README.md, "Seventh round",
used it on 8 GPT blocks.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile


def cc1plus_command(src, include):
    out = subprocess.run(['g++', '-std=c++20', '-O2', '-march=native', '-I', include, '-c', src, '-o', os.devnull,
                          '-###'], capture_output=True, text=True).stderr
    for line in out.splitlines():
        if 'cc1plus' in line:
            return [a.strip('"') for a in re.findall(r'"[^"]*"|\S+', line.strip())]
    sys.exit('gcc_profile: g++ -### printed no cc1plus command')


def mangler_range(cc1plus):
    syms = []
    for line in subprocess.run(['nm', '-D', '--defined-only', cc1plus], capture_output=True,
                               text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            syms.append((int(parts[0], 16), parts[2]))
    syms.sort()
    mangle = [i for i, (_, name) in enumerate(syms) if 'mangle' in name and 'demangle' not in name]
    decl = [i for i in mangle if syms[i][1] == '_Z11mangle_declP9tree_node']
    if not decl:
        sys.exit('gcc_profile: no mangle_decl among the dynamic symbols of ' + cc1plus)
    # the cluster of mangler symbols around mangle_decl (others, e.g. mangle_path, live elsewhere)
    first = last = decl[0]
    for i in reversed([i for i in mangle if i < decl[0]]):
        if syms[first][0] - syms[i][0] > 0x20000:
            break
        first = i
    for i in [i for i in mangle if i > decl[0]]:
        if syms[i][0] - syms[last][0] > 0x20000:
            break
        last = i
    return syms[first][0], syms[min(last + 1, len(syms) - 1)][0]


def load_base(cc1plus):
    # perf prints addresses as offsets from the first loaded segment of a non-PIE binary
    out = subprocess.run(['readelf', '-lW', cc1plus], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith('LOAD'):
            return int(line.split()[2], 16)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('src')
    ap.add_argument('--include', default=os.path.join(os.path.dirname(__file__), '..', '..', 'include'))
    ap.add_argument('--freq', type=int, default=40)
    ap.add_argument('--keep-data', action='store_true')
    ap.add_argument('--callers', type=int, default=0)
    args = ap.parse_args()
    if not shutil.which('perf'):
        sys.exit('gcc_profile: perf not found (apt-get install linux-perf)')
    cmd = cc1plus_command(args.src, args.include)
    lo, hi = mangler_range(cmd[0])
    base = load_base(cmd[0])
    tmp = tempfile.mkdtemp(prefix='gcc_profile_')
    data = os.path.join(tmp, 'perf.data')
    cmd[cmd.index('-o') + 1] = os.path.join(tmp, 'out.s')  # g++ -### names a temporary .s
    subprocess.run(['perf', 'record', '-F', str(args.freq), '--call-graph', 'dwarf,16384', '-o', data, '--'] + cmd,
                   check=True, stdout=subprocess.DEVNULL)
    text = subprocess.run(['perf', 'script', '-i', data, '-F', 'ip,sym'], capture_output=True, text=True).stdout
    samples, cur = [], []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if cur:
                samples.append(cur)
            cur = []
            continue
        ip, _, sym = line.partition(' ')
        cur.append((int(ip, 16), sym.strip()))
    if cur:
        samples.append(cur)
    rows = collections.OrderedDict([
        ('mangler (mangle.cc)', lambda s: any(lo <= ip + base < hi for ip, _ in s)),
        ('free-page walk (innermost ggc_internal_alloc)', lambda s: s[0][1] == 'ggc_internal_alloc'),
        ('finalize_compilation_unit', lambda s: any(n == 'symbol_table::finalize_compilation_unit' for _, n in s)),
        ('template instantiation', lambda s: any(n.startswith(('instantiate_', 'tsubst')) for _, n in s)),
        ('constant evaluation', lambda s: any(n.startswith('cxx_eval_') or n == 'maybe_constant_value'
                                              for _, n in s)),
        ('optimisation passes', lambda s: any(n == 'execute_one_pass' for _, n in s)),
    ])
    n = len(samples)
    print(f'{n} samples of {args.src} ({n / args.freq:.0f} s at {args.freq} Hz)')
    for name, test in rows.items():
        k = sum(1 for s in samples if test(s))
        print(f'{100.0 * k / max(n, 1):5.1f}%  {name}')
    if args.callers:
        skip = ('ggc_internal_alloc', 'ggc_internal_cleared_alloc', '[unknown]', '')

        def named_callers(frames, depth=3):
            names = [n for _, n in frames if n not in skip and not n.startswith('0x')]
            return ' < '.join(names[:depth])
        walk = collections.Counter(named_callers(s[1:]) for s in samples if s[0][1] == 'ggc_internal_alloc')
        mangler = collections.Counter(
            named_callers([f for f in s if not lo <= f[0] + base < hi])
            for s in samples if any(lo <= ip + base < hi for ip, _ in s))
        for title, counter in (('free-page walk, called from', walk), ('mangler, called from', mangler)):
            print(title + ':')
            for key, k in counter.most_common(args.callers):
                print(f'  {100.0 * k / max(n, 1):5.1f}%  {key}')
    if args.keep_data:
        print('perf data:', data)
    else:
        shutil.rmtree(tmp)


if __name__ == '__main__':
    main()
