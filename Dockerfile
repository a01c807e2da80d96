# syntax=docker/dockerfile:1
# Three images from one build, each with only what it runs (docker-bake.json names them;
# release/publish builds, pushes and pins them):
#   agent    burnrate-agent     node agent: the agent extra only
#   app      burnrate           analyzer and dashboard
#   trainer  burnrate-trainer   reference trainer, CUDA build of torch
# All run as an unprivileged user (uid 65532) with `burnrate` as the entrypoint.

FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY burnrate burnrate
COPY agent agent
COPY exporter exporter
COPY analyzer analyzer
COPY dashboard dashboard
COPY trainer trainer
COPY simulator simulator
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# A home directory, because torch.compile and Triton keep their caches under it.
RUN groupadd --gid 65532 burnrate \
 && useradd --uid 65532 --gid 65532 --create-home --home-dir /home/burnrate --shell /usr/sbin/nologin burnrate
ENTRYPOINT ["burnrate"]

FROM base AS agent
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/*.whl)[agent]"
USER 65532:65532
CMD ["agent"]

FROM base AS app
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/*.whl)[analyzer,dashboard]"
USER 65532:65532
CMD ["--help"]

# PyPI's default torch wheel for Linux x86_64 is the CUDA build, with the CUDA runtime
# libraries as dependencies; the node provides only the driver.
FROM base AS trainer
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install "$(ls /wheels/*.whl)[trainer]"
USER 65532:65532
WORKDIR /home/burnrate
CMD ["--help"]
