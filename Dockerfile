# The rapidfs image: the binary, the shared libraries it links and the CA certificates, on an
# empty base, running as uid/gid 65534. Its entrypoint is `rapidfs gke-sidecar`, so GKE's
# managed Cloud Storage FUSE CSI driver can run it as the pod's `gke-gcsfuse-sidecar`
# (k8s/gke-managed-csi.yaml); the other manifests set `command: ["/usr/local/bin/rapidfs"]`.
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/REPO/rapidfs:VERSION .

FROM docker.io/library/rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked \
    && sh docker/rootfs.sh target/release/rapidfs /rootfs

FROM scratch
COPY --from=build /rootfs/ /
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/rapidfs", "gke-sidecar"]
