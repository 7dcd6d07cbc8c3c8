"""The default recipe's rules: settings decided from the data and the machine instead of written down, so that a
folder no one here has seen gets a batch, a budget and a learning rate that suit it.

Each rule is a pure function of what it reads (the number of training images, the budget asked for, the step
times the start-up probe measured), so a test can pin it; `resolve` (hasten/run/resolve.py) calls them, prints one line
per decision and records the values in recipe.yaml. The constants are measured, not guessed: docs/defaults.md
holds the measurements that chose them and the command that made each.

- **Batch, by time to the result** (`train.batch_size: auto`). After McCandlish et al. ("An Empirical Model of
  Large-Batch Training", 2018): the optimizer steps a run needs to reach a given loss fall with the batch as
  S(B) = S_min (1 + B_noise / B): far below the gradient noise scale B_noise a bigger batch saves steps in
  proportion, far above it, none. A step takes t(B) seconds on this machine, which the probe measures for each
  candidate batch. The time to the result is S(B) t(B), so the rule picks the candidate that minimises
  (1 + B_noise / B) t(B): on a GPU, where t(B) hardly grows with B, a large batch; on a CPU, where it grows almost
  in proportion, a small one. Candidates are powers of two from MIN_BATCH, capped so the run keeps at least
  MIN_RUN_STEPS optimizer steps (a 400-image set trained for one epoch at batch 64 takes 7 steps and learns
  nothing), and with `train.epochs: auto` the whole RUN_STEPS budget within MAX_EPOCHS.
- **Budget** (`train.epochs: auto`): enough optimizer steps for a small set to converge (RUN_STEPS for a model with
  batch norm, NO_BATCH_NORM_RUN_STEPS for one without, which learns more slowly; at a global batch of BUDGET_BATCH,
  and for a smaller batch as many more as S(B) says it needs, so that the batch the time rule picks does not decide
  the result), at least MIN_EPOCHS passes over a large one, at most MAX_EPOCHS.
- **Learning rate across batches**: the recipe gives Adam's LR per `optim.base_batch` images and scales it by the
  square root of the batch (`optim.scaling: sqrt`; Malladi et al., "On the SDEs and Scaling Rules for Adaptive
  Gradient Algorithms", 2022), which the rule's batches then follow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from hasten.engine import step

PROBE_BATCH = 128  # precision and layout are timed at this batch (or the largest candidate, when smaller)
MIN_BATCH = 16  # below this the batch-norm statistics of one batch get too noisy to train with
MAX_BATCH = 512  # per process; beyond it no measured set gained time
NOISE_BATCH = 64  # B_noise of S(B) = S_min (1 + B_noise / B), calibrated in docs/defaults.md
MIN_RUN_STEPS = 64  # the batch is capped so the run (all its epochs) takes at least this many optimizer steps
RUN_STEPS = 600  # train.epochs=auto: optimizer steps a small set needs, for a model with batch norm (docs/defaults.md)
# ... and for one without (GroupNorm, LayerNorm or none): the model suite's CNNs without batch norm on 1,200 letters
# were at chance on 2 of 3 seeds at 600 steps and off it on every seed at 1,200 (docs/defaults.md)
NO_BATCH_NORM_RUN_STEPS = 1200
BUDGET_BATCH = 32  # the global batch those budgets are steps at; a smaller one is planned more (budget_steps)
MIN_EPOCHS = 5  # train.epochs=auto: passes over a large set at least
MAX_EPOCHS = 60  # train.epochs=auto: passes over a tiny set at most


def steps_per_epoch(images: int, batch: int, world: int = 1, accumulate: int = 1) -> int:
    """Optimizer steps an epoch of `images` is planned at before a loader exists: each of `world` ranks takes its
    padded share, in micro-batches of `batch`, counted into steps by hasten.engine.step.steps_per_epoch (the
    ceilings nest, so this is ceil(images / (batch * world * accumulate)))."""
    shard = -(-images // world)
    return step.steps_per_epoch(-(-shard // batch), accumulate)


def run_steps(batch_norm: bool) -> int:
    """`train.epochs: auto`'s optimizer steps for a small set: RUN_STEPS for a model with batch norm,
    NO_BATCH_NORM_RUN_STEPS for one without."""
    return RUN_STEPS if batch_norm else NO_BATCH_NORM_RUN_STEPS


def budget_steps(budget: int, batch: int, world: int = 1, accumulate: int = 1) -> int:
    """The optimizer steps `train.epochs: auto` plans at this batch: `budget` (steps at a global batch of
    BUDGET_BATCH) times S(B) / S(BUDGET_BATCH) when the global batch B is smaller, the time rule's own model of the
    steps a batch needs (S(B) = S_min (1 + NOISE_BATCH / B): batch 16 needs 5/3 of batch 32's), so that the batch the
    rule picks by predicted time is given the steps that prediction assumed and the batch does not decide the
    result; a larger batch keeps `budget` (at 64 the model said 240 steps would do, and they did not:
    docs/defaults.md)."""
    global_batch = batch * world * accumulate
    scale = (1 + NOISE_BATCH / global_batch) / (1 + NOISE_BATCH / BUDGET_BATCH)
    return math.ceil(budget * max(1.0, scale) - 1e-9)


def steps_needed(epochs: int | None, budget: int = RUN_STEPS) -> int:
    """Optimizer steps a candidate batch's run must keep: MIN_RUN_STEPS for a given number of epochs, the budget's
    steps (`budget`, from run_steps) for `train.epochs: auto` (None)."""
    return MIN_RUN_STEPS if epochs is not None else budget


def batch_candidates(
    images: int, epochs: int | None, world: int = 1, accumulate: int = 1, budget: int = RUN_STEPS
) -> list[int]:
    """Per-process batches the rule may choose: powers of two from MIN_BATCH to MAX_BATCH whose run over `images`,
    split over `world` processes with `accumulate` micro-batches a step, keeps enough optimizer steps: with
    `epochs` given, MIN_RUN_STEPS; with `epochs` None (`train.epochs: auto`), the whole `budget` of steps that
    `auto_epochs` plans, not cut short by MAX_EPOCHS (the time rule assumes each candidate's run reaches its result;
    300 images at batch 64 would get 60 epochs of 5 steps, half the budget). MIN_BATCH alone when even it falls
    short: the run is then as long as its budget allows."""
    candidates, batch = [MIN_BATCH], 2 * MIN_BATCH
    while batch <= MAX_BATCH:
        run_epochs = epochs if epochs is not None else auto_epochs(images, batch, world, accumulate, budget)
        needed = steps_needed(epochs, budget_steps(budget, batch, world, accumulate))
        if run_epochs * steps_per_epoch(images, batch, world, accumulate) < needed:
            break
        candidates.append(batch)
        batch *= 2
    return candidates


def timed_sizes(candidates: list[int]) -> list[int]:
    """The candidates the probe times: the smallest, the largest and one between (the others are read off the line
    through them, `step_time_line`): a step's time is close to linear in the batch, a + b B."""
    if len(candidates) <= 3:
        return list(candidates)
    return [candidates[0], candidates[len(candidates) // 2], candidates[-1]]


def step_time_line(seconds: Mapping[int, float], candidates: list[int]) -> dict[int, float]:
    """Each candidate's step time from the timed ones: measured where measured, else on the least-squares line
    t(B) = a + b B through them (a and b not below 0)."""
    points = [(batch, t) for batch, t in seconds.items() if math.isfinite(t)]
    if len(points) < 2:
        return {batch: seconds.get(batch, math.inf) for batch in candidates}
    mean_b = sum(b for b, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    spread = sum((b - mean_b) ** 2 for b, _ in points)
    slope = max(0.0, sum((b - mean_b) * (t - mean_t) for b, t in points) / spread)
    intercept = max(0.0, mean_t - slope * mean_b)
    return {batch: seconds.get(batch, intercept + slope * batch) for batch in candidates}


def predicted_cost(batch: int, step_seconds: float, noise_batch: float = NOISE_BATCH) -> float:
    """Seconds to the result, up to a factor the batch does not change: S(B) t(B) / S_min."""
    return (1 + noise_batch / batch) * step_seconds


# batches whose predicted times are this close (relative) count as tied: the smaller wins. 5%, as the probe's TIE: at
# 1%, cold runs of the default recipe on an idle Zen 4 split 3/2 between batches 32 and 64 (their costs 1-3% apart,
# read off a line through steps of 16, 128 and 512 whose 512 varied 109-163 ms from run to run)
BATCH_TIE = 0.05
MAX_BATCH_TIE = 0.25  # ... or as close as the timings' own spread, up to this


def batch_tie(spread: float) -> float:
    """How close two batches' predicted times must be to count as tied, when the step timings they come from were
    `spread` apart from one repeat to the next (hasten/tune/steadiness.py): noise must not pick the batch."""
    return max(BATCH_TIE, min(spread, MAX_BATCH_TIE))


def choose_batch(step_seconds: Mapping[int, float], noise_batch: float = NOISE_BATCH, tie: float = BATCH_TIE) -> int:
    """The batch of least predicted time to the result among those timed; ties (within `tie`, relative) go to the
    smaller batch, which takes more steps for the same time."""
    costs = {batch: predicted_cost(batch, seconds, noise_batch) for batch, seconds in step_seconds.items()
             if math.isfinite(seconds)}  # fmt: skip
    if not costs:
        raise ValueError("no batch was timed")
    best = min(costs.values())
    return min(batch for batch, cost in costs.items() if cost <= best * (1 + tie))


def auto_epochs(images: int, batch: int, world: int = 1, accumulate: int = 1, budget: int = RUN_STEPS) -> int:
    """train.epochs=auto: enough epochs for the optimizer steps `budget` plans at this batch (budget_steps; `budget`
    from run_steps: RUN_STEPS with batch norm), at least MIN_EPOCHS, at most MAX_EPOCHS."""
    needed = budget_steps(budget, batch, world, accumulate)
    return max(MIN_EPOCHS, min(MAX_EPOCHS, -(-needed // steps_per_epoch(images, batch, world, accumulate))))


EVAL_BATCH = 256  # train.eval_batch_size=auto on a GPU
# ... on a CPU, where a forward pass over a batch whose activations outgrow the caches slows per image: at most
# EVAL_BATCH_CPU images and EVAL_BYTES bytes of input a batch at the evaluation's element size (4 in fp32, 2 in bf16
# or fp16): measured on a Zen 4 and with AVX2 kernels (benchmarks/eval_batch.py, docs/defaults.md), 28-32 px images
# ran fastest in batches of 128-256 in fp32 and bf16, and the batch where larger ones slow (fp32: 64 at 64 px, 16-32
# at 96 px) doubles in bf16, whose activations take half the bytes (128 at 64 px, 32 at 96 px)
EVAL_BATCH_CPU = 256
EVAL_BYTES = 64 * 64 * 64 * 4


def eval_batch(device_type: str, height: int, width: int, element_bytes: int = 4) -> int:
    """train.eval_batch_size=auto: EVAL_BATCH on a GPU; on a CPU the largest power of two of images from MIN_BATCH
    to EVAL_BATCH_CPU whose pixels, at `element_bytes` each (the evaluation's precision: 4 for fp32, 2 for bf16 and
    fp16), hold at most EVAL_BYTES (MIN_BATCH when even it holds more)."""
    if device_type != "cpu":
        return EVAL_BATCH
    fits = max(1, EVAL_BYTES // max(1, height * width * element_bytes))
    return max(MIN_BATCH, min(EVAL_BATCH_CPU, 1 << (fits.bit_length() - 1)))


def element_bytes(precision: str) -> int:
    """Bytes of one activation under `precision` (a resolved one; auto counts as fp32, the widest)."""
    return 2 if precision in ("bf16", "fp16", "fp16-master") else 4


def auto_whiten(model: str, pretrained: str | None) -> bool:
    """model.whiten=auto: hasten's ResNet trained from scratch starts with its first conv's filters whitening the
    images' patches, frozen (hasten/techniques/whitening.py); a user's model or pretrained weights are left as they
    are. Measured in docs/defaults.md: on 100 classes of rendered glyphs the network without it stayed at the loss of
    a uniform guess for the default budget's whole 5 epochs."""
    return model == "resnet" and not pretrained


MIN_RISE_STEPS = 10  # schedule.min_warmup_steps=auto: the LR's rise to its peak takes at least this many steps


def auto_rise_steps(classes: int) -> int:
    """schedule.min_warmup_steps=auto: the LR rises to its peak over one optimizer step per class, at least
    MIN_RISE_STEPS. Measured in docs/defaults.md: on 100 classes of rendered glyphs (a batch of 32 holds a third of
    them) the loss stayed near ln 100 for one to three epochs after a 10-step rise, and the seeds ended 54-87%; a
    100-step rise took the median from 69.6 to 84.7%. A longer rise for every set cost 10-class sets: on 200 images
    (few-shot) a rise of a tenth of the run took the median from 73.2 to 67.6% over six seeds, so a set of ten
    classes or fewer keeps the 10 steps."""
    return max(MIN_RISE_STEPS, classes)


# optim.lr unset: Adam and AdamW's peak LR per optim.base_batch (32) images, by what the model is made of. With batch
# norm (hasten's ResNet, a timm-style ResNet, a MobileNet) BATCH_NORM_LR, the value hasten's ResNet was tuned at
# (docs/defaults.md); without it (an MLP, a CNN with GroupNorm or no normalisation, a transformer) NO_BATCH_NORM_LR.
# Measured on the model suite (docs/defaults.md, "A model hasten did not write"): at 0.0007 a MobileNet-like net fell
# from 70.8% to 33.0% on a letters folder; without batch norm, a grid of 0.00035-0.003 per 32 on the letters and the
# scenes, 3 seeds, put the GroupNorm CNN, the CNN without normalisation and the vision transformer best at 0.0015,
# and the MLP there too once its 3,072-input first layer takes its share of the LR by fan-in (optim.fan_in_lr,
# which the same models get): at one LR for all its layers the MLP was dead at 0.0015 (10.8-13.0% on the letters)
BATCH_NORM_LR = 0.002
NO_BATCH_NORM_LR = 0.0015


def default_lr(optimizer: str, batch_norm: bool) -> float | str:
    """optim.lr unset, decided: for sgd `auto`, the range test (its rule was measured for SGD); for adam, adamw (and
    muon's parameters that are not conv filters) BATCH_NORM_LR for a model with batch norm, NO_BATCH_NORM_LR for one
    without: batch norm makes each layer's output blind to its weights' scale, which bears a larger step."""
    if optimizer in LR_AUTO_CALIBRATED:
        return "auto"
    return BATCH_NORM_LR if batch_norm else NO_BATCH_NORM_LR


FAN_IN_OPTIMIZERS = ("adam", "adamw")  # optim.fan_in_lr=auto: the optimizers whose steps ignore the gradient's size


def default_fan_in_lr(optimizer: str) -> bool:
    """optim.fan_in_lr=auto, decided: on for Adam and AdamW, whatever the model (hasten/engine/fan_in.py: a weight
    that feeds a batch norm keeps the LR, so the batch-norm nets the LR was measured on train as measured). Measured
    on the model suite and two held-out VGG-style nets with a 4,096-input dense layer (docs/defaults.md, "A model
    hasten did not write"): with batch norm at 0.002, every seed dead (10.0%) at one LR, 80.8-85.2% with the rule."""
    return optimizer in FAN_IN_OPTIMIZERS


# optim.layer_scale_lr=auto: a layer scale (hasten/engine/layer_scale.py) at this times Adam's LR. Chosen on a
# ConvNeXt-like net written after the rules (layer scales from 1e-6; benchmarks/heldout_models.py) on the letters, 3
# seeds, in fp32 on an AVX2 CPU (docs/defaults.md, "Layer scales"): at optim.lr its seed 2's scales ended at 0.07-0.23
# and the seeds at 85.5, 58.0 and 46.2% (the plain loop 76.5, 49.0, 60.0%); at 10x that seed's scales at 0.34-1.30
# and the seeds at 93.5, 61.5 and 69.5%. On seeds 1 and 2: 3x 70.0 / 49.8%, 10x 61.5 / 69.5%, 30x 10.0 (at chance to
# the end) / 65.5%: 10 is the largest factor measured that breaks no seed.
LAYER_SCALE_LR = 10.0


def default_layer_scale_lr(optimizer: str, has_layer_scales: bool) -> float:
    """optim.layer_scale_lr=auto, decided: LAYER_SCALE_LR for Adam and AdamW on a model with a layer scale (their
    steps are about the LR whatever the gradient: a scale from 1e-6 needs a thousand steps of one sign to reach 1),
    else 1: SGD's steps follow the gradient's size, and a model without one has nothing to scale."""
    return LAYER_SCALE_LR if optimizer in FAN_IN_OPTIMIZERS and has_layer_scales else 1.0


LR_AUTO_CALIBRATED = ("sgd",)  # optim.lr=auto's rule was measured for these optimizers (docs/lr-auto.md)

AUTO_TRANSLATE_FRACTION = 1 / 32  # data.augment.translate=auto: shifts of up to this share of the image side
AUTO_TRANSLATE_EPOCHS = 5  # ... in runs of at least this many epochs (docs/defaults.md)


def auto_translate(side: int, epochs: int, patch: int = 0) -> int:
    """data.augment.translate=auto: pixels of random shift for images of `side` pixels trained `epochs` epochs, in
    runs of AUTO_TRANSLATE_EPOCHS or more; for a model whose only spatial layer cuts `patch`-pixel patches
    (hasten.engine.patches: a transformer, a Mixer), in runs of at least `patch_shift_epochs` of the shift."""
    shift = round(side * AUTO_TRANSLATE_FRACTION)
    return shift if epochs >= (patch_shift_epochs(shift) if patch else AUTO_TRANSLATE_EPOCHS) else 0


def patch_shift_epochs(shift: int) -> int:
    """The epochs a model that cuts patches needs before shifts of up to `shift` pixels pay: one for each shifted
    view, (2 shift + 1)^2 (9 at 1 pixel). Nothing after its cut slides, so it learns each view from the data: a small
    ViT on Fashion-MNIST 5,000 lost 2-4 points to 1-pixel shifts in 7 epochs and gained from them on the letters in
    27 (docs/defaults.md, "Shifts and patches")."""
    return (2 * shift + 1) ** 2


def describe_batch_choice(seconds: Mapping[int, float], chosen: int, measured: Mapping[int, float]) -> str:
    """The line `hasten train` prints for `train.batch_size: auto`: each candidate's images/s (measured ones
    marked) and predicted time to the result relative to the chosen batch's."""
    cost = {batch: predicted_cost(batch, t) for batch, t in seconds.items()}
    shown = ", ".join(f"{batch}{'*' if batch in measured else ''} {batch / seconds[batch]:,.0f}/s "
                      f"x{cost[batch] / cost[chosen]:.2f}" for batch in seconds)  # fmt: skip
    return (
        f"train.batch_size=auto -> {chosen}: least predicted time to the result, (1 + {NOISE_BATCH}/B) x step time "
        f"(batch images/s time; *: timed): {shown}"
    )


# a plain PyTorch loop's batch, which users compare a run against (the model suite's plain arm trains at it)
PLAIN_BATCH = 64
SHORTER_BY = 0.9  # the run says how to be shorter when its epochs at PLAIN_BATCH are predicted under this share


def shorter_run_note(
    seconds: Mapping[int, float],
    chosen: int,
    images: int,
    epochs: int | None,
    world: int = 1,
    accumulate: int = 1,
    budget: int = RUN_STEPS,
) -> list[str]:
    """A line for a run whose batch rule chose a batch under PLAIN_BATCH: the rule picks the batch of least time to
    a result, which on a small set is more optimizer steps, so the run's epochs take longer than the same epochs at
    a plain loop's batch would (their predicted seconds of training steps, from the probe's step times `seconds`),
    and a user who wants the shorter run is told the keys that give it (the batch and the epochs: `train.epochs:
    auto` alone would plan more epochs at the larger batch). `seconds`: the step times the probe measured; a batch
    not timed (PLAIN_BATCH is often no candidate on a small set: too few steps an epoch) is read off their line
    (step_time_line). Empty where it cannot be predicted or saves less than 1 - SHORTER_BY of the time."""
    seconds = step_time_line(seconds, [chosen, PLAIN_BATCH])
    if chosen >= PLAIN_BATCH or not math.isfinite(seconds[PLAIN_BATCH]):
        return []
    run_epochs = epochs if epochs is not None else auto_epochs(images, chosen, world, accumulate, budget)
    steps = {batch: run_epochs * steps_per_epoch(images, batch, world, accumulate) for batch in (chosen, PLAIN_BATCH)}
    spent = {batch: steps[batch] * seconds[batch] for batch in steps}
    if spent[PLAIN_BATCH] > SHORTER_BY * spent[chosen]:
        return []
    shown = {batch: f"{value:,.0f}" if value >= 10 else f"{value:.1f}" for batch, value in spent.items()}
    return [
        f"train.batch_size={chosen} trains for the result, not the shortest run: {run_epochs} epoch"
        f"{'s' * (run_epochs != 1)} at batch {chosen}: {steps[chosen]:,} optimizer steps, about "
        f"{shown[chosen]} s of training steps here; at batch {PLAIN_BATCH}, {steps[PLAIN_BATCH]:,} steps, about "
        f"{shown[PLAIN_BATCH]} s, which on a set this small learn less (docs/defaults.md). For the shorter run: "
        f"train.batch_size={PLAIN_BATCH} train.epochs={run_epochs}"
    ]


# the batch a run whose model's outputs collapsed to the same for every class restarts at (hasten/run/restart.py,
# restart_settings) or, where its settings were the user's, is advised first, at half its LR: a
# user's SqueezeNet-like net (a ReLU after its classifier) on 1,200 letters collapsed at the rule's batch 16 on seeds 0
# and 2 (training loss ln(10) to 1e-5; seed 1 at 11.5%); at 64 it reached 95.0% and 91.2% on seeds 0 and 1 and seed 2
# collapsed again, at 64 and half the LR seed 2 reached 94.8% (the plain loop's batch and about its LR, which learnt
# all three), and at batch 16 and a third of the LR seed 0 77.5% (docs/results/models.md, "Two more")
COLLAPSE_BATCH = 64
