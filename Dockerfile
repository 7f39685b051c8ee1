# moerl image for the Kubeflow MPI operator (configs/k8s/). At the repository
# root, not in deploy/, because the build context must be the whole source tree
# (CMake, scripts/, configs/) and .dockerignore only applies at the context root:
#
#   docker build -t moerl:latest .
#
# Stage 1 installs the toolchain through scripts/setup.sh and builds through
# scripts/build.sh, so the package list lives in one place (setup.sh). Stage 2
# keeps only what a rank needs: the binary, the fault-tolerant MPI in .mpi/ (at
# the same absolute path, because `moerl --mpiexec` names the mpiexec it was
# built against), scripts/ (launch.sh), configs/, the shared libraries the
# binary links (derived from the binary, not listed again) and sshd, which the
# MPI operator's launcher uses to start Open MPI's daemons on the workers.

FROM debian:12 AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /opt/moerl
# setup.sh first and alone, so that editing sources does not reinstall packages.
COPY scripts/ scripts/
RUN scripts/setup.sh && rm -rf /var/lib/apt/lists/* .deploy-tools
COPY . .
RUN scripts/build.sh --target moerl && build/moerl --version
# The Debian packages that own every shared library the binary and the MPI
# runtime load: the runtime stage installs exactly these. dpkg knows a library
# by the path it shipped, which may be the path ldd prints (/lib/...) or the
# file behind it (alternatives such as libblas.so.3 -> OpenBLAS), so both are
# asked; libraries inside .mpi/ belong to no package and are copied instead.
RUN set -eu; \
    for f in build/moerl .mpi/bin/* $(find .mpi/lib -name '*.so*' -type f); do \
      ldd "$f" 2>/dev/null | awk '/=> \//{print $3}' || true; \
    done | sort -u | while read -r lib; do \
      dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true; \
    done | cut -d: -f1 | sort -u > runtime-packages.txt; \
    grep -q . runtime-packages.txt; cat runtime-packages.txt

FROM debian:12 AS runtime
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /opt/moerl
COPY --from=build /opt/moerl/runtime-packages.txt /tmp/runtime-packages.txt
# openssh-server/client: the operator's launcher reaches the workers by ssh;
# procps: launch.sh watches mpirun's children with ps, the worker wrapper in
# configs/k8s/mpijob.yaml finds its ranks with pgrep.
RUN apt-get update -qq \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y -qq --no-install-recommends \
      openssh-server openssh-client procps ca-certificates \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && mkdir -p /run/sshd
# The operator mounts its generated key pair and authorized_keys from a Secret
# at sshAuthMountPath (/root/.ssh by default). Secret volumes are symlinks with
# modes sshd's StrictModes refuses, and pod names are new on every run, so host
# keys cannot be known in advance.
RUN printf 'StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n' \
      > /etc/ssh/sshd_config.d/moerl-mpi.conf \
 && printf 'Host *\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n' \
      > /etc/ssh/ssh_config.d/moerl-mpi.conf
COPY --from=build /opt/moerl/.mpi /opt/moerl/.mpi
COPY --from=build /opt/moerl/build/moerl /opt/moerl/build/moerl
COPY scripts/ scripts/
COPY configs/ configs/
# Fails the image build, not the first job, when a library is missing.
RUN build/moerl --version && build/moerl config check configs/quickstart.toml
EXPOSE 22
# The MPIJob's pod templates set their own commands (launch.sh on the
# launcher, sshd on the workers); this default serves `docker run`.
CMD ["build/moerl", "--help"]
