"""The recipe: every knob of a run, validated in one place (docs/reference.md lists every key).

A recipe is a YAML file (or the name of one shipped in `hasten/recipe/shipped/`), then dotted `key=value`
overrides from the command line, then `Recipe.model_validate`. Unknown keys, wrong types and values out of
range are all reported together, each naming its dotted field, as one `RecipeError` (exit code 2).

This module is the recipe's front: its parts live in `sections` (data, model, optimizer, schedule; the frozen
base and `replaced`), `root` (the loop, tricks, run folder, `Recipe`) and `loading` (files, overrides, validation).
"""

from __future__ import annotations

from hasten.recipe.loading import (  # noqa: F401
    DEFAULT_RECIPE,
    INTERNAL_VALUES,
    MAX_YAML_NODES,
    MOVED,
    OTHER_WAYS,
    RECIPE_SUFFIXES,
    SHORTHAND,
    BoundedLoader,
    apply_overrides,
    closest_key,
    data_label,
    did_you_mean,
    dotted,
    image_folder_layout,
    load_raw,
    load_recipe,
    load_yaml,
    parse_value,
    read_text_file,
    recipe_error,
    shipped_recipes,
    to_yaml,
    validate,
)
from hasten.recipe.root import (  # noqa: F401
    DEVICE,
    LossScaleConfig,
    Recipe,
    RunConfig,
    RunFolder,
    RunName,
    SweepConfig,
    TrainConfig,
    TransferConfig,
    TricksConfig,
    unsafe_folder,
)
from hasten.recipe.sections import (  # noqa: F401
    MAX_BLOCKS,
    MAX_EPOCHS,
    MAX_STAGES,
    MAX_SYNTHETIC,
    MAX_THREADS,
    MAX_WIDTH,
    MAX_WORKERS,
    PRECISION_MODES,
    AugmentConfig,
    BaseModelT,
    DataConfig,
    DatasetName,
    Fp32WeightsPrecision,
    Fraction,
    ModelConfig,
    OptimConfig,
    PositiveFloat,
    PrecisionName,
    ScheduleConfig,
    Section,
    replaced,
)
