"""`hasten data`: fetch a dataset, show what is on disk, or write it out as an image folder."""

from __future__ import annotations

import argparse
import json

from hasten.cli.command import Command, arg
from hasten.errors import HastenError


def cmd_data(ns: argparse.Namespace) -> int:
    from hasten.data import fetch, info

    if ns.action != "make-folder" and (ns.out or ns.size or ns.rgb is not None or ns.limit):
        raise HastenError(f"data {ns.action}: OUT, --size, --rgb and --limit belong to 'data make-folder'")
    from hasten.data.preprocessing import MAX_IMAGE_SIDE

    if ns.size is not None and not 1 <= ns.size <= MAX_IMAGE_SIDE:
        raise HastenError(f"--size {ns.size}: a side of 1 to {MAX_IMAGE_SIDE} pixels")
    if ns.limit is not None and ns.limit < 1:
        raise HastenError(f"--limit {ns.limit}: at least 1 image of each split")
    if ns.action == "fetch":
        print(fetch(ns.name, ns.root))
    elif ns.action == "make-folder":
        from hasten.data.makefolder import make_folder

        if not ns.out:
            raise HastenError("data make-folder: give the output folder: hasten data make-folder fashion-mnist OUT")
        counts = make_folder(ns.name, ns.out, root=ns.root, size=ns.size, rgb=ns.rgb, limit=ns.limit)
        print(f"wrote {counts['train']} training and {counts['val']} validation images into {ns.out}/train and /val")
    else:
        print(json.dumps(info(ns.name, ns.root), indent=2, default=str))
    return 0


DATA = Command(
    name="data",
    summary="fetch a dataset, show what is on disk, or write it as an image folder",
    description="Fetch a dataset, show what is on disk, or write it as an image folder "
    "(make-folder: OUT/train/<class>/*.png and OUT/val/<class>/*.png).",
    arguments=(
        arg("action", choices=["fetch", "info", "make-folder"]),
        arg("name", help="dataset name, e.g. fashion-mnist"),
        arg("out", nargs="?", help="make-folder: the folder to write"),
        arg("--root", help="folder that holds (or will hold) the dataset's files"),
        arg("--size", type=int, help="make-folder: resize images to SIZE x SIZE pixels"),
        arg(
            "--rgb",
            action=argparse.BooleanOptionalAction,
            help="make-folder: 3 channels (--no-rgb: 1); default: as stored",
        ),
        arg("--limit", type=int, help="make-folder: at most the first N images of each split"),
    ),
    run=cmd_data,
)
