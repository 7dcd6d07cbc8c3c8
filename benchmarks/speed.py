"""The speed-record recipes' measurements: time to 91/93/94%, every speed technique's ablation, `auto` against
the fixed choices, the default net's arithmetic efficiency by width, and the headline accuracies over seeds; then
docs/results/speed.md from whatever stages have results.

Each stage is one `hasten bench` run (variants interleaved, order rotated per repeat, a warm-up first, each run
in its own process), so every ratio it reports is measured side by side in one sitting:

    .venv/bin/python benchmarks/speed.py headline   # fashion-fast/-sprint beside the ones they replace (3 repeats)
    .venv/bin/python benchmarks/speed.py headline94 # fashion-94 beside the one it replaces
    .venv/bin/python benchmarks/speed.py ablations  # each technique on and off over the default recipe
    .venv/bin/python benchmarks/speed.py auto       # precision/channels_last: auto beside every fixed choice
    .venv/bin/python benchmarks/speed.py widths     # the default net's share of the bf16 matmul peak by width
    .venv/bin/python benchmarks/speed.py seeds      # headline accuracies over 5 seeds
    .venv/bin/python benchmarks/speed.py report     # docs/results/speed.md from the stages' results

Results go to bench/speed/<stage>/ (report.md, results.json, plots); `--repeats N` and `--seeds N` shorten a
stage, `--quick` makes every stage a seconds-long smoke run (tiny subset, 1 repeat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from hasten.experiments.bench import Variant, bench, plan_variants
from hasten.experiments.report import bench_table
from hasten.experiments.variants import recipe_variant
from hasten.recipe.schema import load_recipe
from hasten.techniques.registry import switch

OUT = Path("bench/speed")
DOC = Path("docs/results/speed.md")
BASELINES = Path("benchmarks/baselines")
HEADLINE = {  # new recipe -> the recipe it replaces (flattened copies of the shipped ones before the speed work)
    "fashion-fast": BASELINES / "fashion-fast-before.yaml",
    "fashion-sprint": BASELINES / "fashion-sprint-before.yaml",
    "fashion-94": BASELINES / "fashion-94-before.yaml",
}
TARGETS = {"fashion-fast": ("0.93", 0.5), "fashion-94": ("0.94", 0.5), "fashion-sprint": ("0.91", 0.6)}


def switched(key: str, *values: str) -> str:
    """`KEY=V1,V2` for `--vary`, KEY a technique's switch in the registry (hasten/techniques/registry.py), so a
    misspelt key fails here; without values, the switch's example on value, then its off value."""
    technique = switch(key)
    return f"{technique.key}={','.join(values or (technique.on, technique.off))}"


# each speed-record technique switched against the default recipe (one change at a time); "on" where the default
# leaves it off, "off" where the default has it
ABLATIONS = [
    switched("model.whiten"),
    switched("model.init", "dirac"),
    switched("model.bn_weight"),
    switched("model.bn_momentum", "0.4"),
    switched("tricks.lookahead_steps"),
    switched("data.augment.flip", "alternate", "true"),
    switched("train.tta_translate"),
    switched("tricks.label_smoothing", "0.0", "0.1", "0.2"),
    switched("train.progressive_resize"),
    switched("schedule.name", "linear", "one-cycle"),
    "optim.name=sgd",  # the default's Muon off: Nesterov SGD for the filters too (an optimizer, not a switch)
    "model.width=32",
    "train.batch_size=512",
    switched("tricks.ema", "0", "0.99"),
]
QUICK = ["data.subset=512", "data.test_subset=256", "train.epochs=1", "train.threads=1"]
EXTRA: list[str] = []  # --threads N: train.threads=N for every run of the stage (set in main)


# every headline run evaluates every EVAL_EVERY optimizer steps too (a quarter of an epoch at batch 256): the same
# resolution of time to accuracy for the recipes before and now (a measurement setting, not a recipe change)
EVAL_EVERY = "train.eval_every_steps=59"


