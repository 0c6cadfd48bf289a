# The rapidfs images, built from this repository.
#
#   docker build -t REGISTRY/rapidfs:VERSION .                        # the GKE sidecar image
#   docker build --target full -t REGISTRY/rapidfs:VERSION-full .     # rapidfs mount in a pod
#
# The default (last) stage is the sidecar image: the binary, the shared libraries it links
# and the CA certificates on an empty base, running as uid/gid 65534, with the entrypoint
# `rapidfs gke-sidecar`, so GKE's managed Cloud Storage FUSE CSI driver can run it as the
# pod's `gke-gcsfuse-sidecar` (k8s/gke-managed-csi.yaml). The `full` stage adds a shell and
# fusermount3 for the manifests that mount by themselves (k8s/sidecar-job.yaml,
# k8s/node-daemonset.yaml); its entrypoint is plain `rapidfs`.

FROM docker.io/library/rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
    && sh docker/rootfs.sh target/release/rapidfs /rootfs

FROM docker.io/library/debian:bookworm-slim AS full
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates fuse3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /rootfs/usr/local/bin/rapidfs /usr/local/bin/rapidfs
ENTRYPOINT ["/usr/local/bin/rapidfs"]

FROM scratch
COPY --from=build /rootfs/ /
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/rapidfs", "gke-sidecar"]
