"""How long check_model takes in a user's pytest: the import, the first check and a second one, in one process.

    python benchmarks/check_model_speed.py                        # this tree, 2 rounds
    python benchmarks/check_model_speed.py --against 3ac2ae8      # and that commit, alternating A B A B

The check is issue 56's: a small Keras model with a LayoutMap (Dense 784-32-10, its dense layers split over the
`model` axis), DTensor on `batch=4` and `batch=2,model=2` plus MirroredStrategy, 256 training examples, 2 epochs,
given as FILE.py:FUNCTION. Each round is a fresh process, as a pytest run is. With --against, the commit is checked
out in a temporary git worktree and measured by this same script, the two trees taking turns, so that a machine's
load (other work on a shared one) falls on both alike; the table gives each tree's median and the ratio. A
benchmark, not a test: the figures depend on the machine and on what else it runs.
"""

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MESHES = ("batch=4", "batch=2,model=2")
OPTIONS = dict(devices=4, epochs=2, train_examples=256, test_examples=128)
FIGURES = ("import_s", "first_s", "second_s")


def small_keras():
    """The checked model: a built Keras model and its LayoutMap (column- then row-parallel dense layers)."""
    import keras

    inputs = keras.Input((784,))
    hidden = keras.layers.Dense(32, activation="relu", name="dense")(inputs)
    layout_map = keras.distribution.LayoutMap(None)  # no mesh of Keras's: check_model makes the meshes
    layout_map["dense/kernel"] = (None, "model")
    layout_map["dense/bias"] = ("model",)
    layout_map["out/kernel"] = ("model", None)
    return keras.Model(inputs, keras.layers.Dense(10, name="out")(hidden)), layout_map


def measure() -> dict:
    """In this process, from the tree on sys.path: the import's and each check's seconds."""
    started = time.perf_counter()
    if os.path.isdir("dtensor_vs_mirrored"):  # the tree measured is this process's working directory
        from dtensor_vs_mirrored.shared.api import check_model
    else:  # a commit from before the project's own import name: its folder's, by name
        check_model = importlib.import_module("dtensor_vs_mirrored.shared.api").check_model

    figures = {"import_s": time.perf_counter() - started}
    for name in ("first_s", "second_s"):
        started = time.perf_counter()
        result = check_model(f"{os.path.abspath(__file__)}:small_keras", meshes=MESHES, **OPTIONS)
        figures[name] = time.perf_counter() - started
        if not result.ok:
            raise SystemExit(f"check_model failed:\n{result.summary()}")
    return figures


def measured_in(tree: str) -> dict:
    """One round in a fresh process whose `shared` is `tree`'s."""
    env = dict(os.environ, PYTHONPATH=tree)
    command = [sys.executable, os.path.abspath(__file__), "--measure"]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"a round in {tree} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rounds: dict) -> str:
    """Each tree's median per figure, and with two trees the ratio of this one's to the other's."""
    names = list(rounds)
    lines = ["figure     " + "".join(f"{name:>14}" for name in names) + ("   ratio" if len(names) == 2 else "")]
    for figure in FIGURES:
        medians = [statistics.median(round_[figure] for round_ in rounds[name]) for name in names]
        ratio = f"{medians[0] / medians[1]:8.2f}" if len(names) == 2 else ""
        lines.append(f"{figure:<11}" + "".join(f"{median:13.1f}s" for median in medians) + ratio)
    return "\n".join(lines)


def compared(against: str, count: int) -> dict:
    """`count` rounds of this tree and of commit `against`, alternating; the commit's worktree removed after."""
    scratch = tempfile.mkdtemp(prefix="check_model_speed-")
    other = os.path.join(scratch, "tree")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", other, against], check=True, capture_output=True)
    try:
        rounds = {"this tree": [], against: []}
        for index in range(count):
            for name, tree in (("this tree", ROOT), (against, other)):
                rounds[name].append(measured_in(tree))
                print(f"round {index + 1} {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[name][-1].items()))
        return rounds
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", other], capture_output=True)
        os.rmdir(scratch)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="COMMIT", help="also measure this commit, the two taking turns")
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per tree (default 2)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one round, JSON on stdout
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure()))
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give 1 or more")
    if args.against:
        rounds = compared(args.against, args.rounds)
    else:
        rounds = {"this tree": []}
        for index in range(args.rounds):
            rounds["this tree"].append(measured_in(ROOT))
            print(f"round {index + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds["this tree"][-1].items()))
    print(table(rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
