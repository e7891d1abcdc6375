"""The reproduction recipes take a user's own features with one variable (DOMAINS=…).

examples/slot/Makefile (``FEATURES_DIR=… DOMAINS=…`` or ``DATASETS=mydata mydata_DOMAINS=…``)
and examples/dadil/Makefile (``lodo FEATURES_DIR=… DOMAINS=…``) are dry-run (``make -n``) on a
generated 3-domain features folder, and their scripts are run far enough to read every flag the
recipe gives them (a missing domain file stops them after parsing, before any work); the real
runs on the tiny folder are marked slow.
"""

import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import make_features

ROOT = Path(__file__).resolve().parents[1]
SLOT, DADIL = ROOT / "examples" / "slot", ROOT / "examples" / "dadil"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


@pytest.fixture
def mydata(tmp_path):
    """tmp_path/feats/mydata/{a,b,c}.h5: three small labeled domains."""
    folder = tmp_path / "feats" / "mydata"
    folder.mkdir(parents=True)
    for i, dom in enumerate("abc"):
        make_features(folder / f"{dom}.h5", n=90, d=6, seed=i, shift=0.5 * i)
    return folder


def make(folder, *args, dry=True, check=True):
    cmd = ["make", "--no-print-directory", "-C", str(folder)] + (["-n"] if dry else []) + list(args)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check:
        assert res.returncode == 0, res.stdout + res.stderr
    return res


def command_with(out: str, word: str) -> list:
    """The first dry-run command line containing ``word``, split into words."""
    text = out.replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if word in ln)
    return shlex.split(line)


def flag(words, name):
    i = words.index(name)
    vals = []
    for w in words[i + 1:]:
        if w.startswith("-"):
            break
        vals.append(w)
    return vals


def test_slot_recipe_takes_a_features_folder_and_domains(mydata, tmp_path):
    work = tmp_path / "work"
    own = make(SLOT, "results", f"FEATURES_DIR={mydata}/", "DOMAINS=a, b,c", f"WORK={work}")
    grid = command_with(own.stdout, "run_grid.py")
    assert flag(grid, "--features") == [str(mydata.parent)]
    assert flag(grid, "--datasets") == ["mydata"]
    assert flag(grid, "--domains") == ["mydata=a,b,c"]
    assert flag(grid, "-o") == [str(work / "grid")]
    results = command_with(own.stdout, "make_results.py")
    assert flag(results, "-o") == [str(work / "RESULTS.md")]     # never the repo's RESULTS.md
    # the same run named the other way: DATASETS=mydata mydata_DOMAINS=…
    named = make(SLOT, "results", f"FEATURES={mydata.parent}", "DATASETS=mydata",
                 "mydata_DOMAINS=a b c", f"WORK={work}")
    assert named.stdout == own.stdout
    also = make(SLOT, "results", f"FEATURES={mydata.parent}", "DATASETS=mydata", "DOMAINS=a b c",
                f"WORK={work}")
    assert also.stdout == own.stdout
    # the file-by-file recipe partitions exactly those files, in order
    one = make(SLOT, "one", f"FEATURES_DIR={mydata}", "DOMAINS=a b c", f"WORK={work}")
    part = command_with(one.stdout, "partition")
    assert part[2:5] == [str(mydata / f"{d}.h5") for d in "abc"] and part[5] == "-o"
    # the built-in recipe is unchanged
    builtin = command_with(make(SLOT, "grid", f"WORK={work}").stdout, "run_grid.py")
    assert flag(builtin, "--datasets") == ["office_caltech10", "digits"]
    assert flag(builtin, "--domains") == ["office_caltech10=amazon,caltech10,dslr,webcam",
                                          "digits=mnist,usps,mnistm"]


