"""`make demo TRIALS=12` wall-clock, before and after the launch budget (issue 30), ABBA.

Rerun (the real vLLM CPU server; about 80 minutes on 2 cores for the default of 2 blocks)::

    .venv/bin/python benchmarks/demo_wallclock.py --before a23c8f3 --blocks 2

What ``make demo TRIALS=12`` runs, ``autotune run --trials 12 --spec studies/demo.yaml``, with
the autotune of two commits: ``--before`` (default ``a23c8f3``, the last commit before ``--trials
N`` meant the run's launches: 12 trials, then a confirmation of the top configs against the
baseline in interleaved rounds) and ``--after`` (default ``HEAD``: the launch budget, short
screens, the raced confirmation). Each run gets a checkout of its commit of its own (a new study,
as on a fresh clone), the same virtualenv (this one's, with the checkout first on
``PYTHONPATH``) and an empty ``VLLM_CACHE_ROOT`` of its own, so that neither arm starts from a
compile cache the other filled: both start as a first ``make demo`` on a fresh machine does.

Runs go in blocks ordered before, after, after, before (ABBA), so a slow drift of the machine
weighs on both arms alike; both runs of an arm inside a block share the block's ``--seed``.
Printed and saved (``benchmarks/results/demo_wallclock.json``): each run's wall-clock, exit code
and server launches (its trial logs: one per launch, the confirmation's included), each arm's
median, and the after/before ratio of the medians and of each block's pair means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULT_PATH = ROOT / "benchmarks" / "results" / "demo_wallclock.json"
BEFORE, AFTER = "before", "after"
#: one block: before, after, after, before
ABBA = (BEFORE, AFTER, AFTER, BEFORE)


def checkout(commit: str, where: Path) -> Path:
    """A detached worktree of ``commit`` at ``where`` (a fresh clone's files, no study in it)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(where), commit],
        check=True,
    )
    return where


def remove_checkout(where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], check=False
    )


def launches_in(tree: Path) -> int:
    """Server launches the run made: every launch, a trial's or the confirmation's, writes its
    own ``trial-NNNNN.log`` in both commits (a failed start too)."""
    return sum(1 for _ in (tree / "studies").rglob("trial-*.log"))


def run_demo(commit: str, trials: int, seed: int, work: Path) -> dict[str, Any]:
    """One ``autotune run --trials N`` of the demo with ``commit``'s autotune, timed."""
    tree = checkout(commit, work / "tree")
    cache = work / "vllm-cache"
    cache.mkdir()
    env = {**os.environ, "PYTHONPATH": str(tree), "VLLM_CACHE_ROOT": str(cache)}
    argv = [sys.executable, "-m", "autotune", "run", "--trials", str(trials)]
    argv += ["--spec", "studies/demo.yaml", "--seed", str(seed)]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    record = {
        "commit": commit,
        "seed": seed,
        "wall_s": round(wall_s, 1),
        "returncode": done.returncode,
        "launches": launches_in(tree),
        "stdout_tail": done.stdout[-1500:],
        "stderr_tail": done.stderr[-800:] if done.returncode else "",
    }
    remove_checkout(tree)
    shutil.rmtree(work, ignore_errors=True)
    return record


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["returncode"] == 0]
    arms = {arm: sorted(r["wall_s"] for r in ok if r["arm"] == arm) for arm in (BEFORE, AFTER)}
    medians = {arm: statistics.median(v) if v else None for arm, v in arms.items()}
    launches = {arm: [r["launches"] for r in ok if r["arm"] == arm] for arm in (BEFORE, AFTER)}
    block_ratios = []
    for block in sorted({r["block"] for r in runs}):
        inside = [r for r in ok if r["block"] == block]
        before = [r["wall_s"] for r in inside if r["arm"] == BEFORE]
        after = [r["wall_s"] for r in inside if r["arm"] == AFTER]
        if len(before) == 2 and len(after) == 2:
            block_ratios.append(round(statistics.mean(after) / statistics.mean(before), 3))
    return {
        "runs_ok": len(ok),
        "runs_failed": len(runs) - len(ok),
        "wall_s": arms,
        "median_wall_s": medians,
        # absent (None), never 0, for an arm with no successful run
        "median_launches": {
            arm: statistics.median(counts) if (counts := launches[arm]) else None
            for arm in (BEFORE, AFTER)
        },
        "ratio_of_medians": (
            round(medians[AFTER] / medians[BEFORE], 3)
            if medians[AFTER] is not None and medians[BEFORE]
            else None
        ),
        "block_ratios": block_ratios,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="a23c8f3")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument(
        "--first-block",
        type=int,
        default=0,
        help="index of the first block (its seed is index + 1): a later block of an earlier "
        "run, with a seed of its own",
    )
    parser.add_argument("--out", type=Path, default=RESULT_PATH)
    parser.add_argument(
        "--summarise",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print the summary of the runs of these result files together (blocks of "
        "several sessions' runs, each with its own --first-block) and launch nothing",
    )
    args = parser.parse_args(argv)
    if args.summarise:
        together = [r for path in args.summarise for r in json.loads(path.read_text())["runs"]]
        print(json.dumps(summarise(together), indent=1))
        return 0
    resolve = ["git", "-C", str(ROOT), "rev-parse", "--short"]
    commits = {
        BEFORE: subprocess.check_output([*resolve, args.before], text=True).strip(),
        AFTER: subprocess.check_output([*resolve, args.after], text=True).strip(),
    }
    runs: list[dict[str, Any]] = []
    for block in range(args.first_block, args.first_block + args.blocks):
        seed = block + 1
        for arm in ABBA:
            with tempfile.TemporaryDirectory(prefix=f"demo-{arm}-") as tmp:
                record = run_demo(commits[arm], args.trials, seed, Path(tmp) / "work")
            record.update(arm=arm, block=block)
            runs.append(record)
            print(
                f"block {block} {arm:6s} {record['commit']} seed {seed}: "
                f"{record['wall_s']:.0f} s, {record['launches']} launches, "
                f"exit {record['returncode']}",
                flush=True,
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            result = {
                "label": "the real vLLM CPU server on the embedded demo (studies/demo.yaml)",
                "command": "python benchmarks/demo_wallclock.py " + " ".join(argv or sys.argv[1:]),
                "trials": args.trials,
                "commits": commits,
                "order": "ABBA blocks: before, after, after, before; one seed per block",
                "runs": runs,
                "summary": summarise(runs),
                "machine": {
                    "nproc": os.cpu_count(),
                    "platform": platform.platform(),
                    "date_utc": datetime.now(UTC).isoformat(timespec="seconds"),
                },
            }
            args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
