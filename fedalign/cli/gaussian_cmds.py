"""``stats``, ``barycenter`` and ``align``: the SLOT-Align pipeline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from fedalign import defaults

from fedalign.cli.app import command
from fedalign.cli.console import err, progress_bar
from fedalign.cli.options import (choice_option, chunk_rows_option, output_option, parse_shrinkage,
                                  tau_option)
from fedalign.cli.runtime import guard_outputs


def _backend_option():
    return choice_option("numpy", "--backend", "fedalign.backend:BACKENDS",
                         "numpy (default) or torch: where the arithmetic runs (same results, "
                         "float64 moments and matrix functions).")


def _device_option():
    return typer.Option("cpu", help="cpu (default), cuda, cuda:N (imply --backend torch) or "
                        "auto (a GPU if torch sees one).")


def _compute(backend: str, device: str):
    """The backend adapter (validated before any file is read: a bad device is exit 2)."""
    from fedalign.backend import get_backend

    if str(device).lower().startswith("cuda"):
        backend = "torch"
    return get_backend(backend, device)


@command("stats", outputs=("output",), epilog="Example: fedalign stats client3.h5 -o client3.stats.npz --per-class")
def stats_cmd(
    features: Path = typer.Argument(..., help="Features file (.h5)."),
    output: Path = output_option("Stats file to write (.npz)."),
    shrinkage: str = typer.Option("auto", help="auto (Ledoit–Wolf), none, or a value in [0, 1]."),
    per_class: bool = typer.Option(False, "--per-class", help="Also store class counts and class sums."),
    chunk_rows: int = chunk_rows_option("Rows read per chunk (memory ∝ chunk_rows·d + d²)."),
    backend: str = _backend_option(),
    device: str = _device_option(),
    dp_epsilon: Optional[float] = typer.Option(None, "--dp-epsilon", help="Release the statistics with (ε, δ)-differential privacy (add/remove one row): rows clipped to --clip, Gaussian noise on the count, Σx and Σxxᵀ."),
    dp_delta: Optional[float] = typer.Option(None, "--dp-delta", help="δ of the DP release, in (0, 1)."),
    clip: Optional[float] = typer.Option(None, "--clip", help="L2 norm C every row is clipped to for the DP release (> 0)."),
    dp_mechanism: str = choice_option("analytic", "--dp-mechanism", "fedalign.dp.calibration:MECHANISMS", "analytic (Balle & Wang's exact calibration, default) or zcdp (ρ-zCDP, standard conversion to (ε, δ))."),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, max=defaults.MAX_SEED, help="Seed of the DP noise (reproducible, so not secret: for tests). Default: fresh from the OS."),
    compact: bool = typer.Option(False, "--compact", help="Store the symmetric matrices once, as their upper triangles (format_version 2: half the bytes, exact). Example: fedalign stats c3.h5 -o c3.stats.npz --compact"),
    dtype: str = choice_option("float64", "--dtype", "fedalign.files.schemas:PACKED_DTYPES", "float64 (default) or float32 storage of the matrices (implies --compact: a quarter of the bytes; readers compute in float64; a domain map of several clients, align --stats … --stats …, refuses float32 files)."),
):
    """Mean and Ledoit–Wolf shrunk covariance of a features file, in one streaming pass.

    The file holds aggregates only (counts, sums, moments), never per-sample rows. With
    --dp-epsilon/--dp-delta/--clip it is a differentially private release instead (fedalign.dp):
    the noisy count, Σx and Σxxᵀ, a covariance post-processed from them (PSD projection and a
    shrinkage rule that needs no fourth moment), and the release record (mechanism, ε, δ, C,
    each σ, the clipped fraction) in its metadata; barycenter and align carry it forward.
    """
    from fedalign.files import open_features, sha256_file
    from fedalign.stats import compute_stats, save_stats

    from fedalign.align import stats_digest

    from fedalign.errors import FedalignError
    from fedalign.files import PACKED_DTYPES

    if dtype not in PACKED_DTYPES:
        raise FedalignError(f"--dtype must be {' or '.join(PACKED_DTYPES)}, got {dtype!r}")
    spec = _dp_spec(dp_epsilon, dp_delta, clip, dp_mechanism, seed, per_class, shrinkage)
    shr = parse_shrinkage(shrinkage)
    bk = _compute(backend, device)
    with open_features(features) as ff:
        n = ff.n
        client, domain = _owner_of(features, ff.provenance)
    t0 = time.perf_counter()
    if spec is not None:
        from fedalign.dp import noise_rng, release_stats_of_file

        with progress_bar(n, f"stats {features.name} (DP)") as bar:
            st = release_stats_of_file(features, spec, noise_rng(seed), shr, chunk_rows, progress=bar,
                                       backend=None if not bk.is_torch else bk)
        st.dp.update(noise_seed="given (--seed): reproducible, so the noise is not secret"
                     if seed is not None else "fresh from the OS, not recorded")
        # no source_sha256: a digest of the private rows is not a DP release
        meta = dict(producer="fedalign stats", source=str(features), shrinkage_option=str(shrinkage),
                    class_names=st.class_names, client=client, domain=domain,
                    stats_sha256=stats_digest(st), dp=st.dp)
    else:
        with progress_bar(n, f"stats {features.name}") as bar:
            st = compute_stats(features, shr, per_class, chunk_rows, progress=bar, backend=bk)
        meta = dict(producer="fedalign stats", source=str(features), source_sha256=sha256_file(features),
                    shrinkage_option=str(shrinkage), class_names=st.class_names, client=client,
                    domain=domain, stats_sha256=stats_digest(st))
    if bk.record():
        meta["compute"] = bk.record()
    save_stats(output, st, meta, compact=compact, dtype=dtype)
    dp_note = ""
    if spec is not None:
        g = st.dp["guarantee"]
        dp_note = (f" DP {spec.mechanism} ε={spec.epsilon:g} δ={spec.delta:g} C={spec.clip:g} "
                   f"(μ={g['mu']:.4g}), clipped {100 * st.dp['clipped_fraction']:.1f}% of rows;")
    n_txt = f"n={st.n}" if spec is None else f"n≈{st.n} (released with noise)"
    err.print(f"stats: {n_txt} d={st.d} shrinkage={st.shrinkage:.4g}{dp_note} "
              f"({time.perf_counter() - t0:.2f}s{_on(bk)}) → {output}")


def _dp_spec(epsilon, delta, clip, mechanism, seed, per_class, shrinkage):
    """The DP budget of ``stats`` (None without --dp-epsilon), or one error line for options
    that cannot be honoured together."""
    from fedalign.errors import FedalignError

    if epsilon is None:
        given = [f for f, v in (("--dp-delta", delta), ("--clip", clip), ("--seed", seed)) if v is not None]
        if given:
            raise FedalignError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for a DP "
                                "release: also give --dp-epsilon")
        return None
    if per_class:
        raise FedalignError("--per-class cannot be honoured with --dp-epsilon: class counts and sums "
                            "are not released with DP by stats (a DP FedCGS message is "
                            "evaluate --param fedcgs.dp_epsilon=…)")
    if delta is None or clip is None:
        raise FedalignError("--dp-epsilon needs --dp-delta and --clip (the L2 norm rows are clipped to)")
    from fedalign.dp import check_shrinkage, make_spec

    spec = make_spec(epsilon, delta, clip, mechanism, dict(
        epsilon="--dp-epsilon", delta="--dp-delta", clip="--clip", mechanism="--dp-mechanism"))
    check_shrinkage(parse_shrinkage(shrinkage), "--shrinkage")
    return spec


def _owner_of(path: Path, provenance: dict) -> tuple:
    """(client, domain) of a features file: its provenance (``partition`` records both), else
    no client and the file-name stem as the domain (as ``evaluate`` reads it)."""
    client = provenance.get("client")
    domain = provenance.get("domain") or Path(path).name.split(".")[0]
    return (None if client is None else str(client)), str(domain)


def _stats_meta(path: Path) -> dict:
    """The metadata of a stats file, read and validated (a broken file is one error)."""
    from fedalign.files import read_npz

    return read_npz(path, "stats")[1]


def _domain_map(stats, ref, load_stats, domain_map):
    """The domain map of several clients' stats files (all of one domain, owners recorded)."""
    from fedalign.errors import FedalignError

    metas = [_stats_meta(p) for p in stats]
    for p, m in zip(stats, metas):
        if m.get("domain") is None or m.get("client") is None:
            raise FedalignError(f"{p}: the stats file does not record its client and domain "
                                "(recompute it with `fedalign stats` on a partition file)")
    doms = sorted({m["domain"] for m in metas})
    if len(doms) > 1:
        raise FedalignError(f"a domain map pools the clients of one domain; the stats come from "
                            f"domains {', '.join(doms)}")
    sts = [load_stats(p) for p in stats]
    for p, st in zip(stats, sts):
        st.require_float64(p, "a domain map (its clients' moment sums pooled, Ledoit–Wolf's "
                              "fourth-moment algebra recomputed on them)")
    return domain_map(sts, ref, doms[0], [m["client"] for m in metas])


