"""Everything the trainers share, in layers, one sentence a folder, lowest first. Imports run one way, down the
layers: a module imports its own layer and lower ones, never a higher one.

config.py, option.py, errors.py, console.py, files.py, devices.py: the process (one Config and how its options
    are declared, the error a user can fix, what is printed, files written atomically, logical devices).
model/     What is trained: named variables, initial values, one forward and a layout each; imports no training.
measure/   What is measured: the history a run fills, memory, bytes per device, step profile, checksums.
judge/     What is decided: numbers in, verdicts out, and which runs are needed in float64; it never trains.
training/  How one trainer trains: the shared loop and step, the trainer contract and registry, the reference,
    data, optimizer, loss, checkpoints, export (dtensor_impl/, mirrored_impl/ sit here, each with its spec).
report/    What is printed and written: the header, the tables, the JSON report and its schema, plots.
run/       What sequences a run: the only layer that trains and judges (compare.py's run, sweep, clients).
api.py     check_model, for your own tests; cli.py: compare.py's command; export.py: `python -m ...shared.export`.

tests/test_imports.py holds the order and fails on an import that runs the wrong way.
"""

if __name__ == "shared":  # imported by its folder's name: in a repository with its own `shared`, that name is theirs
    raise ImportError(
        "this project's shared/ is imported as dtensor_vs_mirrored.shared "
        "(from dtensor_vs_mirrored.shared.api import check_model), not as shared"
    )
