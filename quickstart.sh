#!/usr/bin/env bash
# rapidfs quick start: on a fresh Debian/Ubuntu machine, installs fuse3 if missing, builds the
# release binary, makes a small demo dataset, mounts it through the built-in emulator, and
# says what to try. Run it again to remount; `bash quickstart.sh --unmount` to stop.
set -euo pipefail
cd "$(dirname "$0")"

DEMO="${RAPIDFS_DEMO:-$HOME/rapidfs-demo}"
DATA="$DEMO/data"          # the emulator serves each subdirectory of this as a bucket
BUCKET="demo-bucket"
MNT="$DEMO/mnt"

say() { printf '\033[1m%s\033[0m\n' "$*"; }
is_mounted() { grep -q " $MNT fuse" /proc/mounts 2>/dev/null; }
unmount() {
  if is_mounted; then
    fusermount3 -u "$MNT" 2>/dev/null || umount "$MNT"
    say "unmounted $MNT"
  fi
}

if [ "${1:-}" = "--unmount" ]; then
  unmount
  exit 0
fi

if ! command -v fusermount3 >/dev/null; then
  say "installing fuse3"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fuse3 >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "Rust is needed: curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
  exit 1
fi

say "building rapidfs (release)"
cargo build --release --quiet
BIN="$PWD/target/release/rapidfs"

if [ ! -f "$DEMO/.dataset-done" ]; then
  say "making a demo dataset in $DATA/$BUCKET"
  mkdir -p "$DATA/$BUCKET"
  for split in train val; do
    for class in cats dogs birds; do
      dir="$DATA/$BUCKET/$split/$class"
      mkdir -p "$dir"
      n=40; [ "$split" = val ] && n=10
      for i in $(seq -w 1 "$n"); do
        head -c $(( (RANDOM % 200 + 20) * 1024 )) /dev/urandom > "$dir/$i.jpg"
      done
    done
  done
  head -c $((256 * 1024 * 1024)) /dev/urandom > "$DATA/$BUCKET/checkpoint.bin"
  echo "A demo bucket served by rapidfs' built-in emulator." > "$DATA/$BUCKET/README.txt"
  touch "$DEMO/.dataset-done"
fi

unmount
mkdir -p "$MNT"
say "mounting $BUCKET on $MNT"
"$BIN" mount "$BUCKET" "$MNT" --emulator "$DATA" --log-file "$DEMO/rapidfs.log"

cat <<MSG

rapidfs is serving $DATA/$BUCKET (through the gRPC emulator) at $MNT. Try:

  ls -l $MNT/train/cats | head
  find $MNT -name '*.jpg' | wc -l
  dd if=$MNT/checkpoint.bin of=/dev/null bs=1M      # sequential read speed
  dd if=$MNT/checkpoint.bin of=/dev/null bs=1M      # again: served from the page cache
  sha256sum $MNT/train/dogs/01.jpg $DATA/$BUCKET/train/dogs/01.jpg
  python3 -c "import os; print(sum(len(open(os.path.join(d, f), 'rb').read()) for d, _, fs in os.walk('$MNT/train') for f in fs))"
  df -h $MNT

Writing works too (close and fsync return once the bytes are in the bucket):

  echo hello > $MNT/notes.txt && cat $DATA/$BUCKET/notes.txt
  ln -s notes.txt $MNT/latest.txt && ls -l $MNT/latest.txt && cat $MNT/latest.txt   # symlinks, stored as gcsfuse stores them
  mkdir -p $MNT/out && dd if=/dev/zero of=$MNT/out/shard-0.bin bs=1M count=256 conv=fsync
  python3 -c "import torch; torch.save({'w': torch.ones(1024, 1024)}, '$MNT/model.pt'); print(torch.load('$MNT/model.pt')['w'].sum())"   # with PyTorch

The daemon logs to $DEMO/rapidfs.log.
To unmount:  fusermount3 -u $MNT    (or: bash quickstart.sh --unmount)
MSG
