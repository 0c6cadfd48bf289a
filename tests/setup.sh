# Sourced by tests/run.sh and the benchmarks: installs the system packages and the Python
# packages the tests use, idempotently, and exports RAPIDFS_PYTHON for the tests.

need_apt=()
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v bindfs >/dev/null || need_apt+=(bindfs)
command -v systemd-analyze >/dev/null || need_apt+=(systemd)
command -v openssl >/dev/null || need_apt+=(openssl)
command -v rsync >/dev/null || need_apt+=(rsync)
command -v git >/dev/null || need_apt+=(git)
[ -f /etc/ssl/certs/ca-certificates.crt ] || need_apt+=(ca-certificates)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Ordinary users mount through fusermount3, which opens /dev/fuse with the user's rights:
# make it 0666 as on a stock Debian system (some containers create it 0600).
if [ "$(id -u)" = 0 ] && [ -c /dev/fuse ]; then
  chmod 0666 /dev/fuse
fi

RAPIDFS_VENV="${RAPIDFS_VENV:-$HOME/.cache/rapidfs/venv}"
if [ ! -x "$RAPIDFS_VENV/bin/python" ]; then
  python3 -m venv "$RAPIDFS_VENV"
fi
"$RAPIDFS_VENV/bin/python" -m pip install -q --disable-pip-version-check -r tests/python/requirements.txt
export RAPIDFS_PYTHON="$RAPIDFS_VENV/bin/python"
