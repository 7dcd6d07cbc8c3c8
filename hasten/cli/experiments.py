"""The commands that train a recipe many times and report on the whole: `hasten bench` (variants side by side),
`hasten sweep` (a grid of values), `hasten transfer` (pretrain, then fine-tune) and `hasten gan` (a DCGAN)."""

from __future__ import annotations

import argparse

from hasten.cli.command import RECIPE_ARGUMENTS, TRUST_HELP, Command, arg, recipe_of, show, split_recipe
from hasten.errors import HastenError


def cmd_bench(ns: argparse.Namespace) -> int:
    recipe = recipe_of(ns)
    if ns.repeats < 1 or (ns.naive_epochs is not None and ns.naive_epochs < 1):
        raise HastenError("bench: --repeats and --naive-epochs must be at least 1")
    from hasten.experiments.bench import bench, plan_variants
    from hasten.experiments.report import bench_table

    variants = plan_variants(recipe, ns.vary, ns.ablate, naive=not ns.no_naive, also=ns.also)
    results, files = bench(
        recipe,
        variants,
        ns.repeats,
        ns.out,
        warmup=not ns.no_warmup,
        isolate=not ns.in_process,
        naive_epochs=ns.naive_epochs,
        command=ns.command_line,
    )
    print(bench_table(results))
    print(f"\nwritten: {', '.join(str(f) for f in files)}")
    failed = [f"{v['name']} r{r['repeat']}" for v in results["variants"] for r in v["runs"] if "error" in r]
    if failed:
        raise HastenError(f"bench: {len(failed)} run(s) failed ({', '.join(failed)}); see report.md for why")
    return 0


BENCH = Command(
    name="bench",
    summary="train variants of a recipe side by side (and the naive loop): time-to-accuracy, speed, memory",
    description="Train variants of RECIPE side by side, after a warm-up, interleaved over --repeats, each "
    "in its own process, beside the naive textbook loop; write results.csv, results.json, report.md and "
    "plots to --out. E.g. 'hasten bench fashion-fast --vary precision=fp32,bf16 --repeats 3'.",
    arguments=(
        RECIPE_ARGUMENTS,
        arg(
            "--vary",
            action="append",
            default=[],
            metavar="KEY=V1,V2",
            help="values to compare (repeatable): every combination is run, or one change at a time with --ablate",
        ),
        arg(
            "--ablate",
            action="store_true",
            help="the recipe, then one change at a time: the --vary values, or else each technique switched off",
        ),
        arg(
            "--also",
            action="append",
            default=[],
            metavar="RECIPE",
            help="another recipe (name or YAML) to run beside, e.g. --also fashion-94 (repeatable)",
        ),
        arg("--repeats", type=int, default=3, help="runs of each variant (default 3)"),
        arg("--out", metavar="DIR", help="output folder (default: bench/<recipe name>)"),
        arg("--naive-epochs", type=int, metavar="N", help="epochs of the naive loop (default: the recipe's)"),
        arg("--no-naive", action="store_true", help="leave out the naive loop"),
        arg("--no-warmup", action="store_true", help="skip the warm-up run"),
        arg(
            "--in-process",
            action="store_true",
            help="run everything in this process: faster to start, but CPU peak memory only grows from run to run",
        ),
    ),
    run=cmd_bench,
)


def cmd_sweep(ns: argparse.Namespace) -> int:
    recipe = recipe_of(ns)
    from hasten.experiments.sweep import sweep

    rows, files = sweep(recipe, ns.vary, ns.out, isolate=not ns.in_process, command=ns.command_line)
    print(files[0].read_text())
    print(f"written: {', '.join(str(f) for f in files)}")
    failed = [row["name"] for row in rows if "error" in row]
    if failed:  # as bench: a grid point without a result is not a finished sweep
        raise HastenError(
            f"sweep: {len(failed)} of {len(rows)} run(s) failed ({', '.join(failed)}); see sweep.md for why"
        )
    return 0


SWEEP = Command(
    name="sweep",
    summary="train a recipe over a grid of values (model width, ...): train and test error table and plots",
    description="Train RECIPE once per point of a grid and write sweep.md (table), results.json/csv and "
    "plots of train and test error against the first varied key and against epochs to --out. E.g. "
    "'hasten sweep double-descent --vary model.width=1,2,4,8,16,32,64' (Nakkiran et al., 2019).",
    arguments=(
        RECIPE_ARGUMENTS,
        arg("--vary", action="append", default=[], metavar="KEY=V1,V2", help="values to sweep (repeatable: a grid)"),
        arg("--out", metavar="DIR", help="output folder (default: the recipe's run folder)"),
        arg("--in-process", action="store_true", help="run everything in this process (faster to start)"),
    ),
    run=cmd_sweep,
)


def cmd_transfer(ns: argparse.Namespace) -> int:
    recipe = recipe_of(ns)
    try:
        seeds = [int(s) for s in ns.seeds.split(",")] if ns.seeds else None
    except ValueError:
        raise HastenError(f"--seeds {ns.seeds!r}: whole numbers separated by commas, e.g. --seeds 0,1,2") from None
    from hasten.experiments.transfer import transfer

    _, files = transfer(recipe, ns.out, seeds=seeds, isolate=not ns.in_process, command=ns.command_line)
    print(files[0].read_text())
    print(f"written: {', '.join(str(f) for f in files)}")
    return 0


TRANSFER = Command(
    name="transfer",
    summary="pretrain, then fine-tune on N images per class beside training from scratch: table and plot",
    description="Pretrain with RECIPE's transfer.pretrain overrides (or take its model.pretrained), then "
    "fine-tune on each size of transfer.per_class beside training from scratch on the same budget; write "
    "transfer.md, transfer.png and results.json/csv to --out. E.g. 'hasten transfer transfer-digits'.",
    arguments=(
        RECIPE_ARGUMENTS,
        arg("--seeds", metavar="S1,S2", help="seeds to repeat each run with (default: the recipe's)"),
        arg("--out", metavar="DIR", help="output folder (default: the recipe's run folder)"),
        arg("--in-process", action="store_true", help="run everything in this process"),
    ),
    run=cmd_transfer,
)


def cmd_gan(ns: argparse.Namespace) -> int:
    from hasten.recipe.gan import load_gan_recipe

    source, overrides = split_recipe(ns.args)
    recipe = load_gan_recipe(source, overrides)  # recipe errors show before torch and the data are loaded
    from hasten.experiments.gan import train_gan
    from hasten.experiments.gan_report import results_table as gan_results_table

    show(train_gan(recipe, trust_code=ns.trust_code), recipe.run.progress, gan_results_table)
    return 0


GAN = Command(
    name="gan",
    summary="train a DCGAN (fp32, bf16, fp16): sample grids, Fréchet distance on hasten classifier features",
    description="Train the DCGAN of RECIPE (default: dcgan-fashion) with dotted key=value overrides, e.g. "
    "'hasten gan dcgan-fashion precision=fp16 train.epochs=2'. Writes a sample grid per epoch, metrics.csv, "
    "TensorBoard events, checkpoints (resume=auto continues) and a Fréchet distance on features of a "
    "hasten classifier (not Inception FID).",
    arguments=(RECIPE_ARGUMENTS, arg("--trust-code", action="store_true", help="quality.classifier: " + TRUST_HELP)),
    run=cmd_gan,
    resumable=True,
)
