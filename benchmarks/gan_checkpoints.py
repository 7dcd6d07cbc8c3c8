"""Sample quality of every checkpoint of a `hasten gan` run: the Fréchet distance on hasten classifier features
and the class mix of the generated samples, per checkpoint (one per epoch with `run.keep` at least the epochs).

    .venv/bin/python benchmarks/gan_checkpoints.py runs/gan-diag --classifier runs/clf/model.safetensors

Used to tell a short budget from a broken recipe (docs/gan.md): runs trained with `quality.enabled=false` and a
large `run.keep` are measured afterwards with one classifier, on the same noise and real images as `hasten gan`
measures them (quality.samples of each, the probe of hasten/experiments/frechet.py). Prints one line per
checkpoint and writes RUN/checkpoint_quality.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console

from hasten.experiments.frechet import quality_probe
from hasten.experiments.gan import build_gan
from hasten.experiments.gan_report import collapse_warning, generate, largest_class
from hasten.recipe.gan import GanRecipe
from hasten.runfolder.checkpoint import checkpoints_in, load_checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a `hasten gan` run folder (with checkpoints/)")
    parser.add_argument("--classifier", required=True, help="weights of the quality classifier")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    paths = sorted(checkpoints_in(args.run / "checkpoints"), key=lambda p: int(p.stem.split("-")[1]))
    if not paths:
        print(f"{args.run}: no checkpoints", file=sys.stderr)
        return 2
    saved = load_checkpoint(paths[0])["recipe"]
    saved["quality"] |= {"enabled": True, "classifier": args.classifier, "samples": args.samples}
    recipe = GanRecipe.model_validate(saved)
    parts = build_gan(recipe)
    probe = quality_probe(recipe, parts.data, parts.device, args.run, Console(stderr=True))
    rows = []
    for path in paths:
        checkpoint = load_checkpoint(path)
        parts.generator.load_state_dict(checkpoint["generator"])
        frechet, mix = probe.measure(generate(parts.generator, probe.noise))
        name, share = largest_class(mix)
        state = checkpoint["state"]
        row = {"epoch": state["epoch"], "step": state["step"], "frechet": round(frechet, 2), "largest_class": name}
        rows.append(row | {"largest_share": share, "classes_present": sum(v > 0 for v in mix.values()), "mix": mix})
        warning = collapse_warning(mix, recipe.quality.collapse_share)
        print(
            f"epoch {row['epoch']:>3} step {row['step']:>5}  Fréchet {frechet:7.2f}  largest {name} {share:.0%}  "
            f"classes {rows[-1]['classes_present']}{'  ' + warning if warning else ''}",
            flush=True,
        )
    out = {"run": str(args.run), "quality": probe.info, "checkpoints": rows}
    (args.run / "checkpoint_quality.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