@command("barycenter", outputs=("output",),
         epilog="Example: fedalign barycenter c0.stats.npz c1.stats.npz c2.stats.npz -o ref.npz")
def barycenter_cmd(
    stats: List[Path] = typer.Argument(..., help="Client stats files (.npz)."),
    output: Path = output_option("Reference file to write (.npz)."),
    weights: str = choice_option("samples", "--weights", ("samples", "uniform"), "samples (w_k = n_k/N) or uniform."),
    tol: float = typer.Option(1e-10, min=0.0, help="Relative tolerance of the fixed point."),
    max_iter: int = typer.Option(100, min=1, help="Maximum fixed-point iterations."),
    strict: bool = typer.Option(False, "--strict", help="A barycenter that does not converge is an error (exit 2, nothing written)."),
    storage: str = choice_option("auto", "--storage", ("auto", "factored", "dense"),
                                 "How the server holds the clients' covariances: factored "
                                 "(c·I + W Wᵀ, exact, for clients with fewer rows than d/2: "
                                 "memory K·d·n instead of K·d²), dense, or auto (factored when "
                                 "K dense matrices would take over 1 GiB)."),
    backend: str = _backend_option(),
    device: str = _device_option(),
):
    """Bures–Wasserstein barycenter of client Gaussians (the SLOT-Align reference).

    Fixed point of Álvarez-Esteban et al. (2016) in float64; the convergence record
    (iterations, relative change, residual ‖Σ w_k A_k⁻¹ − I‖) is stored and printed.
    Every file's header is checked before any is read (a file of another dimension or
    version is the error); clients with identical statistics count once, with their weights
    summed.
    """
    from fedalign.align import load_client_stats, make_reference, save_reference

    bk = _compute(backend, device)
    t0 = time.perf_counter()
    with progress_bar(len(stats), f"reading {len(stats)} stats files", unit="files") as bar:
        clients = load_client_stats(stats, storage, progress=bar)
    sts = [c.stats for c in clients]
    with progress_bar(None, f"barycenter K={len(sts)} d={sts[0].d}", unit="iterations") as bar:
        ref = make_reference(sts, weights, tol=tol, max_iter=max_iter, backend=bk,
                             progress=lambda it, rel, res: bar.update(
                                 completed=it, note=f"residual {res:.1e} (tol {tol:g})"))
    c = ref.meta["convergence"]
    if not c["converged"]:
        from fedalign.errors import FedalignError

        why = (f"barycenter did not converge in {c['iterations']} iterations (rel. change "
               f"{c['rel_change']:.2e} > tol {tol:g})")
        if strict:
            raise FedalignError(f"{why}; raise --max-iter or --tol, or drop --strict")
        err.print(f"warning: {why}; the reference records converged = false")
    from fedalign.dp import reference_inputs

    extra = dict(producer="fedalign barycenter", sources=[str(p) for p in stats],
                 source_sha256=[c.sha256 for c in clients])
    dp_inputs = reference_inputs([c.meta for c in clients], [c.digest for c in clients])
    if dp_inputs is not None:
        extra["dp_inputs"] = dp_inputs  # each input's DP record (None: exact statistics)
    save_reference(output, ref, extra)
    status = "converged" if c["converged"] else "NOT converged"
    n_dp = "" if dp_inputs is None else f", {sum(e['dp'] is not None for e in dp_inputs)} DP inputs"
    err.print(f"barycenter: K={len(sts)}{n_dp} d={ref.d} {status} in {c['iterations']} iterations, "
              f"rel. change {c['rel_change']:.2e}, residual {c['residual']:.2e} "
              f"({time.perf_counter() - t0:.2f}s{_on(bk)}) → {output}")


