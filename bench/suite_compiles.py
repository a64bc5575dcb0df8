"""What a cold test suite compiles, and which tests pay for it: sums an ``OPSNN_COMPILE_LOG`` file
written by the suite (``tests/conftest.py`` names the running test in each row, and subprocesses
the test starts inherit the name) by kernel, by test file and by test, in CPU seconds of the
compiling threads (nested compiles subtracted, so the totals add up; independent of the load).

    d=$(mktemp -d); OPSNN_KERNEL_CACHE_DIR=$d/kernels OPSNN_COMPILE_LOG=$d/compiles.jsonl make test
    python bench/suite_compiles.py $d/compiles.jsonl --top 25

A kernel compiled in several processes (both test workers, a fuzz worker, a run under the ISA cap)
counts once per process: each paid for it.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys


def load(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def summarize(rows: list[dict], top: int) -> str:
    def table(title: str, key) -> list[str]:
        acc: dict = collections.defaultdict(lambda: [0.0, 0, set()])
        for r in rows:
            a = acc[key(r)]
            a[0] += r["cpu_s"]
            a[1] += 1
            a[2].add(r.get("pid"))
        out = [f"-- {title}: CPU s, compiles, processes"]
        for k, (cpu, n, pids) in sorted(acc.items(), key=lambda kv: -kv[1][0])[:top]:
            out.append(f"{cpu:8.1f} {n:6d} {len(pids):4d}  {k}")
        return out

    def test_file(r) -> str:
        return r.get("context", "(no test: import or collection)").split("::")[0]

    total = sum(r["cpu_s"] for r in rows)
    lines = [f"{len(rows)} compiles, {total:.1f} CPU s, {len({r.get('pid') for r in rows})} processes"]
    lines += table("by kernel", lambda r: r["kernel"])
    lines += table("by test file", test_file)
    lines += table("by test", lambda r: r.get("context", "(no test: import or collection)"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="the OPSNN_COMPILE_LOG file the suite wrote")
    ap.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    args = ap.parse_args(argv)
    print(summarize(load(args.log), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
