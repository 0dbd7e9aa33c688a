"""Run memsim's walker benchmark (same as `memsim bench`): ratios against a floor in one run."""

import sys

from memsim.bench import run_benchmarks

if __name__ == "__main__":
    print(run_benchmarks(quick="--quick" in sys.argv))
