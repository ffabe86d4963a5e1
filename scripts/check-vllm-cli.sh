#!/usr/bin/env bash
# vLLM's own parser on SpecDeck's command lines (issue 13, docs/gpu.md): installs the pinned vLLM
# (requirements/vllm.txt), speculators and SpecDeck's dependencies in a throwaway venv, then has
# scripts/check_vllm_cli.py parse every command SpecDeck builds with vLLM's and speculators' own
# parsers and record the result under tests/data/vllm_cli/. No GPU needed; the install is a
# 336 MB vLLM wheel plus a CUDA torch of several GB, so this is not part of `make test`.
#
#   scripts/check-vllm-cli.sh [VENV_DIR]
#
# With VENV_DIR the venv is kept there (and reused by the next run); without it, it is made
# under a temporary directory and removed at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

VLLM_PIN="$(grep -oE '^vllm==[^ ]+' "$ROOT/requirements/vllm.txt")"
[ -n "$VLLM_PIN" ] || { echo "no vllm== line in requirements/vllm.txt" >&2; exit 1; }

if [ $# -ge 1 ]; then
  VENV="$1"
else
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  VENV="$TMP/venv"
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet)

# vLLM first without its dependencies, then those from its own metadata, so that one floor this
# index cannot meet can be relaxed: certifi>=2026.10.19 (a CA bundle's date; the index's newest
# was 2026.10.18 when this was written; the record lists what is unmet). Everything else is
# installed as vLLM declares it, with a CUDA torch from PyPI (it imports and parses without a
# GPU). speculators' own dependencies come from requirements/local.txt without its CPU torch
# pin. SpecDeck runs from this checkout (PYTHONPATH), so only its dependencies are installed:
# the builders checked are always the checked-out ones.
"${PIP[@]}" --no-deps "$VLLM_PIN"
REQS="$(mktemp -d)"
"$VENV/bin/python" -c 'from importlib.metadata import requires
print("\n".join(r for r in requires("vllm") if "extra ==" not in r))' \
  | sed -E 's/^certifi>=[^;]*/certifi/' > "$REQS/vllm.txt"
grep -vE '^torch==' "$ROOT/requirements/local.txt" > "$REQS/local.txt"
"$VENV/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
  "$ROOT/pyproject.toml" > "$REQS/specdeck.txt"
"${PIP[@]}" -r "$REQS/vllm.txt" -r "$REQS/local.txt" -r "$REQS/specdeck.txt"
rm -rf "$REQS"
# Installed with --no-deps as everywhere else (they declare torchvision and torchaudio).
"${PIP[@]}" --no-deps -r "$ROOT/requirements/speculators.txt"

PYTHONPATH="$ROOT" "$VENV/bin/python" "$ROOT/scripts/check_vllm_cli.py" --out "$ROOT/tests/data/vllm_cli"
