"""``demo-data``: the offline multi-domain digits image set of the quick start."""

from __future__ import annotations

from pathlib import Path

import typer

from fedalign.cli.app import command, err


@command("demo-data", epilog="Example: fedalign demo-data images/ --per-domain 200 --size 32")
def demo_data_cmd(
    output: Path = typer.Argument(..., help="Folder to create: OUTPUT/<domain>/<digit>/<i>.png."),
    per_domain: int = typer.Option(200, help="Images per domain (≤ 599)."),
    size: int = typer.Option(32, help="Image side in pixels."),
    seed: int = typer.Option(0, help="Split and style seed."),
):
    """Render scikit-learn's bundled digits in three visual styles (ink, neon, blocky).

    No download: three ImageFolder domains with a real covariate shift, for trying the
    pipelines offline.
    """
    from fedalign.demo import make_digit_domains
    from fedalign.errors import FedalignError

    if output.exists() and any(output.iterdir()):
        raise FedalignError(f"{output} exists and is not empty")
    try:
        counts = make_digit_domains(output, per_domain, size, seed)
    except ValueError as e:
        raise FedalignError(str(e)) from None
    err.print("demo-data: " + ", ".join(f"{d} {n}" for d, n in counts.items()) + f" images → {output}")