def test_slot_recipe_errors_and_its_script_reads_every_flag(mydata, tmp_path):
    bad = make(SLOT, "grid", f"FEATURES_DIR={mydata}", check=False)
    assert bad.returncode != 0 and "needs DOMAINS=" in bad.stderr
    bad = make(SLOT, "grid", "DOMAINS=a b c", check=False)        # two built-in datasets
    assert bad.returncode != 0 and "one dataset" in bad.stderr
    # run for real with a domain that has no file: run_grid.py parses the recipe's flags, then stops
    res = make(SLOT, "grid", f"FEATURES_DIR={mydata}", "DOMAINS=a b zz", f"WORK={tmp_path / 'w'}",
               dry=False, check=False)
    assert res.returncode != 0
    assert f"missing features file(s): {mydata / 'zz.h5'}" in res.stderr, res.stderr
    assert not (tmp_path / "w").exists()


def test_dadil_recipe_takes_a_features_folder_and_domains(mydata, tmp_path):
    work = tmp_path / "work"
    out = make(DADIL, "lodo", f"FEATURES_DIR={mydata}", "DOMAINS=a b,c", f"WORK={work}").stdout
    lodo = command_with(out, "run_lodo.py")
    assert flag(lodo, "--features") == [str(mydata)]
    assert flag(lodo, "--domains") == ["a,b,c"]
    assert flag(lodo, "--out") == [str(work / "lodo-mydata" / "mydata")]
    assert command_with(out, "make_results.py")[2:] == [str(work / "lodo-mydata")] * 2
    named = make(DADIL, "lodo", f"FEATURES_DIR={mydata}", "DOMAINS=a,b,c", "NAME=mine",
                 f"WORK={work}").stdout
    assert flag(command_with(named, "run_lodo.py"), "--out") == [str(work / "lodo-mine" / "mine")]
    bad = make(DADIL, "lodo", "DOMAINS=a b", check=False)
    assert bad.returncode != 0 and "needs FEATURES_DIR" in bad.stderr
    bad = make(DADIL, "lodo", f"FEATURES_DIR={mydata}", "DOMAINS=a", check=False)
    assert bad.returncode != 0 and "at least 2 domain" in bad.stderr
    res = make(DADIL, "lodo", f"FEATURES_DIR={mydata}", "DOMAINS=a b zz", f"WORK={work}",
               dry=False, check=False)
    assert res.returncode != 0
    assert f"missing features file(s): {mydata / 'zz.h5'}" in res.stderr, res.stderr
    assert not work.exists()


@pytest.mark.slow
def test_both_recipes_run_on_a_new_dataset(mydata, tmp_path):
    work = tmp_path / "work"
    make(SLOT, "results", f"FEATURES_DIR={mydata}", "DOMAINS=a b c", f"WORK={work}", "ALPHAS=0.5",
         "SEEDS=0", "TAUS=0.4", "HEADS=fedcgs", "JOBS=1", dry=False)
    assert (work / "grid" / "mydata" / "M1_a0.5_s0.json").is_file()
    assert "mydata" in (work / "RESULTS.md").read_text()
    make(DADIL, "lodo", f"FEATURES_DIR={mydata}", "DOMAINS=a b c", f"WORK={work}", "ROUNDS=2",
         "LOCAL_STEPS=1", "SEEDS=0", "MISSING=0", "MISSING_SEEDS=0", "WORKERS=1", dry=False)
    out = work / "lodo-mydata"
    assert sorted(p.name for p in (out / "mydata" / "results").glob("*.json")) == \
        [f"main_{d}_s0_m00.json" for d in "abc"]
    assert "## mydata" in (out / "RESULTS.md").read_text()


def test_dadil_reproduction_runs_its_three_benchmarks_in_one_pool(tmp_path):
    out = make(DADIL, "RESULTS.md", f"FEATURES={tmp_path}/f", f"WORK={tmp_path}/w").stdout
    words = command_with(out, "run_lodo.py")
    assert words.count("--and") == 2
    groups, cur = [], []
    for w in words[2:]:
        (groups.append(cur), cur := []) if w == "--and" else cur.append(w)
    groups.append(cur)
    assert [flag(g, "--out") for g in groups] == [[f"{tmp_path}/w/runs/{d}"] for d in
                                                   ("office_caltech10", "digits", "amazon_review")]
    assert flag(groups[1], "--missing-targets") == ["usps"] and "--envelope" not in groups[2]
    assert command_with(out, "make_results.py")[2:] == [f"{tmp_path}/w/runs", "."]


