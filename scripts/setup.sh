#!/usr/bin/env bash
# make setup: install everything pdd-testbed needs on a fresh Debian machine.
# Idempotent: re-running skips what is already in place. Stops on the first failure
# with a message naming the step.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
VENV=.venv
PEERS=.venv-peers  # peers' load tools (AIPerf), apart: never in the project's venv
DEBIAN_PACKAGES=(mininet bridge-utils iperf3 iputils-ping iptables nftables ethtool iproute2 procps psmisc util-linux openssl)

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
fail() { printf '\n\033[31msetup failed: %s\033[0m\n' "$*" >&2; exit 1; }
trap 'fail "step \"${CURRENT:-?}\" exited with status $?"' ERR

CURRENT="Debian packages"
step "$CURRENT: ${DEBIAN_PACKAGES[*]}"
missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "installing ${missing[*]} needs root (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends keeps Open vSwitch out: the topologies use Linux bridges.
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "all present"
fi

CURRENT="virtual environment"
step "$CURRENT ($VENV with $PY)"
command -v "$PY" >/dev/null || fail "$PY not found; Python >= 3.11 is required"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

CURRENT="Mininet's Python package into the venv"
step "$CURRENT"
# Mininet lives in Debian's system Python; link just that package, not all of dist-packages.
MN_SRC=$(/usr/bin/python3 -c 'import mininet, os; print(os.path.dirname(mininet.__file__))')
ln -sfn "$MN_SRC" "$SITE/mininet"
"$VENV/bin/python" -c 'import mininet.net' || fail "mininet does not import from $VENV"

CURRENT="CPU torch"
step "$CURRENT (torch 2.13.0, never a CUDA build)"
"${PIP[@]}" -c requirements/constraints.txt torch==2.13.0
"$VENV/bin/python" - <<'PY'
import torch, sys
if torch.version.cuda is not None:
    sys.exit(f"a CUDA torch was installed ({torch.__version__}); expected the CPU build")
print("torch", torch.__version__)
PY

CURRENT="SGLang without its CUDA-only requirements"
step "$CURRENT"
"${PIP[@]}" --no-deps -c requirements/constraints.txt sglang
"${PIP[@]}" -c requirements/constraints.txt -r requirements/sglang-cpu.txt

CURRENT="project and tools"
step "$CURRENT"
"${PIP[@]}" -c requirements/constraints.txt -r requirements/project.txt
"${PIP[@]}" --no-deps -e .
# Import hooks that must precede SGLang's own imports in every process it spawns
# (sgl_kernel stand-in, torchvision fix); each is inert where not needed.
echo "import engine_patches.bootstrap" > "$SITE/pdd_testbed_bootstrap.pth"

CURRENT="peers' load tools in $PEERS (AIPerf)"
step "$CURRENT"
[ -x "$PEERS/bin/python" ] || "$PY" -m venv "$PEERS"
"$PEERS/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements/peers.txt
"$PEERS/bin/aiperf" --version

CURRENT="check"
step "$CURRENT"
"$VENV/bin/python" - <<'PY'
import torch, sglang, torchvision, pandas, mininet.net  # noqa: F401
from importlib.metadata import version, entry_points
assert torch.version.cuda is None, "CUDA torch"
eps = [e.name for e in entry_points(group="sglang.srt.plugins")]
assert "pdd_testbed" in eps, f"engine_patches plugin not registered: {eps}"
print("torch", torch.__version__, "| sglang", version("sglang"), "| locust", version("locust"))
PY
# Locust monkey-patches with gevent at import: check it in a process of its own.
"$VENV/bin/python" -c "import locust" 2>/dev/null || fail "locust does not import"
echo "setup complete: activate with 'source $VENV/bin/activate' or use 'make test'"
