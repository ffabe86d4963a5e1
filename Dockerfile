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
ENV PATH="/app/.venv/bin:$PATH"
EXPOSE 8000
CMD ["specdeck", "api", "--host", "0.0.0.0"]
