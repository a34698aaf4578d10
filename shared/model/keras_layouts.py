"""A Keras LayoutMap, audited before anything trains: which variables each key matched and the axes they got, the
keys that matched nothing (their variables stay replicated, and Keras says nothing), and where the other Keras
release's matching would lay out differently: Keras up to 3.13 matched a key with `re.search`, 3.14 on with
`re.fullmatch` (keras-team/keras#22164), so a map written for one leaves variables whole under the other.
The mesh's share of it (bytes per device, what stays replicated on a model axis): shared/report/layouts.py.
docs/keras.md, "What the tool says of your LayoutMap".
"""

import dataclasses
import inspect
import re
from typing import Dict, List, Optional, Sequence, Tuple

from dtensor_vs_mirrored.shared.errors import UsageError
from dtensor_vs_mirrored.shared.model import keras_compat

SEARCH, FULLMATCH = "re.search", "re.fullmatch"
RULE_RELEASES = {SEARCH: "Keras before 3.14", FULLMATCH: "Keras 3.14 and later"}


@dataclasses.dataclass(frozen=True)
class KeyUse:
    """One LayoutMap key: its axis tuple, as the user wrote it, and the variables (Keras paths) it laid out."""

    key: str
    axes: Tuple[Optional[str], ...]
    paths: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class RuleDifference:
    """A variable the other rule would match otherwise: the key here (None: none), the keys there (two or more:
    Keras there raises, as it does for any path that matches several keys)."""

    path: str
    key: Optional[str]
    other_keys: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class LayoutAudit:
    rule: str  # the installed Keras's: SEARCH or FULLMATCH, read from its LayoutMap.__getitem__
    keys: Tuple[KeyUse, ...]  # every key, in the map's order, matched or not
    key_of_name: Dict[str, str]  # definition variable name -> the key that laid it out (matched ones only)
    differences: Tuple[RuleDifference, ...]  # under the other rule

    @property
    def other_rule(self) -> str:
        return SEARCH if self.rule == FULLMATCH else FULLMATCH

    @property
    def unmatched(self) -> List[str]:
        return [use.key for use in self.keys if not use.paths]

    def key_for(self, name: str) -> Optional[str]:
        """The key that laid out the definition's variable `name`; None when none matched it."""
        return self.key_of_name.get(name)


def installed_rule(layout_map_class, keras_version: str) -> str:
    """How the installed Keras matches a key that is not the path itself, read from its own
    LayoutMap.__getitem__ (Keras 3.15.1: `re.fullmatch(pattern, key)`); from its version where the source cannot
    be read or names neither."""
    try:
        source = inspect.getsource(layout_map_class.__getitem__)
    except (OSError, TypeError):
        source = ""
    if "re.fullmatch(" in source:
        return FULLMATCH
    if "re.search(" in source:
        return SEARCH
    return FULLMATCH if keras_compat.release(keras_version) >= (3, 14) else SEARCH


def check_keys(layout_map, source: str) -> None:
    """Every key a regular expression (Keras treats each as one; a bad one raised re.error from inside its lookup),
    or UsageError in one line naming it; nothing for no map."""
    for key in layout_map or ():
        try:
            re.compile(key)
        except re.error as error:
            raise UsageError(
                f"--model {source}: LayoutMap key {key!r} is not a regular expression ({error}); Keras matches every "
                f"key as one: escape its special characters (re.escape) or fix it"
            ) from None


def matching_keys(keys: Sequence[str], path: str, rule: str) -> List[str]:
    """The keys Keras's LayoutMap.__getitem__ takes for `path` under `rule`: the path itself where it is a key
    (an exact key wins), else every key the rule matches, in the map's order (two or more: Keras raises)."""
    if path in keys:
        return [path]
    match = re.fullmatch if rule == FULLMATCH else re.search
    return [key for key in keys if match(key, path)]


def audit_layout_map(layout_map, keras, variables, names: Sequence[str]) -> LayoutAudit:
    """The audit of `layout_map` over the Keras `variables` (the definition's, named `names`), each already laid
    out by `layout_map[path]` (shared/model/keras.py layout_for: several keys for one path are refused there)."""
    rule = installed_rule(type(layout_map), keras.__version__)
    keys = list(layout_map)
    matched: Dict[str, List[str]] = {key: [] for key in keys}
    key_of_name, differences = {}, []
    for variable, name in zip(variables, names, strict=True):
        here, there = matching_keys(keys, variable.path, rule), matching_keys(keys, variable.path, other(rule))
        check_same_as_keras(layout_map, variable.path, here)
        if here:
            matched[here[0]].append(variable.path)
            key_of_name[name] = here[0]
        if here != there:
            differences.append(RuleDifference(variable.path, here[0] if here else None, tuple(there)))
    uses = tuple(KeyUse(key, tuple(layout_map[key].axes), tuple(matched[key])) for key in keys)
    return LayoutAudit(rule, uses, key_of_name, tuple(differences))


def other(rule: str) -> str:
    return SEARCH if rule == FULLMATCH else FULLMATCH


def check_same_as_keras(layout_map, path: str, keys: List[str]) -> None:
    """The rule read from Keras's source gives what Keras's own lookup gives; a Keras that matches otherwise is
    this module's to follow, so it fails loudly here rather than report another model's layouts."""
    found = layout_map[path]
    if (found is None) != (not keys) or (keys and layout_map[keys[0]] is not found):
        raise RuntimeError(
            f"Keras's LayoutMap matched {path!r} otherwise than shared/model/keras_layouts.py reads its rule "
            f"({keys or 'no key'}); this Keras release needs that module updated"
        )
