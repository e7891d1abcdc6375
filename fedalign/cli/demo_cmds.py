"""``demo-data``: the offline multi-domain digits image set of the quick start."""

from __future__ import annotations

from pathlib import Path

import typer

from fedalign import defaults

from fedalign.cli.app import command
from fedalign.cli.console import err


@command("demo-data", folders=("output",), epilog="Example: fedalign demo-data images/ --per-domain 200 --size 32")
def demo_data_cmd(
    output: Path = typer.Argument(..., help="Folder to create: OUTPUT/<domain>/<digit>/<i>.png."),
    per_domain: int = typer.Option(200, min=1, help="Images per domain (≤ 599)."),
    size: int = typer.Option(32, min=8, help="Image side in pixels (≥ 8)."),
    seed: int = typer.Option(0, min=0, max=defaults.MAX_SEED, help="Split and style seed."),
):
    """Render scikit-learn's bundled digits in three visual styles (ink, neon, blocky).

    No download: three ImageFolder domains with a real covariate shift, for trying the
    pipelines offline.
    """
    from fedalign.demo import make_digit_domains
    from fedalign.errors import FedalignError
    from fedalign.files import atomic_output, make_output_folder

    if output.exists() and any(output.iterdir()):
        raise FedalignError(f"{output} exists and is not empty")
    make_output_folder(output.parent)
    with atomic_output(output, directory=True) as tree:  # the whole tree appears at the end
        counts = make_digit_domains(tree, per_domain, size, seed)
    err.print("demo-data: " + ", ".join(f"{d} {n}" for d, n in counts.items()) + f" images → {output}")