def test_run_lodo_refuses_two_studies_writing_to_one_folder(mydata, tmp_path):
    import sys

    study = ["--features", str(mydata), "--domains", "a,b,c", "--out", str(tmp_path / "o")]
    res = subprocess.run([sys.executable, str(DADIL / "run_lodo.py"), *study, "--and", *study],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "same --out" in res.stderr
    assert not (tmp_path / "o").exists()
    res = subprocess.run([sys.executable, str(DADIL / "run_lodo.py"), *study, "--and", *study[:-1],
                          str(tmp_path / "p"), "--workers", "1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "agree on --workers" in res.stderr


@pytest.mark.slow
def test_two_studies_in_one_pool_write_their_own_results(mydata, tmp_path):
    import json
    import sys

    other = tmp_path / "feats" / "other"
    shutil.copytree(mydata, other)
    runs = tmp_path / "runs"
    common = ["--domains", "a,b,c", "--rounds", "2", "--local-steps", "1", "--seeds", "0",
              "--missing", "0", "--missing-seeds", "0", "--workers", "1", "--no-peers"]
    res = subprocess.run([sys.executable, str(DADIL / "run_lodo.py"), "--features", str(mydata),
                          "--out", str(runs / "mydata"), *common, "--and", "--features",
                          str(other), "--out", str(runs / "other"), *common],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    for name in ("mydata", "other"):
        assert sorted(p.name for p in (runs / name / "results").glob("*.json")) == \
            [f"main_{d}_s0_m00.json" for d in "abc"]
        rec = json.loads((runs / name / "run_cpu.json").read_text())
        assert rec["shared_pool"] == ["mydata", "other"]
        r = json.loads((runs / name / "results" / "main_a_s0_m00.json").read_text())
        assert 0 <= r["started_s"] <= r["wall_clock_s"]
    res = subprocess.run([sys.executable, str(DADIL / "make_results.py"), str(runs), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    md = (tmp_path / "RESULTS.md").read_text()
    assert "their jobs in one pool of worker processes" in md
    assert "in a pool shared with other" in md


def test_run_lodo_fits_source_only_once_per_target_for_every_seed(mydata):
    import sys

    from fedalign.dadil.classifiers import source_only_classifier
    from fedalign.files import read_features

    sys.path.insert(0, str(DADIL))
    try:
        import run_lodo
    finally:
        sys.path.remove(str(DADIL))
    first = run_lodo.source_only_fit(str(mydata), 0, ("a", "b", "c"), "a")
    assert run_lodo.source_only_fit(str(mydata), 0, ("a", "b", "c"), "a") is first
    rows = [read_features(mydata / f"{d}.h5")[:2] for d in "bc"]
    _, rec = source_only_classifier([(X.astype(float), y) for X, y in rows])
    assert first[1] == rec and rec["cv"] == "leave-one-source-domain-out"
    assert run_lodo.source_only_fit(str(mydata), 0, ("a", "b"), "a") is None  # one source: k-fold


def test_job_data_maps_the_sources_only_when_the_study_aligns(mydata, tmp_path):
    import sys

    sys.path.insert(0, str(DADIL))
    try:
        import run_lodo
    finally:
        sys.path.remove(str(DADIL))

    def study(align):
        return run_lodo.parse_study(run_lodo.parser(), [
            "--features", str(mydata), "--domains", "a,b,c", "--out", str(tmp_path / align),
            "--align-to-target", align])

    on, off = study("on"), study("off")
    data = run_lodo.load_all(on)
    X, y, (tr, te, dropped), sources, src, rec = run_lodo.job_data(on, data, "a", 0, 0.0, 3)
    assert sources == ["b", "c"] and rec is not None and not dropped
    assert len(set(tr) | set(te)) == len(tr) + len(te) == len(y)
    for d in sources:   # moved onto the target's Gaussian; the labels as they were
        np.testing.assert_array_equal(src[d][1], data[d][1])
        assert not np.allclose(src[d][0], data[d][0])
    *_, raw, none = run_lodo.job_data(off, data, "a", 0, 0.0, 3)
    assert none is None and all(raw[d][0] is data[d][0] for d in sources)
    # --map-shrinkage reaches the map (stop 42's tried variant); a bad value is one usage error
    iso = run_lodo.parse_study(run_lodo.parser(), [
        "--features", str(mydata), "--domains", "a,b,c", "--out", str(tmp_path / "iso"),
        "--align-to-target", "on", "--map-shrinkage", "1"])
    assert on.map_shrinkage == "auto" and iso.map_shrinkage == 1.0
    *_, src_iso, _ = run_lodo.job_data(iso, data, "a", 0, 0.0, 3)
    assert not np.allclose(src_iso["b"][0], src["b"][0])
    with pytest.raises(SystemExit) as bad:
        run_lodo.parse_study(run_lodo.parser(), ["--features", str(mydata), "--domains", "a,b",
                                                 "--out", str(tmp_path / "x"),
                                                 "--map-shrinkage", "2"])
    assert bad.value.code == 2
    # the tuning scripts' view is the aligned job's, split for split
    X2, y2, split2, sources2, src2 = run_lodo.aligned_job_data(on, "a", 0, 0.0, 3)
    np.testing.assert_array_equal(split2[0], tr)
    assert all(np.array_equal(src2[d][0], src[d][0]) for d in sources)


def _make_results():
    import sys

    sys.path.insert(0, str(DADIL))
    try:
        import make_results
    finally:
        sys.path.remove(str(DADIL))
    return make_results


def _job(kind, target, seed, acc, missing=0.0):
    accuracy = {}
    for (m, h), v in acc.items():
        accuracy.setdefault(m, {})[h] = [v]
    name = f"{kind}_{target}_s{seed}_m{int(round(100 * missing)):02d}"
    return dict(job=dict(kind=kind, name=name), target=target, seed=seed, missing=missing,
                result=dict(accuracy=accuracy))


def test_goal_margins_are_paired_over_seeds_with_their_standard_error():
    mr = _make_results()
    so, rep = ("source-only", "logreg"), ("DeFed replacement", "auto")
    res = [_job("main", t, s, {so: 0.5 + 0.1 * s, rep: 0.5 + 0.1 * s + gain})
           for s, gain in ((0, 0.02), (1, 0.04)) for t in ("a", "b")]
    res.append(_job("main", "a", 2, {so: 0.9, rep: 0.9}))      # seed 2 lacks target b: left out
    mine = mr.per_seed_average(res, *rep)
    assert sorted(mine) == [0, 1] and mine[1] == pytest.approx(0.64)
    m, se, n = mr.paired(mine, mr.per_seed_average(res, *so), offset=3.0)
    # differences 2 and 4 points, minus 3: [-1, 1] → mean 0, SE = std([-1, 1], ddof=1)/√2 = 1
    assert (m, se, n) == (pytest.approx(0.0), pytest.approx(1.0), 2)
    table = mr.goals_table({"digits": res}, {})
    row = next(line for line in table.splitlines() if "DeFed replacement (auto)" in line)
    assert "source-only + 3.0" in row and "+0.00 ± 1.00 (n = 2)" in row and "| met |" in row


def test_goal_table_says_not_met_and_whether_within_one_standard_error():
    mr = _make_results()
    so, agg = ("source-only", "logreg"), ("DeFed aggregation", "auto")
    lda = ("DeFed aggregation", "lda")
    res = [_job("main", "u", s, {so: 0.5, agg: 0.52, lda: 0.8}) for s in (0, 1, 2)]
    res += [_job("missing", "u", s, {agg: 0.8 - 0.01 * (3 + s), lda: 0.8 - 0.05}, missing=0.45)
            for s in (0, 1, 2)]
    for s in (0, 1, 2):       # the missing study's 0 % column is the main jobs' accuracy
        res[s]["result"]["accuracy"]["DeFed aggregation"]["auto"] = [0.8]
    table = mr.goals_table({"digits": res}, {"digits": dict(pool_wall=40 * 60)})
    lines = table.splitlines()
    auto = next(x for x in lines if "missing classes" in x and "(auto)" in x)
    assert "loss +4.00" in auto and "-1.00 ± 0.58" in auto and "beyond one SE" in auto
    lda_row = next(x for x in lines if "missing classes" in x and "(lda)" in x)
    assert "loss +5.00" in lda_row and "**not met**" in lda_row
    assert any("40.0 min" in x and "**not met**" in x for x in lines)


def _tune(script: str, mydata, out, missing: str):
    """A tuning script of examples/dadil on the tiny features: target a, seed 0, 2 rounds."""
    import sys

    res = subprocess.run([sys.executable, str(DADIL / script), "--features", str(mydata),
                          "--domains", "a,b,c", "--targets", "a", "--out", str(out),
                          "--rounds", "2", "--local-steps", "1", "--k", "2", "--missing", missing,
                          "--missing-seeds", "0", "--workers", "1"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    return res


@pytest.mark.slow
def test_tune_head_rule_scores_every_stand_in_on_missing_class_jobs(mydata, tmp_path):
    import json

    out = tmp_path / "tune"
    res = _tune("tune_head_rule.py", mydata, out, "0.34")
    [job] = json.loads((out / "head_rule_tuning.json").read_text())
    assert (job["target"], job["seed"], job["missing"]) == ("a", 0, 0.34)
    assert set(job["pick"]) == {"own", "relabeled", "unlabeled", "own+relabeled",
                                "own+unlabeled"}
    assert set(job["pick"].values()) <= {"lda", "linear"}
    # own+relabeled is the library's rule: the choice the job itself recorded
    rec = json.loads((out / "results" / "missing_a_s0_m34.json").read_text())
    assert job["pick"]["own+relabeled"] == \
        rec["result"]["records"]["lda head"]["head_rule"]["choice"]
    assert "| a | 1 |" in res.stdout


@pytest.mark.slow
def test_tune_lda_head_scores_every_variant_on_missing_class_jobs(mydata, tmp_path):
    import json

    out = tmp_path / "tune"
    res = _tune("tune_lda_head.py", mydata, out, "0,0.34")
    jobs = json.loads((out / "lda_head_tuning.json").read_text())
    assert sorted(j["missing"] for j in jobs) == [0.0, 0.34]
    for j in jobs:
        for acc in j["acc"].values():
            assert set(acc) == {"hard", "soft", "prior", "soft+prior", "poe", "cem1", "cem",
                                "shift", "shift-pooled", "weighted", "iso", "bary", "true",
                                "true+shift", "true+weighted", "true+iso", "true+bary",
                                "sources", "iso-sources", "src-labels"}
            assert all(0.0 <= v <= 1.0 for v in acc.values())
    # the library's head is hard (the script asserts it against the job's own lda row)
    assert "| a | 2 |" in res.stdout and "(loss " in res.stdout


def test_barycenter_statistics_are_the_messages_of_rows_with_the_gmms_moments():
    """Exact oracle: for each component k, the 2d rows m_k ± (d v_k,j)^{1/2} e_j have mean m_k
    and covariance diag(v_k) exactly; repeated in proportion to w_k with k's class, their
    FedCGS message is B's in expectation, to rounding."""
    import sys

    from fedalign.gmm import GMM
    from fedalign.heads.fedcgs import class_statistics

    sys.path.insert(0, str(DADIL))
    try:
        import tune_lda_head
    finally:
        sys.path.remove(str(DADIL))
    rng = np.random.default_rng(0)
    K, d, C = 4, 3, 3
    reps = np.array([1, 3, 2, 2])                        # w = reps / 8
    means, var = rng.normal(size=(K, d)), rng.uniform(0.1, 2.0, (K, d))
    cls = np.array([0, 2, 2, 1])
    B = GMM(reps / reps.sum(), means, var, np.eye(C)[cls])
    rows, y = [], []
    for k in range(K):
        step = np.diag(np.sqrt(d * var[k]))
        pts = np.vstack([means[k] + step, means[k] - step])   # (2d, d)
        rows += [pts] * reps[k]
        y += [cls[k]] * (2 * d * reps[k])
    X = np.vstack(rows)
    want = class_statistics(X, np.array(y), C)
    got = tune_lda_head.barycenter_statistics(B, len(X))
    assert set(got) == {"class_counts", "class_sums", "sum_x", "sum_xx"}
    for key in got:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-10, err_msg=key)


def test_variant_section_pairs_the_variant_with_the_default_over_seeds():
    mr = _make_results()
    lda, auto = ("DeFed aggregation", "lda"), ("DeFed aggregation", "auto")

    def run(shift, loss):
        res = [_job("main", t, s, {lda: 0.6 + 0.1 * s + shift, auto: 0.6 + 0.1 * s + shift})
               for s in (0, 1) for t in ("a", "b")]
        res += [_job("missing", "a", s, {lda: 0.6 + 0.1 * s + shift - loss[s],
                                         auto: 0.6 + 0.1 * s + shift - loss[s]}, missing=0.45)
                for s in (0, 1)]
        return {"digits": res}

    lines = mr.variant_section(run(0.0, (0.01, 0.03)), "cem", run(0.02, (0.04, 0.04)))
    assert lines[0] == "## Variant: cem"
    main = next(x for x in lines if "| DeFed aggregation (lda) |" in x)
    assert "| 65.00 | 67.00 | +2.00 ± 0.00 (n = 2) |" in main
    loss = next(x for x in lines if "(lda): loss 0 → 45 %" in x)
    # losses 1 and 3 points (default), 4 and 4 (variant): Δ = [3, 1], mean 2, SE 1
    assert "| 2.00 | 4.00 | +2.00 ± 1.00 (n = 2) |" in loss
    assert not any("replacement" in x for x in lines)          # no such rows in these runs


def test_more_seeds_section_pools_the_seeds_of_both_runs_job_by_job():
    mr = _make_results()
    so, agg = ("source-only", "logreg"), ("DeFed aggregation", "auto")

    def jobs(seeds, targets, full, last):
        res = [_job("main", t, s, {so: 0.5, agg: full(s)}) for s in seeds for t in targets]
        return res + [_job("missing", "a", s, {agg: last(s)}, missing=0.45) for s in seeds]

    data = {"digits": jobs((0, 1), ("a", "b"), lambda s: 0.6, lambda s: 0.55)}
    # seeds 2-4 of target a only, and seed 0 again with other numbers: data's copy is kept
    extra = {"digits": jobs((2, 3, 4), ("a",), lambda s: 0.6, lambda s: 0.59)
             + jobs((0,), ("a",), lambda s: 0.9, lambda s: 0.1)}
    lines = mr.more_seeds_section(data, extra)
    assert lines[0] == "## Precision check: the targets on more seeds"
    assert "main jobs: seeds 0–4; missing-class study: seeds 0–4" in lines[2]
    goal = next(x for x in lines if "≥ source-only + 3.0" in x)
    assert "| +7.00 ± 0.00 (n = 2) | met |" in goal      # seeds 2-4 lack target b
    # losses 5, 5, 1, 1, 1 points over seeds 0-4: mean 2.6, SE 0.98
    loss = [x for x in lines if "missing classes" in x and "(auto)" in x]
    assert len(loss) == 2 and all("loss +2.60 | +0.40 ± 0.98 (n = 5) | met |" in x for x in loss)
    assert not any("consensus" in x or "whole reproduction" in x for x in lines)


def test_goal_table_checks_consensus_also_without_a_missing_class_study():
    mr = _make_results()
    job = _job("main", "kitchen", 0, {("source-only", "logreg"): 0.8})
    job["consensus"] = {"aggregation": dict(rounds=[0, 50], max=[1.0, 0.2], mean=[1.0, 0.1])}
    lines = mr.goals_table({"amazon_review": [job]}, {}).splitlines()
    row = next(x for x in lines if "consensus" in x)
    assert "(target kitchen, seed 0) | DeFed aggregation | 0.20 | +0.10 | met |" in row