def _headline(names: list[str], stage: str, repeats: int, quick: bool, every: list[str]) -> None:
    """The recipes `names` beside the ones they replace, in one bench: before-recipes first."""
    short = [*(QUICK if quick else []), *every]
    sources = [str(HEADLINE[name]) for name in names] + names
    base = load_recipe(sources[0], short)
    variants = [Variant(base.name)] + [recipe_variant(base, load_recipe(src, short)) for src in sources[1:]]
    bench(base, variants, repeats, OUT / stage, command=" ".join(sys.argv))


def stage_headline(repeats: int, quick: bool) -> None:
    _headline(["fashion-fast", "fashion-sprint"], "headline", repeats, quick, [EVAL_EVERY])


def stage_headline94(repeats: int, quick: bool) -> None:
    _headline(["fashion-94"], "headline94", repeats, quick, [])  # 16 epochs before: epoch ends resolve it


def stage_ablations(repeats: int, quick: bool) -> None:
    # a sixth of the data (half the test set) for 3 epochs at the full-data batch (256): ~20 variants in ~10
    # minutes on 2 cores; accuracy differences under ~0.5 points are within a seed's spread at this budget
    short = QUICK if quick else ["data.subset=10000", "data.test_subset=5000", "train.epochs=3",
                                 "train.min_steps_per_epoch=0"]  # fmt: skip
    base = load_recipe("fashion-fast", [*short, *EXTRA])
    variants = plan_variants(base, vary=ABLATIONS, ablate=True, naive=False)
    bench(base, variants, repeats, OUT / "ablations", command=" ".join(sys.argv))


def stage_auto(repeats: int, quick: bool) -> None:
    short = QUICK if quick else ["data.subset=10000", "data.test_subset=2000", "train.epochs=1",
                                 "train.min_steps_per_epoch=0"]  # fmt: skip
    base = load_recipe("fashion-fast", [*short, *EXTRA])
    vary = ["precision=fp32,bf16,auto", "train.channels_last=false,true,auto"]
    variants = [v for v in plan_variants(base, vary=vary, naive=False)
                if ("precision=auto" in v.overrides) == ("train.channels_last=auto" in v.overrides)]  # fmt: skip
    bench(base, variants, repeats, OUT / "auto", command=" ".join(sys.argv))


def stage_widths(repeats: int, quick: bool) -> None:
    short = QUICK if quick else ["data.subset=10000", "data.test_subset=2000", "train.epochs=1"]
    fixed = ["precision=bf16", "train.channels_last=false", "tricks.ema=0", "train.min_steps_per_epoch=0"]
    base = load_recipe("fashion-fast", [*short, *fixed, *EXTRA])
    variants = plan_variants(base, vary=["model.width=16,32,64"], naive=False)
    bench(base, variants, repeats, OUT / "widths", command=" ".join(sys.argv))


def stage_seeds(seeds: int, quick: bool, names: list[str]) -> None:
    """Accuracy over seeds, one thread per run (it may run beside a timing stage; its times are not the point)."""
    for name in names:
        base = load_recipe(name, QUICK if quick else ["train.threads=1"])
        variants = plan_variants(base, vary=[f"seed={','.join(map(str, range(seeds)))}"], naive=False)
        bench(base, variants, 1, OUT / "seeds" / name, command=" ".join(sys.argv), warmup=False)


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def seed_line(results: dict[str, Any]) -> str:
    accuracies = [run["summary"]["test_accuracy"] for v in results["variants"] for run in v["runs"] if "summary" in run]
    times = {t: [run["summary"]["time_to_accuracy"].get(t) for v in results["variants"] for run in v["runs"]
                 if "summary" in run] for t in results["thresholds"]}  # fmt: skip
    mean, spread = statistics.fmean(accuracies), statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    reached = [f"{float(t):.0%}: {sum(s is not None for s in ss)}/{len(ss)}" for t, ss in times.items() if any(ss)]
    return (f"| {results['name']} | {len(accuracies)} | {mean:.2%} ± {spread:.2%} | {min(accuracies):.2%}–"
            f"{max(accuracies):.2%} | {', '.join(reached)} |")  # fmt: skip


