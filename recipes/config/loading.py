"""Load a recipe: YAML/JSON file -> `extends` chain merged -> dotted overrides -> typed `Recipe`.

`extends` names other recipe files (relative to the including file) or presets under configs/ ("models/llama-7b",
"clusters/h100-80gb"). Later sources win; mappings merge key by key, everything else is replaced.
"""
from __future__ import annotations

import difflib
import typing
import json
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from recipes.config.schema import Recipe

# configs/ beside the package in a checkout (editable install); from an installed wheel, ./configs
_CHECKOUT_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIGS_DIR = _CHECKOUT_CONFIGS if _CHECKOUT_CONFIGS.is_dir() else Path.cwd() / "configs"


# libyaml's parser when PyYAML was built with it (its wheels are): the same documents ~7x faster than the pure-Python
# one; recipes are read per candidate layout by the planner and per command by every tool.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_yaml(text: str):
    """`yaml.safe_load`, on libyaml where available."""
    return yaml.load(text, Loader=_SAFE_LOADER)


class RecipeError(ValueError):
    """A recipe problem a user can fix: the message names the file/field, the value and the fix."""


def _read_mapping(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecipeError(f"{path}: recipe file not found") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else safe_yaml(text)
    except json.JSONDecodeError as e:
        raise RecipeError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise RecipeError(f"{path}{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a mapping of sections, got {type(data).__name__}")
    return data


def resolve_preset(name: str, base_dir: Path | None = None) -> Path:
    """Find a recipe by path (relative to base_dir or cwd) or preset name under configs/ (with or without suffix)."""
    candidates = []
    for root in ([base_dir] if base_dir else []) + [Path.cwd(), CONFIGS_DIR]:
        p = Path(name) if Path(name).is_absolute() else root / name
        # Append the suffix (not with_suffix): preset names may contain dots ("models/gpt-1.3b").
        candidates += [p] + [p.with_name(p.name + ext) for ext in (".yaml", ".yml", ".json")]
    for c in candidates:
        if c.is_file():
            return c
    known = sorted(str(p.relative_to(CONFIGS_DIR).with_suffix("")) for p in CONFIGS_DIR.rglob("*.y*ml"))
    folder = next((c for c in candidates[::4] if c.is_dir()), None)
    if folder is not None:
        inside = sorted(p.name for p in folder.glob("*.y*ml"))[:5]
        raise RecipeError(f"recipe '{name}' is a directory; give a recipe file"
                          + (f", e.g. {name.rstrip('/')}/{inside[0]} (it holds {', '.join(inside)})" if inside else ""))
    hint = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    msg = f"unknown recipe or preset '{name}'"
    if hint:
        msg += f"; did you mean {', '.join(hint)}?"
    else:
        msg += f"; presets live under {CONFIGS_DIR} (e.g. {', '.join(known[:5])})"
    raise RecipeError(msg)


def deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_raw(path: str | Path, _seen: tuple = ()) -> dict:
    """The merged mapping of a recipe and everything it extends (no validation yet)."""
    path = resolve_preset(str(path)) if not Path(path).is_file() else Path(path)
    path = path.resolve()
    if path in _seen:
        raise RecipeError(f"{path}: 'extends' loops back to itself via {' -> '.join(map(str, _seen))}")
    data = _read_mapping(path)
    parents = data.pop("extends", []) or []
    if isinstance(parents, str):
        parents = [parents]
    merged: dict = {}
    for parent in parents:
        merged = deep_merge(merged, load_raw(resolve_preset(parent, path.parent), _seen + (path,)))
    return deep_merge(merged, data)


def apply_overrides(data: dict, overrides: Iterable[str]) -> dict:
    """Apply `section.key=value` overrides; values are parsed as YAML scalars (4, 3e-4, true, [a, b])."""
    data = json.loads(json.dumps(data))  # deep copy of plain data
    for item in overrides:
        if "=" not in item:
            raise RecipeError(f"override '{item}' must look like section.key=value (e.g. parallel.tp=4)")
        key, raw = item.split("=", 1)
        value: Any = safe_yaml(raw) if raw != "" else None
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise RecipeError(f"override '{item}': '{p}' is not a section")
        node[parts[-1]] = value
    return data


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: the recipe is invalid:"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":
            section_path = e["loc"][:-1]
            field = str(e["loc"][-1])
            known = _known_fields(section_path)
            guess = difflib.get_close_matches(field, known, n=1)
            fix = f"did you mean '{'.'.join(map(str, section_path + (guess[0],)))}'?" if guess else (
                f"known keys here: {', '.join(known)}")
            lines.append(f"  - {loc}: unknown key; {fix}")
        elif e["type"] == "missing":
            lines.append(f"  - {loc}: required field missing; add it to the recipe or to a file it extends")
        elif e["type"] == "value_error":  # a validator's own message already names the field and the fix
            lines.append(f"  - {loc or 'recipe'}: {e['ctx']['error']}")
        else:
            lines.append(f"  - {loc} = {e.get('input')!r}: {e['msg']}")
    return "\n".join(lines)


def _known_fields(section_path: tuple) -> list[str]:
    model: Any = Recipe
    for part in section_path:
        if isinstance(part, int):  # an item of a list section (data.stages.0): its element type
            model = next(iter(typing.get_args(model)), None)
            continue
        field = getattr(model, "model_fields", {}).get(str(part))
        if field is None:
            return []
        model = field.annotation
        if typing.get_origin(model) is typing.Union:  # Optional[Section]
            model = next((a for a in typing.get_args(model) if a is not type(None)), model)
    return sorted(getattr(model, "model_fields", {}).keys())


def load_recipe(path: str | Path, overrides: Iterable[str] = ()) -> Recipe:
    """Load, merge and type-check a recipe. Cross-field rules are checked by `recipes.planner.validation.validate`."""
    data = apply_overrides(load_raw(path), overrides)
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(_format_validation_error(e, str(path))) from None


def recipe_from_dict(data: dict, source: str = "<dict>") -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(_format_validation_error(e, source)) from None
