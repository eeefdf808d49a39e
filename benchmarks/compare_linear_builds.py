#!/usr/bin/python3
"""bench_linear of several builds, alternately, best run of each: an A/B for projection kernels.

  benchmarks/compare_linear_builds.py BENCH_LINEAR[,BENCH_LINEAR...] SHAPES ROUNDS [THREADS]
  benchmarks/compare_linear_builds.py /tmp/old/bench_linear,build/benchmarks/bench_linear \\
      197,2304,768/3136,288,96 4 1

Each round runs every build once (`bench_linear --threads T --shapes SHAPES --json`), the order
reversed every other round, so that the host's drift hits all builds alike. Prints per shape and
build the best tessera GFLOP/s over the rounds (the worst in parentheses), then OpenBLAS's best and
the FMA loop's best over all processes. The best, not the median: on a host whose neighbours come
and go, one binary's numbers move by 20-25% from minute to minute, and the best run is the closest
to the kernel's own speed. Only /usr/bin/python3 and its standard library.
"""
import collections
import json
import subprocess
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    bins, shapes, rounds = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    threads = sys.argv[4] if len(sys.argv) > 4 else "1"
    runs = collections.defaultdict(list)
    for r in range(rounds):
        for b in (bins if r % 2 == 0 else bins[::-1]):
            out = subprocess.run([b, "--threads", threads, "--shapes", shapes, "--json"],
                                 capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                j = json.loads(line)
                runs[(b, (j["m"], j["n"], j["k"]))].append(j)
    order = [tuple(int(v) for v in s.split(",")) for s in shapes.split("/")]
    print("rows x out x in".ljust(18) + "".join(f"{b[-28:]:>30}" for b in bins) + "   openblas  FMA loop")
    for key in order:
        row = f"{key[0]}x{key[1]}x{key[2]}".ljust(18)
        for b in bins:
            v = [j["tessera_best_gflops"] for j in runs[(b, key)]]
            row += f"{max(v):>20.1f} ({min(v):6.1f})  "
        every = [j for b in bins for j in runs[(b, key)]]
        row += f"  {max(j['openblas_best_gflops'] for j in every):7.1f}  {max(j['ceiling_gflops'] for j in every):7.1f}"
        print(row)


if __name__ == "__main__":
    main()
