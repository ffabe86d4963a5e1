# The dashboard, built when frontend/ has a package.json; otherwise dist/ stays empty and the
# API answers / with how to build it.
FROM node:20-slim AS dashboard
WORKDIR /frontend
COPY frontend ./
RUN mkdir -p dist && if [ -f package.json ]; then npm ci && npm run build; fi

# One image for the API and the workers. GPU hosts add vLLM (see docs/gpu.md).
FROM python:3.11-slim
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends make git && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md alembic.ini Makefile ./
COPY requirements ./requirements
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
RUN python -m venv /app/.venv && make install PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# Where the API looks for it (SPECDECK_DASHBOARD_DIR's default, beside app/).
COPY --from=dashboard /frontend/dist ./frontend/dist
ENV PATH="/app/.venv/bin:$PATH"
EXPOSE 8000
CMD ["specdeck", "api", "--host", "0.0.0.0"]
