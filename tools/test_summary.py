#!/usr/bin/env python3
"""Summarises a CTest JUnit report: how many tests passed, failed and were skipped, and each
skipped test with its reason. A CTest test that ran a GoogleTest suite (cmake/KilnGtestSuites.cmake)
is counted by the suite's own XML report (GTEST_XML_DIR, default <junit's folder>/gtest-xml/<suite>.xml):
each of its tests as passed, failed or skipped with GoogleTest's message. With --ci, a skip whose
"name: reason" matches none of the patterns in tests/ci_allowed_skips.txt fails the run: on CI only
what this machine cannot do (a GPU) may skip.

usage: test_summary.py JUNIT_XML [--ci] [--allowed FILE] [--gtest-xml-dir DIR]
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET


def skip_reason(output: str) -> str:
    # GoogleTest prints "<file>:<line>: Skipped" and the message on the lines after it.
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip().endswith(": Skipped"):
            reason = []
            for follow in lines[i + 1:]:
                if follow.startswith("[  SKIPPED ]") or follow.startswith("["):
                    break
                reason.append(follow.strip())
            return " ".join(r for r in reason if r) or "(no reason given)"
    # Scripts that exit with the skip code say why on a line containing SKIPPED / skipped.
    for line in reversed(lines):
        if re.search(r"skip", line, re.I):
            return line.strip()
    return lines[-1].strip() if lines else "(no output)"


def gtest_cases(path: str):
    """(name, outcome, reason) of each test in a GoogleTest XML report; None if there is none or it
    cannot be read (a suite's process that crashed or timed out writes none)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '?')}.{case.get('name', '?')}"
        failure = case.find("failure")
        skipped = case.find("skipped")
        if failure is not None or case.find("error") is not None:
            cases.append((name, "failed", ""))
        elif skipped is not None or case.get("result") == "skipped":
            # GoogleTest's message is "<file>:<line>\n<reason>".
            message = (skipped.get("message", "") if skipped is not None else "").split("\n", 1)
            reason = message[-1].strip() if message and message[-1].strip() else "(no reason given)"
            cases.append((name, "skipped", " ".join(reason.split())))
        elif case.get("status") == "notrun" or case.get("result") == "suppressed":
            cases.append((name, "skipped", "disabled"))
        else:
            cases.append((name, "passed", ""))
    return cases


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("junit")
    ap.add_argument("--ci", action="store_true", help="fail on skips not allowed on CI")
    ap.add_argument("--allowed", default="tests/ci_allowed_skips.txt")
    ap.add_argument("--gtest-xml-dir", default=None, help="the GoogleTest suites' XML reports")
    args = ap.parse_args()
    xml_dir = args.gtest_xml_dir or os.path.join(os.path.dirname(os.path.abspath(args.junit)), "gtest-xml")
    try:
        root = ET.parse(args.junit).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"test_summary: cannot read the CTest report '{args.junit}': {e}", file=sys.stderr)
        return 2
    passed, failed, skipped = [], [], []
    for case in root.iter("testcase"):
        name = case.get("name", "?")
        out = "".join(e.text or "" for e in case.iter("system-out"))
        ctest_failed = case.find("failure") is not None or case.find("error") is not None or case.get(
            "status") == "fail"
        suite = gtest_cases(os.path.join(xml_dir, name.replace("/", "_") + ".xml"))
        if suite is not None:
            for test, outcome, reason in suite:
                if outcome == "skipped":
                    skipped.append((test, reason))
                else:
                    (failed if outcome == "failed" else passed).append(test)
            # The process failed with no test failing in its report (a crash at exit, a sanitizer
            # report, a timeout): the suite itself is the failure.
            if ctest_failed and not any(o == "failed" for _, o, _ in suite):
                failed.append(name)
            continue
        if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            skipped.append((name, skip_reason(out)))
        elif ctest_failed:
            failed.append(name)
        else:
            passed.append(name)
    print(f"tests: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    for name in failed:
        print(f"  failed: {name}")
    for name, reason in skipped:
        print(f"  skipped: {name}: {reason}")
    if not args.ci:
        return 0
    patterns = []
    try:
        with open(args.allowed) as f:
            patterns = [l.strip() for l in f if l.strip() and not l.startswith("#")]
    except OSError as e:
        print(f"test_summary: cannot read '{args.allowed}': {e}", file=sys.stderr)
        return 2
    unexpected = [(n, r) for n, r in skipped if not any(re.search(p, f"{n}: {r}") for p in patterns)]
    for name, reason in unexpected:
        print(f"test_summary: on CI this test must run, but it skipped: {name}: {reason}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
