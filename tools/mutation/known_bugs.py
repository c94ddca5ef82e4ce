"""Issue 28's ten hand-made bugs, put back one at a time into a copy of this checkout's HEAD, each with the tests
that should catch it: prints CAUGHT or MISSED per bug. A bug MISSED is a gap in the tests (docs/mutation.md).

    .venv/bin/python tools/mutation/known_bugs.py      # about 2 minutes on 2 cores
"""
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
A = "workflow/amprepro/"

# (what the bug does, the file, the code, the code with the bug, the tests that must catch it)
BUGS = [
    ("verify: nothing comparable is PASS", A + "verify/verify.py",
     '    elif compared == 0:\n        result["status"] = "not_comparable"',
     '    elif compared < 0:\n        result["status"] = "not_comparable"',
     ["tests/report/test_verify.py"]),
    ("verify: error exit 2 -> 0", A + "verify/verify.py",
     '        print(f"verify: ERROR: {exc}", file=sys.stderr)\n        return 2',
     '        print(f"verify: ERROR: {exc}", file=sys.stderr)\n        return 0',
     ["tests/report/test_verify.py"]),
    ("measure: CUDA ms as s", A + "train/measure.py",
     "self.start.elapsed_time(self.end) / 1000.0", "self.start.elapsed_time(self.end)",
     ["tests/backbone/test_measure.py"]),
    ("summary: add_mfu without gpus", A + "analysis/summary.py",
     "ratio(achieved, measured and measured * gpus)", "ratio(achieved, measured and measured)",
     ["tests/report/test_summary_metrics.py"]),
    ("claims: tensor cores only for generic", A + "analysis/claims.py",
     '    if (models or generic) and "tensor_cores" in claim.get("requires", []):',
     '    if generic and "tensor_cores" in claim.get("requires", []):',
     ["tests/report/test_claims.py"]),
    ("claims: baseline status ignored", A + "analysis/claimmodels.py",
     "    for rows, name in ((var_rows, variant), (base_rows, baseline)):",
     "    for rows, name in ((var_rows, variant),):",
     ["tests/report/test_claims.py"]),
    ("claims: borderline threshold", A + "analysis/claimmodels.py",
     'for k in ("min", "median", "max")}) > 1', 'for k in ("min", "median", "max")}) > 2',
     ["tests/report/test_claims.py"]),
    ("config: warmup >= steps -> >", A + "config/runs.py",
     'if train["warmup_steps"] >= train["steps"]:', 'if train["warmup_steps"] > train["steps"]:',
     ["tests/backbone/test_config.py"]),
    ("config: float->int coerce dropped", A + "config/schema.py",
     '    if isinstance(value, float) and value.is_integer() and "integer" in types and "number" not in types:\n'
     "        return int(value)\n", "",
     ["tests/backbone/test_config.py"]),
    ("codedigest: docstrings kept", A + "codedigest.py",
     "        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and has_docstring"
     "(node):",
     "        if isinstance(node, (ast.Module, ast.ClassDef)) and has_docstring(node):",
     ["tests/backbone/test_reruns.py"]),
]


def main() -> int:
    missed = 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
        for name, path, old, new, tests in BUGS:
            f = copy / path
            src = f.read_text()
            if src.count(old) != 1:
                print(f"STALE  | {name} | the code it changes is no longer in {path}: update this list", flush=True)
                missed += 1
                continue
            f.write_text(src.replace(old, new))
            started = time.time()
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests], cwd=copy,
                               env={"PYTHONPATH": "workflow:tests", "PATH": "/usr/bin:/bin"}, capture_output=True,
                               text=True, timeout=900)
            f.write_text(src)
            last = ([line for line in r.stdout.splitlines() if " passed" in line or " failed" in line] or ["?"])[-1]
            caught = r.returncode != 0 and " failed" in last
            missed += not caught
            print(f"{'CAUGHT' if caught else 'MISSED'} | {name} | {' '.join(tests)} | {last} | "
                  f"{time.time() - started:.0f} s", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
