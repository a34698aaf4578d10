"""Timing apart from parity: after a run has trained (its trainers kept, RunControl.keep), each distributed
trainer's steady call is timed in rounds, each between two of the reference's (shared/measure/timing.py), so that
a ratio compares figures measured seconds apart however long the run was; the parity run stays as short as its
options ask. The reference's rounds, all of them, are its own figure. Not for a float64 run nor with --no-timing
(shared.measure.timing.wanted)."""

from typing import Dict, Optional

from shared.measure.timing import REFERENCE_ROUND_STEPS, ROUND_STEPS, ROUNDS, Timing


def beside(reference, result, rounds: int = ROUNDS, steps: int = ROUND_STEPS) -> Optional[Timing]:
    """`result`'s kept trainer (shared.run.results.TrainerResult) timed in `rounds` rounds of `steps`, each between
    two of the kept reference's; None when either has no kept trainer or a round failed."""
    if reference.kept is None or result.kept is None:
        return None
    references, own = [timed_round(reference, REFERENCE_ROUND_STEPS)], []
    for _ in range(rounds):
        own.append(timed_round(result, steps) if references[-1] is not None else None)
        references.append(timed_round(reference, REFERENCE_ROUND_STEPS) if own[-1] is not None else None)
    return None if None in references + own else Timing(own, references)


def timed_round(result, steps: int):
    """A round of `result`'s kept trainer; None when it raised (a trainer process answers None itself): no figure
    then, and the run measures that trainer by its epochs, but the run goes on."""
    try:
        return result.kept.time(steps)
    except Exception:  # noqa: BLE001 - a round that fails is no figure, not a failed run
        return None


def time_run(results: Dict[str, object], reference_key: str = "reference", trained_reference: bool = True) -> None:
    """Each kept trainer of `results` beside the reference, into its history's `timing`, then let it go; the
    reference's rounds into its own history when it was trained with these (`trained_reference`), and it stays
    kept (the sweep times beside it too). A reference alone is timed alone."""
    reference = results[reference_key]
    rounds = []
    for key, result in results.items():
        if key == reference_key or result.history is None:
            continue
        result.history.timing = beside(reference, result)
        result.release()
        if result.history.timing is not None:
            rounds += result.history.timing.beside
    if trained_reference and reference.history is not None and reference.kept is not None:
        if not rounds:
            rounds = [found for found in (timed_round(reference, ROUND_STEPS) for _ in range(ROUNDS)) if found]
        reference.history.timing = Timing(rounds) if rounds else None
