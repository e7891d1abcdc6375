"""``stats``, ``barycenter`` and ``align``: the SLOT-Align pipeline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign.cli.app import command, err, guard_outputs, progress_bar


@command("stats", outputs=("output",), epilog="Example: fedalign stats client3.h5 -o client3.stats.npz --per-class")
def stats_cmd(
    features: Path = typer.Argument(..., help="Features file (.h5)."),
    output: Path = typer.Option(..., "-o", "--output", help="Stats file to write (.npz)."),
    shrinkage: str = typer.Option("auto", help="auto (Ledoit–Wolf), none, or a value in [0, 1]."),
    per_class: bool = typer.Option(False, "--per-class", help="Also store class counts and class sums."),
    chunk_rows: int = typer.Option(8192, min=1, help="Rows read per chunk (memory ∝ chunk_rows·d + d²)."),
):
    """Mean and Ledoit–Wolf shrunk covariance of a features file, in one streaming pass.

    The file holds aggregates only (counts, sums, moments), never per-sample rows.
    """
    from fedalign.files import open_features, sha256_file
    from fedalign.stats import compute_stats, parse_shrinkage, save_stats

    shr = parse_shrinkage(shrinkage)
    with open_features(features) as ff:
        n = ff.n
    t0 = time.perf_counter()
    with progress_bar(n, f"stats {features.name}") as bar:
        st = compute_stats(features, shr, per_class, chunk_rows, progress=bar)
    meta = dict(producer="fedalign stats", source=str(features), source_sha256=sha256_file(features),
                shrinkage_option=str(shrinkage), class_names=st.class_names)
    save_stats(output, st, meta)
    err.print(f"stats: n={st.n} d={st.d} shrinkage={st.shrinkage:.4g} "
              f"({time.perf_counter() - t0:.2f}s) → {output}")


@command("barycenter", outputs=("output",),
         epilog="Example: fedalign barycenter c0.stats.npz c1.stats.npz c2.stats.npz -o ref.npz")
def barycenter_cmd(
    stats: List[Path] = typer.Argument(..., help="Client stats files (.npz)."),
    output: Path = typer.Option(..., "-o", "--output", help="Reference file to write (.npz)."),
    weights: str = typer.Option("samples", help="samples (w_k = n_k/N) or uniform."),
    tol: float = typer.Option(1e-10, min=0.0, help="Relative tolerance of the fixed point."),
    max_iter: int = typer.Option(100, min=1, help="Maximum fixed-point iterations."),
):
    """Bures–Wasserstein barycenter of client Gaussians (the SLOT-Align reference).

    Fixed point of Álvarez-Esteban et al. (2016) in float64; the convergence record
    (iterations, relative change, residual ‖Σ w_k A_k⁻¹ − I‖) is stored and printed.
    """
    from fedalign.align import make_reference, save_reference
    from fedalign.files import sha256_file
    from fedalign.stats import load_stats

    sts = [load_stats(p) for p in stats]
    t0 = time.perf_counter()
    ref = make_reference(sts, weights, tol=tol, max_iter=max_iter)
    c = ref.meta["convergence"]
    save_reference(output, ref, dict(producer="fedalign barycenter",
                                     sources=[str(p) for p in stats],
                                     source_sha256=[sha256_file(p) for p in stats]))
    status = "converged" if c["converged"] else "NOT converged"
    err.print(f"barycenter: K={len(sts)} d={ref.d} {status} in {c['iterations']} iterations, "
              f"rel. change {c['rel_change']:.2e}, residual {c['residual']:.2e} "
              f"({time.perf_counter() - t0:.2f}s) → {output}")


@command("align", outputs=("output", "save_map"), epilog="Example: fedalign align --tau 0.5 client3.h5 ref.npz -o client3.aligned.h5\n\n"
                          "Test features with the training map: fedalign align --map c3.map.npz --tau 0.5 test3.h5 -o test3.aligned.h5")
def align_cmd(
    features: Path = typer.Argument(..., help="Client features file (.h5)."),
    reference: Optional[Path] = typer.Argument(None, help="Reference file from `barycenter` (not needed with --map)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Aligned features (default: <input>.aligned.h5)."),
    tau: float = typer.Option(0.4, help="Geodesic time τ ∈ [0, 1]: 0 keeps features, 1 maps fully onto the reference."),
    stats: Optional[Path] = typer.Option(None, help="Client stats file (default: computed from FEATURES)."),
    save_map: Optional[Path] = typer.Option(None, "--save-map", help="Also write the client map (.npz)."),
    map_file: Optional[Path] = typer.Option(None, "--map", help="Use a saved client map instead of a reference."),
    chunk_rows: int = typer.Option(8192, min=1, help="Rows per streamed chunk."),
):
    """Move features along the W2 geodesic towards the reference: T_τ(z) = (1−τ)z + τ(A z + b).

    A = Σ_b^{1/2}(Σ_b^{1/2} Σ_k Σ_b^{1/2})^{-1/2} Σ_b^{1/2}, b = μ_b − A μ_k, built from the
    client's own statistics. Protocol: map each domain's test features with that domain's
    client map (--save-map on the training file, --map on the test file) at the same τ.
    """
    from fedalign.align import align_file, client_map, load_map, load_reference, save_map as _save_map
    from fedalign.errors import FedalignError
    from fedalign.files import open_features
    from fedalign.gaussian import check_tau
    from fedalign.stats import compute_stats, load_stats

    check_tau(tau)
    if output is None:
        output = features.with_name(features.stem + ".aligned.h5")
        guard_outputs([features, reference, stats, map_file], [output, save_map])
    if map_file is not None:
        amap = load_map(map_file)
        ref_hash = amap.meta.get("reference_sha256")
    else:
        if reference is None:
            raise FedalignError("give a reference file (from `fedalign barycenter`) or --map")
        ref = load_reference(reference)
        st = load_stats(stats) if stats is not None else compute_stats(features)
        amap = client_map(st, ref)
        ref_hash = ref.meta["sha256"]
    with open_features(features) as ff:
        n = ff.n
    t0 = time.perf_counter()
    with progress_bar(n, f"align {features.name}") as bar:
        align_file(features, output, amap, tau, chunk_rows,
                   provenance=dict(reference_sha256=ref_hash), progress=bar)
    if save_map is not None:
        _save_map(save_map, amap)
    err.print(f"align: n={n} τ={tau} ({time.perf_counter() - t0:.2f}s) → {output}")