@command("target-reference", outputs=("output",),
         epilog="Example: fedalign target-reference target.h5 s1.stats.npz s2.stats.npz -o ref.npz\n\n"
                "Each source first: fedalign stats s1.h5 -o s1.stats.npz --per-class; then: "
                "fedalign align s1.h5 ref.npz --tau 1 -o s1.to_target.h5")
def target_reference_cmd(
    features: Path = typer.Argument(..., help="The target's features file (.h5; labels unused)."),
    stats: List[Path] = typer.Argument(..., help="The sources' stats files, written with --per-class."),
    output: Path = output_option("Reference file to write (.npz)."),
):
    """The target's Gaussian as the reference, completed by the classes the target lacks.

    SLOT toward the target (every source mapped onto the target's mean and Ledoit–Wolf
    covariance with `align --tau 1`) squeezes the sources' classes that the target does not
    hold into the region of those it holds. This reference estimates the target's class
    priors (Saerens' EM on an LDA of the sources' class statistics); each class that looks
    absent is put where the sources hold it, moved by the shift the present classes show, and
    the mixture's Gaussian is the reference. Nothing absent: the target's own Gaussian.
    Messages: the sources' class counts, class sums, Σx and Σxxᵀ (their --per-class stats);
    the target's rows stay with it. Formulas: `fedalign.label_shift`.
    """
    from fedalign.align import save_reference
    from fedalign.files import sha256_file
    from fedalign.label_shift import reference_from_files

    ref, rec = reference_from_files(features, list(stats))
    extra = dict(producer="fedalign target-reference", target=str(features),
                 sources=[str(p) for p in stats], source_sha256=[sha256_file(p) for p in stats])
    save_reference(output, ref, extra)
    absent = ", ".join(map(str, rec["absent"])) or "none"
    err.print(f"target-reference: d={ref.d}, classes absent from the target: {absent} "
              f"(EM {rec['iterations']} iterations) → {output}")


