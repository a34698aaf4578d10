"""A forward's tapped values and their gradients on one global batch: what the first-difference replay compares
(shared/judge/first_difference.py)."""

import dataclasses
from typing import List, Optional

import numpy as np


@dataclasses.dataclass
class Taps:
    """In forward order; each value and gradient joined in batch order (the examples on the first axis, a
    DTensor's padding examples cut; its zero units stay), as host arrays. A gradient is None where the loss does
    not depend on the value."""

    names: List[str]
    values: List[np.ndarray]
    gradients: List[Optional[np.ndarray]]
    step: int = 0  # the training step replayed
