"""Reading a recipe: a YAML file or a shipped recipe's name (with `extends`), bounded as any file from elsewhere
is; dotted `key=value` overrides from the command line; validation into the frozen `Recipe`, every error at once,
each naming its dotted field, as one `RecipeError` (exit code 2), with a did-you-mean for keys and recipe names.
"""

from __future__ import annotations

import copy
import difflib
import importlib.resources
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from hasten.errors import RecipeError
from hasten.recipe.root import Recipe
from hasten.recipe.sections import DataConfig, replaced
from hasten.text import printable

DEFAULT_RECIPE = "default"


def did_you_mean(source: str) -> str:
    """'; did you mean X?' for a recipe name or folder that does not exist: the closest shipped recipe, or the
    closest folder beside the path given (a mistyped `photos/`); empty when nothing is close."""
    path = Path(source.rstrip("/") or source)
    if "/" in source or source.startswith("."):  # written as a path: a folder (or recipe file) beside it
        parent = path.parent if str(path.parent) else Path(".")
        try:
            near = [p.name for p in parent.iterdir() if not p.name.startswith(".")]
        except OSError:
            near = []
        found = difflib.get_close_matches(path.name, near, n=1, cutoff=0.6)
        if not found:
            return "; no such folder either"
        close = parent / found[0]
        return f"; no such folder either: did you mean {close}{'/' if close.is_dir() else ''}?"
    found = difflib.get_close_matches(source, shipped_recipes(), n=1, cutoff=0.6)
    if found:
        return f"; did you mean {found[0]}?"
    try:  # a bare name (`phtos`): a folder of images in the current folder, as `photos` would be
        here = [p.name for p in Path(".").iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        here = []
    found = difflib.get_close_matches(source, here, n=1, cutoff=0.6)
    return f"; did you mean the folder {found[0]}/?" if found else ""


def shipped_recipes() -> list[str]:
    """Names of the recipes that ship inside the package."""
    folder = importlib.resources.files("hasten.recipe") / "shipped"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


MAX_YAML_NODES = 100_000  # values a recipe may expand to through YAML aliases (`*name`); real recipes hold ~100


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a document whose aliases expand to more than MAX_YAML_NODES values, or
    refer to themselves: a few hundred bytes of nested aliases ("billion laughs") would otherwise become
    gigabytes once the recipe is copied, merged and validated."""

    def compose_document(self) -> yaml.Node:
        node = super().compose_document()
        sizes: dict[int, int] = {}
        open_nodes: set[int] = set()

        def expanded(n: yaml.Node) -> int:  # values `n` stands for once every alias is copied out
            if id(n) in sizes:
                return sizes[id(n)]
            if id(n) in open_nodes:
                raise yaml.YAMLError("an alias refers to the value that contains it (a recursive structure)")
            open_nodes.add(id(n))
            children = n.value if isinstance(n, yaml.SequenceNode) else []
            if isinstance(n, yaml.MappingNode):
                children = [part for pair in n.value for part in pair]
            total = 1
            for child in children:
                total += expanded(child)
                if total > MAX_YAML_NODES:
                    raise yaml.YAMLError(
                        f"its aliases expand to more than {MAX_YAML_NODES:,} values (an alias bomb?); "
                        "write the values out or use fewer nested aliases"
                    )
            open_nodes.discard(id(n))
            sizes[id(n)] = total
            return total

        if node is not None:
            expanded(node)
        return node

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        """A mapping that sets a key twice is an error naming both lines (YAML would keep the last silently)."""
        node = super().compose_mapping_node(anchor)
        seen: dict[str, int] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key.value!r} (first set on line {seen[key.value]}): a recipe "
                        "sets each key once", key.start_mark,
                    )  # fmt: skip
                seen[key.value] = key.start_mark.line + 1
        return node


def load_yaml(text: str, origin: str) -> Any:
    """`text` parsed as YAML with BoundedLoader; a RecipeError naming `origin` when it is not valid or too big."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise RecipeError(f"{origin}: not a usable recipe: nested too deeply") from None
    except yaml.YAMLError as error:
        raise RecipeError(f"{origin}: not valid YAML: {error}") from None


def read_text_file(path: Path, what: str) -> str:
    """A UTF-8 text file's contents; a RecipeError naming the file when it is unreadable, binary or not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RecipeError(f"{what} {path}: cannot read it: {error.strerror or error}") from None
    if b"\0" in data:
        raise RecipeError(f"{what} {path}: a binary file, not a YAML recipe")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecipeError(f"{what} {path}: not UTF-8 text (byte {error.start}): not a YAML recipe") from None


RECIPE_SUFFIXES = (".yaml", ".yml")


def read_recipe_yaml(source: str | Path) -> tuple[dict[str, Any], str, Path | None]:
    """The raw mapping of a recipe given as a path or a shipped name, where it came from, and the folder of its
    file (None for a shipped recipe). A file must be YAML by name (.yaml or .yml): any other file is refused
    before it is read, so nothing of it is echoed back."""
    path = Path(source)
    if path.suffix in RECIPE_SUFFIXES or path.is_file():  # a folder named like a recipe does not shadow it
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {path}")
        if path.suffix.lower() not in RECIPE_SUFFIXES:
            raise RecipeError(f"{path}: not a recipe file (a recipe is YAML, named .yaml or .yml)")
        text, origin, folder = read_text_file(path, "recipe"), str(path), path.parent
    else:
        shipped = importlib.resources.files("hasten.recipe") / "shipped" / f"{source}.yaml"
        if not str(source) or not shipped.is_file():
            raise RecipeError(
                f"unknown recipe {str(source)!r}: not a file, and not one of the shipped recipes "
                f"({', '.join(shipped_recipes())}){did_you_mean(str(source))}"
            )
        text, origin, folder = shipped.read_text(encoding="utf-8"), f"shipped recipe {str(source)!r}", None
    raw = load_yaml(text, origin)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{origin}: a recipe must be a mapping of keys to values, got {type(raw).__name__}")
    raw.setdefault("name", path.stem if path.suffix in RECIPE_SUFFIXES else str(source))
    return raw, origin, folder


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` laid over `base`, section by section."""
    merged = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_raw(source: str | Path | None, _seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """A recipe's mapping, with `extends: OTHER` resolved (the other recipe's keys under this one's). OTHER is a
    shipped recipe's name, or a .yaml file found from the folder of the recipe that extends it (as an include
    is), not from the current folder."""
    raw, origin, folder = read_recipe_yaml(source or DEFAULT_RECIPE)
    parent = raw.pop("extends", None)
    if parent is not None:
        if not isinstance(parent, str) or not parent.strip():
            raise RecipeError(f"{origin}: extends must name a recipe, got {parent!r}")
        target: str | Path = parent
        looks_like_path = Path(parent).suffix in RECIPE_SUFFIXES or "/" in parent or "\\" in parent
        if looks_like_path or Path(parent).is_file():
            base_folder = folder if folder is not None else Path.cwd()
            target = (base_folder / Path(parent).expanduser()).resolve()
            if not target.is_file():
                raise RecipeError(
                    f"{origin}: extends: {printable(parent)}: no such recipe file (looked for {printable(str(target))})"
                )
            if target.suffix.lower() not in RECIPE_SUFFIXES:
                raise RecipeError(
                    f"{origin}: extends: {printable(parent)}: not a recipe file (a recipe is YAML, .yaml or .yml)"
                )
        key = str(target)
        if key in _seen or (folder is not None and key == str(Path(source or "").resolve())):
            chain = " -> ".join((*_seen, key))
            raise RecipeError(f"{origin}: recipes extend each other in a loop: {chain}")
        base, _ = load_raw(target, _seen + (key,))
        base.pop("name", None)
        raw = _merge(base, raw)
    return raw, origin


def parse_value(text: str) -> Any:
    """A command-line value as YAML would read it, so `0.2`, `1e-3`, `true`, `null`, `[1,2]` get their types."""
    try:
        value = yaml.load(text, Loader=BoundedLoader) if text.strip() else ""  # noqa: S506 - a SafeLoader
    except yaml.constructor.ConstructorError as error:
        if "duplicate key" in str(error.problem):  # a mapping that sets a key twice is refused, not taken as text
            raise RecipeError(f"{text!r}: {error.problem}") from None
        return text
    except (yaml.YAMLError, RecursionError):
        return text
    if isinstance(value, str):
        try:  # YAML 1.1 reads `1e-3` as a string; users mean a number
            return float(value)
        except ValueError:
            return value
    return value


SHORTHAND = {"resume": "from"}  # a top-level value that may also be written as a section: resume=auto


def dotted(tree: Any, key: str) -> Any:
    """The value at dotted `key` (`train.epochs`) of a nested dict such as a dumped recipe; KeyError when the path
    is not there."""
    node = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(key)
        node = node[part]
    return node


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`raw` with each `dotted.key=value` set; a malformed override is an error naming it."""
    result = copy.deepcopy(raw)
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            folder = f"; a folder of images is data.name=imagefolder data.root={item}" if Path(item).is_dir() else ""
            problems.append(f"{item!r}: an override is written key=value, e.g. optim.lr=0.2{folder}")
            continue
        *parents, leaf = key.split(".")
        node = result
        for i, part in enumerate(parents):
            if i == 0 and part in SHORTHAND and not isinstance(node.get(part), (dict, type(None))):
                node[part] = {SHORTHAND[part]: node[part]}  # `resume=auto resume.allow_changes=[...]`
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"{key}: {'.'.join(parents[: i + 1])} is a value, not a section")
                break
            node = child
        else:
            try:
                value = parse_value(text)
            except RecipeError as error:
                problems.append(f"{key}: {error}")
                continue
            if not parents and leaf in SHORTHAND and isinstance(node.get(leaf), dict) and not isinstance(value, dict):
                node[leaf][SHORTHAND[leaf]] = value  # `resume=auto` keeps the section's allow_changes
            else:
                node[leaf] = value
    if problems:
        raise RecipeError("bad override(s):\n" + "\n".join(f"  - {p}" for p in problems))
    return result


MOVED = {
    "train.label_smoothing": "tricks.label_smoothing",
    "run.resume": "resume",
}  # keys that moved, so old recipes get a pointer


# values hasten records itself (the user's Python object given to hasten.train), not ones a user types
INTERNAL_VALUES = ("object",)
# where a value is not one of the names: what else the user may have meant
OTHER_WAYS = {
    "model.name": "your own model: model.name=import model.target=package.module:callable",
    "data.name": "your own data: data.name=import data.target=package.module:function, or a folder of images: "
    "data.name=imagefolder data.root=DIR",
}


def _fields_of(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a recipe model, sections included (`train`, `train.epochs`, ...)."""
    keys = []
    for name, info in model.model_fields.items():
        keys.append(prefix + name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            keys += _fields_of(info.annotation, f"{prefix}{name}.")
    return keys


def closest_key(dotted: str, root: type[BaseModel]) -> str | None:
    """The valid key nearest to an unknown `dotted` one (`train.epoch` -> `train.epochs`, `lr` -> `optim.lr`)."""
    keys = _fields_of(root)
    leaf = dotted.rsplit(".", 1)[-1]
    same_section = [k for k in keys if k.rsplit(".", 1)[0] == dotted.rsplit(".", 1)[0] and "." in dotted]
    for pool, word in ((same_section, dotted), (keys, dotted)):
        found = difflib.get_close_matches(word, pool, n=1, cutoff=0.75)
        if found:
            return found[0]
    by_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]  # the right key in another section
    if by_leaf:
        return by_leaf[0]
    found = difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1] for k in keys], n=1, cutoff=0.8)
    return next((k for k in keys if found and k.rsplit(".", 1)[-1] == found[0]), None)


