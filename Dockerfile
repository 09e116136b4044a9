# SpecVoice's server (`specvoice serve`): the page, its WebSocket protocol and the
# OpenAI-compatible API. The models are not in the image: mount a models folder (as
# `../shared/models/fetch` or `cargo xtask download` fill it) at /models.
#
#   docker build -t specvoice .
#   docker run -p 8080:8080 -v ~/.cache/specvoice/models:/models:ro \
#       -e SPECVOICE_API_KEYS=sk-local-1 specvoice
#
# See docs/openai.md for TLS behind a reverse proxy and several replicas behind a load balancer.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p specvoice --bin specvoice

FROM debian:bookworm-slim
# espeak-ng: the phonemizer of the neural voices and the fallback voice; curl: the health check.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends espeak-ng curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/specvoice /usr/local/bin/specvoice
RUN useradd --system --home /nonexistent specvoice
USER specvoice
ENV SPECVOICE_MODELS=/models
VOLUME /models
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/health || exit 1
# SIGTERM (docker stop, a rolling update) drains: no new sessions, the turns in progress complete.
STOPSIGNAL SIGTERM
ENTRYPOINT ["specvoice", "serve", "--addr", "0.0.0.0:8080"]
