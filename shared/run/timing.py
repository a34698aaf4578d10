"""Timing apart from parity: after a run has trained (its trainers kept, RunControl.keep), each distributed
trainer's steady call is timed in rounds, each between two of the reference's (shared/measure/timing.py), so that
a ratio compares figures measured seconds apart however long the run was; the parity run stays as short as its
options ask. The reference's rounds, all of them, are its own figure. Not for a float64 run nor with --no-timing
(shared.measure.timing.wanted)."""

from typing import Dict, List, Optional, Sequence

from dtensor_vs_mirrored.shared.measure.timing import REFERENCE_ROUND_STEPS, ROUND_STEPS, ROUNDS, Timing


def beside(reference, results: Sequence, rounds: int = ROUNDS, steps: int = ROUND_STEPS) -> List[Optional[Timing]]:
    """Each of `results`' kept trainers (shared.run.results.TrainerResult) timed in `rounds` rounds of `steps`,
    interleaved with the kept reference's: a reference round, one round of each trainer in turn, the reference's
    again, and so on (R A B R A B R A B R), so that every round sits between two of the reference's, which the
    trainers of a run or a sweep's block share (4 reference rounds for them all, not 4 each). Returns each one's
    Timing, with every reference round beside it; None for one without a kept trainer or with a failed round (it is
    timed no more), and for all when a reference round fails."""
    timed = [index for index, result in enumerate(results) if result.kept is not None]
    if reference.kept is None or not timed:
        return [None] * len(results)
    references, own = [timed_round(reference, REFERENCE_ROUND_STEPS)], {index: [] for index in timed}
    for _ in range(rounds):
        if references[-1] is None or not timed:
            break
        for index in timed:
            own[index].append(timed_round(results[index], steps))
        timed = [index for index in timed if own[index][-1] is not None]
        references.append(timed_round(reference, REFERENCE_ROUND_STEPS) if timed else None)
    if None in references:
        return [None] * len(results)
    return [
        Timing(own[index], references[: len(own[index]) + 1])
        if index in own and len(own[index]) == rounds and None not in own[index]
        else None
        for index in range(len(results))
    ]


def timed_round(result, steps: int):
    """A round of `result`'s kept trainer; None when it raised (a trainer process answers None itself): no figure
    then, and the run measures that trainer by its epochs, but the run goes on."""
    try:
        return result.kept.time(steps)
    except Exception:  # noqa: BLE001 - a round that fails is no figure, not a failed run
        return None


def time_together(reference, results: Sequence) -> list:
    """`results` (each trained, with a history) timed beside the kept reference (beside), each one's Timing into its
    history, then let go; returns the reference's rounds, [] when none is timed."""
    timings = beside(reference, results)
    for result, found in zip(results, timings):
        result.history.timing = found
        result.release()
    return next((found.beside for found in timings if found is not None), [])


def untimed(results: Dict[str, object], reference_key: str = "reference") -> list:
    """The kept trainers of `results` (besides the reference) that no rounds have timed yet."""
    others = [result for key, result in results.items() if key != reference_key and result.history is not None]
    return [result for result in others if result.history.timing is None and result.kept is not None]


def time_run(
    results: Dict[str, object], reference_key: str = "reference", trained_reference: bool = True, also: Sequence = ()
) -> None:
    """The kept trainers of `results` not yet timed, and `also` (a sweep's block, which times the main run's with its
    first: shared/run/sweep.py), timed beside the reference, interleaved, into their histories' `timing`, then let
    go; the reference's rounds into its own history when it was trained with these (`trained_reference`) and has none
    yet, and it stays kept (the sweep times beside it too). A reference alone is timed alone; nothing left: nothing."""
    reference = results[reference_key]
    rounds = time_together(reference, untimed(results, reference_key) + list(also))
    if trained_reference and reference.history is not None and reference.kept is not None:
        if reference.history.timing is not None:
            return
        if not rounds:
            rounds = [found for found in (timed_round(reference, ROUND_STEPS) for _ in range(ROUNDS)) if found]
        reference.history.timing = Timing(rounds) if rounds else None