def _describe(error: dict[str, Any], root: type[BaseModel] | None = None) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "recipe"
    if error["type"] == "extra_forbidden":
        if field in MOVED:
            return f"{field}: unknown key (moved to {MOVED[field]})"
        guess = closest_key(field, root) if root is not None else None
        return f"{field}: unknown key" + (f" (did you mean {guess}?)" if guess else "")
    if error["type"] == "literal_error":
        allowed = [v for v in re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", ""))) if
                   v not in INTERNAL_VALUES]  # fmt: skip
        given = error.get("input")
        guess = difflib.get_close_matches(str(given), allowed, n=1, cutoff=0.6) if allowed else []
        text = f"{field}: {given!r} is not one of {', '.join(allowed)}"
        text += f" (did you mean {guess[0]}?)" if guess else ""
        return text + (f"; for {OTHER_WAYS[field]}" if field in OTHER_WAYS else "")
    if error["type"] == "union":  # _joined_unions: what each member of the field's union takes
        parts = sorted(error["parts"], key=lambda part: part.startswith("or "))
        return f"{field}: {error.get('input')!r}: should be {', '.join(parts)}"
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] in ("value_error", "assertion_error") and ": " in message:
        return message  # our validators already start with the field name
    return f"{field}: {message} (got {str(repr(error.get('input')))[:200]})"


