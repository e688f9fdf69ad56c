"""Runs SGLang's own HTTP-level server tests, unchanged, against sgl_lite; prints pass counts.

    python scripts/sglang_server_tests.py --tests-dir DIR [--num-threads 1] [--json out.json]

DIR holds SGLang's test files as in its repository's test/srt (openai_server/basic/..., or the
older flat layout) and, in DIR/kits, python/sglang/test/kits (the mixins some tests import).
They are SGLang's code (Apache-2.0), so this repository does not vendor them: copy them from a
checkout of github.com/sgl-project/sglang. The only thing pointed elsewhere is the launch: a
stand-in `sglang` package (scripts/sglang_shim, ours) first on the tests' PYTHONPATH makes
`popen_launch_server` start `python -m sgl_lite.launch_server --model-path default`.

Each file runs in its own pytest process (its unittest classes start their own servers), with a
per-test timeout; the table counts passed / failed / errors / skipped per file from pytest's
JUnit XML. Server logs go to --log-dir.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIM = Path(__file__).resolve().parent / "sglang_shim"
# The files issue 23 names, each with the paths it has had in SGLang's tree (newest first).
FILES = [
    ("openai_server/basic/test_openai_server.py", "test_openai_server.py"),
    ("openai_server/features/test_json_constrained.py", "test_json_constrained.py"),
    ("openai_server/features/test_json_mode.py", "test_json_mode.py"),
    ("openai_server/features/test_openai_server_ebnf.py", "test_openai_server_ebnf.py"),
    ("openai_server/validation/test_matched_stop.py", "test_matched_stop.py"),
    (
        "openai_server/validation/test_openai_server_ignore_eos.py",
        "test_openai_server_ignore_eos.py",
    ),
    (
        "openai_server/validation/test_request_length_validation.py",
        "test_request_length_validation.py",
    ),
    ("openai_server/function_call/test_tool_choice.py", "test_tool_choice.py"),
    (
        "openai_server/function_call/test_openai_function_calling.py",
        "test_openai_function_calling.py",
    ),
    ("test_regex_constrained.py",),
    ("test_ebnf_constrained.py",),
    ("test_srt_endpoint.py",),
]
# The files are unittest files: collect TestCase subclasses only, as `python -m unittest` does
# (a mixin named Test... imported into a module is not a test there).
INI = (
    "[pytest]\naddopts = -p no:cacheprovider\n"
    "python_classes = __unittest_only__\npython_functions = __unittest_only__\n"
)


def find(tests_dir: Path, candidates: tuple[str, ...]) -> Path | None:
    """The first of a file's known paths that exists under `tests_dir`."""
    for rel in candidates:
        if (tests_dir / rel).is_file():
            return tests_dir / rel
    return None


@dataclasses.dataclass
class FileResult:
    """One file's outcome: counts per kind and the ids of the tests that did not pass."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failing: list[str] = dataclasses.field(default_factory=list)

    @property
    def ran(self) -> int:
        """Tests that ran (skips excluded)."""
        return self.passed + self.failed + self.errors


def counts(junit: Path) -> FileResult:
    """A file's result from pytest's JUnit XML (all zero when pytest wrote none)."""
    out = FileResult()
    if not junit.exists():
        return out
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            out.failed += 1
            out.failing.append(name)
        elif "error" in kinds:
            out.errors += 1
            out.failing.append(name)
        elif "skipped" in kinds:
            out.skipped += 1
        else:
            out.passed += 1
    return out


def run_file(path: Path, args: argparse.Namespace, work: Path) -> FileResult:
    """Runs one SGLang test file in its own pytest process; its counts."""
    junit = work / f"{path.stem}.xml"
    ini = work / "pytest.ini"
    ini.write_text(INI)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(REPO)])
    env["SGL_LITE_REPO"] = str(REPO)
    env["SGL_LITE_SGLANG_KITS"] = str(args.tests_dir / "kits")
    env["SGL_LITE_SERVER_LOG_DIR"] = str(args.log_dir / path.stem)
    env["SGL_LITE_TEST_PORT"] = str(args.port)
    if args.num_threads:
        env["SGL_LITE_NUM_THREADS"] = str(args.num_threads)
    cmd = [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(path.parent)]
    cmd += ["--import-mode=importlib", "-p", "timeout", f"--timeout={args.test_timeout}"]
    cmd += ["-q", "-rfE", f"--junitxml={junit}", str(path)]
    if args.k:
        cmd += ["-k", args.k]
    log = args.log_dir / f"{path.stem}.pytest.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        try:
            subprocess.run(
                cmd,
                cwd=path.parent,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=args.file_timeout,
            )
        except subprocess.TimeoutExpired:
            out.write(f"\n[runner] file timed out after {args.file_timeout} s\n")
    return counts(junit)


def main(argv: list[str] | None = None) -> int:
    """Runs the files; prints a per-file table; writes --json when asked."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tests-dir", type=Path, required=True, help="SGLang's test/srt files")
    p.add_argument("--files", nargs="*", help="only these (a substring of the file name)")
    p.add_argument("-k", help="pytest -k expression, passed on")
    p.add_argument("--num-threads", type=int, default=1, help="the server's torch threads")
    p.add_argument("--port", type=int, default=21000, help="the port of DEFAULT_URL_FOR_TEST")
    p.add_argument("--test-timeout", type=int, default=600, help="seconds per test")
    p.add_argument("--file-timeout", type=int, default=3600, help="seconds per file")
    p.add_argument("--log-dir", type=Path, default=Path(tempfile.gettempdir()) / "sglang_tests")
    p.add_argument("--json", type=Path, help="write the counts here")
    args = p.parse_args(argv)
    args.tests_dir = args.tests_dir.resolve()
    args.log_dir = args.log_dir.resolve()
    results: dict[str, FileResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for candidates in FILES:
            if args.files and not any(f in candidates[0] for f in args.files):
                continue
            path = find(args.tests_dir, candidates)
            if path is None:
                print(f"{candidates[0]}: not found under {args.tests_dir}", file=sys.stderr)
                continue
            results[candidates[0]] = res = run_file(path, args, Path(tmp))
            print(f"{candidates[0]:65s} {res.passed:>3}/{res.ran:<3} skipped {res.skipped}")
            for name in res.failing:
                print(f"    not passed: {name}")
            sys.stdout.flush()
    passed = sum(r.passed for r in results.values())
    ran = sum(r.ran for r in results.values())
    print(f"{'total':65s} {passed:>3}/{ran:<3}")
    if args.json:
        data = {name: dataclasses.asdict(r) for name, r in results.items()}
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