@command("align", outputs=("output", "save_map"), epilog="Example: fedalign align --tau 0.5 client3.h5 ref.npz -o client3.aligned.h5\n\n"
                          "Test features with the training map: fedalign align --map c3.map.npz --tau 0.5 test3.h5 -o test3.aligned.h5")
def align_cmd(
    features: Path = typer.Argument(..., help="Client features file (.h5)."),
    reference: Optional[Path] = typer.Argument(None, help="Reference file from `barycenter` (not needed with --map)."),
    output: Optional[Path] = output_option("Aligned features (default: <input>.aligned.h5).", required=False),
    tau: float = tau_option(),
    stats: Optional[List[Path]] = typer.Option(None, "--stats", help="Client stats file (default: computed from FEATURES). Repeat it with the stats of every client of one domain to build that domain's map from their pooled statistics (the rule for a domain's test split with several clients per domain)."),
    save_map: Optional[Path] = typer.Option(None, "--save-map", help="Also write the client map (.npz)."),
    map_file: Optional[Path] = typer.Option(None, "--map", help="Use a saved client map instead of a reference."),
    chunk_rows: int = chunk_rows_option("Rows per streamed chunk."),
    backend: str = _backend_option(),
    device: str = _device_option(),
):
    """Move features along the W2 geodesic towards the reference: T_τ(z) = (1−τ)z + τ(A z + b).

    A = Σ_b^{1/2}(Σ_b^{1/2} Σ_k Σ_b^{1/2})^{-1/2} Σ_b^{1/2}, b = μ_b − A μ_k, built from the
    client's own statistics. Protocol: map each domain's test features with that domain's
    client map (--save-map on the training file, --map on the test file) at the same τ; with
    several clients per domain, with the domain map (--stats of each of its clients). The map
    and the aligned file record whose map it is (client, or domain and its clients) and the
    statistics' digest; evaluate refuses a test file mapped with another domain's map.

    DP: without --stats a client maps its rows with its exact statistics (they never leave it);
    with --stats client.dp.npz the map is built from its released statistics, which a DP head
    message sent afterwards needs for its guarantee to hold (evaluate's privacy report says
    which case applies). The map and the aligned file carry the DP records forward.
    """
    from fedalign.align import (align_file, client_map, domain_map, load_map, load_reference,
                                map_provenance, save_map as _save_map)
    from fedalign.errors import FedalignError
    from fedalign.files import open_features
    from fedalign.stats import compute_stats, load_stats

    t0 = time.perf_counter()
    bk = _compute(backend, device)
    stats = list(stats or [])
    if output is None:
        output = features.with_name(features.stem + ".aligned.h5")
        guard_outputs([features, reference, map_file, *stats], [output, save_map])
    with open_features(features) as ff:
        own_client, own_domain = _owner_of(features, ff.provenance)
    if map_file is not None:
        if reference is not None:  # the map would be used, the reference silently ignored
            raise FedalignError(f"the reference {reference} and --map {map_file} exclude each "
                                "other (a saved map already holds its reference): give one")
        if stats:
            raise FedalignError("--map and --stats exclude each other (a saved map already holds its statistics)")
        amap = load_map(map_file)
        ref_hash = amap.meta.get("reference_sha256")
    else:
        if reference is None:
            raise FedalignError("give a reference file (from `fedalign barycenter`) or --map")
        ref = load_reference(reference)
        if len(stats) > 1:
            amap = _domain_map(stats, ref, load_stats,
                               lambda *a: domain_map(*a, backend=bk))
        elif stats:
            meta = _stats_meta(stats[0])
            amap = client_map(load_stats(stats[0]), ref, meta.get("client", own_client),
                              meta.get("domain", own_domain), backend=bk)
        else:
            with open_features(features) as ff:
                n = ff.n
            with progress_bar(n, f"stats {features.name} (no --stats given)") as bar:
                st = compute_stats(features, progress=bar, backend=bk)
            amap = client_map(st, ref, own_client, own_domain, backend=bk)
        ref_hash = ref.meta["sha256"]
    t_map = time.perf_counter() - t0
    with open_features(features) as ff:
        n = ff.n
    with progress_bar(n, f"align {features.name}") as bar:
        align_file(features, output, amap, tau, chunk_rows,
                   provenance=map_provenance(amap, ref_hash), progress=bar, backend=bk)
    if save_map is not None:
        _save_map(save_map, amap)
    err.print(f"align: n={n} τ={tau} ({time.perf_counter() - t0:.2f}s in all, "
              f"{t_map:.2f}s for the map{_on(bk)}) → {output}")


def _on(bk) -> str:
    return f", torch on {bk.device}" if bk.is_torch else ""