_UNION_MEMBER = re.compile(r"^(constrained-\w+|int|float|str|bool|literal\[.*\])$")


def _joined_unions(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic reports a value that fits no member of a union (`int >= 1 | "auto"`) once per member, each at
    the field plus the member's tag: one problem per field instead, naming what each member would take."""
    joined: list[dict[str, Any]] = []
    by_field: dict[tuple, dict[str, Any]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        if not (loc and isinstance(loc[-1], str) and _UNION_MEMBER.match(loc[-1])):
            joined.append(error)
            continue
        if error["type"] == "literal_error":
            wanted = ", ".join(re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", ""))))
            part = f"or one of {wanted}" if "," in wanted else f"or {wanted}"
        else:
            part = error["msg"].removeprefix("Value error, ").removeprefix("Input should be ")
        if loc[:-1] in by_field:
            by_field[loc[:-1]]["parts"].append(part)
        else:
            by_field[loc[:-1]] = {"type": "union", "loc": loc[:-1], "input": error.get("input"), "parts": [part]}
            joined.append(by_field[loc[:-1]])
    return joined


def _origin_of(error: dict[str, Any], overrides: list[str]) -> str | None:
    """The override (`key=value`) the problem comes from, when its key is the problem's field, a section around
    it, or a key inside it; None when it comes from the recipe itself."""
    field = ".".join(str(part) for part in error["loc"])
    for item in reversed(overrides):
        key = item.partition("=")[0]
        if key and (key == field or field.startswith(key + ".") or (field and key.startswith(field + "."))):
            return item
    return None


def recipe_error(
    exc: ValidationError, origin: str, overrides: list[str] | None = None, root: type[BaseModel] | None = None
) -> RecipeError:
    """One `RecipeError` listing every problem of a failed validation, each naming its dotted field (and the
    nearest valid key for an unknown one, from `root`'s fields); a problem an override made is attributed to the
    command line, the others to `origin`."""
    found = [(_describe(error, root), _origin_of(error, overrides or [])) for error in _joined_unions(exc.errors())]
    if overrides and all(where is not None for _, where in found):  # the recipe itself is fine: say so
        lines = [line if line.startswith(where.partition("=")[0] + ":") else f"{line} (from {where})"
                 for line, where in found]  # fmt: skip
        header = f"the command line (over {origin}): {len(lines)} problem(s)"
    else:
        lines = [line + (f" (from the command line: {where})" if where else "") for line, where in found]
        header = f"{origin}: {len(lines)} problem(s)"
    return RecipeError(header + ":\n" + "\n".join(f"  - {line}" for line in lines))


def validate(raw: dict[str, Any], origin: str = "recipe", overrides: list[str] | None = None) -> Recipe:
    """A validated `Recipe`, or one `RecipeError` that lists every problem, each naming its field (problems from
    `overrides`, already applied to `raw`, are attributed to the command line)."""
    try:
        return Recipe.model_validate(raw)
    except ValidationError as exc:
        if gan_recipe(raw, exc):
            raise RecipeError(
                f"{origin} is a GAN recipe (it has {', '.join(GAN_MARKS)}), for hasten gan; hasten train and the "
                "commands around it take a classifier's recipe (hasten train --help lists them)"
            ) from None
        raise recipe_error(exc, origin, overrides, Recipe) from None


GAN_MARKS = ("model.latent", "quality")  # the sections and keys of hasten gan's recipe that a classifier's lacks


def gan_recipe(raw: dict[str, Any], error: ValidationError) -> bool:
    """Whether a mapping refused as a classifier's recipe is hasten gan's: only unknown keys were wrong, and it
    holds the GAN's own (a recipe that merely mistypes a key gets the usual did-you-mean)."""
    if not all(problem["type"] == "extra_forbidden" for problem in error.errors()):
        return False
    model = raw.get("model")
    return "quality" in raw and isinstance(model, dict) and "latent" in model


def image_folder_layout(folder: str | Path) -> bool:
    """Whether `folder` is laid out as an image folder: a train/ folder of class folders."""
    train = Path(folder) / "train"
    return train.is_dir() and any(p.is_dir() for p in train.iterdir())


def load_recipe(source: str | None = None, overrides: list[str] | None = None) -> Recipe:
    """The recipe named or at `source` (default: the default recipe) with `overrides` applied and validated.
    `source` may also be an image folder (DIR/train/<class>/...): the default recipe on it, as with
    `data.name=imagefolder data.root=DIR`."""
    overrides = list(overrides or [])
    shipped = (
        source is not None and (importlib.resources.files("hasten.recipe") / "shipped" / f"{source}.yaml").is_file()
    )
    if source is not None and not shipped and Path(source).is_dir():
        if not image_folder_layout(source):
            raise RecipeError(
                f"{source} is a folder, not a recipe: give a recipe (.yaml or a shipped name), or a folder of images "
                "laid out as train/<class>/*.png and val/<class>/... (hasten train DIR trains the default recipe on it)"
            )
        overrides = ["data.name=imagefolder", f"data.root={source}", *overrides]
        source = None
    raw, origin = load_raw(source)
    recipe = validate(apply_overrides(raw, overrides or []), origin, overrides)
    section = raw.get("data")
    own_data = section.get("name", DataConfig().name) if isinstance(section, dict) else DataConfig().name
    if recipe.run.dir is None and recipe.name == DEFAULT_RECIPE:  # the default recipe's run is named by its data
        recipe = replaced(recipe, {"run.dir": str(Path("runs") / data_label(recipe.data))})
    elif recipe.run.dir is None and recipe.data.name != own_data:  # never in the folder of the recipe's own data
        recipe = replaced(recipe, {"run.dir": str(Path("runs") / f"{recipe.name}-{recipe.data.name}")})
    return recipe


def data_label(data: DataConfig) -> str:
    """A folder name for the data a recipe trains on: an image folder's own name, else the dataset's."""
    if data.name == "imagefolder" and data.root:
        name = Path(data.root).expanduser().resolve().name
        if name and name not in (".", "..") and not name.startswith("."):
            return name
    return data.name


def to_yaml(recipe: Recipe) -> str:
    """The resolved recipe as YAML, as saved beside every run."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False)