def targets_table(results: dict[str, Any]) -> list[str]:
    """Time to each recipe's target accuracy, new against the recipe it replaces, as a ratio of medians."""
    by_name = {v["name"]: v for v in results["variants"]}
    lines = ["| recipe | target | before (median s) | now (median s) | ratio | asked | met |", "|" + " --- |" * 7]
    for new, (threshold, asked) in TARGETS.items():
        old = by_name.get(f"{new}-before")
        if new not in by_name or old is None:
            continue
        before, now = (v["stats"]["time_to_accuracy"].get(threshold) for v in (old, by_name[new]))
        b, n = (s["median"] if s else None for s in (before, now))
        ratio = n / b if b and n else None
        shown = [f"{b:.1f}" if b else "not reached", f"{n:.1f}" if n else "not reached"]
        met = "yes" if ratio and ratio <= asked else "no"
        shown.append(f"{ratio:.2f}x" if ratio else "—")
        lines.append(f"| {new} | {float(threshold):.0%} | {' | '.join(shown)} | ≤ {asked}x | {met} |")
    return lines


def auto_lines(results: dict[str, Any]) -> list[str]:
    """precision/channels_last: auto against the best fixed choice, in training images/s (medians)."""
    speeds = {v["name"]: (v["stats"]["images_per_second"] or {}).get("median") for v in results["variants"]}
    auto = next((speed for name, speed in speeds.items() if "auto" in name), None)
    fixed = {name: speed for name, speed in speeds.items() if "auto" not in name and speed}
    if not auto or not fixed:
        return []
    best = max(fixed, key=fixed.get)
    ratio = auto / fixed[best]
    verdict = "met" if ratio >= 0.95 else "not met"
    return [f"auto: {auto:,.0f} images/s; the best fixed choice ({best}): {fixed[best]:,.0f}; auto/best = "
            f"{ratio:.2f} (asked: within 5%, {verdict})", ""]  # fmt: skip


def stage_report() -> None:
    sections = [
        "# Speed: the speed targets, measured",
        "",
        "Generated by `benchmarks/speed.py report` from the stages' results in bench/speed/ (each stage one "
        "`hasten bench` run: variants interleaved, order rotated per repeat, after a warm-up).",
        "",
    ]
    for stage in ("headline", "headline94"):
        headline = _load(OUT / stage / "results.json")
        if headline:
            sections += [f"## Time to accuracy against the recipes before ({stage})", "", f"`{headline['command']}`"]
            sections += ["", *targets_table(headline), "", bench_table(headline, "train"), ""]
    for stage, title in (("ablations", "Each technique on and off (one change at a time over fashion-fast)"),
                         ("ablations-optimizer", "Muon off (the same base as the ablations, run apart)"),
                         ("auto", "precision/channels_last: auto beside the fixed choices"),
                         ("widths", "The default net's arithmetic efficiency by width (bf16)")):  # fmt: skip
        results = _load(OUT / stage / "results.json")
        if results:
            sections += [f"## {title}", "", f"`{results['command']}`", "", bench_table(results, "train"), ""]
            sections += auto_lines(results) if stage == "auto" else []
    seeds = [r for name in HEADLINE if (r := _load(OUT / "seeds" / name / "results.json"))]
    if seeds:
        sections += [
            "## Headline accuracies over seeds",
            "",
            "| recipe | seeds | test accuracy, mean ± std | min–max | runs reaching |",
            "|" + " --- |" * 5,
        ]
        sections += [seed_line(r) for r in seeds] + [""]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(sections))
    print(f"written: {DOC}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stages = ["headline", "headline94", "ablations", "auto", "widths", "seeds", "report"]
    parser.add_argument("stage", choices=stages)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny subset, 1 epoch, 1 repeat")
    parser.add_argument("--recipes", default=",".join(HEADLINE), help="seeds: the recipes, comma-separated")
    parser.add_argument("--threads", type=int, help="ablations, auto, widths: train.threads of every run")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    if args.threads:
        EXTRA.append(f"train.threads={args.threads}")
    if args.stage == "report":
        stage_report()
    elif args.stage == "seeds":
        stage_seeds(2 if args.quick else args.seeds, args.quick, args.recipes.split(","))
    else:
        globals()[f"stage_{args.stage}"](repeats, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
