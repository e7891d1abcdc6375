"""What a ``fedalign`` process sets up before any command runs (fedalign.cli.app.main): one
BLAS thread and sleeping OpenMP threads unless the user says otherwise, and POT imported
without its optional scikit-learn / networkx integrations — with the same OT plans."""

import os
import subprocess
import sys

CODE = """
import os, sys
sys.argv = ["fedalign", "--version"]
from fedalign.cli import main
try:
    main()
except SystemExit:
    pass
print(os.environ["OPENBLAS_NUM_THREADS"], os.environ["OMP_WAIT_POLICY"], os.environ["FEDALIGN_POT_LEAN"])
import numpy as np
from threadpoolctl import threadpool_info
print(sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}))
from fedalign.dadil.distances import emd_plan
P = emd_plan(np.array([0.5, 0.5]), np.array([0.25, 0.75]), np.array([[0.0, 1.0], [1.0, 0.0]]))
print("sklearn" in sys.modules, "networkx" in sys.modules, P.round(12).tolist())
import sklearn.cluster  # still importable afterwards
print("ok")
"""


def test_cli_process_defaults_and_lean_pot():
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY", "FEDALIGN_POT_LEAN")}
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("fedalign ")
    assert lines[1] == "1 PASSIVE 1"
    assert lines[2] == "[1]"
    # the exact plan by hand: the diagonal keeps min(a_i, b_i) (0.25, 0.5), row 0's other 0.25
    # crosses at cost 1
    assert lines[3] == "False False [[0.25, 0.25], [0.0, 0.5]]"
    assert lines[4] == "ok"


def test_a_variable_the_user_set_wins():
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE", FEDALIGN_POT_LEAN="0")
    code = CODE.split("import numpy")[0]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[1] == "2 ACTIVE 0"
