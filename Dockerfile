# int4serve on CUDA: build with the CUDA devel image, run on the runtime image.
#
#   docker build -t int4serve .
#   docker run --gpus all -p 8000:8000 -v /srv/models/llama-3-8b:/model:ro int4serve
#
# The image's configuration is config.example.toml with host 0.0.0.0,
# backend "cuda" and model "/model"; mount another at
# /etc/int4serve/config.toml, or append flags (they override the file):
#   docker run ... int4serve --tp 2 --devices 0,1
#
# Ubuntu 24.04 images: CMake >= 3.25 comes from the distribution. CUDA 13
# at least: the CUDA backend uses CUDA 13's cudaMemcpyBatchAsync, and CMake
# refuses an older toolkit (INT4SERVE_CUDA_MIN_VERSION in CMakeLists.txt);
# tests/cuda_version_test.sh checks that this stays in step.
ARG CUDA_VERSION=13.0.1
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
# Architectures to compile the kernels for: 80 (A100-class, the oldest with
# the mma.sync + cp.async path) and 90 (H100/H200).
ARG CUDA_ARCHITECTURES="80;90"
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        build-essential cmake ninja-build pkg-config \
        libuv1-dev libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev \
        check libsubunit-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The whole project is configured (test and bench targets included, hence
# Check and libcurl above) so the image is built the way CI builds it; only
# the daemon is compiled.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build build --target int4serve \
 && sed -e 's|^host = .*|host = "0.0.0.0"|' \
        -e 's|^backend = .*|backend = "cuda"|' \
        -e 's|^model = .*|model = "/model"|' \
        config.example.toml > build/config.toml \
 && grep -q '^host = "0.0.0.0"' build/config.toml \
 && grep -q '^backend = "cuda"' build/config.toml \
 && grep -q '^model = "/model"' build/config.toml

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
ARG DEBIAN_FRONTEND=noninteractive
# The shared libraries int4serve links (Ubuntu 24.04 names), and curl for
# health checks. cuBLAS and NCCL come with the runtime image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        libuv1t64 libmicrohttpd12t64 libjansson4 libpcre2-8-0 libutf8proc3 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin int4serve
COPY --from=build /src/build/server/int4serve /usr/local/bin/int4serve
COPY --from=build /src/build/config.toml /etc/int4serve/config.toml
# Fail the build, not the first start, when a library is missing. The driver
# library (libcuda.so.1) comes from the host at run time, so it is not checked,
# and the binary is only started here when it does not need it.
RUN ! ldd /usr/local/bin/int4serve | grep -v "libcuda\.so" | grep "not found" \
 && if ! ldd /usr/local/bin/int4serve | grep -q "libcuda\.so"; then \
        /usr/local/bin/int4serve --version; fi
USER int4serve
EXPOSE 8000
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/int4serve", "--config", "/etc/int4serve/config.toml"]
