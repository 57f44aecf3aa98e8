# vq: multi-stage image. The build stage runs scripts/build-release.sh, the same script that
# is run and tested outside containers; the runtime stage is Debian slim with curl (for the
# HEALTHCHECK) and an unprivileged user. No secret is baked in: pass VQ_TOKEN_SECRET or
# VQ_TOKEN_SECRET_FILE (a mounted secret) at run time.
#
#   docker build -t vq .
#   docker run -e VQ_TOKEN_SECRET=... -e VQ_REDIS__URL=redis://redis:6379 -p 8080:8080 vq

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY lua ./lua
# Compiled in: the waiting page (assets/) and the OpenAPI document (docs/openapi.json).
COPY assets ./assets
COPY docs/openapi.json ./docs/openapi.json
COPY tests ./tests
COPY scripts ./scripts
RUN scripts/build-release.sh /out

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin vq
COPY --from=build /out/vq /usr/local/bin/vq
USER vq
# Listen on every interface inside the container; everything else comes from VQ_* variables.
ENV VQ_LISTEN=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s --start-period=5s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8080/healthz >/dev/null || exit 1
ENTRYPOINT ["vq"]
CMD ["serve"]
