"""Check a model from your own tests: the reference, DTensor on each mesh and MirroredStrategy, judged.

    from shared.api import check_model
    result = check_model("examples/my_model.py:my_model", meshes=("batch=8", "batch=2,model=4"),
                         epochs=2, train_examples=512, test_examples=256)
    assert result.ok, result.summary()

`model` is anything `--model` takes (mlp, vit, FILE.py:FUNCTION). The reference trains once; DTensor
once per mesh and MirroredStrategy once, in this process, on the first `devices` logical devices
(configured here if TensorFlow has not started; else the process's own must suffice). Every verdict
is compare.py's: a float32 failure is rerun in float64 to tell float noise from a MISMATCH.
Bad input raises shared.errors.UsageError with compare.py's one-line message.
"""

import dataclasses
from typing import Dict, Sequence

from shared import comparison
from shared.config import Config
from shared.data import load_data
from shared.devices import configure_devices
from shared.errors import UsageError
from shared.parity import Parity
from shared.verdict import Verdict


@dataclasses.dataclass
class ModelCheck:
    model: str
    verdicts: Dict[str, Verdict]  # "dtensor batch=8", "dtensor batch=2,model=4", "mirrored" -> verdict
    parity: Dict[str, Parity]  # the same keys: the float32 (or run's dtype) figures against the reference
    errors: Dict[str, str]  # a trainer that raised: its one line
    run: comparison.RunResult  # everything compare.py would tabulate

    @property
    def ok(self) -> bool:
        return self.run.ok

    def summary(self) -> str:
        """One line per trainer: its verdict and why."""
        lines = [f"{name}: FAILED: {error}" for name, error in self.errors.items()]
        lines += [f"{name}: {verdict.line()}" for name, verdict in self.verdicts.items()]
        return "\n".join([f"model {self.model}"] + lines)


def check_model(
    model: str = "mlp",
    meshes: Sequence[str] = ("batch=8",),
    trainers: Sequence[str] = ("dtensor", "mirrored"),
    devices: int = 8,
    data: str = "embedded",
    **options,
) -> ModelCheck:
    """Train `model` with the reference and each of `trainers` (DTensor on every mesh) and judge them.

    `options` are shared.config.Config fields: epochs, batch_size, train_examples, dtype, ...
    """
    unknown = [name for name in trainers if name not in ("dtensor", "mirrored")]
    if unknown or not trainers:
        raise UsageError(f"trainers {list(trainers)}: choose from dtensor, mirrored")
    config = Config(model=model, devices=devices, data=data, quiet=True, trainers=("reference", *trainers), **options)
    all_devices = configure_devices(devices, config.device_type)[:devices]
    configs = {f"dtensor {mesh}": config.replace(mesh=mesh) for mesh in (meshes if "dtensor" in trainers else ())}
    if "mirrored" in trainers:
        configs["mirrored"] = config
    for key, run_config in configs.items():
        comparison.check_config(run_config.replace(trainers=(key.split()[0],)), all_devices)
    dataset = load_data(config.data, config.train_examples, config.test_examples)

    results = {"reference": comparison.train_one("reference", config, dataset, all_devices, print)}
    for key, run_config in configs.items():
        results[key] = comparison.train_one(key.split()[0], run_config, dataset, all_devices, print)

    def rerun(names):  # a float32 failure: the reference and those trainers again in float64
        reruns = {
            "reference": comparison.train_one(
                "reference", comparison.float64_rerun_config(config), dataset, all_devices, print
            )
        }
        for key in names[1:]:
            reruns[key] = comparison.rerun_one(
                key.split()[0], comparison.float64_rerun_config(configs[key]), dataset, all_devices, print
            )
        return reruns

    run = comparison.compare_results(config, all_devices, dataset, results, rerun, log=lambda line: None)
    return ModelCheck(
        model,
        dict(run.verdicts),
        dict(run.parity),
        {name: result.error for name, result in run.results.items() if result.failed},
        run,
    )
